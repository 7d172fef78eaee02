"""Stream–stream joins with watermarks: lineage across micro-batches, late data dropped.

Impressions and clicks arrive in rounds (each round one or more micro-batches), with
event times that advance the watermark, clicks that match impressions from earlier
rounds, and late events past the watermark. Every output row names the impression
and click ids it joined, so its true lineage is known from its content: exactly the
Kafka records holding those ids. Outputs must equal the same rounds run untraced.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter

import pytest
from pyspark.sql import functions as F

from headwater.adapters.kafka import ensure_topics
from headwater.adapters.spark_lines import last_progress
from headwater.capture import attach
from headwater.core.offsets import partition_offsets, reached
from headwater.core.rid import kafka_rid
from headwater.demo import orders as demo_data
from headwater.query.api import LineageClient
from tests.conftest import index, own_topics, while_initializing
from tests.oracle import as_input

pytestmark = pytest.mark.every_line  # runs on every supported Spark line (./dev test)

T0 = dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc)


def at(seconds: int) -> str:
    return (T0 + dt.timedelta(seconds=seconds)).isoformat()


def rounds() -> list[tuple[list[dict], list[dict]]]:
    """(impressions, clicks) per round. Ads 0-9 per round; clicks 0-30 s after their impression."""
    out = []
    for r in range(4):
        base = r * 100
        impressions = [{"iid": base + i, "ad": base + i, "t": at(base + i)} for i in range(10)]
        clicks = [{"cid": 1000 + base + i, "ad": base + i, "t": at(base + i + 5 * (i % 3))} for i in range(0, 10, 2)]
        if r:
            # A click for an impression of the previous round, within 30 s of it and in time.
            clicks.append({"cid": 5000 + r, "ad": base - 95, "t": at(base - 95 + 20)})
            # Late: event times far behind the watermark (max event time - 20 s). Spark may
            # still join two late rows of one batch; lineage must be right either way.
            impressions.append({"iid": 9000 + r, "ad": 9000 + r, "t": at(0)})
            clicks.append({"cid": 9500 + r, "ad": 9000 + r, "t": at(1)})
        out.append((impressions, clicks))
    return out


def build(spark, bootstrap: str, impressions_topic: str, clicks_topic: str, how: str):
    def read(topic, schema, time_column):
        raw = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
               .option("startingOffsets", "earliest")
               .option("subscribe", topic).load())
        parsed = raw.select(F.from_json(F.col("value").cast("string"), schema).alias("e")).select("e.*")
        return parsed.withColumn(time_column, F.col("t").cast("timestamp")).drop("t") \
            .withWatermark(time_column, "20 seconds")

    imps = read(impressions_topic, "iid long, ad long, t string", "it").withColumnRenamed("ad", "iad")
    clicks = read(clicks_topic, "cid long, ad long, t string", "ct")
    condition = (F.col("iad") == F.col("ad")) & (F.col("ct") >= F.col("it")) & \
        (F.col("ct") <= F.col("it") + F.expr("INTERVAL 30 SECONDS"))
    return imps.join(clicks, condition, how).select("iid", "cid", "iad", "it", "ct")


class Run:
    """One join query over topics of its own (``imp-TAG``, ``clk-TAG``) into a Parquet sink, traced where a
    tracer is given; the Kafka coordinates of every event produced into them, and how far they reach."""

    def __init__(self, spark, config, workdir, tag: str, how: str, tracer=None):
        self.config, self.sink = config, str(workdir / f"sink-{tag}")
        self.topics = {"iid": f"imp-{tag}", "cid": f"clk-{tag}"}
        ensure_topics(config.bootstrap, list(self.topics.values()), 1)
        df = build(spark, config.bootstrap, self.topics["iid"], self.topics["cid"], how)
        writer = (tracer.trace(df, name=f"ssj-{tag}") if tracer else df).writeStream.format("parquet")
        self.query = (writer.option("checkpointLocation", str(workdir / f"cp-{tag}"))
                      .trigger(processingTime="200 milliseconds").start(self.sink))
        self.coordinates: dict = {}
        self.ends = {(topic, 0): 0 for topic in self.topics.values()}

    def produce(self, impressions: list[dict], clicks: list[dict]) -> None:
        for id_field, events in (("iid", impressions), ("cid", clicks)):
            topic = self.topics[id_field]
            placed = demo_data.produce(self.config.bootstrap, topic, [(None, json.dumps(e).encode()) for e in events])
            for event, (p, o) in zip(events, placed):
                self.coordinates[(id_field, event[id_field])] = ("kafka", topic, p, o)
                self.ends[topic, p] = max(self.ends[topic, p], o + 1)


def run_until_both(query, ends: dict) -> None:
    """Wait until both sources have read up to ``ends`` and a no-data batch has run."""
    import time

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        progress = last_progress(query)
        if progress is not None:
            read = {}
            for source in progress.sources:
                read.update(partition_offsets(source.endOffset))
            if reached(read, ends) and not progress.numInputRows and not query.status["isTriggerActive"]:
                return
        if query.exception():
            raise RuntimeError(query.exception())
        time.sleep(0.2)
    raise TimeoutError(f"stream did not reach {ends}")


HOWS = ["inner", "left_outer", "full_outer"]


@pytest.fixture(scope="module")
def joined(spark, stack_config, tmp_path_factory):
    """Each join traced and untraced, the six streams running at once through the rounds (each round produced
    into every stream's topics, then waited for in each: a stream sees the rounds as it would alone, and the
    suite saves minutes), then indexed once. ``(config, {how: (traced rows, untraced rows, coordinates)})``."""
    config, tag = own_topics(stack_config, "ssj")
    workdir = tmp_path_factory.mktemp("ssj")
    tracer = attach(spark, config)
    runs: dict[tuple[str, bool], Run] = {}
    try:
        for how in HOWS:
            for traced in (True, False):
                while_initializing([run.query for run in runs.values()])
                runs[how, traced] = Run(spark, config, workdir, f"{tag}-{how}{'' if traced else 'p'}", how,
                                        tracer if traced else None)
        for impressions, clicks in rounds():
            for run in runs.values():
                run.produce(impressions, clicks)
            for run in runs.values():
                run_until_both(run.query, run.ends)
    finally:
        for run in runs.values():
            run.query.stop()
        tracer.close()
    index(config)
    return config, {how: (spark.read.parquet(runs[how, True].sink).collect(),
                          spark.read.parquet(runs[how, False].sink).collect(), runs[how, True].coordinates)
                    for how in HOWS}


@pytest.mark.parametrize("how", HOWS)
def test_stream_stream_join_lineage_across_batches(joined, how):
    config, by_how = joined
    traced, plain, coordinates = by_how[how]

    def content(row):
        return (row.iid, row.cid, row.iad, row.it, row.ct)

    assert Counter(content(r) for r in traced) == Counter(content(r) for r in plain)
    ids = {(r.iid, r.cid) for r in traced}
    # Clicks of rounds 1-3 join impressions produced (and read) in the round before.
    assert {(5, 5001), (105, 5002), (205, 5003)} <= ids, "cross-batch matches are missing"
    if how != "inner":
        assert any(cid is None for _, cid in ids), "unmatched impressions are emitted with a null click"

    outputs_of: dict = {}
    with LineageClient(config) as client:
        for row in traced:
            expected = set()
            if row.iid is not None:
                expected.add(coordinates[("iid", row.iid)])
            if row.cid is not None:
                expected.add(coordinates[("cid", row.cid)])
            found = client.backward(row._hw_rid)
            assert {as_input(x) for x in found} == expected, (row.iid, row.cid)
            assert all(x.exact for x in found)
            for item in expected:
                outputs_of.setdefault(item, set()).add(row._hw_rid)
        # Forward: each impression and click reaches exactly the joined rows holding it.
        for (_, topic, partition, offset) in coordinates.values():
            answer = client.forward(kafka_rid(topic, partition, offset))
            item = ("kafka", topic, partition, offset)
            assert {x.rid for x in answer} == outputs_of.get(item, set())
            if item not in outputs_of:  # joined nothing and was not emitted alone: read, and complete
                assert answer.complete and len(answer.read_by) == 1 and answer.read_by[0].status == "full"
