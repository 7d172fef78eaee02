import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from headwater.capture import UnsupportedPlanError
from headwater.capture.rewrite import thread_rids
from headwater.capture.spark_plan import plan_ir
from headwater.core.plan import build, column_lineage, column_masks
from headwater.demo import orders as data
from headwater.demo.pipeline import enriched_orders


def attr(name, i):
    return {"name": name, "expr_id": i, "dtype": "bigint"}


def ref(i):
    return {"class": "org.apache.spark.sql.catalyst.expressions.AttributeReference", "exprId": {"id": i}}


def alias(i):
    return {"class": "org.apache.spark.sql.catalyst.expressions.Alias", "exprId": {"id": i}}


def node(cls, output, children=0, streaming=True, **fields):
    return {"spark_class": cls, "num_children": children, "streaming": streaming, "output": output,
            "fields": fields, "location": None}


def test_ir_from_records_classifies_folds_static_subtrees_and_masks_columns():
    # Project[a, c = b + d] <- Join <- (stream source[a, b], static Filter <- relation[d])
    raw = [
        node("Project", [attr("a", 1), attr("c", 9)], 1,
             projectList=[[ref(1)], [alias(9), {"class": "Add"}, ref(2), ref(4)]]),
        node("Join", [attr("a", 1), attr("b", 2), attr("d", 4)], 2,
             joinType={"object": "org.apache.spark.sql.catalyst.plans.Inner$"}),
        node("StreamingRelationV2", [attr("a", 1), attr("b", 2)]),
        node("SubqueryAlias", [attr("d", 4)], 1, streaming=False, identifier={"name": "dims"}),
        node("Filter", [attr("d", 4)], 1, streaming=False),
        node("LocalRelation", [attr("d", 4)], streaming=False),
    ]
    ir = build(raw)
    assert [n.kind for n in ir.walk()] == ["Project", "Join", "Source", "Source"]
    stream, static = ir.sources()
    assert stream.detail["source"] == "stream"
    assert static.detail["source"] == "static" and static.detail["name"] == "dims"
    assert ir.children[0].detail["join_type"] == "inner"
    # a comes only from the stream; c = b + d from both.
    assert column_masks(ir) == {stream.id: 0b11, static.id: 0b10}
    assert column_lineage(ir) == {stream.id: [["a"], ["b"]], static.id: [[], ["d"]]}


def test_a_static_table_is_known_by_where_it_lives():
    def static_of(*relations):
        raw = [node("Join", [attr("a", 1)], 2), node("StreamingRelationV2", [attr("a", 1)]),
               node("SubqueryAlias", [attr("d", 4)], 1, streaming=False, identifier={"name": "sites"})]
        if len(relations) > 1:
            raw.append(node("Join", [attr("d", 4)], len(relations), streaming=False))
        for location in relations:
            raw.append({**node("LogicalRelation", [attr("d", 4)], streaming=False), "location": location})
        return build(raw).sources()[1].detail

    v1 = {"paths": ["file:/data/v1/sites.parquet"], "format": "parquet"}
    catalog = {"paths": ["file:/warehouse/sites"], "format": "parquet", "table": "spark_catalog.prod.sites"}
    assert (static_of(v1)["name"], static_of(v1)["table"]) == ("sites", "file:/data/v1/sites.parquet")
    assert static_of(catalog)["table"] == "catalog:spark_catalog.prod.sites"  # by name, wherever its files move
    assert static_of(catalog, v1)["table"] == "catalog:spark_catalog.prod.sites,file:/data/v1/sites.parquet"
    assert static_of(None)["table"] is None  # rows made in memory: known within their query only
    assert static_of(v1)["locations"] == [v1] and static_of(catalog, v1)["locations"] == [catalog, v1]


def test_union_columns_derive_from_every_branch():
    # Union[x] <- (Project[x = a * 2] <- stream[a], stream[b])
    raw = [
        node("Union", [attr("x", 5)], 2),
        node("Project", [attr("x", 5)], 1, projectList=[[alias(5), {"class": "Multiply"}, ref(1)]]),
        node("StreamingRelationV2", [attr("a", 1)]),
        node("StreamingRelationV2", [attr("b", 2)]),
    ]
    ir = build(raw)
    first, second = ir.sources()
    assert column_masks(ir) == {first.id: 1, second.id: 1}
    assert column_lineage(ir) == {first.id: [["a"]], second.id: [["b"]]}


def test_ir_rejects_records_that_are_not_one_tree():
    with pytest.raises(ValueError):
        build([node("Filter", [], 1)])
    with pytest.raises(ValueError):
        build([node("LocalRelation", []), node("LocalRelation", [])])


@pytest.fixture
def demo_df(spark, tmp_path):
    path = tmp_path / "customers.parquet"
    pq.write_table(pa.Table.from_pylist(data.customers()), path)
    return enriched_orders(spark, "127.0.0.1:1", "orders", str(path))


def test_demo_plan_ir_and_attribute_masks(demo_df):
    ir, _ = plan_ir(demo_df)
    kafka, customers = ir.sources()
    assert kafka.detail["source"] == "kafka"
    assert customers.detail["source"] == "static" and customers.detail["name"] == "customers"
    assert customers.detail["location"]["format"] == "parquet"
    assert [a.name for a in ir.output] == ["order_id", "customer_id", "name", "region", "amount_eur", "event_time"]
    # order_id, customer_id (the USING key comes from the stream side), amount_eur and
    # event_time derive from the Kafka value; name and region from customers.
    assert column_masks(ir) == {kafka.id: 0b110011, customers.id: 0b001100}


def test_threaded_plan_keeps_user_columns_and_adds_one_struct_per_source(demo_df):
    threaded = thread_rids(demo_df, {"customers": ("customer_id",)})
    assert threaded.df.columns == demo_df.columns + [s.column for s in threaded.sources]
    assert [s.source for s in threaded.sources] == ["kafka", "static"]
    assert threaded.df.isStreaming


def test_unsupported_operators_fail_clearly_naming_the_node_and_why(demo_df, spark):
    """What is refused says why Spark's semantics put it out of reach, naming the node and the black-box way."""
    static = spark.createDataFrame([(1,)], "customer_id long")
    ranked = F.row_number().over(Window.partitionBy("customer_id").orderBy("amount_eur"))
    refused = {
        "Intersect": (demo_df.select("customer_id").intersect(static), "Spark refuses INTERSECT over a stream"),
        "Except": (demo_df.select("customer_id").exceptAll(static), "EXCEPT ALL .* emits each row as many times"),
        "Window": (demo_df.withColumn("rank", ranked), "Spark refuses window functions"),
        "LateralJoin": (demo_df.lateralJoin(static.where(F.col("customer_id") == F.col("customer_id").outer())),
                        "reads rows of a table"),
    }
    for node, (df, why) in refused.items():
        with pytest.raises(UnsupportedPlanError, match=rf"{node} .*{why}.*black_boxes=\{{'{node}'\}}"):
            thread_rids(df)


def test_operators_that_keep_rows_pass_their_rids_through(demo_df, spark):
    """A limit, a sort, an observation, a hint, an index column: the rows are the child's, each with its rids."""
    kept = {"GlobalLimit": demo_df.limit(10), "Sort": demo_df.sortWithinPartitions("amount_eur"),
            "CollectMetrics": demo_df.observe("seen", F.count(F.lit(1))), "ResolvedHint": demo_df.hint("broadcast"),
            "AttachDistributedSequence": demo_df.zipWithIndex("ix")}
    for node, df in kept.items():
        threaded = thread_rids(df, {"customers": ("customer_id",)})
        assert node in {n.spark_class for n in threaded.ir.walk()}
        assert [s.source for s in threaded.sources] == ["kafka", "static"], node
        assert threaded.df.columns[: threaded.user_columns] == df.columns


def test_black_boxes_become_placeholders_with_their_inputs_on_a_second_branch(demo_df):
    boxed = demo_df.mapInPandas(lambda frames: frames, demo_df.schema)
    threaded = thread_rids(boxed, {"customers": ("customer_id",)})
    (box,) = threaded.black_boxes
    assert box.dataset == f"MapInPandas#{box.node_id}" and not box.stateful
    assert [s.source for s in threaded.sources] == ["blackbox"]
    assert [s.source for s in threaded.inputs] == ["kafka", "static"]
    assert threaded.df.columns == demo_df.columns + [box.column, *box.inputs, "_hw_bb"]
    assert threaded.user_columns == len(demo_df.columns)


def test_declared_key_must_exist(demo_df):
    with pytest.raises(UnsupportedPlanError, match="declared key"):
        thread_rids(demo_df, {"customers": ("nope",)})


def test_semi_joins_that_cannot_be_traced_exactly_are_refused(demo_df, spark, tmp_path):
    stream_side = demo_df.select(demo_df.customer_id.alias("c"))
    with pytest.raises(UnsupportedPlanError, match="streaming right side"):
        thread_rids(demo_df.join(stream_side, demo_df.customer_id == stream_side.c, "left_semi"))
    path = tmp_path / "limits.parquet"
    pq.write_table(pa.table({"c": [1, 2], "cap": [10.0, 50.0]}), path)
    limits = spark.read.parquet(str(path))
    # Many right rows can match one left row with different caps: not traceable by key.
    above = demo_df.join(limits, (demo_df.customer_id == limits.c) & (demo_df.amount_eur > limits.cap), "left_semi")
    with pytest.raises(UnsupportedPlanError, match="equates each right-side column"):
        thread_rids(above)
    by_key = demo_df.join(limits, demo_df.customer_id == limits.c, "left_semi")
    threaded = thread_rids(by_key)
    assert threaded.df.columns[: len(demo_df.columns)] == demo_df.columns
    assert [(s.source, s.name) for s in threaded.sources] == [("kafka", None), ("static", "customers"),
                                                              ("static", "limits")]
    assert threaded.sources[-1].table == f"file:{path}" and threaded.sources[-1].dataset == f"table:file:{path}"
    # Every customers row that matched, as a list: the semi join's right-side lineage.
    assert dict(threaded.df.dtypes)[threaded.sources[-1].column].startswith("array<struct<rid:bigint")
