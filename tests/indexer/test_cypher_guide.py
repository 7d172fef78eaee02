"""The Cypher guide (indexer/README.md): each of its questions, its text read from the README, run against
Neo4j after a traced stream was indexed, equals the query tier's answer to the same question.

The stream: a Kafka topic of two partitions, its events through a ``mapInPandas`` black box (the rows it
keeps) and beside it a branch with no black box (the rows it drops), unioned and joined with a static table,
into a Parquet sink; two batches fully captured, then, restarted log-only, a third of events no table row
matches (a gap whose inferred lineage is empty, so the graph and the query tier hold the same lineage).
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F

from headwater.adapters.graph import driver
from headwater.adapters.kafka import ensure_topics
from headwater.capture import attach
from headwater.core.offsets import offset_ranges
from headwater.demo import orders as demo_data
from headwater.demo.run import end_offsets, run_until
from headwater.query.api import LineageClient
from headwater.store.batch_log import BatchLog
from tests import pipelines
from tests.conftest import index, local_file, own_topics, sink_file_batches

README = Path(__file__).resolve().parents[2] / "indexer" / "README.md"
CAPTURED, PER_BATCH = 160, 80  # events of the captured run, and per batch


def guide() -> dict[str, str]:
    """The guide's questions, ``{name: Cypher}``: its ``cypher`` blocks, each named by its first line."""
    section = README.read_text().split("## Cypher guide", 1)[1].split("\n## ", 1)[0]
    found = {}
    for block in re.findall(r"```cypher\n(.*?)```", section, re.S):
        name, text = re.fullmatch(r"// name: (\w+)\n(.*)", block, re.S).groups()
        found[name] = text
    return found


def keep_and_triple(frames):
    for frame in frames:
        kept = frame[frame["v"] % 3 != 0]
        yield kept.assign(v3=kept["v"] * 3)[["id", "k", "v3"]]


def traced(spark, env, capture: dict):
    """Run the stream (its checkpoint kept in ``env.workdir``) until it read every event produced so far."""
    config = env.config.with_overrides(**capture)
    tracer = attach(spark, config)
    try:
        source = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", config.bootstrap)
                  .option("startingOffsets", "earliest").option("subscribe", env.topic)
                  .option("maxOffsetsPerTrigger", PER_BATCH).load())
        valid = source.select(F.from_json(F.col("value").cast("string"), pipelines.EVENT_SCHEMA).alias("e")) \
            .select("e.*").where("v IS NOT NULL")
        boxed = valid.mapInPandas(keep_and_triple, "id long, k int, v3 long")
        plain = valid.where("v % 3 = 0").select("id", "k", (F.col("v") * 3).cast("long").alias("v3"))
        df = boxed.unionByName(plain).join(env.dims_df, "k").select("id", "v3", "name")
        query = (tracer.trace(df, name=env.name, keys={"dims": "k"}).writeStream.format("parquet")
                 .option("checkpointLocation", str(env.workdir / "cp"))
                 .trigger(processingTime="200 milliseconds").start(str(env.workdir / "sink")))
        run_until(query, end_offsets(env.topic, env.coordinates), say=print)
    finally:
        tracer.close()


@pytest.fixture(scope="module")
def env(spark, stack_config, tmp_path_factory):
    from types import SimpleNamespace

    # Capture's superset as it is (re-execution would narrow the black box: test_black_box_narrowing.py).
    config, tag = own_topics(stack_config.with_overrides(narrowing_key="", narrowing_key_file=""), "cg")
    workdir = tmp_path_factory.mktemp("cypher-guide")
    topic = f"cg-events-{tag}"
    ensure_topics(config.bootstrap, [topic], 2)
    values = pipelines.events(CAPTURED, seed=7)
    unmatched = [v for v in pipelines.events(400, seed=8)
                 if v.startswith(b"{\"") and pipelines.parse(v)["k"] not in pipelines.DIM_KEYS][:40]
    pq.write_table(pa.Table.from_pylist(pipelines.dims()), workdir / "dims.parquet")
    env = SimpleNamespace(config=config, topic=topic, workdir=workdir, name=f"guide-{uuid.uuid4().hex[:6]}",
                          dims_df=spark.read.parquet(str(workdir / "dims.parquet")))
    env.coordinates = demo_data.produce(config.bootstrap, topic, [(None, v) for v in values], partitions=2)
    traced(spark, env, {})
    env.coordinates += demo_data.produce(config.bootstrap, topic, [(None, v) for v in unmatched], partitions=2)
    traced(spark, env, {"capture": "log-only"})
    index(config)
    env.log = BatchLog(config.store_uri(), config.log_topic)
    env.batches = env.log.batches(env.name)
    env.entries = {b: env.log.batch(env.name, b) for b in env.batches}
    batch_of = sink_file_batches(config, env.name)
    env.rows = {}  # rid → batch of every sink row
    for fragment in ds.dataset(str(workdir / "sink"), format="parquet").get_fragments():
        env.rows.update({rid: batch_of[local_file(fragment.path)]
                         for rid in fragment.to_table(columns=["_hw_rid"])["_hw_rid"].to_pylist()})
    env.table = next(name for name, d in env.log.datasets().items() if d.get("short_name") == "dims")
    with driver(config) as d, LineageClient(config) as client:
        env.client = client
        with d.session(database=config.graph_database) as session:
            env.ask = lambda name, **params: [r.data() for r in session.run(QUESTIONS[name], params)]
            yield env


QUESTIONS = guide()


def test_the_guide_asks_at_least_eight_questions_and_the_stream_has_captured_and_gap_batches(env):
    assert len(QUESTIONS) >= 8 and set(QUESTIONS) == set(ASKED)
    statuses = {b: env.entries[b].get("status") for b in env.batches}
    assert list(statuses.values()) == ["full", "full", "log-only"], statuses
    assert {b for b in env.rows.values()} == {0, 1}  # the log-only batch matched no table row


def outputs(answer) -> set[int]:
    return {x.rid for x in answer.records if x.kind == "output"}


def test_sink_rows_from_offsets(env):
    for partition, first, end in ((0, 10, 50), (1, 0, 80), (0, 75, 200)):
        got = env.ask("sink_rows_from_offsets", topic=env.topic, partition=partition, first=first, end=end)
        expected = set()
        for p, offset in env.coordinates:
            if p == partition and first <= offset < end:
                expected |= outputs(env.client.forward(f"kafka:{env.topic}:{p}:{offset}", to="output"))
        assert expected and [r["rid"] for r in got] == sorted(expected)
        assert all(r["query"] == env.name and r["batch"] == env.rows[r["rid"]] for r in got)


def test_batches_that_read_a_record(env):
    for partition, offset in env.coordinates[::17] + env.coordinates[-3:]:
        got = env.ask("batches_that_read_a_record", topic=env.topic, partition=partition, offset=offset)
        spans = {b: offset_ranges(env.entries[b]["sources"]).get((env.topic, partition), (0, 0))
                 for b in env.batches}
        expected = [{"query": env.name, "batch": b, "status": env.entries[b]["status"]} for b in env.batches
                    if spans[b][0] <= offset < spans[b][1]]
        assert len(expected) == 1 and got == expected


def test_batches_that_used_a_table_row(env):
    for key in ("0", "3", "9"):
        got = env.ask("batches_that_used_a_table_row", table=env.table, key=key)
        answer = env.client.forward(f"table:dims@{env.workdir.name}/dims.parquet:{key}", to="output")
        expected = sorted({b for x in answer.records for b in x.batches})
        assert expected and [(r["query"], r["batch"]) for r in got] == [(env.name, b) for b in expected]
        assert [r["version"] for r in got] == [env.entries[b]["tables"][env.table.removeprefix("table:")]
                                               for b in expected]


def test_outputs_in_a_time_window(env):
    times = sorted(env.entries[b]["at"] for b in env.batches)
    for since, until in ((times[0], times[1]), (times[1], "9999"), ("0000", "9999"), (times[2], "9999")):
        got = env.ask("outputs_in_a_time_window", query=env.name, since=since, until=until)
        ran = {b for b in env.batches if since <= env.entries[b]["at"] < until}
        expected = sorted(rid for rid, b in env.rows.items() if b in ran)
        assert [r["rid"] for r in got] == expected
        assert {r["batch"] for r in got} == ran - {2}


def test_outputs_through_a_black_box(env):
    got = [r["rid"] for r in env.ask("outputs_through_a_black_box", query=env.name)]
    expected = sorted(rid for rid in env.rows if not all(x.exact for x in env.client.backward(rid).records))
    assert got == expected and 0 < len(got) < len(env.rows)  # the box's branch, not the other


def test_gaps(env):
    got = env.ask("gaps", query=env.name)
    statuses = env.log.statuses([(env.name, b) for b in env.batches])
    expected = [{"batch": b, "status": s} for (_, b), s in sorted(statuses.items()) if s != "full"]
    assert got == expected == [{"batch": 2, "status": "log-only"}]


def test_backward_to_sources(env):
    for rid in sorted(env.rows)[::7]:
        got = env.ask("backward_to_sources", rid=rid)
        expected = sorted(((x.rid, x.topic, x.partition, x.offset, x.key, x.exact)
                           for x in env.client.backward(rid, to="source").records), key=lambda t: t[0])
        assert [(r["rid"], r["topic"], r["partition"], r["offset"], r["key"], r["exact"]) for r in got] == expected
        assert all(r["dataset"] in (f"kafka:{env.topic}", env.table) for r in got)


def test_forward_to_outputs(env):
    for partition, offset in env.coordinates[::9]:
        got = env.ask("forward_to_outputs", topic=env.topic, partition=partition, offset=offset)
        expected = outputs(env.client.forward(f"kafka:{env.topic}:{partition}:{offset}", to="output"))
        assert [r["rid"] for r in got] == sorted(expected)


def test_slow_batches(env):
    took = {b: env.entries[b]["durations_ms"]["triggerExecution"] for b in env.batches}
    for ms in sorted(took.values()):
        got = env.ask("slow_batches", query=env.name, ms=ms - 1)
        assert [(r["batch"], r["ms"], r["add_batch_ms"], r["status"]) for r in got] == [
            (b, t, env.entries[b]["durations_ms"]["addBatch"], env.entries[b]["status"])
            for b, t in sorted(took.items()) if t > ms - 1]


def test_offsets_a_batch_read(env):
    for batch in env.batches:
        got = env.ask("offsets_a_batch_read", query=env.name, batch=batch)
        expected = [{"topic": t, "partition": p, "start_offset": s, "end_offset": e}
                    for (t, p), (s, e) in sorted(offset_ranges(env.entries[batch]["sources"]).items())]
        assert expected and got == expected


ASKED = {"sink_rows_from_offsets", "batches_that_read_a_record", "batches_that_used_a_table_row",
         "outputs_in_a_time_window", "outputs_through_a_black_box", "gaps", "backward_to_sources",
         "forward_to_outputs", "slow_batches", "offsets_a_batch_read"}
