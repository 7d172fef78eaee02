"""Spark's half of ``--dataset SINK --where "SQL"``: a sink's rows read and filtered by Spark.

``where.py`` answers what it can without Spark and comes here for the rest (a table sink,
a predicate over dates or decimals…). A traced query's sink rows carry their rid in
``_hw_rid``, and lineage names a sink the way capture describes it (``SinkSpec.describe``):
``parquet:/path``, ``json:/path``, ``orc:/path``, ``table:NAME``. ``select`` reads the sink
with Spark, keeps the rows the predicate holds for, and returns their rids.

The predicate is checked twice before it runs: by ``predicate.parse_predicate`` and by Spark's
own parser, whose tree must hold no subquery (which could read other tables) and call only
the value functions of ``predicate.FUNCTIONS`` (``reflect``, ``java_method`` and the like run
arbitrary code), so it can only select rows of that sink.
"""

from __future__ import annotations

from .errors import LineageError
from .predicate import FUNCTIONS, MAX_SELECTED, READABLE, RID_COLUMN, parse_predicate

# Expression nodes that reach beyond the sink's rows.
REFUSED_NODES = ("Subquery", "Exists", "ListQuery", "Lateral", "Outer")


def sink_frame(spark, dataset: str):
    """The sink's rows, as a DataFrame."""
    kind, _, location = dataset.partition(":")
    if kind == "table" and location:
        return spark.table(location)
    if kind in READABLE and location:
        return spark.read.format(kind).load(location)
    raise LineageError(f"{dataset!r}: give a sink as lineage names it, one of "
                       f"{', '.join(k + ':PATH' for k in READABLE)} or table:NAME")


def _children(expression) -> list:
    children = expression.children()
    return [children.apply(i) for i in range(children.size())]


def check_predicate(spark, where: str) -> None:
    """``LineageError`` unless ``where`` is one plain Spark SQL expression (no subqueries, known functions only),
    to ``predicate.parse_predicate`` and to Spark's parser alike."""
    parse_predicate(where)
    parser = spark._jsparkSession.sessionState().sqlParser()
    try:
        parsed = parser.parseExpression(where)
    except Exception as exc:  # py4j carries the ParseException
        raise LineageError(f"--where is not a SQL expression: {str(exc).splitlines()[0][:300]}") from None
    todo = [parsed]
    while todo:
        node = todo.pop()
        name = node.getClass().getSimpleName()
        if any(part in name for part in REFUSED_NODES):
            raise LineageError(f"--where may only test the sink's own columns: {name} is not allowed")
        if name == "UnresolvedFunction":
            parts = node.nameParts()
            function = parts.apply(parts.size() - 1).lower()
            if parts.size() != 1 or function not in FUNCTIONS:
                raise LineageError(f"--where may not call {function!r}: only value functions (comparisons, "
                                   f"arithmetic, strings, dates, nulls, casts) are allowed")
        todo += _children(node)


def select(spark, dataset: str, where: str, limit: int = MAX_SELECTED) -> list[int]:
    """The rids of the sink's rows for which ``where`` holds (at most ``limit``; more is an error)."""
    frame = sink_frame(spark, dataset)
    if RID_COLUMN not in frame.columns:
        raise LineageError(f"{dataset!r} has no {RID_COLUMN} column: its query was traced with emit_rid=False, "
                           f"or it is not a traced query's sink")
    check_predicate(spark, where)
    try:
        found = frame.where(where).select(RID_COLUMN).distinct().limit(limit + 1).collect()
    except Exception as exc:  # unknown columns, type errors: Spark's AnalysisException
        raise LineageError(f"--where over {dataset!r}: {str(exc).splitlines()[0][:300]}") from None
    if len(found) > limit:
        raise LineageError(f"--where selects more than {limit} rows of {dataset!r}: narrow it")
    return sorted(r[0] for r in found if r[0] is not None)
