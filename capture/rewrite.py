"""Threading rid columns from every source of a plan to its sink (Perm/Smoke style).

Each source gets one struct column ``_hw_src_<node id>`` holding its rid and
coordinates, added right above the source; every operator above passes it on:
filters and aliases unchanged, projections by appending it, joins by keeping both
sides' (an anti join only the left's; a semi join the left's and the list of right rows
it matched). The user's own expressions are never
re-derived: the rewritten plan is the analyzed plan with columns added, so exprIds
and semantics stay as the user wrote them.

A black box (mapInPandas, applyInPandas, applyInPandasWithState …, or any node the
caller names) cannot carry columns through the user's code. Its output gets a
placeholder column instead, and the rows going into it reach the sink by a second
branch: the root becomes ``Union(user rows, black box input rows)``, the latter marked
by ``_hw_bb`` (the black box's node id) and null in every user column. The per-batch
hook splits them again and links inputs and outputs through the black box's state node
with superset edges. The placeholder holds the black box's output row's digest (a hash of
its columns), which names that row in the graph, so that the query tier can narrow the
superset by re-running the user's function (``headwater.query.narrow``).

A stateful aggregate gets state nodes (DESIGN §2): one per group and input column, named
by its state key ``xxhash64(STATE, query, op, input, key values…)``. Above the aggregate,
each input's rid column is replaced by a struct of that key, an output expression of the
group's key values, so Spark's state holds nothing of headwater's. Right below it, a column
(``ENTERING_COLUMN``, kept by a filter and then dropped) hands the rows entering the aggregate (their rid
columns and state keys, nothing of the user's columns) to ``entering``, which journals each one's edge to
its group's state node from the task, once, in the batch it enters (``state_nodes.py``).

Operators not handled here raise ``UnsupportedPlanError`` naming the node, rather than
produce wrong edges.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, _parse_datatype_json_string

from headwater.core import rid as rids
from headwater.core.plan import PlanNode, column_masks, state_dataset
from headwater.spark.catalyst import STATEFUL_BLACK_BOXES

from .spark_plan import Jvm, analyzed, digested, plan_ir, preorder, python_function, session_jvm

SOURCE_PREFIX = "_hw_src_"
RID_COLUMN = "_hw_rid"
BLACK_BOX_MARKER = "_hw_bb"
ENTERING_COLUMN = "_hw_entering"  # below a stateful aggregate, true once its journal filter has journaled the row

# Operators whose output rows are rows of their child, kept, dropped, reordered or moved, with at most
# new columns: the rid columns pass through them as they are. Deduplicate keeps one row per key, its
# output row derives from that row, whose values it is; a limit, a sample or a sort keeps whichever rows
# Spark keeps, each with its own rids; an observation (CollectMetrics) or a hint changes no row.
_PASS_THROUGH = {"Filter", "Alias", "EventTimeWatermark", "Generate", "Deduplicate", "Repartition", "Sort", "Limit",
                 "Sample", "Observe", "Hint", "Sequence"}
_TRACED = _PASS_THROUGH | {"Project", "Join", "Union", "Aggregate", "Expand", "LateralJoin"}
# Why an operator is not traced, where it is not: what Spark does with it over a stream.
_REFUSED = {
    "Intersect": "Spark refuses INTERSECT over a stream (its UnsupportedOperationChecker), so no streaming query "
                 "holds one; the same query untraced fails at start",
    "Except": "EXCEPT ALL (exceptAll) emits each row as many times as its copies on the left outnumber those on the "
              "right, counted by Spark's RewriteExceptAll over a union of the stream and the static table, a plan "
              "Spark refuses to run as a stream once written out; subtract (EXCEPT DISTINCT) and a left anti join "
              "are traced",
    "Window": "Spark refuses window functions (over) on a stream other than time windows in an aggregation; the "
              "same query untraced fails at start",
}
# Join types traced by carrying rid columns through the join. An anti join's output
# derives from its left row alone: no right row contributed to it. A semi join's output
# also derives from the right rows that matched, which its output cannot carry: it is
# rewritten (``semi_join``).
_JOINS = {"inner", "cross", "leftouter", "rightouter", "fullouter", "leftanti", "leftsemi"}
_JOINS_KEEPING_LEFT_ONLY = {"leftanti"}


class UnsupportedPlanError(ValueError):
    """The plan holds an operator capture cannot yet trace exactly."""

    def __init__(self, node: PlanNode, reason: str):
        self.node = node
        super().__init__(
            f"cannot trace plan node {node.spark_class} (#{node.id}, {node.kind}): {reason}. "
            f"Rewrite the query without it, or trace it as a black box with superset lineage "
            f"(edges flagged exact=false): Tracer.trace(df, …, black_boxes={{'{node.spark_class}'}})"
        )


@dataclass(frozen=True)
class TracedSource:
    """One source of a traced plan, as the per-batch hook needs it."""

    node_id: int
    column: str  # the struct column threaded to the sink
    source: str  # kafka | file | rate | static | blackbox | state (an aggregate's groups)
    # static table (``table:<identity>``), black box or aggregate; Kafka and file rows are named by topic or path
    dataset: str | None
    key: tuple[str, ...]  # declared key columns of a static table, empty for a content hash
    location: dict | None  # {"paths": [...], "format": ..., "options": {...}} of a file-backed table or stream
    stateful: bool = False  # a black box whose outputs may derive from earlier batches' inputs
    hashed: tuple[str, ...] = ()  # a static table without a key: the columns its rows' rids hash, in order
    name: str | None = None  # a static table's short name (alias or file name), as ``keys`` names it
    table: str | None = None  # a static table's identity (``plan.static_table``): what its rids hash

    def to_dict(self) -> dict:
        return {**self.__dict__, "key": list(self.key), "hashed": list(self.hashed)}


def _static_key(df: DataFrame, key: tuple[str, ...]) -> Column:
    texts = [F.col(f"`{k}`").cast("string") for k in key]
    return texts[0] if len(texts) == 1 else F.concat_ws(rids.KEY_SEPARATOR, *texts)


def source_column(df: DataFrame, node: PlanNode, keys: dict[str, tuple[str, ...]],
                  query: str | None = None) -> tuple[Column, TracedSource]:
    """The ``_hw_src_<id>`` struct for rows of source ``node`` (a DataFrame over it) of query ``query``."""
    name = f"{SOURCE_PREFIX}{node.id}"
    kind = node.detail.get("source")
    if kind == "kafka":
        rid = F.xxhash64(F.lit(rids.KAFKA), F.col("topic"), F.col("partition"), F.col("offset"))
        struct = F.struct(rid.alias("rid"), F.col("topic"), F.col("partition"), F.col("offset"))
        return struct.alias(name), TracedSource(node.id, name, "kafka", None, (), None)
    if kind == "static":
        short = node.detail["name"]
        # Rows are named by where the table lives, so two tables of one name never share a rid.
        table = node.detail.get("table") or f"query:{query}/{short}#{node.id}"
        key = tuple(keys.get(short, ()))
        missing = [k for k in key if k not in df.columns]
        if missing:
            raise UnsupportedPlanError(node, f"declared key {missing} of table {short!r} is not among its columns "
                                             f"{df.columns}")
        if key:
            text = _static_key(df, key)
            rid = F.xxhash64(F.lit(rids.TABLE), F.lit(table), text)
        else:
            text = F.lit(None).cast("string")
            rid = F.xxhash64(F.lit(rids.TABLE), F.lit(table), *[F.col(f"`{c}`") for c in df.columns])
        struct = F.struct(rid.alias("rid"), text.alias("key"))
        return struct.alias(name), TracedSource(node.id, name, "static", rids.table_dataset(table), key,
                                                node.detail.get("location"), hashed=() if key else tuple(df.columns),
                                                name=short, table=table)
    if kind == "rate":
        rid = F.xxhash64(F.lit(rids.RATE), F.col("value"))
        struct = F.struct(rid.alias("rid"), F.col("value").cast("string").alias("key"))
        return struct.alias(name), TracedSource(node.id, name, "rate", "rate", (), None)
    if kind == "file":
        location = node.detail["location"]
        path = F.col("_metadata.file_path")
        if location["format"] == "parquet":
            position = F.col("_metadata.row_index")
            rid = F.xxhash64(F.lit(rids.FILE), path, position)
        else:
            # Spark gives no row position in JSON, CSV or text files: the row is named by
            # its file and content, which tells apart every row that differs.
            position = F.lit(None).cast("long")
            rid = F.xxhash64(F.lit(rids.FILE), path, *[F.col(f"`{c}`") for c in df.columns])
        struct = F.struct(rid.alias("rid"), path.alias("path"), position.alias("position"))
        return struct.alias(name), TracedSource(node.id, name, "file", None, (), location)
    raise UnsupportedPlanError(
        node, "only Kafka-shaped stream sources (topic, partition, offset columns), file and rate streams and "
              "static tables are traced so far"
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


WATERMARK_KEY = "spark.watermarkDelayMs"  # Spark's metadata key of an event-time column


@dataclass(frozen=True)
class StateOp:
    """A stateful aggregate of a traced plan: what its state nodes gather, and from where."""

    node_id: int
    dataset: str  # its state nodes' dataset: "Aggregate#<node id>"
    inputs: tuple[TracedSource, ...]  # the rid columns entering it, in the order ``entering`` gets them
    columns: tuple[str, ...]  # above it, the state key column standing for each input
    masks: tuple[int, ...]  # each input's attribute mask (``plan.column_masks`` of the source it comes from)
    late_key: int | None  # exprId of the grouping column whose watermark drops late rows; None: none is dropped

    def to_dict(self) -> dict:
        return {"node_id": self.node_id, "dataset": self.dataset, "inputs": [s.column for s in self.inputs],
                "columns": list(self.columns), "late_key": self.late_key}


# entering(op, frame, columns) -> a boolean Column over ``frame``, true for every row, that journals the state
# edges of the rows (``columns``: the state key of each input, then each input's rid struct, then the watermark
# column's value if the aggregate drops late rows) as a side effect.
Entering = Callable[[StateOp, DataFrame, list], Column]


def _late_column(jvm: Jvm, grouping: list) -> tuple[Column | None, int | None]:
    """The grouping column Spark drops late rows by (a window's end, or an event-time key), and its exprId."""
    for expression in grouping:
        if expression.getClass().getSimpleName() != "AttributeReference" or \
                not expression.metadata().contains(WATERMARK_KEY):
            continue
        column = jvm.column(expression)
        if expression.dataType().typeName() == "struct":
            column = column.getField("end")
        return column, expression.exprId().id()
    return None, None


def state_nodes(jvm: Jvm, original, node: PlanNode, plan, attrs: list, traced: dict[str, TracedSource],
                masks: dict[int, int], query: str | None, entering: Entering | None,
                drops_late: bool = True) -> tuple[object, list, StateOp]:
    """The Aggregate with a state key column per input rid column, and the filter below it; ``drops_late=False``
    where Spark drops no late row (complete mode): no watermark column then goes to the filter."""
    child = jvm.dataframe(plan)
    grouping = Jvm.items(original.groupingExpressions())
    keys_of = [jvm.column(g) for g in grouping]
    inputs = tuple(traced[a.name()] for a in attrs)
    columns = tuple(f"{SOURCE_PREFIX}{node.id}_{s.node_id}" for s in inputs)
    keys = [F.xxhash64(F.lit(rids.STATE), F.lit(query or ""), F.lit(node.id), F.lit(s.node_id), *keys_of)
            for s in inputs]
    late, late_key = _late_column(jvm, grouping) if drops_late else (None, None)
    op = StateOp(node.id, state_dataset("Aggregate", node.id), inputs, columns,
                 tuple(masks.get(s.node_id, -1) for s in inputs), late_key)
    if entering is not None:
        fields = keys + [F.col(a.name()) for a in attrs] + ([late] if late is not None else [])
        # The journal's call is a column of its own projection, and the filter reads only that column: a filter
        # whose condition held the call would be pushed by Spark's optimizer through the projection computing the
        # grouping keys (a window's struct), copying their expressions into it once per state key and for the
        # late column, a plan Spark plans and generates code for in every batch (capture/README, "The hot path").
        journaled = child.select("*", entering(op, child, fields).alias(ENTERING_COLUMN))
        plan = analyzed(journaled.where(F.col(ENTERING_COLUMN)).drop(ENTERING_COLUMN))
        child = jvm.dataframe(plan)
    helper = analyzed(child.groupBy(*keys_of).agg(*[F.struct(k.alias("rid")).alias(c) for k, c in zip(keys, columns)]))
    extra = Jvm.items(helper.aggregateExpressions())[-len(columns):]
    new = jvm.aggregate(original, Jvm.items(original.aggregateExpressions()) + extra, plan)
    for source, column in zip(inputs, columns):
        traced[column] = TracedSource(source.node_id, column, "state", op.dataset, (), None)
    return new, Jvm.items(new.output())[-len(extra):], op


def aggregate(jvm: Jvm, original, plan, attrs: list):
    """The Aggregate plus, per source, the sorted list of its rows' rid structs (Smoke's rid arrays).

    Spark's own aggregation then decides which input rows an emitted group holds,
    across micro-batches and after late data is dropped, so the list is exact. Sorting
    keeps a retried batch's output rids the same. Kept for aggregates whose groups merge
    (session windows), where a group has no key to name a state node by.
    """
    extra, _ = _rid_lists(jvm, plan, attrs)
    new = jvm.aggregate(original, Jvm.items(original.aggregateExpressions()) + extra, plan)
    return new, Jvm.items(new.output())[-len(extra):] if extra else []


def _merges_groups(aggregate) -> bool:
    """Whether an aggregate's groups merge across batches (session windows): no key names such a group."""
    return any(g.getClass().getSimpleName() == "AttributeReference" and g.metadata().contains("spark.sessionWindow")
               for g in Jvm.items(aggregate.groupingExpressions()))


def _rid_lists(jvm: Jvm, plan, attrs: list) -> tuple[list, object]:
    """Named expressions collecting, per rid column, the sorted list of a group's rid structs,
    and the helper Aggregate they were analyzed in."""
    columns = []
    for attr in attrs:
        collected = F.collect_list(F.col(attr.name()))
        if isinstance(_parse_datatype_json_string(attr.dataType().json()), ArrayType):
            collected = F.flatten(collected)  # an aggregate over an aggregate's rid lists
        columns.append(F.array_sort(collected).alias(attr.name()))
    helper = analyzed(jvm.dataframe(plan).agg(*columns))
    return Jvm.items(helper.aggregateExpressions()), helper


def semi_join(jvm: Jvm, original, node: PlanNode, left: tuple, right: tuple):
    """A left semi join with a static right side, as an inner join with the right rows grouped by key.

    The output row is its left row; its lineage also holds every right row that
    matched. Grouping the right side by its join keys, with the list of its rows' rid
    structs, makes exactly one right row match each left row that has a match, so an
    inner join keeps the semi join's rows and brings the matches' rids along. This holds
    when every right column the condition reads is equated to a left-side value.
    """
    if node.children[1].streaming:
        raise UnsupportedPlanError(node, "a left semi join with a streaming right side emits each left row once, from "
                                         "Spark's join state, when its first match arrives, and no column of the right "
                                         "rows that matched comes out of it, so their rids cannot reach the output; an "
                                         "inner join of the two streams is traced")
    keys = jvm.equi_join_keys(original)
    right_plan, right_attrs = right
    right_ids = {a.exprId().id() for a in Jvm.items(original.right().output())}
    if keys is not None:
        _, right_keys, other = keys
        key_ids = {k.exprId().id() for k in right_keys if k.getClass().getSimpleName() == "AttributeReference"}
        read = {a.exprId().id() for a in Jvm.items(other.references().toSeq())} if other is not None else set()
    if keys is None or len(key_ids) != len(right_keys) or (read & right_ids) - key_ids:
        raise UnsupportedPlanError(
            node, "a left semi join is traced when its condition equates each right-side column it reads with a "
                  "left-side value (e.g. df.join(dim, 'k', 'left_semi'))"
        )
    lists, helper = _rid_lists(jvm, right_plan, right_attrs)
    grouped = jvm.aggregate(helper, right_keys + lists, right_plan, grouping=right_keys)
    left_plan, left_attrs = left
    joined = jvm.inner_join(original, left_plan, grouped)
    list_attrs = Jvm.items(grouped.output())[len(right_keys):]
    rid_attrs = left_attrs + list_attrs
    return jvm.project(_user_attrs(left_plan, left_attrs) + rid_attrs, joined), rid_attrs


def _user_attrs(plan, rid_attrs: list) -> list:
    """``plan``'s output without its rid columns, wherever an operator put them."""
    rid_ids = {a.exprId().id() for a in rid_attrs}
    return [a for a in Jvm.items(plan.output()) if a.exprId().id() not in rid_ids]


@dataclass(frozen=True)
class BlackBox:
    """A black box of a traced plan: its state node's placeholder column and its inputs."""

    node_id: int
    column: str  # the placeholder struct standing for the black box in rows above it
    dataset: str  # its state node's dataset: "<Spark class>#<node id>"
    inputs: tuple[str, ...]  # rid columns of the rows going into it
    stateful: bool
    spark_class: str = ""
    digest: tuple[int, ...] = ()  # positions of the output columns its output rows' digest hashes
    function: dict | None = None  # ``spark_plan.python_function``: what re-running it needs; None: no Python

    def to_dict(self) -> dict:
        """As the plan record logs it (the function's bytes as base64: ``headwater.core.signing``)."""
        return {"node_id": self.node_id, "dataset": self.dataset, "spark_class": self.spark_class,
                "stateful": self.stateful, "inputs": list(self.inputs), "digest": list(self.digest)}


@dataclass(frozen=True)
class Threaded:
    df: DataFrame  # the user's DataFrame plus one ``_hw_src_<id>`` column per source (and ``_hw_bb``)
    ir: PlanNode
    sources: list[TracedSource]  # those whose rows reach the sink, black boxes included
    inputs: list[TracedSource]  # those whose rows go into a black box
    black_boxes: list[BlackBox]
    user_columns: int  # how many of df's columns are the user's
    state_ops: list[StateOp]  # stateful aggregates, whose groups are state nodes
    read: list[TracedSource]  # every source the plan reads (black boxes included), wherever its rows go


def digest_positions(node: PlanNode) -> tuple[int, ...]:
    """The black box's output columns its output rows' digest hashes: those whose hash ``rid`` reproduces."""
    return tuple(i for i, a in enumerate(node.output) if digested(a.dtype))


def black_box_source(jvm: Jvm, node: PlanNode, new_plan) -> tuple:
    """``new_plan`` plus the black box's placeholder struct column, and its TracedSource.

    The placeholder's ``rid`` is the digest of the black box's output row,
    ``xxhash64('bbout', dataset, c…)`` over ``digest_positions`` (``rid.box_output_digests``)."""
    name = f"{SOURCE_PREFIX}{node.id}"
    stateful = node.spark_class in STATEFUL_BLACK_BOXES
    dataset = state_dataset(node.spark_class, node.id)
    frame = jvm.dataframe(new_plan)
    columns = [frame[i] for i in range(len(frame.columns))]
    digest = F.xxhash64(F.lit(rids.BOX_OUTPUT), F.lit(dataset), *[columns[i] for i in digest_positions(node)])
    plan = analyzed(frame.select("*", F.struct(digest.alias("rid")).alias(name)))
    return plan, Jvm.items(plan.output())[-1], TracedSource(node.id, name, "blackbox", dataset, (), None, stateful)


def _with_black_box_inputs(jvm: Jvm, plan, rid_attrs: list, branches: list):
    """``Union(plan's rows, each black box's input rows)``: see the module docstring."""
    main = jvm.dataframe(plan)
    user_fields = main.schema.fields[: len(main.columns) - len(rid_attrs)]
    types = {f.name: f.dataType for f in main.schema.fields[len(user_fields):]}
    for _, branch_plan in branches:
        for f in jvm.dataframe(branch_plan).schema.fields:
            if f.name.startswith(SOURCE_PREFIX):
                types.setdefault(f.name, f.dataType)
    rid_names = list(types)

    def null(name, dtype):
        return F.lit(None).cast(dtype).alias(name)

    present = set(main.columns)
    union = main.select("*", *[null(n, types[n]) for n in rid_names if n not in present],
                        null(BLACK_BOX_MARKER, "int"))
    for node_id, branch_plan in branches:
        branch = jvm.dataframe(branch_plan)
        own = set(branch.columns)
        union = union.union(branch.select(
            *[null(f.name, f.dataType) for f in user_fields],
            *[F.col(n) if n in own else null(n, types[n]) for n in rid_names],
            F.lit(node_id).alias(BLACK_BOX_MARKER),
        ))
    return analyzed(union)


# Relations whose one row holds nothing of the user's data: a lateral subquery over one reads no table.
_NO_ROWS = {"OneRowRelation"}


def lateral_rows_unread(jvm: Jvm, lateral, node: PlanNode) -> None:
    """Refuse a lateral join whose subquery reads a table's rows: those rows contribute to the output, but live
    in Spark's LateralSubquery expression, which carries no rid column out. One that reads none (a table-valued
    function or a Python UDTF over the outer row, ``spark.tvf.explode(col.outer())``) makes each output row of
    its outer row alone, which passes its rids through."""
    subquery = lateral.right().plan()
    read = [n.getClass().getSimpleName() for n in preorder(subquery) if n.children().isEmpty()]
    tables = [name for name in read if name not in _NO_ROWS]
    if tables:
        names = ", ".join(sorted(set(tables)))
        raise UnsupportedPlanError(node, f"its lateral subquery reads rows of a table ({names}), which Spark "
                                         f"evaluates inside the LateralSubquery expression, out of reach of rid "
                                         f"columns; join the table to the stream instead")


def desugared(df: DataFrame) -> DataFrame:
    """``df`` with DISTINCT and EXCEPT DISTINCT written as Spark's optimizer writes them before it runs any
    query (``ReplaceExceptWithAntiJoin``, ``ReplaceDistinctWithAggregate``): a left anti join with null-safe
    equality on every column, and an aggregate grouping by every column. The rows are Spark's own; the
    lineage is then that of a join and of an aggregate's groups (state nodes over a stream)."""
    plan = analyzed(df)
    classes = {n.getClass().getSimpleName() for n in preorder(plan)}
    if not classes & {"Distinct", "Except"}:
        return df
    rules = session_jvm(df.sparkSession).org.apache.spark.sql.catalyst.optimizer
    plan = rules.ReplaceDistinctWithAggregate.apply(rules.ReplaceExceptWithAntiJoin.apply(plan))
    return Jvm(df.sparkSession).dataframe(plan)


def thread_rids(df: DataFrame, keys: dict[str, tuple[str, ...]] | None = None,
                black_boxes: frozenset[str] = frozenset(), query: str | None = None,
                entering: Entering | None = None, drops_late: bool = True) -> Threaded:
    """Rebuild ``df``'s plan (of query ``query``) with rid columns threaded to its root.

    ``black_boxes`` names Spark plan classes (e.g. ``"GlobalLimit"``) to trace as black
    boxes besides those headwater always treats so (user code over pandas or state).
    ``entering`` journals the rows entering each stateful aggregate (``Entering``); without
    it the plan computes state keys but journals nothing of what enters. ``drops_late=False``
    for complete mode, where Spark's aggregates drop no late row.
    """
    keys = keys or {}
    clash = [c for c in df.columns if c in (RID_COLUMN, BLACK_BOX_MARKER) or c.startswith(SOURCE_PREFIX)]
    if clash:
        raise ValueError(f"columns {clash} clash with headwater's own; rename them")
    jvm = Jvm(df.sparkSession)
    df = desugared(df)
    ir, jnodes = plan_ir(df)
    masks = column_masks(ir)
    traced: dict[str, TracedSource] = {}  # by rid column
    boxes: list[BlackBox] = []
    state_ops: list[StateOp] = []
    branches: list[tuple] = []  # (black box node id, the plan of the rows going into it)

    def rewrite(node: PlanNode):
        """(new JVM plan, the rid attributes it outputs) for the subtree at ``node``."""
        original = jnodes[node.id]
        if node.kind == "Source":
            source_df = jvm.dataframe(original)
            column, spec = source_column(source_df, node, keys, query)
            traced[spec.column] = spec
            plan = analyzed(source_df.select("*", column))
            return plan, [Jvm.items(plan.output())[-1]]
        if node.kind == "BlackBox" or node.spark_class in black_boxes:
            rewritten = [rewrite(child) for child in node.children]
            # A static child (transformWithState's initial state) has no branch: Spark runs no union of a
            # stream and a table, and its rows enter the black box's state before any batch.
            branches.extend((node.id, plan) for child, (plan, _) in zip(node.children, rewritten) if child.streaming)
            # The black box reads its children's own columns, as the user wrote it.
            children = [jvm.project(_user_attrs(plan, attrs), plan) for plan, attrs in rewritten]
            plan, attr, spec = black_box_source(jvm, node, jvm.with_children(original, children))
            traced[spec.column] = spec
            inputs = tuple(a.name() for child, (_, attrs) in zip(node.children, rewritten) if child.streaming
                           for a in attrs)
            boxes.append(BlackBox(node.id, spec.column, spec.dataset, inputs, spec.stateful, node.spark_class,
                                  digest_positions(node), python_function(df.sparkSession, original)))
            return plan, [attr]
        if node.kind not in _TRACED:
            raise UnsupportedPlanError(node, _REFUSED.get(node.spark_class, f"no operator of Spark's {node.kind} "
                                                          f"kind is known to headwater"))
        if node.kind == "LateralJoin":
            lateral_rows_unread(jvm, original, node)
        if node.kind == "Join" and node.detail["join_type"] not in _JOINS:
            raise UnsupportedPlanError(
                node, f"{node.detail['join_type']} joins are not traced yet (the matching right rows belong to "
                      f"the lineage); where the right side has at most one match per row, an inner join is traced"
            )
        rewritten = [rewrite(child) for child in node.children]
        if node.kind == "Union":
            return union(jvm, original, node, rewritten)
        if node.kind == "Aggregate" and node.streaming and rewritten[0][1] and not _merges_groups(original):
            child_plan, child_attrs = rewritten[0]
            plan, attrs, op = state_nodes(jvm, original, node, child_plan, child_attrs, traced, masks, query,
                                          entering, drops_late)
            state_ops.append(op)
            return plan, attrs
        if node.kind == "Aggregate":
            return aggregate(jvm, original, *rewritten[0])
        if node.kind == "Join" and node.detail["join_type"] == "leftsemi":
            return semi_join(jvm, original, node, *rewritten)
        if node.kind == "Expand":
            plan, attrs = rewritten[0]
            projections = [Jvm.items(p) + attrs for p in Jvm.items(original.projections())]
            return jvm.expand(projections, Jvm.items(original.output()) + attrs, plan), attrs
        children = [plan for plan, _ in rewritten]
        if node.kind in ("LateralJoin", "Join") and node.detail.get("join_type") in _JOINS_KEEPING_LEFT_ONLY:
            rid_attrs = rewritten[0][1]
        else:
            rid_attrs = [a for _, attrs in rewritten for a in attrs]
        if node.kind == "Project":
            return jvm.project(Jvm.items(original.projectList()) + rid_attrs, children[0]), rid_attrs
        return jvm.with_children(original, children), rid_attrs

    plan, rid_attrs = rewrite(ir)
    # The sink sees the user's columns in the user's order, then the rid columns.
    plan = jvm.project(_user_attrs(plan, rid_attrs) + rid_attrs, plan)
    # A source whose rows cannot reach the sink (the right side of an anti join, the
    # input of a black box) has no rid column there and no edges to outputs.
    reaching = {a.name() for a in rid_attrs}
    if branches:
        plan = _with_black_box_inputs(jvm, plan, rid_attrs, branches)
    into_boxes = {name for box in boxes for name in box.inputs}
    sources = sorted((s for s in traced.values() if s.column in reaching), key=lambda s: (s.node_id, s.column))
    inputs = sorted((s for s in traced.values() if s.column in into_boxes), key=lambda s: (s.node_id, s.column))
    read = sorted((s for s in traced.values() if s.source != "state"), key=lambda s: s.node_id)
    return Threaded(jvm.dataframe(plan), ir, sources, inputs, boxes, len(df.columns), state_ops, read)
