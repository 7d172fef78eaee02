"""OpenLineage events of traced queries, as a catalog receives them: over HTTP (a receiver of the test's own, as
Marquez takes them) and through Kafka (the local broker), both from one ``openlineage.yml``; every event checked
against OpenLineage's own schemas (``headwater.deploy.openlineage_schema``), its datasets, column lineage and counts
against what the stream did."""

import json
import time

import pytest
import yaml
from pyspark.sql import functions as F

from bench.openlineage_receiver import Receiver
from headwater.capture import attach
from headwater.core.schema import LOG_BATCH
from headwater.demo import orders as data
from headwater.demo.pipeline import enriched_orders
from headwater.deploy.openlineage_schema import OpenLineageSchemas
from tests.conftest import own_topics, read_log, stop_when_idle, topic_records, wait_batches

pytestmark = pytest.mark.every_line  # runs on every supported Spark line (./dev test)

ORDERS = 1000
PER_BATCH = 400


@pytest.fixture
def openlineage_config(tmp_path, monkeypatch, stack_config):
    """``(receiver, events topic)``: an ``openlineage.yml`` of two transports, HTTP to the receiver and Kafka to
    the stack's broker, named by ``OPENLINEAGE_CONFIG`` as a user would."""
    from headwater.adapters.kafka import ensure_topics

    topic = f"openlineage-{tmp_path.name[-12:]}"
    ensure_topics(stack_config.with_overrides(topic_partitions=1), [topic])  # one partition: the events in order
    with Receiver() as receiver:
        settings = {"transport": {"type": "composite", "continue_on_failure": False, "transports": {
            "catalog": {"type": "http", "url": receiver.url},
            "kafka": {"type": "kafka", "topic": topic, "flush": True,
                      "config": {"bootstrap.servers": stack_config.bootstrap}}}}}
        path = tmp_path / "openlineage.yml"
        path.write_text(yaml.safe_dump(settings))
        monkeypatch.setenv("OPENLINEAGE_CONFIG", str(path))
        yield receiver, topic


def _of(events, run_id=None, state=None):
    return [e for e in events if (run_id is None or e["run"]["runId"] == run_id)
            and (state is None or e["eventType"] == state)]


def test_a_traced_stream_s_events_reach_a_catalog_over_http_and_kafka_and_follow_the_stream(
        spark, stack_config, tmp_path, openlineage_config):
    receiver, events_topic = openlineage_config
    config, tag = own_topics(stack_config, "ol")
    config = config.with_overrides(openlineage_interval_s=1.0, query_url="http://lineage.example:8080")
    orders = f"ol-orders-{tag}"
    from headwater.adapters.kafka import ensure_topics

    ensure_topics(config, [orders])
    customers = tmp_path / "customers.parquet"
    spark.createDataFrame(data.customers()).write.parquet(str(customers))
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
    name = f"enriched-{tag}"

    def run(df, batches: int):
        query = (tracer.trace(df, name=name, keys={"customers": "customer_id"}).writeStream.format("parquet")
                 .option("checkpointLocation", str(checkpoint)).trigger(processingTime="500 milliseconds")
                 .start(str(sink)))
        try:
            wait_batches(query, batches)
            time.sleep(1.5)  # a RUNNING event is due a second after the last one
        finally:
            stop_when_idle(query)

    tracer = attach(spark, config)
    try:
        assert tracer.events is not None  # OPENLINEAGE_CONFIG names a configuration: events are on
        data.produce(config.bootstrap, orders, data.order_events(ORDERS))
        pipeline = enriched_orders(spark, config.bootstrap, orders, str(customers), PER_BATCH)
        run(pipeline, -(-ORDERS // PER_BATCH))
        first_run = receiver.wait_for(lambda e: _of(e, state="COMPLETE"))
        sink_rows = spark.read.parquet(str(sink)).count()
        data.produce(config.bootstrap, orders, data.order_events(100, seed=8))
        run(pipeline, 1)  # the same plan from its checkpoint: the same run goes on
        receiver.wait_for(lambda e: len(_of(e, state="COMPLETE")) == 2)
        data.produce(config.bootstrap, orders, data.order_events(100, seed=9))
        run(pipeline.where(F.col("region") != "APAC"), 1)  # changed code: a new run, the old one its parent
        receiver.wait_for(lambda e: len(_of(e, state="COMPLETE")) == 3)

        @F.udf("long")
        def refuse(order_id):
            raise ValueError(f"order {order_id} refused")

        failing = tracer.trace(pipeline.select(refuse("order_id").alias("x")), name=f"failing-{tag}")
        query = failing.writeStream.format("parquet").option("checkpointLocation", str(tmp_path / "cp2")) \
            .start(str(tmp_path / "sink2"))
        with pytest.raises(Exception):
            query.awaitTermination(120)
        receiver.wait_for(lambda e: _of(e, state="FAIL"))
    finally:
        tracer.close()

    events = receiver.events()
    schemas = OpenLineageSchemas()
    for event in events:
        assert schemas.check(event) == [], event
    assert {"SchemaDatasetFacet.json", "ColumnLineageDatasetFacet.json", "JobTypeJobFacet.json",
            "ProcessingEngineRunFacet.json", "ErrorMessageRunFacet.json", "ParentRunFacet.json",
            "InputStatisticsInputDatasetFacet.json", "OutputStatisticsOutputDatasetFacet.json",
            "RowLineageRunFacet.json"} <= schemas.check_all.checked
    # Kafka got the same events, in the same order.
    through_kafka = [json.loads(record.value) for record in topic_records(config, events_topic)]
    assert [(e["run"]["runId"], e["eventType"], e["eventTime"]) for e in through_kafka] == \
        [(e["run"]["runId"], e["eventType"], e["eventTime"]) for e in events]

    # The first run: START, RUNNING while its batches ran, COMPLETE at its stop; datasets named by OpenLineage.
    run_id = first_run[0]["run"]["runId"]
    ours = _of(first_run, run_id)
    assert [e["eventType"] for e in ours][0] == "START" and [e["eventType"] for e in ours][-1] == "COMPLETE"
    assert "RUNNING" in [e["eventType"] for e in ours] and set(e["eventType"] for e in ours) == \
        {"START", "RUNNING", "COMPLETE"}
    kafka_input = (f"kafka://{config.bootstrap}", orders)
    for event in ours:
        assert event["job"] == {**event["job"], "namespace": "headwater", "name": name}
        assert event["job"]["facets"]["jobType"]["processingType"] == "STREAMING"
        assert {(d["namespace"], d["name"]) for d in event["inputs"]} == {kafka_input, ("file", str(customers))}
        assert [(d["namespace"], d["name"]) for d in event["outputs"]] == [("file", str(sink))]
    # Counts since each event: every order read once, every row written once, every batch captured in full.
    read = [d["inputFacets"]["inputStatistics"]["rowCount"] for e in ours for d in e["inputs"]
            if (d["namespace"], d["name"]) == kafka_input and d.get("inputFacets")]
    assert sum(read) == ORDERS
    facets = [e["run"]["facets"]["headwater_rowLineage"] for e in ours]
    assert sum(f["rowsOut"] for f in facets) == sink_rows == \
        sum(e["outputs"][0]["outputFacets"]["outputStatistics"]["rowCount"] for e in ours[1:])
    batches = {r["batch"] for r in read_log(config) if r["schema"] == LOG_BATCH and r["query"] == name
               and r["batch"] <= max(f["batches"].get("last", 0) for f in facets)}
    assert sum(f["batches"]["full"] for f in facets) == len(batches) and \
        all(f["batches"]["failed"] == f["batches"]["sampled"] == 0 for f in facets)
    assert facets[0]["captureLevel"] == "full" and facets[0]["ask"]["explorer"] == \
        f"http://lineage.example:8080/#/query?name={name}"
    # Column lineage, as the pipeline computes each column (headwater/demo/pipeline.py).
    lineage = ours[0]["outputs"][0]["facets"]["columnLineage"]
    direct = {column: {(f["namespace"], f["name"], f["field"], t["subtype"]) for f in found["inputFields"]
                       for t in f["transformations"]} for column, found in lineage["fields"].items()}
    from_kafka = {(*kafka_input, "value", "TRANSFORMATION")}
    assert direct == {"order_id": from_kafka, "customer_id": from_kafka, "amount_eur": from_kafka,
                      "event_time": from_kafka, "name": {("file", str(customers), "name", "IDENTITY")},
                      "region": {("file", str(customers), "region", "IDENTITY")}}
    indirect = {(f["namespace"], f["name"], f["field"], t["subtype"]) for f in lineage["dataset"]
                for t in f["transformations"]}
    assert indirect == {(*kafka_input, "value", "FILTER"), (*kafka_input, "value", "JOIN"),
                        ("file", str(customers), "customer_id", "JOIN")}

    # The restart with the same plan continued the run; the changed plan is a new run whose parent is it.
    starts = _of(events, state="START")
    assert [s["run"]["runId"] for s in starts[:2]] == [run_id, run_id]
    changed = starts[2]
    assert changed["run"]["runId"] != run_id and changed["run"]["facets"]["parent"]["run"]["runId"] == run_id
    # The failing query: START, then FAIL with Spark's error.
    [failed] = _of(events, state="FAIL")
    assert failed["job"]["name"] == f"failing-{tag}" and _of(events, failed["run"]["runId"], "START")
    assert "refused" in failed["run"]["facets"]["errorMessage"]["stackTrace"]


def _identity(batches):
    yield from batches


def test_column_lineage_says_how_each_column_is_made_through_aggregates_unions_and_black_boxes(spark):
    from headwater.capture.spark_plan import plan_ir
    from headwater.core.plan import column_transformations

    def lineage(df):
        ir, _ = plan_ir(df)
        sources = {s.id: s.detail.get("source") for s in ir.walk() if s.kind == "Source"}
        found = column_transformations(ir)

        def named(by_node):
            return {(sources.get(node, "box"), column): how for node, columns in by_node.items()
                    for column, how in columns.items()}

        return ({a.name: named(d) for a, d in zip(ir.output, found["direct"])}, named(found["indirect"]))

    rate = spark.readStream.format("rate").load()
    grouped = rate.groupBy((F.col("value") % 3).alias("k")).agg(F.sum("value").alias("total"),
                                                                F.max("timestamp").alias("last"), F.count("*"))
    direct, indirect = lineage(grouped)
    assert direct == {"k": {("rate", "value"): "TRANSFORMATION"}, "total": {("rate", "value"): "AGGREGATION"},
                      "last": {("rate", "timestamp"): "AGGREGATION"}, "count(1)": {}}
    assert indirect == {("rate", "value"): ["GROUP_BY"]}

    unioned = rate.select("value").union(rate.select((F.col("value") + 1).alias("value")))
    direct, indirect = lineage(unioned.where("value > 2"))
    assert direct == {"value": {("rate", "value"): "TRANSFORMATION"}} and indirect == {("rate", "value"): ["FILTER"]}
    direct, _ = lineage(rate.select("value").union(rate.select("value")))
    assert direct == {"value": {("rate", "value"): "IDENTITY"}}

    boxed = rate.mapInPandas(_identity, "timestamp timestamp, value long").select("value")
    direct, _ = lineage(boxed)
    assert direct == {"value": {("box", "value"): "IDENTITY", ("rate", "value"): "TRANSFORMATION",
                                ("rate", "timestamp"): "TRANSFORMATION"}}
