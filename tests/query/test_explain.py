"""Answers that explain themselves (query/explain.py): operators by name, masks as column names, sink rows
as forward payloads, and the errors that keep the promise (a target no plan has, a broker away).

The pure part runs on hand-written plans; the rest on the demo pipeline (Kafka orders joined with
customers) and a tumbling window over events, both traced for real, indexed, and checked against
what the pipelines are and what their sinks hold.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from headwater.query.backend import Lineage
from headwater.query.errors import LineageError
from headwater.query.explain import Explainer, columns, duration, operators
from headwater.store.plans import PlanStore

# Hand-written plans, as capture logs them: the IR (headwater.core.plan), and Spark's optimized plan
# records, whose expressions are flattened in pre-order with each node's number of children.


def expr(cls: str, *children: list, **fields) -> list:
    """A flattened Spark expression: this node, then each child's nodes."""
    node = {"class": f"org.apache.spark.sql.catalyst.expressions.{cls}", "num-children": len(children), **fields}
    return [node] + [part for child in children for part in child]


def attr(name: str, expr_id: int, dtype="long") -> list:
    return expr("AttributeReference", name=name, exprId={"id": expr_id}, dataType=dtype)


def lit(value, dtype="long") -> list:
    return expr("Literal", value=str(value), dataType=dtype)


def alias(name: str, expr_id: int, child: list) -> list:
    return expr("Alias", child, name=name, exprId={"id": expr_id})


def node(node_id, kind, spark_class, output, children=(), **detail) -> dict:
    return {"id": node_id, "kind": kind, "spark_class": spark_class, "streaming": True,
            "output": [[n, i, t] for n, i, t in output], "detail": detail, "children": list(children)}


def record(spark_class: str, output, **fields) -> dict:
    return {"spark_class": spark_class, "output": [{"name": n, "expr_id": i} for n, i, _ in output], "fields": fields}


KAFKA = [("key", 1, "binary"), ("value", 2, "binary"), ("topic", 3, "string"), ("partition", 4, "int"),
         ("offset", 5, "bigint")]
CUSTOMERS = [("customer_id", 10, "bigint"), ("name", 11, "string"), ("region", 12, "string")]
ORDER = [("order_id", 20, "bigint"), ("customer_id", 21, "bigint"), ("amount", 22, "double")]
OUT = [("order_id", 20, "bigint"), ("name", 11, "string"), ("region", 12, "string"), ("amount", 22, "double")]


def demo_ir() -> dict:
    """Kafka orders, parsed, filtered, joined with the static customers table, projected."""
    kafka = node(5, "Source", "StreamingRelationV2", KAFKA, provider="headwater_kafka", source="kafka", location=None)
    parsed = node(4, "Project", "Project", ORDER, [kafka], derives={"20": [2], "21": [2], "22": [2]})
    kept = node(3, "Filter", "Filter", ORDER, [parsed])
    customers = node(7, "Source", "LogicalRelation", CUSTOMERS, source="static", name="customers",
                     table="file:/data/customers.parquet")
    named = node(6, "Alias", "SubqueryAlias", CUSTOMERS, [customers], name="c")
    joined = node(2, "Join", "Join", ORDER + CUSTOMERS, [kept, named], join_type="inner")
    return node(0, "Project", "Project", OUT, [joined], derives={})


DEMO_PLAN = {
    "query": "orders_enriched", "ir": demo_ir(), "output_columns": [n for n, _, _ in OUT], "state": [],
    "sink": "parquet:/data/out",
    "sources": [{"node_id": 5, "source": "kafka", "dataset": None},
                {"node_id": 7, "source": "static", "dataset": "table:file:/data/customers.parquet",
                 "name": "customers"}],
}

EVENTS = [("id", 30, "bigint"), ("k", 31, "int"), ("ts", 32, "timestamp")]
WINDOW_TYPE = {"type": "struct",
               "fields": [{"name": "start", "type": "timestamp"}, {"name": "end", "type": "timestamp"}]}


def window_expression(size_us: int, slide_us: int) -> list:
    """Spark's window arithmetic, as TimeWindowing writes it (the parts this module reads)."""
    ts = expr("PreciseTimestampConversion", attr("ts", 32, "timestamp"))
    start = expr("Subtract", ts, expr("Remainder", expr("Subtract", ts, lit(0)), lit(slide_us)))
    return expr("CreateNamedStruct", lit("start", "string"), start, lit("end", "string"),
                expr("Add", start, lit(size_us)))


def window_plan(size_us: int, slide_us: int, keys=("k",), renamed: str | None = None) -> dict:
    """Events grouped by a time window (``renamed``: ``window(…).alias(renamed)``) and ``keys``, counted."""
    window = ("window", 40, "struct<start:timestamp,end:timestamp>")
    shown = (renamed, 42, window[2]) if renamed else window
    source = node(3, "Source", "StreamingRelationV2", EVENTS, source="stream", provider="memory")
    project = node(2, "Project", "Project", [window] + EVENTS, [source], derives={"40": [32]})
    watermark = node(1, "EventTimeWatermark", "EventTimeWatermark", [window] + EVENTS, [project])
    grouped = [shown] + [e for e in EVENTS if e[0] in keys] + [("n", 41, "bigint")]
    aggregate = node(0, "Aggregate", "Aggregate", grouped, [watermark], derives={"41": []})
    key_exprs = [attr(n, i) for n, i, _ in EVENTS if n in keys]
    optimized = [
        record("Aggregate", grouped, groupingExpressions=[attr("window", 40, WINDOW_TYPE)] + key_exprs,
               aggregateExpressions=[alias(renamed, 42, attr("window", 40, WINDOW_TYPE)) if renamed
                                     else attr("window", 40, WINDOW_TYPE)] + key_exprs + [
                   alias("n", 41, expr("aggregate.AggregateExpression", expr("aggregate.Count", lit(1, "integer"))))]),
        record("Project", [window], projectList=[alias("window", 40, window_expression(size_us, slide_us))]),
        record("EventTimeWatermark", [window] + EVENTS, eventTime=attr("ts", 32, "timestamp")),
    ]
    return {"query": "windows", "ir": aggregate, "optimized": optimized, "output_columns": [n for n, _, _ in grouped],
            "state": [{"node_id": 0, "dataset": "Aggregate#0"}], "sink": "parquet:/data/windows",
            "sources": [{"node_id": 3, "source": "stream", "dataset": None}]}


def named(plan: dict, topics=None) -> list[tuple]:
    return [(o["id"], o["kind"], o["name"]) for o in operators(plan, topics)]


def test_a_plan_reads_as_its_operators_in_data_flow_order():
    assert named(DEMO_PLAN, {5: "orders"}) == [
        (5, "source", "source kafka orders"), (4, "project", "project"), (3, "filter", "filter"),
        (7, "source", "source customers"), (2, "join", "join customers"), (0, "project", "project")]
    ops = {o["id"]: o for o in operators(DEMO_PLAN)}
    # Naming-only nodes (SubqueryAlias) are looked through: the join's inputs are the filter and the table.
    assert ops[2]["inputs"] == [3, 7] and ops[0]["inputs"] == [2] and ops[5]["inputs"] == []
    assert ops[5]["name"] == "source kafka" and ops[2]["spark_class"] == "Join"
    # A bare IR names the same operators.
    assert named(DEMO_PLAN["ir"], {5: "orders"}) == named(DEMO_PLAN, {5: "orders"})


def test_joins_are_named_by_their_table_or_both_streams_and_their_type():
    left_outer = json.loads(json.dumps(DEMO_PLAN))
    left_outer["ir"]["children"][0]["detail"]["join_type"] = "leftouter"
    assert dict((i, n) for i, _, n in named(left_outer))[2] == "join customers (left outer)"
    streams = json.loads(json.dumps(DEMO_PLAN))
    payments = node(7, "Source", "StreamingRelationV2", CUSTOMERS, source="kafka", provider="headwater_kafka")
    streams["ir"]["children"][0]["children"][1] = node(6, "Alias", "SubqueryAlias", CUSTOMERS, [payments],
                                                       name="payments")
    assert dict((i, n) for i, _, n in named(streams, {5: "orders"}))[2] == "join orders with payments"
    assert dict((i, n) for i, _, n in named(streams, {5: "orders"}))[7] == "source kafka payments"


@pytest.mark.parametrize("size, slide, keys, renamed, name", [
    (5_000_000, 5_000_000, ("k",), None, "window 5 s by k"),
    (600_000_000, 60_000_000, (), None, "window 10 min every 1 min"),
    (3_600_000_000, 3_600_000_000, ("k", "id"), None, "window 1 h by id, k"),
    (20_000_000, 20_000_000, ("k",), "w", "window 20 s by k"),
])
def test_a_windowed_aggregate_is_named_by_its_window_and_keys(size, slide, keys, renamed, name):
    found = named(window_plan(size, slide, keys, renamed))
    assert found[-1] == (0, "aggregate", name)
    assert found[1] == (2, "project", "project") and found[2] == (1, "watermark", "watermark on ts")


def test_a_session_window_is_named_by_its_gap():
    plan = window_plan(5_000_000, 5_000_000, ())
    ts = attr("ts", 32, "timestamp")
    plan["optimized"][1] = record("Project", [("window", 40, "")], projectList=[alias("window", 40, expr(
        "CreateNamedStruct", lit("start", "string"), ts, lit("end", "string"),
        expr("TimestampAddInterval", ts, lit("7 seconds", "interval"))))])
    assert named(plan)[-1] == (0, "aggregate", "session window 7 s")


def test_aggregates_black_boxes_and_others_by_what_the_ir_keeps():
    plan = window_plan(5_000_000, 5_000_000)
    plan["optimized"] = None  # a plan with no optimized records: the columns the aggregate passes through
    assert named(plan)[-1] == (0, "aggregate", "window by k")
    source = node(1, "Source", "StreamingRelationV2", EVENTS, source="rate", provider="rate")
    for cls, name in (("MapInPandas", "mapInPandas"), ("FlatMapGroupsWithState", "flatMapGroupsWithState")):
        assert named(node(0, "BlackBox", cls, EVENTS, [source])) == [
            (1, "source", "source rate"), (0, "black box", name)]
    grouped = node(0, "Aggregate", "Aggregate", [("k", 31, "int"), ("n", 41, "bigint")], [source], derives={"41": []})
    assert named(grouped)[-1] == (0, "aggregate", "aggregate by k")
    total = node(0, "Aggregate", "Aggregate", [("n", 41, "bigint")], [source], derives={"41": []})
    assert named(total)[-1] == (0, "aggregate", "aggregate")
    assert named(node(0, "Unknown", "GlobalLimit", EVENTS, [source]))[-1] == (0, "unknown", "GlobalLimit")


def test_durations():
    assert [duration(us) for us in (500, 250_000, 5_000_000, 90_000_000, 7_200_000_000, 86_400_000_000)] == [
        "500 µs", "250 ms", "5 s", "90 s", "2 h", "1 d"]


def test_a_mask_names_the_columns_of_its_bits():
    names = [f"c{i}" for i in range(70)]
    assert columns(["a", "b", "c"], 0b101) == ["a", "c"]
    assert columns(["a", "b", "c"], None) is None and columns(["a", "b", "c"], -1) is None
    assert columns(None, 3) is None
    # Columns past 63 share bit 63; a mask with bit 63 set is negative (a signed 64-bit integer).
    high = (1 << 63) | 1
    assert columns(names, high - (1 << 64)) == ["c0"] + names[63:]
    assert columns(names, 1 << 62) == ["c62"]


def lineage(kind, dataset, hops, cols, **fields) -> Lineage:
    """A record as a walk makes it (``backend.lineage_of``)."""
    item = Lineage(of=1, rid=2, kind=kind, dataset=dataset, ops=sorted(op for _, op in hops), cols=cols, batches=[3],
                   **fields)
    item.hops = set(hops)
    return item


def test_records_name_the_operators_on_their_branch_and_the_columns_they_feed(tmp_path):
    PlanStore(tmp_path, "log").write("orders_enriched", 0, "aa", DEMO_PLAN)
    explainer = Explainer(tmp_path, "log")
    kafka = lineage("source", "kafka:orders", {("orders_enriched", 0)}, 0b1001, topic="orders", partition=0, offset=7)
    table = lineage("source", "table:file:/data/customers.parquet", {("orders_enriched", 0)}, 0b0110, key="4")
    asked = {"kind": "output", "dataset": "orders_enriched"}
    explainer.explain([kafka, table], asked, backward=True)
    assert [o["name"] for o in kafka.operators] == ["source kafka orders", "project", "filter", "join customers",
                                                    "project"]
    assert [o["name"] for o in table.operators] == ["source customers", "join customers", "project"]
    assert all(o["query"] == "orders_enriched" for o in kafka.operators + table.operators)
    assert kafka.columns == ["order_id", "amount"] and table.columns == ["name", "region"]
    # Forward from the Kafka record: the output row's columns, the Kafka branch's operators.
    out = lineage("output", "orders_enriched", {("orders_enriched", 0)}, 0b1001)
    explainer.explain([out], {"kind": "source", "dataset": "kafka:orders", "topic": "orders"}, backward=False)
    assert [o["id"] for o in out.operators] == [5, 4, 3, 2, 0] and out.columns == ["order_id", "amount"]
    # A record's dict carries both, beside ops and cols; without them (unexplained) neither key is there.
    shown = kafka.to_dict()
    assert shown["ops"] == [0] and shown["cols"] == 0b1001 and "hops" not in shown
    assert shown["operators"][0] == {"query": "orders_enriched", "id": 5, "kind": "source",
                                     "name": "source kafka orders", "spark_class": "StreamingRelationV2",
                                     "inputs": []}
    assert set(Lineage(of=1, rid=2, kind="source", dataset="rate").to_dict()) & {"operators", "columns"} == set()
    # Through a window's state: the segment into the aggregate, then out of it.
    PlanStore(tmp_path, "log").write("windows", 0, "bb", window_plan(5_000_000, 5_000_000))
    event = lineage("source", "memory", {("windows", 0)}, 0b101, path="/in/1.json", position=None)
    explainer.explain([event], {"kind": "output", "dataset": "windows"}, backward=True)
    assert [o["name"] for o in event.operators] == ["source memory", "project", "watermark on ts", "window 5 s by k"]
    assert event.columns == ["window", "n"]


def test_plans_kept_before_the_ir_still_load_and_name_operators_by_id(tmp_path):
    store = PlanStore(tmp_path, "log")
    optimized = [{"spark_class": "Project", "output": [{"name": "a", "expr_id": 1}, {"name": "b", "expr_id": 2}],
                  "fields": {}, "num_children": 0}]
    store.write("old", 0, "cc", {"optimized": optimized, "sink": "parquet:/old", "sources": [], "at": 1.0})
    explainer = Explainer(tmp_path, "log")
    assert explainer.operators_of("old") == [] and explainer.columns("old", 0b10) == ["b"]
    assert explainer.columns("parquet:/old", 0b11) == ["a", "b"] and explainer.sink_of("old") == "parquet:/old"
    row = lineage("source", "kafka:t", {("old", 3)}, 0b1, topic="t", partition=0, offset=1)
    explainer.explain([row], {"kind": "output", "dataset": "old"}, backward=True)
    assert row.operators == [{"query": "old", "id": 3, "kind": "unknown", "name": "operator 3", "spark_class": None,
                              "inputs": []}] and row.columns == ["a"]
    assert explainer.operators_of("nothing") is None and explainer.columns("nothing", 1) is None


def test_a_new_plan_is_seen_by_a_stat_and_the_batch_picks_its_plan(tmp_path, monkeypatch):
    store = PlanStore(tmp_path, "log")
    explainer = Explainer(tmp_path, "log")
    assert explainer.queries() == [] and explainer.datasets() == {}
    store.write("orders_enriched", 0, "aa", DEMO_PLAN)
    assert [q["name"] for q in explainer.queries()] == ["orders_enriched"]
    changed = json.loads(json.dumps(DEMO_PLAN))
    changed["output_columns"] = ["w", "x", "y", "z"]
    store.write("orders_enriched", 5, "bb", changed)
    assert explainer.columns("orders_enriched", 1) == ["w"]
    assert explainer.plan("orders_enriched", 4).output_columns[0] == "order_id"
    # Unchanged folders: nothing is read again, nor listed (plan files are written whole, never changed in place).
    reads = []
    monkeypatch.setattr("builtins.open", lambda *args, **kwargs: reads.append(args))
    monkeypatch.setattr("os.listdir", lambda *args: reads.append(args))
    for _ in range(3):
        explainer.columns("orders_enriched", 1)
    monkeypatch.undo()
    assert reads == []
    queries = explainer.queries()
    assert queries[0]["sink"] == "parquet:/data/out" and queries[0]["from_batch"] == 5
    assert [s["name"] for s in queries[0]["sources"]] == ["kafka", "customers"]
    known = explainer.datasets()
    assert known["queries"] == {"orders_enriched"} and known["sinks"] == {"parquet:/data/out": "orders_enriched"}
    assert known["tables"] == {"table:file:/data/customers.parquet": "customers"}


# The real thing: two traced queries on the stack, indexed.

ORDERS = 240
MALFORMED_EVERY = 41


@pytest.fixture(scope="module")
def run(spark, stack_config, tmp_path_factory):
    from headwater.adapters.kafka import ensure_topics
    from headwater.capture import attach
    from headwater.demo import orders as data
    from headwater.demo.run import end_offsets, run_pipeline
    from tests.capture.test_aggregations import run as run_aggregation
    from tests.capture.test_aggregations import sink_of
    from tests.conftest import index, own_topics

    config, tag = own_topics(stack_config, "explain")
    topic = f"orders-{tag}"
    ensure_topics(config.bootstrap, [topic], 2)
    events = data.order_events(ORDERS, malformed_every=MALFORMED_EVERY)
    coordinates = data.produce(config.bootstrap, topic, events)
    workdir = tmp_path_factory.mktemp("explain")
    sink, _ = run_pipeline(spark, config, workdir, topic, end_offsets(topic, coordinates), say=lambda _: None,
                           max_per_batch=80)
    tracer = attach(spark, config)
    try:
        run_aggregation(spark, config, workdir, "tumbling_append", f"agg-{tag}", tracer)
    finally:
        tracer.close()
    index(config)
    # The session's graph holds other tests' customers tables too: this run's, named apart by its folder.
    customers = f"customers@{workdir.name}/customers.parquet"
    return SimpleNamespace(config=config, tag=tag, topic=topic, coordinates=coordinates, sink=sink, customers=customers,
                           window=f"agg-{tag}", window_sink=sink_of(workdir, f"agg-{tag}"),
                           window_topic=f"agg-{tag}")


def sink_rows(path: str) -> dict[int, dict]:
    """A sink's rows by rid, read whole with pyarrow (no filter, no rid): the oracle of what it holds."""
    import pyarrow.parquet as pq

    rows = pq.read_table(path).to_pylist()
    return {row.pop("_hw_rid"): plain(row) for row in rows}


def plain(value):
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value.isoformat() if hasattr(value, "isoformat") else value


def sink_columns(path: str) -> list[str]:
    """A sink's columns as its files hold them, but ``_hw_rid``."""
    import pyarrow.parquet as pq

    return [c for c in pq.read_schema(next(Path(path).glob("*.parquet"))).names if c != "_hw_rid"]


def bits(names: list[str], mask: int) -> list[str]:
    """The oracle of ``columns``: column i where bit i of the mask is set."""
    return [name for i, name in enumerate(names) if mask >> i & 1]


def test_a_traced_pipeline_reads_as_what_it_does(run):
    from headwater.query.api import LineageClient

    with LineageClient(run.config) as client:
        demo = client.explainer().operators_of("enriched_orders")
        window = client.explainer().operators_of(run.window)
        queries = {q["name"]: q for q in client.explainer().queries()}
    # headwater/demo/pipeline.py: Kafka, parse, keep valid orders of at least 20, convert, join customers,
    # select (a join on a column name projects once more).
    assert [(o["kind"], o["name"]) for o in demo] == [
        ("source", f"source kafka {run.topic}"), ("project", "project"), ("project", "project"),
        ("filter", "filter"), ("filter", "filter"), ("project", "project"), ("source", "source customers"),
        ("join", "join customers"), ("project", "project"), ("project", "project")]
    # test_aggregations.py's tumbling_append: parse, watermark on ts, a 20 s window by k.
    assert window[0]["name"] == f"source kafka {run.window_topic}" and window[-1]["name"] == "window 20 s by k"
    assert "watermark on ts" in [o["name"] for o in window]
    assert queries["enriched_orders"]["sink"] == f"parquet:{run.sink}"
    assert queries["enriched_orders"]["output_columns"] == sink_columns(run.sink)
    assert {s["name"] for s in queries["enriched_orders"]["sources"]} == {run.topic, "customers"}


def test_records_name_their_operators_and_columns(run):
    from headwater.query.api import LineageClient

    demo_columns, window_columns = sink_columns(run.sink), sink_columns(run.window_sink)
    with LineageClient(run.config) as client:
        demo = {o["id"]: o for o in client.explainer().operators_of("enriched_orders")}
        customers = next(i for i, o in demo.items() if o["name"] == "source customers")
        for rid in sink_rows(run.sink):
            found = client.backward(rid)
            assert found.complete and {x.kind for x in found} == {"source"}
            for x in found:
                assert x.columns == bits(demo_columns, x.cols), x
                ids = [o["id"] for o in x.operators]
                assert set(x.ops) <= set(ids) and all(o["query"] == "enriched_orders" for o in x.operators)
                if x.topic is not None:  # the Kafka branch: every operator but the customers table
                    assert ids == [i for i in demo if i != customers]
                    assert x.columns == ["order_id", "customer_id", "amount_eur", "event_time"]
                else:  # the customers row: the table, the join, the projections above it
                    assert [o["name"] for o in x.operators] == ["source customers", "join customers", "project",
                                                                "project"]
                    assert x.columns == ["name", "region"]
                assert x.to_dict()["operators"] == x.operators and x.to_dict()["columns"] == x.columns
        window = [o["name"] for o in client.explainer().operators_of(run.window)]
        for rid in sink_rows(run.window_sink):
            found = client.backward(rid)
            assert found and {x.topic for x in found} == {run.window_topic}
            for x in found:  # through the window's state: into the aggregate, and out of it
                assert [o["name"] for o in x.operators] == window
                # Every column but the count, which reads no column of the events.
                assert x.columns == bits(window_columns, x.cols) == [c for c in window_columns if c != "n"]
            to_state = client.backward(rid, to="state", depth=1)
            assert [o["name"] for o in to_state[0].operators] == ["window 20 s by k"]


def test_forward_answers_carry_the_sink_rows_they_name(run):
    from headwater.core.rid import kafka_rid
    from headwater.query.api import LineageClient

    written = sink_rows(run.sink)
    with LineageClient(run.config) as client:
        outputs = 0
        for partition, offset in run.coordinates[::3]:
            started = time.monotonic()
            found = client.forward(kafka_rid(run.topic, partition, offset), payload=True)
            for x in found:
                assert x.kind == "output" and x.payload == written[x.rid], (x, written.get(x.rid))
                assert x.columns == bits(sink_columns(run.sink), x.cols)
                outputs += 1
            assert time.monotonic() - started < 3.0  # a few row groups read, not the sink
        assert outputs > 20
        # A customer's every order, each with its row; the sink named as lineage names it finds the same rows.
        found = client.forward(f"table:{run.customers}:3", payload=True)
        assert found and all(x.payload == written[x.rid] and x.payload["customer_id"] == 3 for x in found)
        by_sink = client.forward(f"table:{run.customers}:3", to=f"parquet:{run.sink}")
        assert [x.rid for x in by_sink] == [x.rid for x in found]
        # A window's row, a struct of times among its columns.
        windows = sink_rows(run.window_sink)
        event = client.backward(next(iter(windows)))[0]
        found = client.forward(event.rid, payload=True)
        assert found and all(x.payload == windows[x.rid] for x in found)
        assert set(found[0].payload["w"]) == {"start", "end"}


def test_a_target_no_plan_has_is_refused_with_the_datasets_there_are(run):
    from headwater.core.rid import kafka_rid
    from headwater.query.api import LineageClient

    output = next(iter(sink_rows(run.sink)))
    source = kafka_rid(run.topic, *run.coordinates[0])
    with LineageClient(run.config) as client:
        for ask in (lambda: client.backward(output, to="custmers"), lambda: client.forward(source, to="enriched_order"),
                    lambda: client.co_contributors(source, to="source", via="outptu")):
            with pytest.raises(LineageError) as refused:
                ask()
            said = str(refused.value)
            assert "no kept plan has a dataset" in said and "enriched_orders" in said and "customers" in said
            assert f"kafka:{run.topic}" in said
        assert "via is source" in said
        # Every name a row's dataset has is taken: the table's, the topic's, the query's, its state's.
        assert client.backward(output, to="customers") and client.backward(output, to=f"kafka:{run.topic}")
        assert client.forward(source, to="enriched_orders")
        assert client.backward(next(iter(sink_rows(run.window_sink))), to="Aggregate#0", depth=1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_payloads_with_the_broker_away_fail_in_seconds_naming_it(run):
    from headwater.query.api import LineageClient

    away = run.config.with_overrides(bootstrap=f"127.0.0.1:{free_port()}")
    output = next(iter(sink_rows(run.sink)))
    with LineageClient(away, backend="csprov") as client:
        started = time.monotonic()
        with pytest.raises(LineageError) as refused:
            client.backward(output, payload=True)
        assert time.monotonic() - started < 6.0
        assert away.bootstrap in str(refused.value) and "did not answer" in str(refused.value)
        # The lineage alone needs no broker; neither do the sink rows of a forward answer.
        assert len(client.backward(output)) == 2
        found = client.forward(f"table:{run.customers}:3", payload=True)
        assert found and all("error" not in x.payload for x in found)


def test_a_sink_row_is_read_from_its_batches_files_else_from_the_whole_sink(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from headwater.query.payload import sink_files, sink_row

    (tmp_path / "out" / "day=2").mkdir(parents=True)
    first, second = tmp_path / "out" / "part-0.parquet", tmp_path / "out" / "day=2" / "part-1.parquet"
    pq.write_table(pa.table({"id": [1, 2], "at": pa.array([0, 10**6], pa.timestamp("us", "UTC")),
                             "_hw_rid": [11, 12]}), first)
    pq.write_table(pa.table({"id": [3], "at": pa.array([2 * 10**6], pa.timestamp("us", "UTC")), "_hw_rid": [13]}),
                   second)
    sink = f"parquet:file://{tmp_path}/out"
    assert sink_files(sink, {0: [f"file:{first}"], 1: [str(tmp_path / "gone.parquet")]}) == [str(first)]
    assert sink_row(sink, 12, [str(first)]) == {"id": 2, "at": "1970-01-01T00:00:01+00:00"}
    # Not in the files given: the whole sink, its partition columns included.
    assert sink_row(sink, 13, [str(first)]) == {"id": 3, "at": "1970-01-01T00:00:02+00:00", "day": 2}
    assert "no row of" in sink_row(sink, 99, [])["error"]
    assert "only file sinks" in sink_row("table:orders", 1, [])["error"]
    pq.write_table(pa.table({"id": [1]}), tmp_path / "plain.parquet")
    assert "no _hw_rid column" in sink_row(f"parquet:{tmp_path}", 1, [str(tmp_path / "plain.parquet")])["error"]
