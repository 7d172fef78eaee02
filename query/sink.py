"""Addressing rows by a predicate over a sink's rows: ``--dataset SINK --where "SQL"``.

A traced query's sink rows carry their rid in ``_hw_rid``, and lineage names a sink the
way capture describes it (``SinkSpec.describe``): ``parquet:/path``, ``json:/path``,
``orc:/path``, ``table:NAME``. ``select`` reads the sink with Spark, keeps the rows the
predicate holds for, and returns their rids, for the lineage questions to start from.

The predicate is one Spark SQL expression over the sink's columns. Before it runs it
is parsed and checked: subqueries (which could read other tables) and functions that
are not plain value functions (``reflect``, ``java_method`` and the like run arbitrary
code) are refused, so it can only select rows of that sink.
"""

from __future__ import annotations

from .backend import LineageError

RID_COLUMN = "_hw_rid"
READABLE = ("parquet", "json", "orc")  # file sinks Spark reads back with their schema
MAX_SELECTED = 1000  # rows a predicate may select; more is refused, not cut
MAX_PREDICATE = 4096  # characters
# Functions a predicate may call: comparisons, logic, arithmetic, strings, dates, nulls, casts.
FUNCTIONS = frozenset("""
abs acos asin atan ceil ceiling cos exp floor ln log log10 log2 mod pmod pow power round bround sign signum sin sqrt tan
greatest least isnull isnotnull isnan nvl nvl2 coalesce ifnull nullif if
lower upper lcase ucase length char_length character_length trim ltrim rtrim substr substring substring_index left right
concat concat_ws replace instr locate position lpad rpad reverse startswith endswith contains like ilike rlike regexp
regexp_like split_part format_number initcap
date to_date to_timestamp timestamp year month day dayofmonth dayofweek dayofyear hour minute second weekofyear
quarter date_add date_sub datediff add_months months_between date_trunc trunc unix_timestamp from_unixtime
current_date current_timestamp now make_date
cast int bigint smallint tinyint double float string boolean decimal
array_contains size element_at
""".split())
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
    """``LineageError`` unless ``where`` is one plain Spark SQL expression (no subqueries, known functions only)."""
    if not isinstance(where, str) or not where.strip() or len(where) > MAX_PREDICATE:
        raise LineageError(f"--where needs one SQL expression of at most {MAX_PREDICATE} characters")
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
