"""The demo path on the real stack and Spark, checked against the brute-force oracle."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
from pyspark.sql import functions as F

from headwater.adapters.graph import driver
from headwater.adapters.kafka import ensure_topics
from headwater.adapters.spark_lines import recent_progress
from headwater.core.offsets import partition_offsets
from headwater.core.rid import kafka_rid
from headwater.core.schema import LOG_BATCH, LOG_PLAN, LOG_PROGRESS
from headwater.demo import orders as data
from headwater.demo.pipeline import enriched_orders
from headwater.demo.run import count_malformed, end_offsets, run_pipeline
from headwater.query.api import LineageClient
from headwater.query.errors import LineageError
from headwater.query.fallback import Fallback
from headwater.spark.operators import build
from headwater.store.plans import PlanStore
from tests.conftest import index, local_file, own_topics, read_log, records_read, sink_file_batches
from tests.oracle import as_input, demo_lineage

ORDERS = 1000
MALFORMED_EVERY = 97


def index_all(config) -> object:
    return index(config, idle_s=2.0)


@pytest.fixture(scope="module")
def run(spark, stack_config, tmp_path_factory):
    config, tag = own_topics(stack_config, "e2e")
    topic = f"orders-{tag}"
    ensure_topics(config.bootstrap, [topic], 2)
    events = data.order_events(ORDERS, malformed_every=MALFORMED_EVERY)
    coordinates = data.produce(config.bootstrap, topic, events)
    workdir = tmp_path_factory.mktemp("e2e")
    sink, query = run_pipeline(spark, config, workdir, topic, end_offsets(topic, coordinates), say=print,
                               max_per_batch=300)
    stats = index_all(config)
    return SimpleNamespace(config=config, topic=topic, events=events, coordinates=coordinates, sink=sink,
                           query=query, stats=stats, workdir=workdir,
                           expected=demo_lineage(topic, events, coordinates, data.customers()))


def sink_rows(spark, run) -> list:
    return spark.read.parquet(run.sink).select("order_id", "_hw_rid").collect()


def test_the_stream_ran_several_batches_and_skipped_malformed_events(run):
    assert sum(1 for p in recent_progress(run.query) if p.numInputRows) >= 4
    assert count_malformed(run.events) == ORDERS // MALFORMED_EVERY
    assert run.stats.dlq == 0


def test_backward_lineage_of_every_output_row_equals_the_oracle(spark, run):
    rows = sink_rows(spark, run)
    assert sorted(r.order_id for r in rows) == sorted(run.expected)
    with LineageClient(run.config) as client, LineageClient(run.config, backend="csprov") as parquet:
        for row in rows:
            found = client.backward(row._hw_rid)
            assert {as_input(x) for x in found} == run.expected[row.order_id], row.order_id
            assert all(x.exact and x.via == "edges" and x.kind == "source" for x in found)
            # Every batch fully captured, as the batch log in the graph and in the store says.
            assert found.complete and not found.gaps and not found.unexplained, found.summary()
            in_store = parquet.backward(row._hw_rid)
            assert [x.to_dict() for x in in_store] == [x.to_dict() for x in found] and in_store.complete
            # Attribute masks over the sink's columns (order_id, customer_id, name, region,
            # amount_eur, event_time): names and regions come from customers, the rest from Kafka.
            assert {x.dataset.split(":")[0]: x.cols for x in found} == {"kafka": 0b110011, "customers": 0b001100}


def test_inferred_lineage_of_every_output_row_contains_the_oracle_and_equals_it_when_exact(spark, run):
    """The log-only fallback, as if no batch had published edges: from the kept plan, the
    batch log's offsets, the Kafka records read back and the customers table alone."""
    rows = (spark.read.parquet(run.sink).withColumn("file", F.input_file_name())
            .drop("_hw_rid").join(spark.read.parquet(run.sink).select("order_id", "_hw_rid"), "order_id").collect())
    fallback = Fallback(run.config)
    exact, reasons = 0, set()
    batch_of = sink_file_batches(run.config, "enriched_orders")
    for row in rows:
        batch = batch_of[local_file(row.file)]
        found, inferred = fallback.backward("enriched_orders", batch, row._hw_rid, row.asDict())
        assert all(x.via == "inference" and x.of == row._hw_rid and x.batches == [batch] for x in found)
        got = {as_input(x) for x in found}
        assert got >= run.expected[row.order_id], row.order_id
        if inferred.exact:
            exact += 1
            assert got == run.expected[row.order_id], row.order_id
        reasons.update(inferred.reasons)
    assert exact == len(rows), f"the demo's plan (filters, a projection, an equi-join) is proven exact: {reasons}"


def test_forward_lineage_of_every_kafka_record_equals_the_oracle(spark, run):
    rid_of_order = {r.order_id: r._hw_rid for r in sink_rows(spark, run)}
    outputs_of = {}
    for order_id, inputs in run.expected.items():
        for item in inputs:
            outputs_of.setdefault(item, set()).add(rid_of_order[order_id])
    read = records_read(run.query)
    with LineageClient(run.config) as client:
        for partition, offset in run.coordinates:
            item = ("kafka", run.topic, partition, offset)
            rid = kafka_rid(run.topic, partition, offset)
            if item in outputs_of:
                assert {x.rid for x in client.forward(rid)} == outputs_of[item]
            else:  # garbage, or filtered out: read by its batch, and nothing derives from it
                answer = client.forward(rid)
                assert list(answer) == [] and answer.complete
                assert [(g.query, g.batch, g.status) for g in answer.read_by] == \
                    [("enriched_orders", read[item[1:]], "full")]
        # A customer's row is named by where its table lives: the session's shared graph holds other
        # tests' customers tables too, of other paths, whose rows are other rows.
        for key in {k for k in outputs_of if k[0] == "table"}:
            from headwater.core.rid import table_rid

            rid = table_rid(f"file:{run.workdir / 'customers.parquet'}", key[2])
            assert {x.rid for x in client.forward(rid)} == outputs_of[key]


def test_outputs_equal_the_untraced_pipeline(spark, run, tmp_path):
    customers = run.workdir / "customers.parquet"
    plain = enriched_orders(spark, run.config.bootstrap, run.topic, str(customers))
    query = (plain.writeStream.format("parquet").option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(availableNow=True).start(str(tmp_path / "plain")))
    query.awaitTermination(180)
    untraced = Counter(tuple(r) for r in spark.read.parquet(str(tmp_path / "plain")).collect())
    traced_df = spark.read.parquet(run.sink)
    traced = Counter(tuple(r) for r in traced_df.drop("_hw_rid").select(*plain.columns).collect())
    assert traced == untraced


def test_payload_returns_the_original_records(spark, run):
    row = sink_rows(spark, run)[0]
    events_at = {c: v for c, (_, v) in zip(run.coordinates, run.events)}
    customers = {str(c["customer_id"]): c for c in data.customers()}
    with LineageClient(run.config) as client:
        found = client.backward(row._hw_rid, payload=True)
    for item in found:
        if item.topic:
            assert item.payload["value"] == json.loads(events_at[(item.partition, item.offset)])
        else:
            assert item.payload == customers[item.key]


def test_batch_log_records_plan_and_every_batch(run):
    records = read_log(run.config)
    plans = [r for r in records if r["schema"] == LOG_PLAN]
    batches = [r for r in records if r["schema"] == LOG_BATCH]
    assert plans and plans[0]["ir"]["kind"] == "Project"
    # Attribute-level lineage, once per query: which source columns each sink column reads.
    assert plans[0]["output_columns"] == ["order_id", "customer_id", "name", "region", "amount_eur", "event_time"]
    kafka, customers = plans[0]["sources"]
    assert kafka["columns_read"] == [["value"], ["value"], [], [], ["value"], ["value"]]
    assert customers["columns_read"] == [[], [], ["name"], ["region"], [], []]
    # The user's optimized plan, for the log-only fallback: the same columns, Kafka joined to customers.
    fallback = build(plans[0]["optimized"])
    assert [a.name for a in fallback.root.output] == plans[0]["output_columns"]
    assert {op.kind for op in fallback.operators()} >= {"Join", "Filter", "Relation"}
    assert not [op for op in fallback.operators() if op.kind == "Unknown"]
    kept = PlanStore(run.config.store_uri(), run.config.log_topic).plan_for(plans[0]["query"], 10**9)
    assert kept["optimized"] == plans[0]["optimized"] and kept["fingerprint"] == plans[0]["fingerprint"]
    ran = {p.batchId for p in recent_progress(run.query) if p.numInputRows}
    assert {b["batch"] for b in batches} >= ran
    assert all(b["status"] == "full" and b["dropped_edges"] == b["spilled_edges"] == 0 for b in batches)
    assert sum(b["edges"] for b in batches) == 2 * len(run.expected) == run.stats.edges
    assert sum(b["rows_out"] for b in batches) == len(run.expected)


def test_batch_log_records_the_offsets_each_batch_read(spark, run):
    """Progress records: per batch, offset ranges that tile the topic and hold that batch's rows."""
    records = read_log(run.config)
    progress = {r["batch"]: r for r in records if r["schema"] == LOG_PROGRESS and r["rows_in"]}
    assert set(progress) == {p.batchId for p in recent_progress(run.query) if p.numInputRows}
    assert all(r["query"] == "enriched_orders" and r["durations_ms"]["triggerExecution"] > 0
               for r in progress.values())
    read_up_to: dict = {}
    for batch in sorted(progress):
        (source,) = progress[batch]["sources"]
        start, end = partition_offsets(source["start"]), partition_offsets(source["end"])
        assert start == read_up_to, "batches must read the topic without gaps or overlaps"
        assert source["rows_in"] == sum(end[k] - read_up_to.get(k, 0) for k in end)
        read_up_to = end
    assert read_up_to == end_offsets(run.topic, run.coordinates)

    # Every output row's Kafka record lies in the range its batch's progress names.
    coordinate_of = {}
    for (_, value), (p, o) in zip(run.events, run.coordinates):
        order = json.loads(value) if value.startswith(b"{") and value.endswith(b"}") else None
        if isinstance(order, dict) and "order_id" in order:
            coordinate_of[order["order_id"]] = (p, o)
    rows = spark.read.parquet(run.sink).withColumn("file", F.input_file_name()).select("order_id", "file").collect()
    batch_of = sink_file_batches(run.config, "enriched_orders")
    for row in rows:
        batch = batch_of[local_file(row.file)]
        (source,) = progress[batch]["sources"]
        p, o = coordinate_of[row.order_id]
        key = (run.topic, p)
        assert partition_offsets(source["start"]).get(key, 0) <= o < partition_offsets(source["end"])[key]


def test_cli_prints_json_lines_and_clear_errors(spark, stack, run):
    row = sink_rows(spark, run)[0]

    def cli(*args, env=None):
        return subprocess.run([sys.executable, "-m", "headwater.cli", "--home", str(stack.home), *args],
                              capture_output=True, text=True, timeout=120, env=env)

    done = cli("lineage", "backward", "--rid", str(row._hw_rid), "--payload")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert {("kafka", x["topic"], x["partition"], x["offset"]) if x["topic"] else ("table", x["dataset"], x["key"])
            for x in lines} == run.expected[row.order_id]
    assert all("payload" in x for x in lines)

    partition, offset = next(
        (p, o) for (p, o), (_, v) in zip(run.coordinates, run.events)
        if ("kafka", run.topic, p, o) in run.expected[row.order_id]
    )
    forward = cli("lineage", "forward", "--source", f"kafka:{run.topic}:{partition}:{offset}")
    assert [json.loads(line)["rid"] for line in forward.stdout.splitlines()] == [row._hw_rid]

    unknown = cli("lineage", "backward", "--rid", "12345")
    assert unknown.returncode == 2 and "not in the lineage graph" in json.loads(unknown.stderr)["error"]
    bad_depth = cli("lineage", "backward", "--rid", str(row._hw_rid), "--depth", "1000")
    assert bad_depth.returncode == 2 and "depth" in json.loads(bad_depth.stderr)["error"]
    bad_source = cli("lineage", "forward", "--source", "kafka:no-partition")
    assert bad_source.returncode == 2 and "expected kafka:TOPIC" in json.loads(bad_source.stderr)["error"]
    # A target no kept plan has is refused, naming those there are (an injection attempt is no dataset either).
    # Asked in-process of the run's own topics, whose kept plans are the run's: the stack's topics may keep
    # none yet, and with none kept nothing tells a dataset from a typo (``LineageClient.target``).
    injection = cli("lineage", "backward", "--rid", str(row._hw_rid), "--to", "x' OR 1=1 //", "--in-process",
                    env={**os.environ, "HEADWATER_LOG_TOPIC": run.config.log_topic,
                         "HEADWATER_EDGES_TOPIC": run.config.edges_topic})
    assert injection.returncode == 2 and injection.stdout == ""
    assert "no kept plan has a dataset" in json.loads(injection.stderr)["error"]


def test_rows_addressed_by_a_predicate_over_the_sink(spark, stack, run):
    from headwater.query.sink import select

    sink = f"parquet:{run.sink}"
    rows = sink_rows(spark, run)
    chosen = sorted(rows, key=lambda r: r.order_id)[:3]
    ids = ", ".join(str(r.order_id) for r in chosen)
    assert select(spark, sink, f"order_id IN ({ids})") == sorted(r._hw_rid for r in chosen)
    assert select(spark, sink, "order_id < 0") == []
    refused = {
        f"order_id IN (SELECT order_id FROM parquet.`{run.sink}`)": "Subquery",
        "EXISTS (SELECT 1)": "Exists",
        "reflect('java.lang.Runtime', 'getRuntime') IS NOT NULL": "may not call 'reflect'",
        "java_method('java.lang.System', 'exit', 0) = 1": "may not call 'java_method'",
        "1 = 1; DROP TABLE x": "not a SQL expression",
        "no_such_column > 1": "no_such_column",
        "": "one SQL expression",
    }
    for where, says in refused.items():
        with pytest.raises(LineageError, match=re.escape(says)):
            select(spark, sink, where)
    with pytest.raises(LineageError, match="more than 3 rows"):
        select(spark, sink, "true", limit=3)
    with pytest.raises(LineageError, match="give a sink as lineage names it"):
        select(spark, "console:", "true")

    done = subprocess.run([sys.executable, "-m", "headwater.cli", "--home", str(stack.home), "lineage", "backward",
                           "--dataset", sink, "--where", f"order_id IN ({ids})"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    found = [json.loads(line) for line in done.stdout.splitlines()]
    for row in chosen:
        assert {as_input(SimpleNamespace(**x)) for x in found if x["of"] == row._hw_rid} == run.expected[row.order_id]
    summaries = [json.loads(line)["summary"] for line in done.stderr.splitlines() if line.startswith('{"summary"')]
    assert sorted(x["of"] for x in summaries) == sorted(r._hw_rid for r in chosen)
    assert all(x["complete"] for x in summaries)


def graph_edges(config, rids: list[int]) -> list[tuple]:
    with driver(config) as d, d.session(database=config.graph_database) as s:
        return [tuple(r.values()) for r in s.run(
            "MATCH (a:Row)-[e:DERIVED]->(b:Row) WHERE b.rid IN $rids RETURN a.rid, b.rid, e.batch, e.op", rids=rids)]


def test_a_retried_batch_yields_identical_rids_and_no_duplicate_edges(spark, run):
    before = sorted(r._hw_rid for r in sink_rows(spark, run))
    edges_before = graph_edges(run.config, before)
    assert len(edges_before) == len(set(edges_before)) == 2 * len(before)

    # Make Spark run the last batch again, as after a crash between sink write and commit.
    commits = Path(run.workdir) / f"checkpoint-{run.topic}" / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    for name in (str(last), f".{last}.crc"):
        (commits / name).unlink(missing_ok=True)
    _, again = run_pipeline(spark, run.config, Path(run.workdir), run.topic,
                            end_offsets(run.topic, run.coordinates), say=print, max_per_batch=300)
    assert [p.batchId for p in recent_progress(again) if p.numInputRows] == [last]
    index_all(run.config)

    after = sorted(r._hw_rid for r in sink_rows(spark, run))
    assert after == before
    edges_after = graph_edges(run.config, after)
    assert sorted(edges_after) == sorted(edges_before)


def test_user_foreach_batch_and_table_sinks_get_the_users_columns(spark, stack, run, tmp_path):
    """The user's own foreachBatch gets their columns plus _hw_rid (or not, with emit_rid=False)."""
    from headwater.capture import attach

    tracer = attach(spark, run.config)
    seen: dict = {}

    def keep(name):
        def collect(batch, batch_id):
            rows = batch.collect()
            seen.setdefault(name, []).extend(rows)
            seen.setdefault(f"{name}-batches", {})[batch_id] = {r.order_id for r in rows}
            seen[f"{name}-columns"] = batch.columns
        return collect

    customers = str(run.workdir / "customers.parquet")
    try:
        for name, emit in (("with_rid", True), ("without_rid", False)):
            df = enriched_orders(spark, run.config.bootstrap, run.topic, customers)
            query = (tracer.trace(df, name=f"fb-{name}", keys={"customers": "customer_id"}, emit_rid=emit)
                     .writeStream.foreachBatch(keep(name)).option("checkpointLocation", str(tmp_path / name))
                     .trigger(availableNow=True).start())
            query.awaitTermination(180)
        table = f"hw_table_{uuid.uuid4().hex[:6]}"
        df = enriched_orders(spark, run.config.bootstrap, run.topic, customers)
        query = (tracer.trace(df, name="fb-table").writeStream.option("checkpointLocation", str(tmp_path / "t"))
                 .trigger(availableNow=True).toTable(table))
        query.awaitTermination(180)
        table_rows = spark.table(table).count()
    finally:
        tracer.close()
    columns = list(df.columns)
    assert seen["with_rid-columns"] == columns + ["_hw_rid"]
    assert seen["without_rid-columns"] == columns
    assert len(seen["with_rid"]) == len(seen["without_rid"]) == len(run.expected)
    assert table_rows == len(run.expected)

    # Whatever the foreachBatch code derives from a batch has, at most, that batch's lineage.
    index_all(run.config)
    for batch_id, order_ids in seen["with_rid-batches"].items():
        answer = subprocess.run(
            [sys.executable, "-m", "headwater.cli", "--home", str(stack.home), "lineage", "backward",
             "--source", f"foreachBatch:fb-with_rid:{batch_id}"], capture_output=True, text=True, timeout=120)
        lines = [json.loads(line) for line in answer.stdout.splitlines()]
        assert answer.returncode == 0, answer.stderr
        assert {("kafka", x["topic"], x["partition"], x["offset"]) if x["topic"] else ("table", x["dataset"], x["key"])
                for x in lines} == set().union(*(run.expected[o] for o in order_ids))
        assert not any(x["exact"] for x in lines)


def test_capture_metrics_are_served_on_loopback(spark, run, tmp_path):
    import urllib.request

    from headwater.capture import attach
    from headwater.deploy.stack import free_port

    port = free_port()
    tracer = attach(spark, run.config, metrics_port=port)
    name = f"metrics-{uuid.uuid4().hex[:6]}"
    try:
        df = enriched_orders(spark, run.config.bootstrap, run.topic, str(run.workdir / "customers.parquet"))
        query = (tracer.trace(df, name=name, keys={"customers": "customer_id"}).writeStream.format("noop")
                 .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start())
        query.awaitTermination(180)
        batches = sum(1 for p in recent_progress(query) if p.numInputRows)
        tracer.spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(10_000)
        deadline = time.monotonic() + 10
        while True:  # the tracer's thread sends the last batch's journal once Spark has finished that batch,
            # and reads the job times about once a second
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
            if all(f'{metric}{{{labels}query="{name}"}}' in text for metric, labels in (
                    ("headwater_capture_bytes_total", ""), ("headwater_capture_job_seconds_total", 'part="user",'))) \
                    or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        tracer.close()

    def value(metric: str, **labels) -> float:
        wanted = ",".join(f'{k}="{v}"' for k, v in sorted({"query": name, **labels}.items()))  # as exposed
        (line,) = [x for x in text.splitlines() if x.startswith(f"{metric}{{{wanted}}} ")]
        return float(line.rsplit(" ", 1)[1])

    assert batches >= 1
    assert value("headwater_capture_edges_total") == 2 * len(run.expected)
    assert value("headwater_capture_dropped_edges_total") == 0
    assert value("headwater_capture_batches_total", status="full") == batches
    assert value("headwater_capture_publish_seconds_count") == batches
    assert value("headwater_capture_bytes_total") > 0
    assert 0 < value("headwater_capture_overhead_ratio") < 100
    assert value("headwater_capture_listener_lag_seconds") < 60
    assert value("headwater_capture_spilled_edges_total") == 0
    # The JVM listener saw the batches' jobs; lineage rode in the sink's write tasks.
    assert value("headwater_capture_job_seconds_total", part="user") > 0
    assert value("headwater_capture_task_seconds_total") > 0
    with pytest.raises(OSError):  # closed with its tracer
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)
