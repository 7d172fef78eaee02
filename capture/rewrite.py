"""Threading rid columns from every source of a plan to its sink (Perm/Smoke style).

Each source gets one struct column ``_hw_src_<node id>`` holding its rid and
coordinates, added right above the source; every operator above passes it on:
filters and aliases unchanged, projections by appending it, joins by keeping both
sides' (a semi or anti join only the left's). The user's own expressions are never
re-derived: the rewritten plan is the analyzed plan with columns added, so exprIds
and semantics stay as the user wrote them.

Operators not handled here raise ``UnsupportedPlanError`` naming the node, rather than
produce wrong edges.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, _parse_datatype_json_string

from headwater.core import rid as rids
from headwater.core.plan import PlanNode

from .spark_plan import Jvm, analyzed, plan_ir

SOURCE_PREFIX = "_hw_src_"
RID_COLUMN = "_hw_rid"

# Operators whose output is their child's output plus, at most, new columns: the rid
# columns pass through them as they are. Deduplicate keeps one row per key; its output
# row derives from that row, whose values it is.
_PASS_THROUGH = {"Filter", "Alias", "EventTimeWatermark", "Generate", "Deduplicate"}
# Join types traced by carrying rid columns through the join. An anti join's output
# derives from its left row alone: no right row contributed to it. A semi join's output
# also derives from the right rows that matched, which its output cannot carry.
_JOINS = {"inner", "cross", "leftouter", "rightouter", "fullouter", "leftanti"}
_JOINS_KEEPING_LEFT_ONLY = {"leftanti"}


class UnsupportedPlanError(ValueError):
    """The plan holds an operator capture cannot yet trace exactly."""

    def __init__(self, node: PlanNode, reason: str):
        self.node = node
        super().__init__(
            f"cannot trace plan node {node.spark_class} (#{node.id}, {node.kind}): {reason}. "
            f"Rewrite the query without it, or mark it a black box (superset lineage) once "
            f"black boxes are supported for it."
        )


@dataclass(frozen=True)
class TracedSource:
    """One source of a traced plan, as the per-batch hook needs it."""

    node_id: int
    column: str  # the struct column threaded to the sink
    source: str  # kafka | static
    dataset: str | None  # static table name; Kafka rows are named by their topic
    key: tuple[str, ...]  # declared key columns of a static table, empty for a content hash
    location: dict | None  # {"paths": [...], "format": ...} of a file-backed table

    def to_dict(self) -> dict:
        return {**self.__dict__, "key": list(self.key)}


def _static_key(df: DataFrame, key: tuple[str, ...]) -> Column:
    texts = [F.col(f"`{k}`").cast("string") for k in key]
    return texts[0] if len(texts) == 1 else F.concat_ws(rids.KEY_SEPARATOR, *texts)


def source_column(df: DataFrame, node: PlanNode, keys: dict[str, tuple[str, ...]]) -> tuple[Column, TracedSource]:
    """The ``_hw_src_<id>`` struct for rows of source ``node`` (a DataFrame over it)."""
    name = f"{SOURCE_PREFIX}{node.id}"
    kind = node.detail.get("source")
    if kind == "kafka":
        rid = F.xxhash64(F.lit(rids.KAFKA), F.col("topic"), F.col("partition"), F.col("offset"))
        struct = F.struct(rid.alias("rid"), F.col("topic"), F.col("partition"), F.col("offset"))
        return struct.alias(name), TracedSource(node.id, name, "kafka", None, (), None)
    if kind == "static":
        table = node.detail["name"]
        key = tuple(keys.get(table, ()))
        missing = [k for k in key if k not in df.columns]
        if missing:
            raise UnsupportedPlanError(node, f"declared key {missing} of table {table!r} is not among its columns {df.columns}")
        if key:
            text = _static_key(df, key)
            rid = F.xxhash64(F.lit(rids.TABLE), F.lit(table), text)
        else:
            text = F.lit(None).cast("string")
            rid = F.xxhash64(F.lit(rids.TABLE), F.lit(table), *[F.col(f"`{c}`") for c in df.columns])
        struct = F.struct(rid.alias("rid"), text.alias("key"))
        return struct.alias(name), TracedSource(node.id, name, "static", table, key, node.detail.get("location"))
    raise UnsupportedPlanError(
        node, "only Kafka-shaped stream sources (topic, partition, offset columns) and static tables are traced so far"
    )


def _null_struct(jvm: Jvm, plan, like):
    """``CAST(NULL AS <like's type>) AS <like's name>`` as a Catalyst named expression."""
    dtype = _parse_datatype_json_string(like.dataType().json())
    helper = jvm.dataframe(plan).select(F.lit(None).cast(dtype).alias(like.name()))
    return Jvm.items(analyzed(helper).projectList())[0]


def union(jvm: Jvm, original, node: PlanNode, rewritten: list):
    """A Union whose branches all carry every branch's rid columns, null where absent.

    Union is positional: each branch is projected to its user columns followed by
    the rid columns of all branches in one order.
    """
    every = [attr for _, attrs in rewritten for attr in attrs]
    children = []
    for plan, attrs in rewritten:
        own = {a.exprId().id() for a in attrs}
        columns = _user_attrs(plan, attrs)
        columns += [a if a.exprId().id() in own else _null_struct(jvm, plan, a) for a in every]
        children.append(jvm.project(columns, plan))
    new = jvm.with_children(original, children)
    return new, Jvm.items(new.output())[len(node.output):]


def aggregate(jvm: Jvm, original, plan, attrs: list):
    """The Aggregate plus, per source, the sorted list of its rows' rid structs (Smoke's rid arrays).

    Spark's own aggregation then decides which input rows an emitted group holds,
    across micro-batches and after late data is dropped, so the list is exact. Sorting
    keeps a retried batch's output rids the same.
    """
    columns = []
    for attr in attrs:
        collected = F.collect_list(F.col(attr.name()))
        if isinstance(_parse_datatype_json_string(attr.dataType().json()), ArrayType):
            collected = F.flatten(collected)  # an aggregate over an aggregate's rid lists
        columns.append(F.array_sort(collected).alias(attr.name()))
    helper = analyzed(jvm.dataframe(plan).agg(*columns))
    extra = Jvm.items(helper.aggregateExpressions())
    new = jvm.aggregate(original, Jvm.items(original.aggregateExpressions()) + extra, plan)
    return new, Jvm.items(new.output())[-len(extra):] if extra else []


def _user_attrs(plan, rid_attrs: list) -> list:
    """``plan``'s output without its rid columns, wherever an operator put them."""
    rid_ids = {a.exprId().id() for a in rid_attrs}
    return [a for a in Jvm.items(plan.output()) if a.exprId().id() not in rid_ids]


@dataclass(frozen=True)
class Threaded:
    df: DataFrame  # the user's DataFrame plus one ``_hw_src_<id>`` column per source
    ir: PlanNode
    sources: list[TracedSource]


def thread_rids(df: DataFrame, keys: dict[str, tuple[str, ...]] | None = None) -> Threaded:
    keys = keys or {}
    clash = [c for c in df.columns if c == RID_COLUMN or c.startswith(SOURCE_PREFIX)]
    if clash:
        raise ValueError(f"columns {clash} clash with headwater's own; rename them")
    jvm = Jvm(df.sparkSession)
    ir, jnodes = plan_ir(df)
    traced: list[TracedSource] = []

    def rewrite(node: PlanNode):
        """(new JVM plan, the rid attributes it outputs) for the subtree at ``node``."""
        original = jnodes[node.id]
        if node.kind == "Source":
            source_df = jvm.dataframe(original)
            column, spec = source_column(source_df, node, keys)
            traced.append(spec)
            plan = analyzed(source_df.select("*", column))
            return plan, [Jvm.items(plan.output())[-1]]
        if node.kind not in _PASS_THROUGH | {"Project", "Join", "Union", "Aggregate", "Expand"}:
            raise UnsupportedPlanError(node, f"{node.kind} operators are not traced yet")
        if node.kind == "Join" and node.detail["join_type"] not in _JOINS:
            raise UnsupportedPlanError(
                node, f"{node.detail['join_type']} joins are not traced yet (the matching right rows belong to "
                      f"the lineage); where the right side has at most one match per row, an inner join is traced"
            )
        rewritten = [rewrite(child) for child in node.children]
        if node.kind == "Union":
            return union(jvm, original, node, rewritten)
        if node.kind == "Aggregate":
            return aggregate(jvm, original, *rewritten[0])
        if node.kind == "Expand":
            plan, attrs = rewritten[0]
            projections = [Jvm.items(p) + attrs for p in Jvm.items(original.projections())]
            return jvm.expand(projections, Jvm.items(original.output()) + attrs, plan), attrs
        children = [plan for plan, _ in rewritten]
        if node.kind == "Join" and node.detail["join_type"] in _JOINS_KEEPING_LEFT_ONLY:
            rid_attrs = rewritten[0][1]
        else:
            rid_attrs = [a for _, attrs in rewritten for a in attrs]
        if node.kind == "Project":
            return jvm.project(Jvm.items(original.projectList()) + rid_attrs, children[0]), rid_attrs
        return jvm.with_children(original, children), rid_attrs

    plan, rid_attrs = rewrite(ir)
    # The sink sees the user's columns in the user's order, then the rid columns.
    plan = jvm.project(_user_attrs(plan, rid_attrs) + rid_attrs, plan)
    # A source whose rows cannot reach the sink (the right side of an anti join) has no
    # rid column there and no edges.
    reaching = {a.name() for a in rid_attrs}
    sources = sorted((s for s in traced if s.column in reaching), key=lambda s: s.node_id)
    return Threaded(jvm.dataframe(plan), ir, sources)
