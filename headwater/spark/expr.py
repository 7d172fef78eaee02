"""Expressions of a logged plan: one small immutable tree, read from Spark's ``toJSON()``.

Spark renders an expression as a flat pre-order list of nodes, each with its class and
``num-children``; here that list becomes an ``Expr`` tree whose ``op`` names what it
computes. Attribute identity is the exprId (``col``), never a name. What this module does
not know stays an ``opaque`` node: it can be carried and compared, never evaluated, so a
predicate that needs it is relaxed (a superset), never guessed.

Predicates pushed through plans also hold ``param`` leaves (a value of the traced output
row, bound when a question is asked) and ``in_set`` tests against value-set variables
(PredTrace's row-value predicates, bound during refinement).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Iterable, Iterator, SupportsInt

from .catalyst import simple_name
from .plan_json import expr_id, flat_tree

_PREFIX = "org.apache.spark.sql.catalyst.expressions."

# Spark class (after the package prefix) → op, for classes that need nothing but children.
_SIMPLE = {
    "And": "and", "Or": "or", "Not": "not",
    "EqualTo": "=", "EqualNullSafe": "<=>", "LessThan": "<", "LessThanOrEqual": "<=",
    "GreaterThan": ">", "GreaterThanOrEqual": ">=",
    "IsNull": "isnull", "IsNotNull": "isnotnull",
    "Add": "+", "Subtract": "-", "Multiply": "*", "Divide": "/", "Remainder": "%",
    "UnaryMinus": "neg", "Abs": "abs",
    "StartsWith": "startswith", "EndsWith": "endswith", "Contains": "contains",
    "If": "if", "Coalesce": "coalesce", "Substring": "substring",
    "Year": "year", "Month": "month", "DayOfMonth": "day",
    "Upper": "upper", "Lower": "lower", "Length": "length",
    "In": "in",
    # Wrappers the optimizer adds that change no value lineage cares about.
    "KnownFloatingPointNormalized": "same", "NormalizeNaNAndZero": "same", "KnownNotNull": "same",
    "PromotePrecision": "same",
}
# Window functions that are neither aggregates nor kept opaque.
_WINDOW_FUNCTIONS = {"RowNumber": "row_number", "Rank": "rank", "DenseRank": "dense_rank", "Lag": "lag", "Lead": "lead"}
_FRAME_BOUNDS = {"UnboundedPreceding$": "unbounded_preceding", "UnboundedFollowing$": "unbounded_following",
                 "CurrentRow$": "current_row"}
_GENERATORS = {"Explode": "explode", "PosExplode": "posexplode", "Inline": "inline"}
_AGGREGATES = {"Sum": "sum", "Count": "count", "Average": "avg", "Min": "min", "Max": "max", "First": "first",
               "Last": "last", "CountIf": "count_if"}
COMPARISONS = ("=", "<=>", "<", "<=", ">", ">=")


@dataclass(frozen=True)
class Expr:
    """One expression node. ``value`` holds what is not a child: an exprId, a literal, a type…"""

    op: str
    args: tuple["Expr", ...] = ()
    value: object = None
    dtype: str | None = None

    def __repr__(self) -> str:
        return show(self)

    def walk(self) -> Iterator["Expr"]:
        yield self
        for a in self.args:
            yield from a.walk()


# What ``value`` holds depends on ``op``: these read it as the type it has for theirs. A node
# holding another is a bug, met with the TypeError reading it untyped would also raise.

def column(e: Expr) -> tuple[int, str]:
    """(exprId, name) of a ``col`` or ``alias`` node."""
    expr_id, name = _parts(e)
    return expr_id, name


def col_id(e: Expr) -> int:
    """The exprId a ``col`` node reads."""
    return column(e)[0]


def str_value(e: Expr) -> str:
    """The name or word a node holds: a parameter's, a value set's, a function's, a frame's…"""
    if not isinstance(e.value, str):
        raise TypeError(f"{e.op} node holds {e.value!r}, not a name")
    return e.value


def int_value(e: Expr) -> int:
    """A literal's value as an integer (a limit's, an offset's)."""
    if not isinstance(e.value, (str, SupportsInt)):
        raise TypeError(f"{e.op} node holds {e.value!r}, not an integer")
    return int(e.value)


def agg_spec(e: Expr) -> tuple[str, bool]:
    """(function, distinct) of an ``agg`` node."""
    fn, distinct = _parts(e)
    return fn, distinct


def sort_spec(e: Expr) -> tuple[str, bool]:
    """(direction, whether NULLs come first) of a ``sort`` node."""
    direction, nulls_first = _parts(e)
    return direction, nulls_first


def yields_spec(e: Expr) -> tuple[str, bool, tuple[str, ...]]:
    """(generator kind, outer, the generated columns' types) of a ``yields`` node."""
    kind, outer, dtypes = _parts(e)
    return kind, outer, dtypes


def _parts(e: Expr) -> tuple[Any, ...]:
    if not isinstance(e.value, tuple):
        raise TypeError(f"{e.op} node holds {e.value!r}, not a tuple")
    return e.value


TRUE = Expr("lit", value=True, dtype="boolean")
FALSE = Expr("lit", value=False, dtype="boolean")


# Spark's ``simpleString`` type names (what capture logs for attributes) → its JSON names.
_TYPE_NAMES = {"bigint": "long", "int": "integer", "smallint": "short", "tinyint": "byte"}


def type_name(dtype: str | None) -> str | None:
    return _TYPE_NAMES.get(dtype, dtype) if dtype else dtype


def col(expr_id: int, name: str = "", dtype: str | None = None) -> Expr:
    return Expr("col", value=(expr_id, name), dtype=type_name(dtype))


def lit(value, dtype: str | None = None) -> Expr:
    return Expr("lit", value=value, dtype=dtype)


def param(name: str, dtype: str | None = None) -> Expr:
    return Expr("param", value=name, dtype=type_name(dtype))


def in_set(expr: Expr, var: str) -> Expr:
    """``expr`` ∈ the value set named ``var`` (bound during refinement)."""
    return Expr("in_set", (expr,), value=var, dtype="boolean")


def cmp(op: str, left: Expr, right: Expr) -> Expr:
    return Expr(op, (left, right), dtype="boolean")


def conj(parts: Iterable[Expr]) -> Expr:
    """The conjunction of ``parts``, flattened, without duplicates or ``true``; ``false`` absorbs."""
    return _connect("and", [c for part in parts for c in conjuncts(part)], absorbing=FALSE, neutral=TRUE)


def disj(parts: Iterable[Expr]) -> Expr:
    """The disjunction of ``parts``, without duplicates or ``false``; ``true`` absorbs."""
    return _connect("or", list(parts), absorbing=TRUE, neutral=FALSE)


def _connect(op: str, parts: list[Expr], absorbing: Expr, neutral: Expr) -> Expr:
    if absorbing in parts:
        return absorbing
    found: list[Expr] = []
    for part in parts:
        if part != neutral and part not in found:
            found.append(part)
    if not found:
        return neutral
    result = found[0]
    for part in found[1:]:
        result = Expr(op, (result, part), dtype="boolean")
    return result


def conjuncts(e: Expr) -> list[Expr]:
    if e.op == "and":
        return [c for a in e.args for c in conjuncts(a)]
    return [e]


def refs(e: Expr) -> set[int]:
    """exprIds an expression reads (subquery plans are separate: they read their own)."""
    return {col_id(n) for n in e.walk() if n.op == "col"}


def set_vars(e: Expr) -> set[str]:
    return {str_value(n) for n in e.walk() if n.op == "in_set"}


def evaluable(e: Expr) -> bool:
    """Whether every node is one this package can evaluate and encode (no opaque, no aggregate)."""
    return not any(n.op in ("opaque", "agg") for n in e.walk())


def substitute(e: Expr, mapping: dict[int, Expr]) -> Expr:
    """``e`` with each column whose exprId is in ``mapping`` replaced by its expression."""
    if e.op == "col":
        return mapping.get(col_id(e), e)
    if not e.args:
        return e
    return Expr(e.op, tuple(substitute(a, mapping) for a in e.args), e.value, e.dtype)


def show(e: Expr) -> str:
    """A readable rendering, for logs, errors and answers' ``predicate`` fields."""
    if e.op == "col":
        expr_id, name = column(e)
        return f"{name or 'c'}#{expr_id}"
    if e.op == "lit":
        return repr(e.value) if isinstance(e.value, str) else str(e.value).lower() if isinstance(e.value, bool) \
            else str(e.value)
    if e.op == "param":
        return f"${e.value}"
    if e.op == "in_set":
        return f"({show(e.args[0])} IN @{e.value})"
    if e.op in ("and", "or") or e.op in COMPARISONS or e.op in ("+", "-", "*", "/", "%"):
        return f"({show(e.args[0])} {e.op.upper() if e.op in ('and', 'or') else e.op} {show(e.args[1])})"
    if e.op == "agg":
        fn, distinct = agg_spec(e)
        return f"{fn}({'DISTINCT ' if distinct else ''}{', '.join(show(a) for a in e.args)})"
    if e.op == "cast":
        return f"cast({show(e.args[0])} as {e.dtype})"
    if e.op == "in":
        return f"({show(e.args[0])} IN ({', '.join(show(a) for a in e.args[1:])}))"
    if e.op in ("like", "opaque", "scalar_subquery", "field", "winfn", "frame", "bound", "generator"):
        return f"{e.op}[{e.value}]({', '.join(show(a) for a in e.args)})"
    return f"{e.op}({', '.join(show(a) for a in e.args)})"


# Reading Spark's JSON ---------------------------------------------------------------------

def _short(cls: str) -> str:
    """An expression class's name within Catalyst's expressions package, which keeps an aggregate function
    (``aggregate.Sum``) apart from a function of a row; a class from elsewhere by its simple name."""
    return cls[len(_PREFIX):] if cls.startswith(_PREFIX) else simple_name(cls)


def literal(value, dtype: str):
    """A Spark literal's JSON value as a Python value of its type (None for null)."""
    if value is None:
        return None
    text = str(value)
    if dtype in ("integer", "long", "short", "byte"):
        return int(text)
    if dtype in ("double", "float"):
        return float(text)
    if dtype.startswith("decimal"):
        return Decimal(text)
    if dtype == "boolean":
        return text == "true"
    if dtype == "date":
        if text.lstrip("-").isdigit():  # Spark's internal form: days since the epoch
            return datetime.date(1970, 1, 1) + datetime.timedelta(days=int(text))
        return datetime.date.fromisoformat(text)
    if dtype == "string":
        return text
    return text


class Subqueries:
    """Scalar subquery plans met while reading expressions, by the subquery's exprId."""

    def __init__(self) -> None:
        self.plans: dict[int, list[dict]] = {}


def parse(flat: list[dict], subqueries: Subqueries | None = None) -> Expr:
    """The tree of one expression given as Spark's flat pre-order JSON list."""
    return flat_tree(flat, lambda node, children: _node(node, children, subqueries))


def _node(node: dict, children: list[Expr], subqueries: Subqueries | None) -> Expr:
    cls = _short(node.get("class", ""))
    dtype = node.get("dataType") if isinstance(node.get("dataType"), str) else None
    args = tuple(children)
    if cls in ("AttributeReference", "OuterReference"):
        if cls == "OuterReference":
            return children[0]
        return col(expr_id(node), node.get("name", ""), dtype)
    if cls == "Alias":
        return Expr("alias", args, value=(expr_id(node), node.get("name", "")), dtype=children[0].dtype)
    if cls == "Literal":
        return lit(literal(node.get("value"), dtype or "string"), dtype)
    if cls in _SIMPLE:
        op = _SIMPLE[cls]
        if op == "same":
            return children[0]
        return Expr(op, args, dtype=_result_type(op, args, dtype))
    if cls == "InSet" and node.get("hset") is not None:
        # The optimizer's form of a long IN list (Spark renders its values only when asked to).
        items = tuple(lit(literal(v, children[0].dtype or "string"), children[0].dtype) for v in node.get("hset", []))
        return Expr("in", args + items, dtype="boolean")
    if cls == "GetStructField":
        return Expr("field", args, value=int(node.get("ordinal", 0)), dtype=dtype)
    if cls == "JsonToStructs" and isinstance(node.get("schema"), dict) \
            and node.get("schema", {}).get("type") == "struct":
        fields = tuple((f["name"], f["type"] if isinstance(f["type"], str) else "") for f in node["schema"]["fields"])
        return Expr("from_json", args, value=fields)
    if cls == "Round":
        return Expr("round", args, dtype=children[0].dtype)
    if cls == "Concat":
        return Expr("concat", args, dtype="string")
    if cls == "Like":
        escape = node.get("escapeChar", "\\")
        return Expr("like", args, value=str(escape) if escape else "\\", dtype="boolean")
    if cls in ("Cast", "AnsiCast", "TryCast"):
        return Expr("cast", args, dtype=dtype)
    if cls == "CaseWhen":
        # Children are cond1, value1, cond2, value2, … then the else value when there is one.
        return Expr("case", args, dtype=children[1].dtype if len(children) > 1 else None)
    if cls == "aggregate.AggregateExpression":
        inner = children[0]
        if len(children) > 1:  # FILTER (WHERE …): not modelled, so never computed without its filter
            return Expr("opaque", args, value="AggregateExpression with FILTER", dtype=inner.dtype)
        return Expr("agg", inner.args, value=(inner.value, bool(node.get("isDistinct"))), dtype=inner.dtype)
    if cls.startswith("aggregate.") and cls[len("aggregate."):] in _AGGREGATES:
        fn = _AGGREGATES[cls[len("aggregate."):]]
        return Expr("aggfn", args, value=fn, dtype="long" if fn in ("count", "count_if") else None)
    if cls == "ScalarSubquery" and subqueries is not None and not node.get("outerAttrs"):
        sid = expr_id(node)
        subqueries.plans[sid] = node.get("plan", [])
        return Expr("scalar_subquery", value=sid, dtype=dtype)
    if cls == "StringSplit":
        return Expr("split", args)
    if cls == "CreateArray":
        return Expr("array", args)
    if cls == "CreateNamedStruct":  # children are name, value, name, value…
        return Expr("struct", args[1::2], value=tuple(str(n.value) for n in args[::2]))
    if cls in _GENERATORS:
        return Expr("generator", args, value=_GENERATORS[cls])
    if cls == "WindowExpression":
        return Expr("window", args, dtype=children[0].dtype)
    if cls == "WindowSpecDefinition":  # children: partition expressions, sort orders, the frame
        return Expr("window_spec", args, value=(len(node.get("partitionSpec", [])), len(node.get("orderSpec", []))))
    if cls == "SpecifiedWindowFrame":
        kind = node.get("frameType", {}).get("object", "").rstrip("$").rsplit(".", 1)[-1]
        return Expr("frame", args, value={"RowFrame": "rows", "RangeFrame": "range"}.get(kind, kind))
    if cls in _FRAME_BOUNDS:
        return Expr("bound", value=_FRAME_BOUNDS[cls])
    if cls in _WINDOW_FUNCTIONS and not node.get("ignoreNulls"):
        fn = _WINDOW_FUNCTIONS[cls]
        return Expr("winfn", args, value=fn, dtype=children[0].dtype if fn in ("lag", "lead") else "integer")
    if cls == "SortOrder":
        direction, nulls = (node.get(k, {}).get("object", "").rstrip("$").rsplit(".", 1)[-1]
                            for k in ("direction", "nullOrdering"))
        return Expr("sort", args, value=(direction, nulls != "NullsLast"))
    return Expr("opaque", args, value=cls, dtype=dtype)


def _result_type(op: str, args: tuple[Expr, ...], dtype: str | None) -> str | None:
    if dtype:
        return dtype
    if op in ("and", "or", "not", "isnull", "isnotnull", "startswith", "endswith", "contains", "in") \
            or op in COMPARISONS:
        return "boolean"
    if op in ("year", "month", "day", "length"):
        return "integer"
    if op in ("substring", "upper", "lower"):
        return "string"
    return args[0].dtype if args else None
