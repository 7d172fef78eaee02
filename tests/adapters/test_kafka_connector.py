"""Spark's own Kafka connector, the traced source, with each of its options a stream reads by: lineage to
the Kafka record (topic, partition, offset) of every sink row, against the oracle of what was produced
where.

``subscribe`` is every other test's; here ``subscribePattern``, ``assign``, ``startingOffsets`` by
partition, ``minPartitions`` (one Kafka partition read by several tasks), ``includeHeaders``, and a
topic deleted and made again under a running query with ``failOnDataLoss`` false. ``endingOffsets`` is
for batch reads only: a traced stream given it fails as the untraced one does, with Spark's error.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest
from pyspark.sql import functions as F

from headwater.adapters.kafka import admin, ensure_topics
from headwater.adapters.spark_lines import last_progress
from headwater.capture import attach
from headwater.core.offsets import partition_offsets, reached
from headwater.demo import orders as demo_data
from headwater.query.api import LineageClient
from tests.conftest import index, records_read, stop_when_idle
from tests.oracle import as_input

pytestmark = [pytest.mark.spark, pytest.mark.stack]

PER_TOPIC = 40


@pytest.fixture(scope="module")
def env(spark, stack_config, tmp_path_factory):
    """Two topics of events (``a`` with two partitions, ``b`` with one), produced before any query starts;
    ``placed[id]``: where each event landed."""
    from tests.conftest import own_topics

    config, tag = own_topics(stack_config, "conn")
    topics = {"a": f"conn{tag}.ev.a", "b": f"conn{tag}.ev.b"}  # the pattern's; not the edges topic
    ensure_topics(config, [topics["a"]], 2)
    ensure_topics(config, [topics["b"]], 1)
    placed = {}
    for n, (name, topic) in enumerate(topics.items()):
        events = [(str(i).encode(), json.dumps({"id": n * 1000 + i}).encode()) for i in range(PER_TOPIC)]
        for (_, value), (p, o) in zip(events, demo_data.produce(config, topic, events)):
            placed[json.loads(value)["id"]] = (topic, p, o)
    tracer = attach(spark, config)
    try:
        yield type("Env", (), dict(config=config, tag=tag, topics=topics, placed=placed, tracer=tracer,
                                   workdir=tmp_path_factory.mktemp("connector")))
    finally:
        tracer.close()


def source(spark, env, **options):
    reader = spark.readStream.format("kafka").option("kafka.bootstrap.servers", env.config.bootstrap)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def parsed(df):
    return df.select(F.from_json(F.col("value").cast("string"), "id long").alias("e"), "topic").select("e.id", "topic")


def run(env, df, name: str, until) -> tuple:
    """Trace ``df`` to Parquet until ``until(query)``; its sink rows."""
    sink = str(env.workdir / f"sink-{name}")
    query = (env.tracer.trace(df, name=f"{name}-{env.tag}").writeStream.format("parquet")
             .option("checkpointLocation", str(env.workdir / f"cp-{name}"))
             .trigger(processingTime="300 milliseconds").start(sink))
    deadline = time.monotonic() + 180
    while not until(query):
        assert query.exception() is None, query.exception()
        assert time.monotonic() < deadline, f"{name}: the stream did not read what it should"
        time.sleep(0.2)
    stop_when_idle(query)
    return query, df.sparkSession.read.parquet(sink).collect()


def read_to(env, *topics: str):
    """Whether a query has read each of ``topics`` to its end (every source's end offsets together)."""
    ends: dict = {}
    for topic, p, o in env.placed.values():
        if topic in topics:
            ends[topic, p] = max(ends.get((topic, p), 0), o + 1)

    def done(query) -> bool:
        progress = last_progress(query)
        read = {}
        for s in (progress.sources if progress is not None else []):
            read.update(partition_offsets(s.endOffset))
        return reached(read, ends)

    return done


def assert_exact(env, rows, want_ids) -> None:
    assert sorted(r.id for r in rows) == sorted(want_ids)
    index(env.config)
    with LineageClient(env.config) as client:
        for row in rows:
            found = client.backward(row._hw_rid)
            assert {as_input(x) for x in found} == {("kafka", *env.placed[row.id])}, row.id
            assert all(x.exact for x in found)


def ids_of(env, topic: str, partitions=None, from_offset=None) -> list[int]:
    return [i for i, (t, p, o) in env.placed.items() if t == topic and (partitions is None or p in partitions)
            and (from_offset is None or o >= from_offset.get(p, 0))]


def test_subscribe_pattern_reads_every_matching_topic(spark, env):
    df = parsed(source(spark, env, subscribePattern=f"conn{env.tag}\\.ev\\..*", startingOffsets="earliest"))
    _, rows = run(env, df, "pattern", read_to(env, *env.topics.values()))
    assert_exact(env, rows, list(env.placed))


def test_assign_reads_only_the_partitions_given(spark, env):
    a = env.topics["a"]
    df = parsed(source(spark, env, assign=json.dumps({a: [1]}), startingOffsets="earliest"))
    want = ids_of(env, a, partitions={1})
    _, rows = run(env, df, "assign", lambda q: len(records_read(q)) >= len(want))
    assert_exact(env, rows, want)


def test_starting_offsets_by_partition(spark, env):
    a = env.topics["a"]
    df = parsed(source(spark, env, subscribe=a, startingOffsets=json.dumps({a: {"0": 5, "1": -2}})))
    want = ids_of(env, a, from_offset={0: 5})
    _, rows = run(env, df, "starting", read_to(env, a))
    assert_exact(env, rows, want)


def test_min_partitions_splits_a_kafka_partition_over_several_tasks(spark, env):
    b = env.topics["b"]  # one Kafka partition, read by four tasks
    df = parsed(source(spark, env, subscribe=b, startingOffsets="earliest", minPartitions="4",
                       maxOffsetsPerTrigger="20"))
    want = ids_of(env, b)
    _, rows = run(env, df, "minparts", read_to(env, b))
    assert_exact(env, rows, want)


def test_include_headers_keeps_the_headers_and_the_lineage(spark, env):
    from headwater.adapters.kafka import producer

    topic = f"conn{env.tag}.headers"
    ensure_topics(env.config, [topic], 1)
    client = producer(env.config)
    try:
        sent = [client.send(topic, value=json.dumps({"id": 7000 + i}).encode(), headers=[("n", str(i).encode())])
                for i in range(15)]
        client.flush(timeout=60)
        env.placed.update({7000 + i: (topic, m.partition, m.offset) for i, m in enumerate(f.get(10) for f in sent)})
    finally:
        client.close()
    df = source(spark, env, subscribe=topic, startingOffsets="earliest", includeHeaders="true")
    df = df.select(F.from_json(F.col("value").cast("string"), "id long").alias("e"), "headers") \
        .select("e.id", F.col("headers")[0]["value"].cast("string").alias("n"))
    _, rows = run(env, df, "headers", read_to(env, topic))
    assert all(r.n == str(r.id - 7000) for r in rows)  # each record's own header
    assert_exact(env, rows, ids_of(env, topic))


def test_ending_offsets_fail_a_traced_stream_as_an_untraced_one(spark, env, tmp_path):
    def start(df, traced: bool):
        writer = (env.tracer.trace(df, name=f"ending-{uuid.uuid4().hex[:6]}") if traced else df).writeStream
        return writer.format("parquet").option("checkpointLocation", str(tmp_path / f"cp-{traced}")) \
            .start(str(tmp_path / f"sink-{traced}"))

    errors = []
    for traced in (False, True):
        with pytest.raises(Exception) as raised:
            df = parsed(source(spark, env, subscribe=env.topics["a"], endingOffsets="latest"))
            start(df, traced).awaitTermination(60)
        errors.append(str(raised.value).splitlines()[0])
    assert "ending" in errors[0].lower() and errors[1] == errors[0]


def test_a_topic_deleted_and_made_again_under_a_running_query(spark, env):
    """``failOnDataLoss`` false: the query goes on reading the topic made again (its offsets start at 0
    again, so its records have the coordinates, and the rids, of the records deleted); every sink row's
    lineage is the record that made it."""
    topic = f"conn{env.tag}.again"
    ensure_topics(env.config, [topic], 1)
    first = [(None, json.dumps({"id": 5000 + i}).encode()) for i in range(10)]
    placed = dict(zip(range(5000, 5010), ((topic, p, o) for p, o in demo_data.produce(env.config, topic, first))))
    df = parsed(source(spark, env, subscribe=topic, startingOffsets="earliest", failOnDataLoss="false"))
    sink = str(env.workdir / "sink-again")
    query = (env.tracer.trace(df, name=f"again-{env.tag}").writeStream.format("parquet")
             .option("checkpointLocation", str(env.workdir / "cp-again"))
             .trigger(processingTime="300 milliseconds").start(sink))
    try:
        deadline = time.monotonic() + 120
        while len(records_read(query)) < 10:
            assert query.exception() is None and time.monotonic() < deadline, query.exception()
            time.sleep(0.2)
        client = admin(env.config)
        try:
            client.delete_topics([topic])
        finally:
            client.close()
        deadline = time.monotonic() + 60
        while True:  # deleting is asynchronous: made again once the broker has let it go
            try:
                ensure_topics(env.config, [topic], 1)
                break
            except Exception:
                assert time.monotonic() < deadline, "the topic was not deleted in time"
                time.sleep(0.5)
        again = [(None, json.dumps({"id": 6000 + i}).encode()) for i in range(25)]
        placed.update(zip(range(6000, 6025), ((topic, p, o) for p, o in demo_data.produce(env.config, topic, again))))
        deadline = time.monotonic() + 120
        while not any(r.id >= 6000 for r in _rows(spark, sink)) or \
                max(o for (t, p, o) in records_read(query)) < 24:
            assert query.exception() is None, query.exception()
            assert time.monotonic() < deadline, "the query did not read the topic made again"
            time.sleep(0.3)
    finally:
        stop_when_idle(query)
    rows = _rows(spark, sink)
    assert {r.id for r in rows} >= set(range(5000, 5010))
    assert any(r.id >= 6000 for r in rows)
    env.placed.update(placed)
    assert_exact(env, rows, [r.id for r in rows])


def _rows(spark, sink: str) -> list:
    try:
        return spark.read.parquet(sink).collect()
    except Exception:  # no file yet
        return []
