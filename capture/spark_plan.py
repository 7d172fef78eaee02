"""Reading and rebuilding Spark's analyzed logical plans through py4j.

The only module that touches Catalyst objects; everything it reads becomes plain
records for ``headwater.core.plan``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from py4j.java_collections import ListConverter
from pyspark.sql import Column, DataFrame, SparkSession

from headwater.adapters import spark_lines
from headwater.core.plan import PlanNode, RawAttr, RawNode, build

if TYPE_CHECKING:
    from py4j.java_gateway import JavaGateway, JavaObject, JVMView

_NO_JVM = "this SparkSession has no JVM: headwater traces a classic session of a running SparkContext"


def session_jvm(spark: SparkSession) -> JVMView:
    """``spark``'s py4j view of its JVM. pyspark types it Optional (it copies SparkContext's class attribute,
    None until the first SparkContext starts), but every session has one."""
    jvm = spark._jvm
    if jvm is None:
        raise RuntimeError(_NO_JVM)
    return jvm


def session_gateway(spark: SparkSession) -> JavaGateway:
    """``spark``'s py4j gateway, Optional in pyspark's types as ``session_jvm``'s view is, and as surely set."""
    gateway = spark.sparkContext._gateway
    if gateway is None:
        raise RuntimeError(_NO_JVM)
    return gateway


class Jvm:
    """py4j access to Catalyst for one SparkSession."""

    def __init__(self, spark: SparkSession):
        self.spark = spark
        self.jvm = session_jvm(spark)
        self._client = session_gateway(spark)._gateway_client
        self.line = spark_lines.running(spark)

    def seq(self, items: list):
        return self.line.scala_seq(self.jvm, ListConverter().convert(items, self._client))

    @staticmethod
    def items(scala_seq) -> list:
        return [scala_seq.apply(i) for i in range(scala_seq.size())]

    @staticmethod
    def mapping(scala_map) -> dict:
        """A Scala map as a dict."""
        found = {}
        entries = scala_map.iterator()
        while entries.hasNext():
            entry = entries.next()
            found[entry._1()] = entry._2()
        return found

    def dataframe(self, plan) -> DataFrame:
        return DataFrame(self.line.dataset_of(self.jvm, self.spark._jsparkSession, plan), self.spark)

    def column(self, expression) -> Column:
        """A Catalyst expression as a PySpark Column."""
        return Column(self.line.column_of(self.jvm, expression))

    def project(self, named_expressions: list, child):
        return self.jvm.org.apache.spark.sql.catalyst.plans.logical.Project(self.seq(named_expressions), child)

    def aggregate(self, original, aggregate_expressions: list, child, grouping: list | None = None):
        """An Aggregate like ``original`` (its grouping, unless given, and hint) over ``child``."""
        groups = original.groupingExpressions() if grouping is None else self.seq(grouping)
        return self.line.aggregate(self.jvm, original, groups, self.seq(aggregate_expressions), child)

    def equi_join_keys(self, join) -> tuple[list, list, JavaObject | None] | None:
        """(left keys, right keys, other condition or None) of an equi-join, else None."""
        found = self.jvm.org.apache.spark.sql.catalyst.planning.ExtractEquiJoinKeys.unapply(join)
        if found.isEmpty():
            return None
        parts = found.get()
        other = parts._4()
        return self.items(parts._2()), self.items(parts._3()), other.get() if other.isDefined() else None

    def inner_join(self, original, left, right):
        """``original`` (condition and hint kept) as an inner join of ``left`` and ``right``."""
        inner = self.jvm.org.apache.spark.sql.catalyst.plans.JoinType.apply("inner")
        return original.copy(left, right, inner, original.condition(), original.hint())

    def expand(self, projections: list[list], output: list, child):
        return self.jvm.org.apache.spark.sql.catalyst.plans.logical.Expand(
            self.seq([self.seq(p) for p in projections]), self.seq(output), child)

    def with_children(self, plan, children: list):
        return plan.withNewChildren(self.seq(children))


def analyzed(df: DataFrame):
    return df._jdf.queryExecution().analyzed()


def preorder(plan) -> list:
    """The JVM plan nodes in pre-order: index i is IR node id i."""
    found = [plan]
    for child in Jvm.items(plan.children()):
        found.extend(preorder(child))
    return found


def raw_node(node) -> RawNode:
    output: list[RawAttr] = [
        {"name": a.name(), "expr_id": a.exprId().id(), "dtype": a.dataType().simpleString()}
        for a in Jvm.items(node.output())
    ]
    try:
        fields = json.loads(node.toJSON())[0]
    except Exception:  # some nodes hold values Spark cannot render as JSON
        fields = {"class": node.getClass().getName()}
    if fields.get("projections", ()) is None:  # an Expand's: Spark writes a list of lists of expressions as null
        fields["projections"] = [[json.loads(e.toJSON()) for e in Jvm.items(projection)]
                                 for projection in Jvm.items(node.projections())]
    return {
        "spark_class": node.getClass().getSimpleName(),
        "location": _file_location(node),
        "num_children": node.children().size(),
        "streaming": bool(node.isStreaming()),
        "output": output,
        "fields": fields,
    }


def _file_location(node) -> dict | None:
    """Where a relation's rows live (Spark's JSON leaves it out): a file-backed relation's
    root paths, format and reader options; a catalog table's qualified name as ``table``; a Kafka stream's
    brokers and topics as ``kafka``."""
    cls = node.getClass().getSimpleName()
    # The relation's own columns and types (partition columns last), to read its files as Spark does.
    columns = [[a.name(), a.dataType().simpleString()] for a in Jvm.items(node.output())]
    if cls == "StreamingRelation":  # a file stream source
        source = node.dataSource()
        path = source.options().get("path")
        paths = [path.get()] if path.isDefined() else [p for p in Jvm.items(source.paths())]
        return {"paths": paths, "format": source.className().lower(), "options": _options(source.options()),
                "columns": columns} if paths else None
    if cls == "StreamingRelationV2" and str(node.sourceName()).lower() == "kafka":
        return {"kafka": _kafka_location(node.extraOptions())}
    if cls == "HiveTableRelation":
        return {"table": node.tableMeta().identifier().unquotedString()}
    if cls == "DataSourceV2Relation":
        identifier = node.identifier()
        if not identifier.isDefined():
            return None
        catalog = node.catalog()
        name = identifier.get().toString()
        return {"table": f"{catalog.get().name()}.{name}" if catalog.isDefined() else name}
    if cls != "LogicalRelation":
        return None
    catalog = node.catalogTable()
    table = {"table": catalog.get().identifier().unquotedString()} if catalog.isDefined() else {}
    relation = node.relation()
    if relation.getClass().getSimpleName() != "HadoopFsRelation":
        return table or None
    paths = [p.toString() for p in Jvm.items(relation.location().rootPaths())]
    return {"paths": paths, "format": relation.fileFormat().toString().lower(), "options": _options(relation.options()),
            "columns": columns, **table}


def _kafka_location(options) -> dict[str, str]:
    """A Kafka stream's brokers (``bootstrap``) and what it reads (``subscribe``, ``subscribePattern`` or
    ``assign``), from its reader's options (case-insensitive): never its other settings, which may hold secrets."""
    found = {"bootstrap": options.get("kafka.bootstrap.servers")}
    for name in ("subscribe", "subscribePattern", "assign"):
        found[name] = options.get(name)
    return {k: str(v) for k, v in found.items() if v is not None}


def _options(scala_map) -> dict[str, str]:
    """A reader's options (a Scala map), but the paths."""
    return {k: v for k, v in Jvm.mapping(scala_map).items() if k.lower() not in ("path", "paths")}


def plan_ir(df: DataFrame) -> tuple[PlanNode, list]:
    """The IR of ``df``'s analyzed plan and the JVM nodes indexed by IR node id."""
    nodes = preorder(analyzed(df))
    return build([raw_node(n) for n in nodes]), nodes


def plan_records(plan) -> list[dict]:
    """A JVM plan as the records the log-only fallback reads (``headwater.spark.operators``):
    pre-order raw nodes, each with the records of the scalar subqueries its expressions hold."""
    records = []
    for node in preorder(plan):
        record = dict(raw_node(node))
        subqueries = {}
        for expression in Jvm.items(node.expressions()):
            for scalar in _scalar_subqueries(expression):
                subqueries[str(scalar.exprId().id())] = plan_records(scalar.plan())
        if subqueries:
            record["subqueries"] = subqueries
        records.append(record)
    return records


def _scalar_subqueries(expression) -> list:
    found, stack = [], [expression]
    while stack:
        e = stack.pop()
        if e.getClass().getSimpleName() == "ScalarSubquery":
            found.append(e)
        stack.extend(Jvm.items(e.children()))
    return found


# Optimizer settings for the plan the log-only fallback reads: no rewrites that hide values
# (DecimalAggregates sums unscaled longs; long IN lists become an InSet Spark's JSON leaves
# empty) and no runtime filters. The plan means the same; it is only easier to reason about.
FALLBACK_CONF = {
    "spark.sql.optimizer.excludedRules": "org.apache.spark.sql.catalyst.optimizer.DecimalAggregates",
    "spark.sql.optimizer.inSetConversionThreshold": "1000000",
    "spark.sql.optimizer.runtime.bloomFilter.enabled": "false",
    "spark.sql.optimizer.runtimeFilter.semiJoinReduction.enabled": "false",
}


def optimized_records(df: DataFrame) -> list[dict]:
    """``plan_records`` of ``df``'s analyzed plan optimized afresh under ``FALLBACK_CONF``
    (subqueries rewritten into joins where Spark can); the session's settings are restored."""
    conf = df.sparkSession.conf
    saved = {key: conf.get(key, None) for key in FALLBACK_CONF}
    try:
        for key, value in FALLBACK_CONF.items():
            conf.set(key, value)
        # The session's optimizer, not a QueryExecution: a streaming plan may not be planned
        # as a batch, and Spark's micro-batches run these same rules over it.
        optimizer = df.sparkSession._jsparkSession.sessionState().optimizer()
        return plan_records(optimizer.execute(analyzed(df)))
    finally:
        for key, before in saved.items():
            if before is None:
                conf.unset(key)
            else:
                conf.set(key, before)


# Flat Spark types whose hash ``headwater.core.rid`` reproduces: a black box's output row is named by the
# hash of these of its columns (``rewrite.black_box_source``), which the query tier recomputes when it
# re-runs the black box's function (``headwater.query.narrow``).
_DIGESTED = ("boolean", "tinyint", "smallint", "int", "bigint", "date", "timestamp", "timestamp_ntz", "float",
             "double", "string", "binary")


def digested(dtype: str) -> bool:
    """Whether a column of Spark type ``dtype`` (``simpleString``) goes into a black box output row's digest."""
    return dtype in _DIGESTED or (dtype.startswith("decimal(") and dtype.endswith(")"))


def python_function(spark: SparkSession, node) -> dict | None:
    """What re-running a black box's user function needs, read off its plan node, or None for a node
    that runs no Python function (a limit named a black box, Scala's mapPartitions…) or reads more than
    one child (a cogroup, transformWithState with its initial state): re-running those is not modelled.

    ``command`` is the function as PySpark pickled it into the plan (cloudpickle of ``(function,
    return type)``); ``eval_type`` PySpark's ``PythonEvalType``; ``grouping`` the positions in the
    child's output of the key's columns (``applyInPandas``, ``applyInPandasWithState``), ``data`` those of
    the columns the function gets; ``input`` the child's schema, ``output`` the node's, ``state`` the
    state's schema of a stateful one, with its ``output_mode`` and ``timeout``; ``timezone`` the session's.
    """
    try:
        expression = node.functionExpr()
    except Exception:
        return None
    if expression.getClass().getSimpleName() != "PythonUDF" or node.children().size() != 1:
        return None
    command = expression.func().command()
    data = bytes(command.toArray(session_jvm(spark).scala.reflect.ClassTag.Byte()))
    child = [a.exprId().id() for a in Jvm.items(node.child().output())]
    grouping = [child.index(a.exprId().id()) for a in Jvm.items(node.groupingAttributes())] \
        if _has(node, "groupingAttributes") else []
    # applyInPandas's child puts the grouping columns first and hands the function the rest; the stateful
    # one hands it every column of its child, the key being some of them.
    columns = list(range(len(grouping), len(child))) if grouping and not _has(node, "stateType") \
        else list(range(len(child)))
    found = {
        "eval_type": int(expression.evalType()),
        "command": data,
        "grouping": grouping,  # positions in the child's output of the key's columns
        "data": columns,  # positions in the child's output of the columns the function gets
        "input": json.loads(node.child().schema().json()),
        "output": json.loads(node.schema().json()),
        "state": None, "output_mode": None, "timeout": None,
        "timezone": spark.conf.get("spark.sql.session.timeZone"),  # how the worker converts timestamps
    }
    if _has(node, "stateType"):
        found["state"] = json.loads(node.stateType().json())
        found["output_mode"] = str(node.outputMode())
        found["timeout"] = str(node.timeout())
    return found


def _has(node, method: str) -> bool:
    try:
        getattr(node, method)()
        return True
    except Exception:
        return False
