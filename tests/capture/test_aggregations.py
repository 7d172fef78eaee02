"""Aggregations and deduplication: lineage of rows emitted across micro-batches.

Events arrive in rounds, a round a micro-batch (``maxOffsetsPerTrigger``), traced and untraced alike over
one topic, so both see the same micro-batches: two rounds are produced, then read by one ``availableNow`` run
of the checkpointed query, then two more by a second run, which resumes from the checkpoint (the state, the
watermark, and capture's state nodes). Every output row also collects the ids of the events Spark aggregated
into it, and the oracle checks those against a plain-Python recomputation (count, sum, min, max, the events of
the group read so far) and then demands that the captured lineage be exactly the Kafka records of those ids.
Late events, far behind the watermark, must appear in no output and no lineage where the state is keyed by
event time (windows, a dedup key holding the timestamp); a group keyed without event time takes them like any
other.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from pyspark.sql import functions as F

from headwater.adapters.kafka import ensure_topics
from headwater.capture import attach
from headwater.core.rid import kafka_rid
from headwater.demo import orders as demo_data
from headwater.query.api import LineageClient
from tests.capture.test_stream_joins import at
from tests.conftest import index, own_topics, while_initializing
from tests.oracle import as_input

pytestmark = pytest.mark.every_line  # runs on every supported Spark line (./dev test)

ROUNDS = 4
ROUNDS_A_RUN = 2  # rounds produced, then read by one availableNow run: the second run resumes from the checkpoint
ROUND_SIZE = 14  # events a round, and a batch (maxOffsetsPerTrigger)
LATE_IDS = (900, 901)


def rounds() -> list[list[dict]]:
    out = []
    for r in range(ROUNDS):
        last = r == ROUNDS - 1
        events = [{"id": r * 100 + i, "k": i % 4, "v": (i * 7 + r) % 23 - 5, "t": at(r * 40 + i * 2)}
                  for i in range(ROUND_SIZE - (len(LATE_IDS) if last else 0))]
        if last:
            # Each batch runs with the watermark of the batches before it (one round behind), across a
            # restart too: by the last round it is past 50 s, so t=1 s is late.
            events += [{"id": LATE_IDS[0], "k": 0, "v": 1000, "t": at(1)},
                       {"id": LATE_IDS[1], "k": 1, "v": -1000, "t": at(3)}]
        out.append(events)
    return out


def runs_of_rounds() -> list[list[list[dict]]]:
    """The rounds, as each ``availableNow`` run reads them: ``ROUNDS_A_RUN`` rounds a run."""
    every = rounds()
    return [every[at:at + ROUNDS_A_RUN] for at in range(0, ROUNDS, ROUNDS_A_RUN)]


def events_frame(spark, bootstrap, topic):
    raw = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
           .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", ROUND_SIZE)
           .option("subscribe", topic).load())
    parsed = raw.select(F.from_json(F.col("value").cast("string"), "id long, k int, v int, t string").alias("e"))
    return parsed.select("e.*").withColumn("ts", F.col("t").cast("timestamp")).drop("t") \
        .withWatermark("ts", "10 seconds")


def ids_and_stats(df):
    return df.agg(F.sort_array(F.collect_list("id")).alias("ids"), F.count("*").alias("n"),
                  F.sum("v").alias("total"), F.min("v").alias("low"), F.max("v").alias("high"),
                  F.avg("v").alias("mean"))


# Queries whose state is keyed by event time, so Spark drops the late events; a group
# keyed without event time takes them like any other. Lineage must be exact either way.
DROPS_LATE = {"tumbling_append", "sliding_update", "dedup_watermark", "union_tumbling", "dedup_within_watermark"}


def distinct_keys(df):
    """``SELECT DISTINCT k FROM events``: Spark's Distinct, which it runs as an aggregate of every column."""
    view = f"events_{id(df)}"
    df.createOrReplaceTempView(view)
    return df.sparkSession.sql(f"SELECT DISTINCT k FROM {view}")


def subtract_static(df):
    """``subtract`` (EXCEPT DISTINCT) of a static table: the distinct (k, v) pairs not in it."""
    static = df.sparkSession.createDataFrame([(k, v) for k in range(4) for v in range(0, 18, 3)], "k int, v int")
    return df.select("k", "v").subtract(static)

QUERIES = {
    # name: (build, output mode)
    "keyed_update": (lambda df: ids_and_stats(df.groupBy("k")), "update"),
    "global_complete": (lambda df: ids_and_stats(df.groupBy()), "complete"),
    "tumbling_append": (lambda df: ids_and_stats(df.groupBy(F.window("ts", "20 seconds").alias("w"), "k")), "append"),
    "sliding_update": (lambda df: ids_and_stats(df.groupBy(F.window("ts", "20 seconds", "10 seconds").alias("w"))),
                       "update"),
    "filter_then_aggregate": (lambda df: ids_and_stats(df.where("v > 0").groupBy("k")), "update"),
    "dedup_watermark": (lambda df: df.dropDuplicates(["k", "ts"]).select("id", "k", "v"), "append"),
    # A chain: both branches of a union into one window; rows in both count twice.
    "union_tumbling": (lambda df: ids_and_stats(df.where("v > 0").union(df.where("v < 3"))
                                                .groupBy(F.window("ts", "20 seconds").alias("w"))), "append"),
    "dedup_no_watermark": (lambda df: df.dropDuplicates(["k"]).select("id", "k", "v"), "append"),
    # Spark's windowed word count shape: a sorted aggregate in complete mode.
    "tumbling_complete_sorted": (lambda df: ids_and_stats(df.groupBy(F.window("ts", "20 seconds").alias("w"), "k"))
                                 .orderBy("w", "k"), "complete"),
    "limit_append": (lambda df: df.select("id", "k", "v").limit(30), "append"),  # a limit over the whole stream
    "dedup_within_watermark": (lambda df: df.dropDuplicatesWithinWatermark(["k"]).select("id", "k", "v"), "append"),
    "distinct_update": (distinct_keys, "update"),
    "subtract_update": (subtract_static, "update"),
}
# Queries whose rows name no event: each row is a group, of every event of its key read up to its batch.
KEYED_BY = {"distinct_update": ("k",), "subtract_update": ("k", "v")}


def sink_of(workdir, topic: str, traced: bool = True) -> str:
    """The sink of the query over ``topic``, traced or not, in ``workdir``."""
    return str(workdir / f"sink-{topic}{'' if traced else '-untraced'}")


def start(spark, config, workdir, name: str, topic: str, tracer=None):
    """One ``availableNow`` run of query ``name`` over ``topic`` (a batch a round produced since the last run),
    traced by ``tracer`` (named as the topic) or not, into its sink (``sink_of``) from its checkpoint beside it."""
    build, mode = QUERIES[name]
    sink = sink_of(workdir, topic, tracer is not None)
    checkpoint = f"{sink}-checkpoint"
    df = build(events_frame(spark, config.bootstrap, topic))
    if tracer is not None:
        writer = tracer.trace(df, name=topic).writeStream.format("parquet").option("path", sink)
    else:
        writer = df.writeStream.foreachBatch(
            lambda batch, batch_id: batch.withColumn("_batch", F.lit(batch_id)).write.mode("append").parquet(sink))
    return writer.outputMode(mode).option("checkpointLocation", checkpoint).trigger(availableNow=True).start()


def produce(config, topic: str, events: list[dict], coordinates: dict) -> None:
    """``events`` into ``topic``; each one's Kafka coordinates into ``coordinates`` by id."""
    placed = demo_data.produce(config.bootstrap, topic, [(None, json.dumps(e).encode()) for e in events])
    coordinates.update({e["id"]: ("kafka", topic, p, o) for e, (p, o) in zip(events, placed)})


def run(spark, config, workdir, name: str, topic: str, tracer=None) -> dict:
    """All rounds through query ``name`` alone (``start``), ``ROUNDS_A_RUN`` produced into ``topic`` then read by
    one ``availableNow`` run, a batch each; id → Kafka coordinates."""
    ensure_topics(config.bootstrap, [topic], 1)
    coordinates = {}
    for run_rounds in runs_of_rounds():
        for events in run_rounds:
            produce(config, topic, events, coordinates)
        query = start(spark, config, workdir, name, topic, tracer)
        query.awaitTermination(120)
        assert query.exception() is None, query.exception()
    return coordinates


@pytest.fixture(scope="module")
def aggregated(spark, stack_config, tmp_path_factory):
    """Every query traced and untraced through all rounds: ``ROUNDS_A_RUN`` rounds produced into each query's
    topic, then read by one ``availableNow`` run of all of them at once (their batches interleave, which saves
    the suite minutes), a batch a round, then the next rounds the same way; then indexed once.
    ``(config, {name: (traced rows, untraced rows, id → Kafka coordinates)})``."""
    config, tag = own_topics(stack_config, "agg")
    workdir = tmp_path_factory.mktemp("agg")
    topics = {name: f"agg-{tag}-{name}" for name in QUERIES}
    ensure_topics(config.bootstrap, list(topics.values()), 1)
    coordinates: dict = {name: {} for name in QUERIES}
    tracer = attach(spark, config)
    runs = []
    try:
        for run_rounds in runs_of_rounds():
            runs.clear()
            for name, topic in topics.items():
                for events in run_rounds:
                    produce(config, topic, events, coordinates[name])
                for by in (tracer, None):
                    while_initializing(runs)
                    runs.append(start(spark, config, workdir, name, topic, by))
            for query in runs:
                query.awaitTermination(120)
                assert query.exception() is None, query.exception()
    finally:
        for query in runs:
            if query.isActive:
                query.stop()
        tracer.close()
    index(config)
    return config, {name: (spark.read.parquet(sink_of(workdir, topic)).collect(),
                           spark.read.parquet(sink_of(workdir, topic, traced=False)).collect(),
                           coordinates[name]) for name, topic in topics.items()}


def check_against_events(name: str, rows) -> None:
    """Each emitted group holds only events of its group, and its figures are theirs."""
    if name in KEYED_BY:  # its rows name no events: ``groups_read``
        return
    events = {e["id"]: e for r in rounds() for e in r}
    for row in rows:
        ids = row["ids"] if "ids" in row else [row["id"]]
        members = [events[i] for i in ids]
        if name in DROPS_LATE:
            assert not set(ids) & set(LATE_IDS), f"late events were aggregated: {ids}"
        if "k" in row and row["k"] is not None:
            assert all(m["k"] == row["k"] for m in members)
        if "ids" in row:
            values = [m["v"] for m in members]
            assert (row["n"], row["total"], row["low"], row["high"]) \
                == (len(ids), sum(values), min(values), max(values))
    if name in ("keyed_update", "global_complete"):
        last = {}
        for row in rows:
            key = row["k"] if "k" in row else None
            if len(row["ids"]) > len(last.get(key, [])):
                last[key] = row["ids"]
        every = [e for r in rounds() for e in r]
        for key, ids in last.items():
            assert sorted(ids) == sorted(e["id"] for e in every if key is None or e["k"] == key)


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_aggregate_lineage_equals_the_oracle(aggregated, name):
    config, runs = aggregated
    traced, plain, coordinates = runs[name]

    def content(row):
        values = row.asDict(recursive=True)
        return json.dumps({k: v for k, v in values.items() if k not in ("_hw_rid", "_batch")}, sort_keys=True,
                          default=str)

    assert traced, "the query emitted nothing"
    assert Counter(content(r) for r in traced) == Counter(content(r) for r in plain)
    rows = [r.asDict(recursive=True) for r in traced]
    check_against_events(name, rows)

    with LineageClient(config) as client:
        outputs_of = (groups_read if name in KEYED_BY else events_read)(client, name, rows, coordinates)
        # Forward: each event reaches exactly the emitted rows that aggregated it. One in no emitted row
        # (late, deduplicated away, filtered out, or in a window not closed yet) was read by a fully
        # captured batch of the query: an empty answer, complete, naming it.
        for event_id, (_, topic, partition, offset) in coordinates.items():
            answer = client.forward(kafka_rid(topic, partition, offset))
            assert {x.rid for x in answer} == outputs_of.get(event_id, set()), event_id
            if event_id not in outputs_of:
                assert answer.complete and [(g.query, g.status) for g in answer.read_by] == [(topic, "full")]


def events_read(client, name: str, rows: list[dict], coordinates: dict) -> dict:
    """Check each row's lineage: exactly the events it names (``ids``, or its own ``id``); returns event id →
    rows that hold it."""
    outputs_of: dict = {}
    for row in rows:
        ids = row["ids"] if "ids" in row else [row["id"]]
        found = client.backward(row["_hw_rid"])
        assert {as_input(x) for x in found} == {coordinates[i] for i in ids}, ids
        assert all(x.exact for x in found)
        for i in ids:
            outputs_of.setdefault(i, set()).add(row["_hw_rid"])
    return outputs_of


def groups_read(client, name: str, rows: list[dict], coordinates: dict) -> dict:
    """Check the rows of a query that names no event (``KEYED_BY``): each is a group, emitted in each batch
    that updated it, whose lineage is every event of its key read up to that batch. Each round is one
    batch, so a key's rows must have, between them, exactly the lineages of its events of round 0..r, one
    for each round r that holds an event of the key the query keeps; returns event id → rows that hold it."""
    keep = {"distinct_update": lambda e: True,
            "subtract_update": lambda e: not (0 <= e["k"] < 4 and e["v"] in range(0, 18, 3))}[name]
    columns = KEYED_BY[name]
    expected: dict = {}
    read_so_far: dict = {}
    for events in rounds():
        updated = set()
        for e in events:
            if keep(e):
                key = tuple(e[c] for c in columns)
                read_so_far.setdefault(key, set()).add(e["id"])
                updated.add(key)
        for key in updated:
            expected.setdefault(key, []).append(frozenset(read_so_far[key]))
    got: dict = {}
    outputs_of: dict = {}
    id_of = {place: i for i, place in coordinates.items()}
    for row in rows:
        found = client.backward(row["_hw_rid"])
        assert all(x.exact for x in found)
        ids = frozenset(id_of[as_input(x)] for x in found)
        got.setdefault(tuple(row[c] for c in columns), []).append(ids)
        for i in ids:
            outputs_of.setdefault(i, set()).add(row["_hw_rid"])
    assert {k: sorted(v, key=len) for k, v in got.items()} == {k: sorted(v, key=len) for k, v in expected.items()}
    return outputs_of
