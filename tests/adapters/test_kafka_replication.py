"""A traced stream over a three-broker Apache Kafka cluster, each broker on a host of its own (``kafka_cluster``:
network namespaces of the test's own), when brokers fail.

The topics (the source's and headwater's) are replicated three times with ``min.insync.replicas=2``;
headwater's producer waits for every in-sync replica (``acks=all``) and is idempotent. While the stream
runs, one broker is killed (SIGKILL) and stays down; then a second is cut off the network, which leaves one
broker of three: no quorum of controllers and too few in-sync replicas for any write, so capture spills (the
breaker opens) as designed; the cut ends once capture has spilled for 5 s (30 s at most). The source topic's
partitions are led by the broker that stays (their replicas listed in that order), so the stream reads on
through the cut and capture has batches to send, and spill, all along: led by the cut broker, the source would
wait, capture would send nothing, and the spill would go untested (CI, 2026-12-02: "capture never spilled").
Both brokers come back; the stream reads to the end. Afterwards the graph and the Parquet store hold exactly
the edges an untraced oracle computes (each output row from its Kafka record): none lost, none twice.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import pytest
from kafka.admin import NewTopic
from pyspark.sql import functions as F

from headwater.adapters.kafka import admin, ensure_topics, producer
from headwater.adapters.spark_lines import recent_progress
from headwater.capture import attach
from headwater.capture.delivery import Breaker
from headwater.core.rid import kafka_rid
from headwater.demo import orders as demo_data
from headwater.demo.run import end_offsets, run_until
from tests.conftest import graph_edge_counts, index, own_topics, stored_edges, wait_batches
from tests.kafka_cluster import Cluster

EVENTS = 2400
PER_BATCH = 40  # records a batch: the stream is still running when the faults come and go
KILLED, CUT = 2, 3  # the nodes the faults take
SURVIVOR = 1  # the node left, which leads the source topic's partitions
CUT_S = 30.0  # the longest the second broker stays cut off
SPILLING_S = 5.0  # the cut ends this long after capture's breaker opened: batches spilled meanwhile
SEND_TIMEOUT_S = 5.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = Cluster(tmp_path_factory.mktemp("kafka-cluster"))
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.down()


def replicas(config, topics: list[str]) -> dict[str, list[int]]:
    """Each topic's replica count, partition by partition."""
    client = admin(config)
    try:
        return {t["name"]: [len(p["replica_nodes"]) for p in t["partitions"]] for t in client.describe_topics(topics)}
    finally:
        client.close()


def led_by_survivor(config, topic: str) -> None:
    """The source topic, two partitions of three replicas each, the survivor first (their preferred leader)."""
    client = admin(config)
    try:
        client.create_topics([NewTopic(topic, replica_assignments={0: [SURVIVOR, KILLED, CUT],
                                                                   1: [SURVIVOR, CUT, KILLED]})])
    finally:
        client.close()


def leaders(config, topic: str, timeout_s: float = 30.0) -> dict[int, int]:
    """Each partition's leader, once every partition has one (a new topic's are elected within moments)."""
    deadline = time.monotonic() + timeout_s
    client = admin(config)
    try:
        while True:
            described = client.describe_topics([topic])
            led = {p["partition_index"]: p["leader_id"] for t in described for p in t["partitions"]}
            if (led and min(led.values()) >= 0) or time.monotonic() > deadline:
                return led
            time.sleep(0.5)
    finally:
        client.close()


@pytest.mark.spark
def test_a_stream_through_a_killed_and_a_cut_off_broker_keeps_every_edge_once(spark, stack_config, cluster,
                                                                               tmp_path):
    config, tag = own_topics(stack_config, "rep")
    config = config.with_overrides(bootstrap=cluster.bootstrap, topic_replication=3,
                                   spill_dir=str(tmp_path / "spill"), store_dir=str(tmp_path / "store"),
                                   send_timeout_s=SEND_TIMEOUT_S, breaker_cooldown_s=3.0)
    topic = f"rep-events-{tag}"
    led_by_survivor(config, topic)
    ensure_topics(config, [config.edges_topic, config.log_topic, config.dlq_topic], 2)
    assert leaders(config, topic) == {0: SURVIVOR, 1: SURVIVOR}
    assert replicas(config, [topic, config.edges_topic, config.log_topic]) == \
        {t: [3, 3] for t in (topic, config.edges_topic, config.log_topic)}
    client = producer(config)
    try:
        assert client.config["acks"] == -1 and client.config["enable_idempotence"] is True
    finally:
        client.close()
    events = [(str(i).encode(), json.dumps({"id": i, "v": i * 7 % 10}).encode()) for i in range(EVENTS)]
    placed = demo_data.produce(config, topic, events, partitions=2)
    where = {i: (topic, p, o) for i, (p, o) in enumerate(placed)}

    tracer = attach(spark, config)
    spill = Path(tracer.delivery_settings.spill_dir)
    name = f"rep-{tag}"
    try:
        source = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", cluster.bootstrap)
                  .option("subscribe", topic).option("startingOffsets", "earliest")
                  .option("maxOffsetsPerTrigger", PER_BATCH).load())
        parsed = source.select(F.from_json(F.col("value").cast("string"), "id long, v int").alias("e"))
        df = parsed.select("e.*").where("v % 3 != 0").withColumn("w", F.col("v") * 2)
        sink = str(tmp_path / "sink")
        query = (tracer.trace(df, name=name).writeStream.format("parquet")
                 .option("checkpointLocation", str(tmp_path / "cp")).trigger(processingTime="500 milliseconds")
                 .start(sink))
        wait_batches(query, 3)
        cluster.kill(KILLED)
        before = len([p for p in recent_progress(query) if p.numInputRows])
        wait_batches(query, before + 3)  # two brokers of three: the stream and capture go on
        cluster.cut(CUT)
        cut_at, opened_at = time.monotonic(), None
        while time.monotonic() - cut_at < CUT_S:  # one broker of three: nothing can be written
            assert query.exception() is None and query.isActive, query.exception()
            if opened_at is None and Breaker(spill, 3.0).is_open():
                opened_at = time.monotonic()
            if opened_at is not None and time.monotonic() - opened_at >= SPILLING_S:
                break
            time.sleep(0.5)
        assert opened_at is not None, "capture never spilled while one broker of three was up"
        cluster.mend(CUT)
        cluster.start(KILLED)
        run_until(query, end_offsets(topic, placed), say=print, timeout_s=600)
    finally:
        tracer.close()
    cluster.wait_replicated([topic, config.edges_topic, config.log_topic], config)
    index(config, max_seconds=300)

    # The oracle: each kept event's output row, derived from its record alone.
    rows = spark.read.parquet(sink).collect()
    kept = sorted(i for i in range(EVENTS) if i * 7 % 10 % 3 != 0)
    assert sorted(r.id for r in rows) == kept, "the sink lost or repeated a row"
    expected = Counter((kafka_rid(*where[r.id]), r._hw_rid, name) for r in rows)
    in_graph = graph_edge_counts(config, [name])
    in_store = stored_edges(config)
    assert in_graph == expected, (f"graph: {sum((expected - in_graph).values())} missing, "
                                  f"{sum((in_graph - expected).values())} extra")
    assert in_store == expected, (f"store: {sum((expected - in_store).values())} missing, "
                                  f"{sum((in_store - expected).values())} extra")
