"""Catalyst's vocabulary: Spark's logical plan classes by what headwater makes of them, and the names Spark's
plan JSON gives classes and join types.

Classes are their simple names (``getSimpleName``: ``Project``, ``StreamingRelationV2``). ``KINDS`` sorts an
analyzed plan's classes into the plan IR's kinds (``headwater.core.plan``); a class in none is ``Unknown``.
Standard library only: capture's driver and the CLI import it through the plan IR.

To teach headwater a Spark class: add it to the kind whose rows it makes as that kind's operators do (a black
box that keeps state across micro-batches to ``STATEFUL_BLACK_BOXES`` too). A new kind also needs its name
in ``headwater.query.explain.KINDS``; what inference makes of a class is ``headwater.spark.operators``'s.
"""

from __future__ import annotations

# The leaves of an analyzed plan: the relations its rows are read from.
RELATIONS = frozenset({
    "StreamingRelationV2", "StreamingRelation", "StreamingExecutionRelation", "StreamingDataSourceV2Relation",
    "LogicalRelation", "LocalRelation", "LogicalRDD", "DataSourceV2Relation", "HiveTableRelation", "Range",
    "OneRowRelation",
})
# An optimized plan's leaves are also the scans the optimizer makes of data source V2 relations.
OPTIMIZED_RELATIONS = RELATIONS | {"DataSourceV2ScanRelation", "StreamingDataSourceV2ScanRelation"}

# Spark logical plan classes by plan IR kind.
KINDS = {
    "Source": RELATIONS,
    "Project": frozenset({"Project"}),
    "Filter": frozenset({"Filter"}),
    "Join": frozenset({"Join"}),
    "Alias": frozenset({"SubqueryAlias", "View"}),
    "Aggregate": frozenset({"Aggregate"}),
    "Window": frozenset({"Window"}),
    "Generate": frozenset({"Generate"}),
    "Union": frozenset({"Union"}),
    "Deduplicate": frozenset({"Deduplicate", "DeduplicateWithinWatermark"}),
    "Distinct": frozenset({"Distinct"}),
    "Expand": frozenset({"Expand"}),
    "EventTimeWatermark": frozenset({"EventTimeWatermark", "UpdateEventTimeWatermarkColumn"}),
    "Repartition": frozenset({"Repartition", "RepartitionByExpression", "RebalancePartitions"}),
    "Sort": frozenset({"Sort"}),
    "Limit": frozenset({"GlobalLimit", "LocalLimit", "Offset"}),
    "Sample": frozenset({"Sample"}),
    "Observe": frozenset({"CollectMetrics"}),
    "Hint": frozenset({"ResolvedHint"}),
    "Sequence": frozenset({"AttachDistributedSequence"}),
    "LateralJoin": frozenset({"LateralJoin"}),
    "SetOperation": frozenset({"Except", "Intersect"}),
    "BlackBox": frozenset({
        "FlatMapGroupsWithState", "MapInPandas", "MapInArrow", "FlatMapGroupsInPandas", "FlatMapGroupsInArrow",
        "FlatMapGroupsInPandasWithState", "FlatMapCoGroupsInPandas", "FlatMapCoGroupsInArrow", "MapPartitions",
        "TransformWithState", "TransformWithStateInPandas", "TransformWithStateInPySpark",
        "PythonMapInArrow",  # Spark 3.5's name of MapInArrow
    }),
}
_KIND_OF = {cls: kind for kind, classes in KINDS.items() for cls in classes}

# Black boxes that keep state across micro-batches: an output may derive from any
# input the operator ever read, not only from its own batch's.
STATEFUL_BLACK_BOXES = frozenset({
    "FlatMapGroupsWithState", "FlatMapGroupsInPandasWithState", "TransformWithState", "TransformWithStateInPandas",
    "TransformWithStateInPySpark",
})

# Classes whose output is their input's columns, each row as it came (naming, partitioning, watermarks, hints,
# metrics; a sample's rows a subset of its input's): inference reads them as projecting every column.
PASS_THROUGH = frozenset(cls for kind in ("Alias", "Repartition", "EventTimeWatermark", "Hint", "Sample", "Observe")
                         for cls in KINDS[kind])

# The join types ``join_type`` names Spark's joins by (an optimized plan's ExistenceJoin is none of them).
JOIN_TYPES = ("inner", "cross", "leftouter", "rightouter", "fullouter", "leftsemi", "leftanti")


def kind_of(spark_class: str) -> str:
    """The plan IR kind of an analyzed plan's class (its simple name); ``Unknown`` for one in no kind."""
    return _KIND_OF.get(spark_class, "Unknown")


def simple_name(class_name: str) -> str:
    """A class's name without its package, as Spark's JSON gives classes in full
    (``org.apache.spark.sql.catalyst.expressions.Alias`` → ``Alias``)."""
    return class_name.rsplit(".", 1)[-1]


def join_type(fields: dict, missing: str = "unknown") -> str:
    """A join's type from its node's plan JSON (``fields``), lower-cased without ``join``: ``inner``,
    ``leftouter``, ``leftsemi``…; ``unknown`` for a type Spark writes as no object (an ExistenceJoin's),
    ``missing`` where the node has no ``joinType`` at all (Spark always writes one)."""
    written = fields.get("joinType")
    if written is None:
        return missing
    name = written.get("object", "") if isinstance(written, dict) else str(written)
    return simple_name(name).rstrip("$").lower().replace("join", "") or "unknown"
