"""Static tables are known by where they live, not by their name (issue 18).

Two queries read one Kafka topic and join two tables each that share their names with the
other query's: ``sites`` (keyed by sensor; v1 a partitioned folder Spark wrote, v2 one
Parquet file) and ``zones`` (no key: rows named by their content; v1 a CSV folder, v2 a
JSON folder). Every answer is checked against a brute-force oracle: each output row's
backward lineage names its own query's table rows (rid, ``table``, payload), forward from
a table row reaches only its own query's rows, records the queries dropped (filtered,
malformed, unmatched) are answered empty and complete with the batches that read them,
and every backend gives the same answers.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F

from headwater.adapters.kafka import ensure_topics
from headwater.capture import attach
from headwater.core.rid import kafka_rid, table_rid, table_row_rid
from headwater.demo import orders as data
from headwater.demo.run import end_offsets, run_until
from headwater.query.api import LineageClient
from headwater.query.errors import LineageError, UnknownRow
from tests.conftest import index, own_topics, records_read

pytestmark = pytest.mark.every_line  # runs on every supported Spark line (./dev test)

SENSORS = ["s0", "s1", "s2", "s3"]
SITES = {"v1": {"s0": "OLD", "s1": "A1", "s2": "B1", "s3": "C1", "s5": "LONELY"},  # no event is from s5
         "v2": {"s0": "NEW", "s1": "A2", "s2": "B2"}}  # v2 has no s3: its events are unmatched there
ZONES = {"v1": [("s0", "north"), ("s1", "north"), ("s1", "east"), ("s2", "south"), ("s3", "west")],
         "v2": [("s0", "up"), ("s1", "down"), ("s2", "down"), ("s2", "left")]}
SITES["v3"], ZONES["v3"] = SITES["v2"], ZONES["v2"]  # v3: v2's tables copied elsewhere, read with capture off
EVENTS = 60


def events() -> list[tuple[bytes, bytes]]:
    """Readings of the four sensors and of s9, which no table has; every seventh is garbage and
    every fifth negative (filtered out)."""
    found = []
    for i in range(EVENTS):
        if i % 7 == 3:
            found.append((None, b"{not json"))
            continue
        sensor = "s9" if i % 11 == 5 else SENSORS[i % 4]
        found.append((None, json.dumps({"sensor": sensor, "v": -i if i % 5 == 0 else i}).encode()))
    return found


def parsed(value: bytes) -> dict | None:
    try:
        return json.loads(value)
    except ValueError:
        return None


def write_tables(spark, root) -> dict[str, dict]:
    """Each version's two tables, as Spark writes them; ``{version: {"sites": path, "zones": path}}``.
    v3 is a copy of v2, for the query whose capture is off."""
    import shutil

    paths = {}
    for version in ("v1", "v2"):
        folder = root / version
        folder.mkdir()
        sites = [(s, site, "eu" if s in ("s0", "s1", "s5") else "us") for s, site in SITES[version].items()]
        zones = spark.createDataFrame(ZONES[version], "sensor string, zone string")
        if version == "v1":  # a partitioned folder of part files, and a CSV folder with a header
            spark.createDataFrame(sites, "sensor string, site string, region string").repartition(2) \
                .write.partitionBy("region").parquet(str(folder / "sites.parquet"))
            zones.repartition(2).write.option("header", "true").csv(str(folder / "zones.csv"))
            paths[version] = {"sites": folder / "sites.parquet", "zones": folder / "zones.csv"}
        else:  # one Parquet file, and a JSON folder
            pq.write_table(pa.table({"sensor": [s for s, _, _ in sites], "site": [x for _, x, _ in sites],
                                     "region": [r for _, _, r in sites]}), folder / "sites.parquet")
            zones.repartition(2).write.json(str(folder / "zones.json"))
            paths[version] = {"sites": folder / "sites.parquet", "zones": folder / "zones.json"}
    shutil.copytree(root / "v2", root / "v3")
    paths["v3"] = {name: root / "v3" / path.name for name, path in paths["v2"].items()}
    return paths


def read_tables(spark, paths: dict):
    sites = spark.read.parquet(str(paths["sites"]))
    zones = spark.read.option("header", "true").csv(str(paths["zones"])) if str(paths["zones"]).endswith(".csv") \
        else spark.read.json(str(paths["zones"]))
    return sites, zones


def pipeline(spark, config, topic: str, sites, zones):
    source = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", config.bootstrap)
              .option("startingOffsets", "earliest")
              .option("subscribe", topic).option("maxOffsetsPerTrigger", 25).load())
    reading = F.from_json(F.col("value").cast("string"), "sensor string, v long")
    return (source.select(reading.alias("r")).select("r.*").where("v >= 0")
            .join(sites.select("sensor", "site"), "sensor").join(zones, "sensor")
            .select("sensor", "v", "site", "zone"))


def oracle(version: str, identities: dict, topic: str, values, coordinates) -> dict:
    """``(sensor, v, site, zone)`` of each output row → the rids it derives from."""
    expected = {}
    for value, (partition, offset) in zip(values, coordinates):
        event = parsed(value)
        if event is None or event["v"] < 0 or event["sensor"] not in SITES[version]:
            continue
        for sensor, zone in ZONES[version]:
            if sensor == event["sensor"]:
                expected[(sensor, event["v"], SITES[version][sensor], zone)] = {
                    kafka_rid(topic, partition, offset),
                    table_rid(identities["sites"], sensor),
                    table_row_rid(identities["zones"], [sensor, zone], ["string", "string"]),
                }
    return expected


@pytest.fixture(scope="module")
def world(spark, stack_config, tmp_path_factory):
    root = tmp_path_factory.mktemp("tables")
    config, tag = own_topics(stack_config, "tbl")
    topic = f"readings-{tag}"
    ensure_topics(config.bootstrap, [topic], 2)
    produced = events()
    coordinates = data.produce(config.bootstrap, topic, produced)
    values = [v for _, v in produced]
    paths = write_tables(spark, root)
    identities = {version: {name: f"file:{path}" for name, path in tables.items()} for version, tables in paths.items()}
    queries, sinks = {}, {}
    for versions, settings in ((("v1", "v2"), {}), (("v3",), {"capture": "log-only"})):
        tracer = attach(spark, config.with_overrides(**settings))
        try:
            for version in versions:
                name = f"q{version}-{tag}"
                sinks[version] = str(root / f"sink-{version}")
                df = pipeline(spark, config, topic, *read_tables(spark, paths[version]))
                queries[version] = (tracer.trace(df, name=name, keys={"sites": "sensor"}).writeStream
                                    .format("parquet").option("checkpointLocation", str(root / f"cp-{version}"))
                                    .trigger(processingTime="200 milliseconds").start(sinks[version]))
                run_until(queries[version], end_offsets(topic, coordinates), say=print)
        finally:
            tracer.close()
    index(config)
    rows = {version: [r.asDict() for r in spark.read.parquet(sink).collect()] for version, sink in sinks.items()}
    expected = {version: oracle(version, identities[version], topic, values, coordinates) for version in paths}
    read = {version: records_read(query) for version, query in queries.items()}
    return dict(config=config, topic=topic, values=values, coordinates=coordinates, paths=paths,
                identities=identities, rows=rows, expected=expected, read=read,
                names={version: f"q{version}-{tag}" for version in paths})


CAPTURED = ("v1", "v2")


def output_key(row: dict) -> tuple:
    return row["sensor"], row["v"], row["site"], row["zone"]


def test_each_answer_names_its_own_tables_rows_though_both_queries_tables_share_their_names(world):
    with LineageClient(world["config"]) as client:
        for version in ("v1", "v2"):
            rows, expected = world["rows"][version], world["expected"][version]
            assert sorted(map(output_key, rows)) == sorted(expected), "capture changed the query's output"
            for row in rows:
                found = client.backward(row["_hw_rid"])
                assert {x.rid for x in found} == expected[output_key(row)], output_key(row)
                assert found.complete and all(x.exact for x in found)
                tables = {x.dataset: x.table for x in found if x.topic is None}
                # One table of each name in one answer: shown by its short name, its identity beside it.
                assert tables == {"sites": world["identities"][version]["sites"],
                                  "zones": world["identities"][version]["zones"]}


def test_payloads_are_the_rows_of_the_answers_own_tables_in_every_format(world):
    with LineageClient(world["config"]) as client:
        for version in ("v1", "v2"):
            by_sensor = {}
            for row in world["rows"][version]:
                by_sensor.setdefault(row["sensor"], row)
            for sensor, row in by_sensor.items():
                found = client.backward(row["_hw_rid"], payload=True)
                payloads = {x.dataset: x.payload for x in found}
                site = payloads["sites"]
                assert (site["sensor"], site["site"]) == (sensor, SITES[version][sensor]), site
                assert site.get("region") == ("eu" if sensor in ("s0", "s1") else "us")
                assert (payloads["zones"]["sensor"], payloads["zones"]["zone"]) == (sensor, row["zone"])
                (kafka,) = [x for x in found if x.topic]
                assert kafka.payload["value"] == {"sensor": sensor, "v": row["v"]}


def test_forward_from_a_table_row_reaches_only_its_own_querys_rows(world):
    with LineageClient(world["config"]) as client:
        for version in ("v1", "v2"):
            rid_of = {}
            for row in world["rows"][version]:
                rid_of.setdefault(output_key(row), row["_hw_rid"])
            identities = world["identities"][version]
            for sensor in SITES[version]:
                want = {rid for key, rid in rid_of.items() if key[0] == sensor}
                answer = client.forward(table_rid(identities["sites"], sensor))
                assert {x.rid for x in answer} == want, (version, sensor)
                if not want:  # read by every batch of its query, joined by no event
                    assert answer.complete and {(g.query, g.status) for g in answer.read_by} == {
                        (world["names"][version], "full")}
                    assert len(answer.read_by) == len(set(world["read"][version].values()))
                shown = f"sites@{version}/sites.parquet"
                assert {x.rid for x in client.forward(f"table:{shown}:{sensor}")} == want
            for sensor, zone in ZONES[version]:
                want = {rid for key, rid in rid_of.items() if key[0] == sensor and key[3] == zone}
                rid = table_row_rid(identities["zones"], [sensor, zone], ["string", "string"])
                assert {x.rid for x in client.forward(rid)} == want, (version, sensor, zone)
        # The short name both tables answer to is no address: the answer says which names are.
        with pytest.raises(LineageError, match=r"3 static tables are called 'sites': name one of "
                                               r"sites@v1/sites.parquet, sites@v2/sites.parquet, "
                                               r"sites@v3/sites.parquet"):
            client.forward("table:sites:s0")


def test_records_the_queries_dropped_are_answered_empty_and_complete_with_the_batches_that_read_them(world):
    topic = world["topic"]
    dropped = []
    for value, (partition, offset) in zip(world["values"], world["coordinates"]):
        event = parsed(value)
        if event is None or event["v"] < 0 or event["sensor"] == "s9":
            dropped.append((partition, offset))
    assert len(dropped) > 10
    with LineageClient(world["config"]) as client:
        for partition, offset in dropped:
            answer = client.forward(f"kafka:{topic}:{partition}:{offset}")
            assert list(answer) == []
            assert sorted((g.query, g.batch, g.status) for g in answer.read_by) == sorted(
                (world["names"][v], world["read"][v][topic, partition, offset], "full") for v in CAPTURED)
            # The query whose capture is off read it too: inferred to derive nothing, its batch a gap.
            assert [(g.query, g.batch, g.status) for g in answer.gaps] == [
                (world["names"]["v3"], world["read"]["v3"][topic, partition, offset], "log-only")]
        # s3 is in v1's sites, not in v2's: read and dropped by v2's join only.
        s3 = next(i for i, v in enumerate(world["values"]) if (parsed(v) or {}).get("sensor") == "s3"
                  and parsed(v)["v"] >= 0)
        answer = client.forward(kafka_rid(topic, *world["coordinates"][s3]))
        assert {x.dataset for x in answer} == {world["names"]["v1"]} and not answer.read_by
        # A record no batch read is another matter, and the error says why.
        last = max(o for p, o in world["coordinates"] if p == 0)
        with pytest.raises(UnknownRow, match=rf"batches read offsets 0 to {last} of {topic}:0, not {last + 1}"):
            client.forward(f"kafka:{topic}:0:{last + 1}")
        with pytest.raises(UnknownRow, match="no batch read partition 0 of topic 'nope'"):
            client.forward("kafka:nope:0:0")
        with pytest.raises(UnknownRow, match="no table row has that key"):
            client.forward("table:sites@v1/sites.parquet:s7")


def test_every_backend_gives_the_same_answers(world):
    clients = {name: LineageClient(world["config"], backend=name) for name in ("cypher", "csprov", "rq", "auto")}
    try:
        for version in ("v1", "v2"):
            for row in world["rows"][version]:
                answers = {name: ([x.to_dict() for x in c.backward(row["_hw_rid"])],
                                  c.backward(row["_hw_rid"]).summary()) for name, c in clients.items()}
                assert all(a == answers["auto"] for a in answers.values()), answers
            for sensor in SITES[version]:
                rid = table_rid(world["identities"][version]["sites"], sensor)
                answers = {name: [x.to_dict() for x in c.forward(rid)] for name, c in clients.items()}
                assert all(a == answers["auto"] for a in answers.values()), answers
    finally:
        for client in clients.values():
            client.close()


def test_over_http_too(world):
    from headwater.query.http import serve

    topic = world["topic"]
    server = serve(world["config"], port=0, say=lambda _: None)
    try:
        def get(route: str, **params) -> tuple[int, dict]:
            url = f"http://127.0.0.1:{server.port}/v1/lineage/{route}?" \
                + "&".join(f"{k}={v}" for k, v in params.items())
            try:
                with urllib.request.urlopen(url, timeout=60) as response:
                    return response.status, json.loads(response.read())
            except urllib.error.HTTPError as e:
                return e.code, json.loads(e.read())

        garbage = next(c for v, c in zip(world["values"], world["coordinates"]) if parsed(v) is None)
        status, body = get("forward", source=f"kafka:{topic}:{garbage[0]}:{garbage[1]}")
        assert status == 200 and body["answer"] == [] and len(body["read_by"]) == 2 and len(body["gaps"]) == 1
        status, body = get("forward", source=f"kafka:{topic}:9:0")
        assert status == 404 and "no batch read partition 9" in body["error"]
        status, body = get("forward", source="table:sites%40v2%2Fsites.parquet:s0")
        assert status == 200 and {x["rid"] for x in body["answer"]} == {
            r["_hw_rid"] for r in world["rows"]["v2"] if r["sensor"] == "s0"}
        status, body = get("backward", rid=world["rows"]["v2"][0]["_hw_rid"], payload="true")
        assert status == 200 and {x["dataset"]: x.get("table") for x in body["answer"] if not x.get("topic")} == {
            "sites": world["identities"]["v2"]["sites"], "zones": world["identities"]["v2"]["zones"]}
    finally:
        server.close()


def test_rows_of_the_query_whose_capture_is_off_are_inferred_from_its_own_tables(world):
    with LineageClient(world["config"]) as client:
        rows, expected = world["rows"]["v3"], world["expected"]["v3"]
        assert sorted(map(output_key, rows)) == sorted(expected)
        for row in rows:
            found = client.backward(row["_hw_rid"])
            assert {x.rid for x in found} == expected[output_key(row)], output_key(row)
            assert all(x.via == "inference" and x.exact for x in found)
            assert {x.dataset: x.table for x in found if x.topic is None} == {
                "sites": world["identities"]["v3"]["sites"], "zones": world["identities"]["v3"]["zones"]}


def test_a_table_rewritten_after_the_batches_that_read_it_is_never_claimed_as_they_read_it(world):
    """Payloads say ``changed_since`` once a table's files change after the batches that read the row,
    and inference over a changed table is no longer claimed exact."""
    import os

    inferred = next(r for r in world["rows"]["v3"] if r["sensor"] == "s0")
    captured = next(r for r in world["rows"]["v2"] if r["sensor"] == "s0")
    untouched = next(r for r in world["rows"]["v1"] if r["sensor"] == "s0")
    with LineageClient(world["config"]) as client:
        def sites_of(rid):
            answer = client.backward(rid, payload=True)
            return answer, next(x for x in answer if x.dataset == "sites")

        before, site = sites_of(inferred["_hw_rid"])
        assert all(x.exact for x in before) and site.changed_since is False and site.payload["site"] == "NEW"
        # The same rows, written again: the files changed, so the batch's rows cannot be known to be these.
        path = world["paths"]["v3"]["sites"]
        later = os.stat(path).st_mtime_ns + 5_000_000_000
        os.utime(path, ns=(later, later))
        after, site = sites_of(inferred["_hw_rid"])
        assert {x.rid for x in after} == {x.rid for x in before} and not any(x.exact for x in after)
        assert site.changed_since is True and site.payload["site"] == "NEW"
        # A captured query's table rewritten with another site for s0: its lineage is from edges, exact,
        # and the payload is the row now, marked.
        changed = {**SITES["v2"], "s0": "NEWEST"}
        pq.write_table(pa.table({"sensor": list(changed), "site": list(changed.values()),
                                 "region": ["eu", "eu", "us"]}), world["paths"]["v2"]["sites"])
        answer, site = sites_of(captured["_hw_rid"])
        assert all(x.exact for x in answer) and site.changed_since is True and site.payload["site"] == "NEWEST"
        _, site = sites_of(untouched["_hw_rid"])
        assert site.changed_since is False and site.payload["site"] == "OLD"


def test_a_payload_that_cannot_be_read_never_loses_the_answer(world, tmp_path):
    """Last: it removes a table and the topic. The records still come back, each unreadable payload
    saying why, within seconds."""
    import shutil

    from headwater.adapters.kafka import admin

    row = world["rows"]["v1"][0]
    shutil.rmtree(world["paths"]["v1"]["zones"])
    client_admin = admin(world["config"].bootstrap)
    try:
        client_admin.delete_topics([world["topic"]])
    finally:
        client_admin.close()
    with LineageClient(world["config"]) as client:
        began = time.monotonic()
        found = client.backward(row["_hw_rid"], payload=True)
        assert time.monotonic() - began < 15
    assert {x.rid for x in found} == world["expected"]["v1"][output_key(row)]
    payloads = {x.dataset: x.payload for x in found}
    assert "not on the broker" in payloads[f"kafka:{world['topic']}"]["error"]
    assert "zones.csv" in payloads["zones"]["error"]
    assert payloads["sites"]["site"] == SITES["v1"][row["sensor"]]
    # The topic made again and written to: the same offsets hold other records, written after the batches
    # ran (stamped a minute on, as a topic recreated later would be).
    from headwater.adapters.kafka import producer

    ensure_topics(world["config"].bootstrap, [world["topic"]], 2)
    later = int(time.time() * 1000) + 60_000
    client = producer(world["config"].bootstrap)
    try:
        for partition in (0, 1):
            for _ in range(EVENTS):
                client.send(world["topic"], value=b"{}", partition=partition, timestamp_ms=later)
        client.flush(timeout=60)
    finally:
        client.close()
    with LineageClient(world["config"]) as client:
        (kafka,) = [x for x in client.backward(row["_hw_rid"], payload=True) if x.topic]
    assert "the topic was recreated since" in kafka.payload["error"]
