"""The evaluator of Spark expressions: an ``Expr`` tree over a table's columns, with Spark's semantics.

    from headwater.spark import evaluate as ev

    found = ev.evaluate(expr, {7: arrow_array, 9: object_array}, length, bind, exact=False)
    rows = ev.predicate(expr, columns, length, exact=True)   # a boolean Arrow array: NULL where unknown

A column is an Arrow array (a sink's column, as ``--where`` reads it; inference's numeric and text
columns) or a numpy array of Python values (inference's other columns: ``None`` for NULL, ``Decimal``,
``datetime.date``, tuples for structs and arrays). Each operation is written once here: by an Arrow
kernel where its operands are Arrow and the kernel gives Spark's answer, else value by value by its
rule in ``semantics.py``. Both forms agree (``tests/spark/test_evaluate.py`` evaluates every operation
both ways).

Literals stay Python values (``Value.literal``) until an operation needs them as Arrow scalars, so
an expression over literals only is computed once, not per row. ``bind`` gives a predicate's free
names: the traced row's values (``param``), value sets (``in_set``), scalar subqueries' results.

Two uses, one rule each:

- ``exact=True`` (``--where``): an answer that could differ from Spark's (NaN compared, non-ASCII
  text under ``upper``/``lower``, an overflow or a division by zero that fails Spark's ANSI-mode
  query, an operation only the Python form computes) raises ``NotExact``: the caller asks Spark.
  ``headwater.spark.sql`` lowers a predicate to ``Expr`` with Spark's coercions as casts first: the
  evaluator coerces nothing itself.
- ``exact=False`` (inference over a logged batch, which ran): a division by zero is NULL, as in
  Spark without ANSI mode (with it the batch failed, and nobody asks about its rows).

What the evaluator does not model (an ``opaque`` node, an aggregate) raises ``NotEvaluable``:
inference then keeps a flagged superset, ``--where`` asks Spark.
"""

from __future__ import annotations

import itertools
import math
import operator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Callable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .arrow_values import ARROW_TYPES, array_of, arrow_type, scalar, spark_type_of
from .expr import Expr, column, int_value, str_value, yields_spec
from .semantics import (
    NUMERIC,
    NotEvaluable,
    NotExact,
    arithmetic,
    caster,
    compare,
    divide,
    from_json,
    generated,
    like_pattern,
    like_regex,
    missing,
    remainder,
    round_half_up,
    splitter,
    substring,
    text,
    value_key,
)

__all__ = ["Binding", "NotEvaluable", "NotExact", "Value", "array_of", "arrow_type", "as_arrow", "as_objects",
           "evaluate", "generated", "objects", "predicate", "value_key"]

_FALSE = scalar(False, "boolean")
_NULL_BOOL = scalar(None, "boolean")


@dataclass
class Binding:
    """Values a predicate's free names stand for: the traced row's values, value sets, subquery results."""

    params: dict[str, object] = field(default_factory=dict)
    sets: dict[str, frozenset] = field(default_factory=dict)
    scalars: dict[int, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Value:
    """An expression's value over the rows: an Arrow array, a numpy array of Python values, or, ``literal``,
    one Python value for every row."""

    data: Any  # pa.Array, np.ndarray (dtype object), or the literal's Python value
    type: str | None  # Spark's JSON type name where known ("long", "decimal(10,2)", "void" for a NULL literal)
    literal: bool = False

    @property
    def arrow(self) -> bool:
        return isinstance(self.data, pa.Array)


def objects(items: list) -> np.ndarray:
    """A list as a 1-d object array, even when its items are sequences themselves."""
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


def evaluate(e: Expr, columns: Mapping[int, Any], length: int, bind: Binding | None = None, *,
             exact: bool = False) -> Value:
    """``e`` over the rows: its value (``Value``). ``columns`` by exprId: Arrow arrays or object arrays."""
    return _Evaluator(columns, length, bind or Binding(), exact).eval(e)


def predicate(e: Expr, columns: Mapping[int, Any], length: int, bind: Binding | None = None, *,
              exact: bool = False) -> pa.BooleanArray:
    """``e`` as a boolean Arrow array of ``length`` rows, NULL where it is unknown (a row passes only where TRUE)."""
    found = evaluate(e, columns, length, bind, exact=exact)
    if found.type not in ("boolean", "void", None):
        raise NotEvaluable(f"the predicate is {found.type}, not boolean")
    return as_arrow(found, length, "boolean")


def as_arrow(v: Value, length: int, spark_type: str) -> pa.Array:
    """``v`` as an Arrow array of ``length`` rows of a Spark scalar type."""
    if v.literal:
        return array_of([None if missing(v.data) else v.data] * length, spark_type)
    if v.arrow:
        return v.data if v.data.type == arrow_type(spark_type) else pc.cast(v.data, arrow_type(spark_type))
    return array_of([None if missing(x) else x for x in v.data], spark_type)


def as_objects(v: Value, length: int) -> np.ndarray:
    """``v`` as an object array of ``length`` Python values, ``None`` for NULL."""
    if v.literal:
        return objects([None if missing(v.data) else v.data] * length)
    if v.arrow:
        return objects(v.data.to_pylist())
    return v.data


_COMPARISONS = {"=": ("equal", operator.eq), "<": ("less", operator.lt), "<=": ("less_equal", operator.le),
                ">": ("greater", operator.gt), ">=": ("greater_equal", operator.ge)}
_ARITHMETIC = {"+": ("add_checked", operator.add), "-": ("subtract_checked", operator.sub),
               "*": ("multiply_checked", operator.mul)}
_STRING_TESTS: dict[str, tuple[str, Callable[[str, str], bool]]] = {
    "startswith": ("starts_with", str.startswith), "endswith": ("ends_with", str.endswith),
    "contains": ("match_substring", operator.contains)}
_TRIMS = {"trim": ("utf8_trim", str.strip), "ltrim": ("utf8_ltrim", str.lstrip), "rtrim": ("utf8_rtrim", str.rstrip)}


# --- the evaluator ---------------------------------------------------------------------------------------------

class _Evaluator:
    """One evaluation: each operation by an Arrow kernel where its operands allow, else value by value."""

    def __init__(self, columns: Mapping[int, Any], length: int, bind: Binding, exact: bool):
        self.columns, self.length, self.bind, self.exact = columns, length, bind, exact

    def eval(self, e: Expr) -> Value:
        handler = getattr(self, "_" + _METHODS.get(e.op, e.op), None)
        if handler is None:
            raise NotEvaluable(f"cannot evaluate {e.op}{'[' + str(e.value) + ']' if e.op == 'opaque' else ''}")
        try:
            return handler(e)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, OverflowError) as exc:
            # An overflow or a division by zero (ANSI mode fails Spark's query), a kernel pyarrow lacks
            raise (NotExact if self.exact else NotEvaluable)(f"{e}: {exc}") from None

    # How an operation is computed: Arrow, or value by value.
    def _kernel_ready(self, *values: Value) -> bool:
        """Whether Arrow kernels take these operands: Arrow columns, or literals of a scalar type. Literals alone
        too when ``exact`` (inference's literals are Python's, computed as such)."""
        return (self.exact or any(v.arrow for v in values)) and all(
            (v.arrow and spark_type_of(v.data.type) is not None)
            or (v.literal and (v.data is None or (v.type or _python_type(v.data)) in ARROW_TYPES))
            for v in values)

    def _kernel_value(self, v: Value, like: Value | None = None):
        """An operand for an Arrow kernel: the array, or the literal as a scalar of its type (a NULL: of ``like``'s)."""
        if v.arrow:
            return v.data
        spark_type = v.type if v.type in ARROW_TYPES else _python_type(v.data) if v.data is not None else None
        if spark_type is None:
            spark_type = (spark_type_of(like.data.type) if like is not None and like.arrow else None) or "boolean"
        return scalar(v.data, spark_type)

    def _per_value(self, fn: Callable, values: list[Value], spark_type: str | None, null_safe: bool = False,
                   spark_rule: bool = False) -> Value:
        """``fn`` of each row's values (NULL where any is NULL, unless ``null_safe``): the Python form. With
        ``exact``, only a ``spark_rule``: a rule whose Python form gives Spark's answer for every value."""
        if self.exact and not spark_rule:
            raise NotExact(f"{spark_type or 'a value'} computed value by value, unchecked against Spark")
        literals = [None if missing(v.data) else v.data for v in values if v.literal]
        if len(literals) == len(values):
            found = fn(*literals) if null_safe or None not in literals else None
            return Value(found, spark_type, True)
        if not null_safe and None in literals:
            return Value(objects([None] * self.length), spark_type)
        parts = [itertools.repeat(None if missing(v.data) else v.data) if v.literal else _python_values(v)
                 for v in values]
        found = [fn(*args) for args in zip(*parts)] if null_safe else _null_propagating(fn, parts)
        if spark_type == "boolean":  # as Arrow, for the kernels of AND, OR, NOT and filters (only inference's
            return Value(pa.array(found, pa.bool_()), "boolean")  # object columns come here: pandas is loaded)
        return Value(objects(found), spark_type)

    def _kernel(self, fn: Callable, values: list[Value], spark_type: str | None) -> Value:
        """An Arrow kernel's result; over literals only, the literal it computes."""
        like = _first_arrow(values)
        return _wrap(fn(*(self._kernel_value(v, like) for v in values)), spark_type)

    def _either(self, kernel: Callable, python: Callable, values: list[Value], spark_type: str | None) -> Value:
        if self._kernel_ready(*values):
            return self._kernel(kernel, values, spark_type)
        return self._per_value(python, values, spark_type)

    # Leaves.
    def _col(self, e: Expr) -> Value:
        expr_id, name = column(e)
        try:
            data = self.columns[expr_id]
        except KeyError:
            raise NotEvaluable(f"column {name}#{expr_id} is not in the table evaluated") from None
        if isinstance(data, pa.ChunkedArray):
            data = data.combine_chunks()
        return Value(data, e.dtype)

    def _lit(self, e: Expr) -> Value:
        return Value(e.value, "void" if e.value is None and not e.dtype else e.dtype, True)

    def _param(self, e: Expr) -> Value:
        if e.value not in self.bind.params:
            raise NotEvaluable(f"no value for ${e.value}")
        return self._bound(self.bind.params[str_value(e)], e.dtype)

    def _scalar_subquery(self, e: Expr) -> Value:
        if e.value not in self.bind.scalars:
            raise NotEvaluable(f"no value for scalar subquery {e.value}")
        return self._bound(self.bind.scalars[int_value(e)], e.dtype)

    def _bound(self, value, dtype: str | None) -> Value:
        if missing(value):
            return Value(None, dtype or "void", True)
        return Value(value.item() if isinstance(value, np.generic) else value, dtype, True)

    def _alias(self, e: Expr) -> Value:
        return self.eval(e.args[0])

    # Logic (Kleene: NULL is unknown; FALSE AND NULL is FALSE, TRUE OR NULL is TRUE).
    def _logic(self, e: Expr, kernel: Callable) -> Value:
        values = [self.eval(x) for x in _chain(e, e.op)]
        for v in values:
            if v.type not in ("boolean", "void", None):
                raise NotEvaluable(f"{v.type} in {e.op.upper()}")
        if self._kernel_ready(*values):
            found = values[0]
            for v in values[1:]:
                found = self._kernel(kernel, [found, v], "boolean")
            return found
        trues, falses = zip(*(_truth(v, self.length) for v in values))
        # AND: FALSE where any operand is, else TRUE where all are, else NULL; OR: the same with TRUE and FALSE swapped
        deciding, unanimous = (falses, trues) if e.op == "and" else (trues, falses)
        out = objects([None] * self.length)
        out[np.logical_and.reduce(unanimous)] = e.op == "and"
        out[np.logical_or.reduce(deciding)] = e.op == "or"
        return Value(out, "boolean")

    def _and(self, e: Expr) -> Value:
        return self._logic(e, pc.and_kleene)

    def _or(self, e: Expr) -> Value:
        return self._logic(e, pc.or_kleene)

    def _not(self, e: Expr) -> Value:
        inner = self.eval(e.args[0])
        if inner.literal:
            return Value(None if inner.data is None else not inner.data, "boolean", True)
        if inner.arrow:
            return Value(pc.invert(inner.data), "boolean")
        true, false = _truth(inner, self.length)
        out = objects([None] * self.length)
        out[true], out[false] = False, True
        return Value(out, "boolean")

    # Comparisons.
    def _comparison(self, e: Expr) -> Value:
        kernel, python = _COMPARISONS[e.op]
        left, right = self.eval(e.args[0]), self.eval(e.args[1])
        if self._kernel_ready(left, right):
            self._no_nan(left, right)
            return self._kernel(getattr(pc, kernel), [left, right], "boolean")
        return self._per_value(compare(python), [left, right], "boolean")

    def _null_safe_equal(self, e: Expr) -> Value:
        left, right = self.eval(e.args[0]), self.eval(e.args[1])
        if self._kernel_ready(left, right):
            self._no_nan(left, right)
            like = _first_arrow([left, right])
            a, b = (self._kernel_value(v, like) for v in (left, right))
            both = pc.and_(pc.is_null(a), pc.is_null(b))
            return _wrap(pc.or_(both, pc.fill_null(pc.equal(a, b), _FALSE)), "boolean")
        equal = compare(operator.eq)

        def same(x, y):
            x, y = (None if missing(v) else v for v in (x, y))
            return x is None and y is None or (x is not None and y is not None and equal(x, y))
        return self._per_value(same, [left, right], "boolean", null_safe=True)

    def _no_nan(self, *values: Value) -> None:
        """NaN is equal to itself and above every number in Spark, unlike IEEE's and Arrow's."""
        if not self.exact:
            return
        for v in values:
            if v.literal:
                if isinstance(v.data, float) and math.isnan(v.data):
                    raise NotExact("NaN compares as Spark orders it, not as IEEE does")
            elif pa.types.is_floating(v.data.type) and pc.any(pc.is_nan(v.data)).as_py():
                raise NotExact("a float column holds NaN, which Spark compares unlike IEEE")

    def _isnull(self, e: Expr) -> Value:
        inner = self.eval(e.args[0])
        if inner.literal:
            return Value(missing(inner.data), "boolean", True)
        if inner.arrow:
            return Value(pc.is_null(inner.data), "boolean")
        return Value(pa.array(_nulls(inner.data)), "boolean")

    def _isnotnull(self, e: Expr) -> Value:
        found = self._isnull(e)
        return Value(not found.data, "boolean", True) if found.literal else Value(pc.invert(found.data), "boolean")

    def _in(self, e: Expr) -> Value:
        """``x IN (a, b…)``: TRUE for a match; else NULL where x or an item is NULL (Spark's In), else FALSE."""
        value, items = self.eval(e.args[0]), [self.eval(x) for x in e.args[1:]]
        if self._kernel_ready(value, *items):
            self._no_nan(value, *items)
            floating = any(pa.types.is_floating(v.data.type) for v in (value, *items) if v.arrow)
            listed = [i.data for i in items]
            column_type = spark_type_of(value.data.type) if value.arrow else None
            if all(i.literal and i.data is None or (i.type or _python_type(i.data)) == column_type for i in items) \
                    and not floating and value.arrow:  # hashing: -0.0 and 0.0 differ there
                wanted = array_of([v for v in listed if v is not None], column_type or "")
                found = pc.is_in(value.data, value_set=wanted)
                unknown = pc.is_null(value.data)
                if any(v is None for v in listed):
                    unknown = pc.or_(unknown, pc.invert(found))
                return Value(pc.if_else(unknown, _NULL_BOOL, found), "boolean")
            result = None
            for item in items:
                equal = self._kernel(pc.equal, [value, item], "boolean")
                result = equal if result is None else self._kernel(pc.or_kleene, [result, equal], "boolean")
            assert result is not None
            return result
        if all(i.literal for i in items):
            listed = [None if missing(i.data) else i.data for i in items]
            return self._member(value, {value_key(v) for v in listed if v is not None}, None in listed)
        found = Value(False, "boolean", True)
        for item in items:
            equal = self._per_value(compare(operator.eq), [value, item], "boolean")
            found = self._per_value(_kleene_or, [found, equal], "boolean", null_safe=True)
        return found

    def _in_set(self, e: Expr) -> Value:
        bound = self.bind.sets.get(str_value(e))
        if bound is None:
            raise NotEvaluable(f"no values bound for the set @{e.value}")
        return self._member(self.eval(e.args[0]), bound, False)

    def _member(self, value: Value, keys, null_listed: bool) -> Value:
        """Whether each value lies in ``keys`` (compared by ``value_key``), NULL for NULL (and for no match beside a
        NULL listed); over a numeric Arrow column by Arrow's hash, else once per distinct value, since a column
        repeats its keys."""
        if value.arrow and not null_listed and spark_type_of(value.data.type) is not None:
            return Value(_arrow_in(value.data, keys), "boolean")
        known: dict = {}

        def member(v):
            try:
                found = known[v]
            except (KeyError, TypeError):
                found = value_key(v) in keys
                try:
                    known[v] = found
                except TypeError:
                    pass
            return True if found else None if null_listed else False
        return self._per_value(member, [value], "boolean")

    def _tuple(self, e: Expr) -> Value:  # a composite key: NULL when any part is
        return self._per_value(lambda *parts: tuple(parts), [self.eval(x) for x in e.args], None)

    # Arithmetic (ANSI, with exact: an overflow or a division by zero fails Spark's query; checked kernels raise).
    def _arithmetic(self, e: Expr) -> Value:
        kernel, python = _ARITHMETIC[e.op]
        left, right = self.eval(e.args[0]), self.eval(e.args[1])
        return self._either(getattr(pc, kernel), arithmetic(python), [left, right], e.dtype or left.type)

    def _divide(self, e: Expr) -> Value:
        left, right = self.eval(e.args[0]), self.eval(e.args[1])
        if self.exact and self._kernel_ready(left, right):  # over doubles, as Spark's analyzer casts both sides
            like = _first_arrow([left, right])
            a, b = (pc.cast(self._kernel_value(v, like), pa.float64()) for v in (left, right))
            return _wrap(pc.divide_checked(a, b), "double")
        return self._per_value(divide, [left, right], e.dtype or "double")

    def _remainder(self, e: Expr) -> Value:
        left, right = self.eval(e.args[0]), self.eval(e.args[1])
        if self.exact and self._kernel_ready(left, right) and all(_integral(v) for v in (left, right)):
            return self._kernel(_java_remainder, [left, right], e.dtype or left.type)
        return self._per_value(remainder, [left, right], e.dtype or left.type)

    def _neg(self, e: Expr) -> Value:
        inner = self.eval(e.args[0])
        return self._either(pc.negate_checked, operator.neg, [inner], inner.type)

    def _abs(self, e: Expr) -> Value:
        inner = self.eval(e.args[0])
        return self._either(pc.abs_checked, abs, [inner], inner.type)

    def _round(self, e: Expr) -> Value:
        value, scale = self.eval(e.args[0]), self.eval(e.args[1])
        return self._per_value(round_half_up, [value, scale], e.dtype or value.type)

    # Strings.
    def _string_test(self, e: Expr) -> Value:
        kernel, python = _STRING_TESTS[e.op]
        value, pattern = self.eval(e.args[0]), self.eval(e.args[1])
        if value.arrow and pattern.literal:
            if pattern.data is None:
                return Value(None, "boolean", True)
            return Value(getattr(pc, kernel)(value.data, pattern=pattern.data), "boolean")
        return self._per_value(lambda x, y: python(text(x), text(y)), [value, pattern], "boolean", spark_rule=True)

    def _like(self, e: Expr) -> Value:
        value, pattern = self.eval(e.args[0]), self.eval(e.args[1])
        escape = str_value(e)
        if value.arrow and pattern.literal:
            if pattern.data is None:
                return Value(None, "boolean", True)
            return Value(pc.match_substring_regex(value.data, pattern=f"^{like_regex(pattern.data, escape)}$"),
                         "boolean")
        return self._per_value(lambda x, p: like_pattern(p, escape).fullmatch(text(x)) is not None, [value, pattern],
                               "boolean", spark_rule=True)

    def _case_change(self, e: Expr) -> Value:
        inner = self.eval(e.args[0])
        python = str.upper if e.op == "upper" else str.lower
        if inner.arrow and pa.types.is_string(inner.data.type) \
                and pc.all(pc.string_is_ascii(inner.data)).as_py() in (True, None):
            return Value(getattr(pc, f"ascii_{e.op}")(inner.data), "string")
        if self.exact and not (inner.literal and (inner.data is None or text(inner.data).isascii())):
            raise NotExact("changing the case of non-ASCII text is Spark's")
        # Python's case mapping of ASCII text is Java's
        return self._per_value(lambda x: python(text(x)), [inner], "string", spark_rule=True)

    def _length(self, e: Expr) -> Value:
        inner = self.eval(e.args[0])
        return self._either(pc.utf8_length, lambda x: len(text(x)), [inner], "integer")

    def _trim(self, e: Expr) -> Value:
        kernel, python = _TRIMS[e.op]
        inner = self.eval(e.args[0])
        # Spark's trim removes spaces (U+0020) only, not other whitespace.
        return self._either(lambda s: getattr(pc, kernel)(s, characters=" "), lambda x: python(text(x), " "),
                            [inner], "string")

    def _substring(self, e: Expr) -> Value:
        value, position, count = (self.eval(x) for x in e.args)
        if value.arrow and position.literal and count.literal and None not in (position.data, count.data):
            begin, stop = _slice_bounds(int(position.data), int(count.data))
            return Value(pc.utf8_slice_codeunits(value.data, begin, stop), "string")
        return self._per_value(lambda s, p, n: substring(text(s), int(p), int(n)), [value, position, count], "string",
                               spark_rule=True)

    def _concat(self, e: Expr) -> Value:
        parts = [self.eval(x) for x in e.args]
        if self._kernel_ready(*parts):
            return self._kernel(lambda *a: pc.binary_join_element_wise(*a, scalar("", "string")), parts, "string")
        return self._per_value(lambda *xs: "".join(map(text, xs)), parts, "string")

    def _split(self, e: Expr) -> Value:
        return self._per_value(splitter(e.args[1], e.args[2]), [self.eval(e.args[0])], None)

    # Dates, structs, collections: Python's form alone.
    def _date_part(self, e: Expr) -> Value:
        return self._per_value(lambda d: getattr(d, e.op), [self.eval(e.args[0])], "integer")

    def _cast(self, e: Expr) -> Value:
        inner, to = self.eval(e.args[0]), e.dtype or "string"
        if (inner.arrow or inner.literal) and self._kernel_ready(inner) and inner.type in NUMERIC and to in NUMERIC \
                and NUMERIC.index(to) >= NUMERIC.index(inner.type):  # widening: exact, or rounded as Java does
            return _wrap(pc.cast(self._kernel_value(inner), arrow_type(to), safe=False), to)
        return self._per_value(caster(to), [inner], to)

    def _collection(self, e: Expr) -> Value:
        # arrays as tuples, so they hash; structs as tuples, as ``field`` reads them
        return self._per_value(lambda *xs: tuple(None if missing(x) else x for x in xs), [self.eval(x) for x in e.args],
                               None, null_safe=True) \
            if e.args else Value((), None, True)

    def _from_json(self, e: Expr) -> Value:
        fields = e.value
        return self._per_value(lambda record: from_json(text(record), fields), [self.eval(e.args[0])], None)

    def _field(self, e: Expr) -> Value:
        ordinal = int_value(e)
        return self._per_value(lambda struct: struct[ordinal], [self.eval(e.args[0])], e.dtype)

    def _yields(self, e: Expr) -> Value:
        """Whether each row's collection yields a row null-safe equal to the values wanted."""
        kind, outer, _ = yields_spec(e)
        width = len(e.args) - 1

        def yields(collection, *wanted):
            key = tuple(value_key(None if missing(w) else w) for w in wanted)
            rows = generated(kind, None if missing(collection) else collection, width, outer)
            return any(tuple(value_key(v) for v in row) == key for row in rows)
        return self._per_value(yields, [self.eval(x) for x in e.args], "boolean", null_safe=True)

    # Conditions.
    def _case(self, e: Expr) -> Value:
        """Children are cond1, value1, cond2, value2, … then the else value when there is one (``if``: one pair)."""
        args = list(e.args)
        pairs = [(args[i], args[i + 1]) for i in range(0, len(args) - 1, 2)]
        otherwise = args[-1] if len(args) % 2 else None
        if self.exact:
            return self._choose([(self.eval(c), self.eval(v)) for c, v in pairs],
                                self.eval(otherwise) if otherwise is not None else Value(None, "void", True), e.dtype)
        return self._choose_lazily(pairs, otherwise, e.dtype)

    def _choose(self, branches: list[tuple[Value, Value]], otherwise: Value, spark_type: str | None) -> Value:
        """Each row's value of the first branch whose condition is TRUE (NULL is not), else ``otherwise``'s."""
        values = [v for _, v in branches] + [otherwise]
        if not self._kernel_ready(*values, *(c for c, _ in branches)):
            raise NotExact("a condition computed value by value")
        to = spark_type if spark_type in ARROW_TYPES else _known_type(*values) or "boolean"
        if all(v.literal for v in values) and all(c.literal for c, _ in branches):
            taken = next((v for c, v in branches if c.data is True), otherwise)
            return Value(taken.data, to, True)
        result = as_arrow(otherwise, self.length, to)
        for condition, value in reversed(branches):
            taken = pc.fill_null(as_arrow(condition, self.length, "boolean"), _FALSE)
            result = pc.if_else(taken, as_arrow(value, self.length, to), result)
        return Value(result, to)

    def _choose_lazily(self, pairs: list[tuple[Expr, Expr]], otherwise: Expr | None, spark_type: str | None) -> Value:
        """``_choose`` in Python's form, a branch's value computed only when some row takes it (a value nobody
        takes may hold what cannot be evaluated)."""
        out = objects([None] * self.length)
        undecided = np.ones(self.length, dtype=bool)
        for condition, value in pairs:
            truth = as_objects(self.eval(condition), self.length)
            chosen = undecided & np.fromiter((t is True for t in truth), bool, self.length)
            if chosen.any():
                out[chosen] = as_objects(self.eval(value), self.length)[chosen]
            undecided &= ~chosen
        if otherwise is not None and undecided.any():
            out[undecided] = as_objects(self.eval(otherwise), self.length)[undecided]
        return Value(out, spark_type)

    def _coalesce(self, e: Expr) -> Value:
        values = [self.eval(x) for x in e.args]
        if self._kernel_ready(*values):
            return self._kernel(pc.coalesce, values, e.dtype or _known_type(*values))
        return self._per_value(lambda *xs: next((x for x in xs if not missing(x)), None), values,
                               e.dtype or _known_type(*values), null_safe=True)


_METHODS = {**{op: "comparison" for op in _COMPARISONS}, "<=>": "null_safe_equal",
            **{op: "arithmetic" for op in _ARITHMETIC}, "/": "divide", "%": "remainder",
            **{op: "string_test" for op in _STRING_TESTS}, "upper": "case_change", "lower": "case_change",
            **{op: "trim" for op in _TRIMS}, "year": "date_part", "month": "date_part", "day": "date_part",
            "array": "collection", "struct": "collection", "if": "case"}


def _chain(e: Expr, op: str) -> list[Expr]:
    """The operands of a chain of one operator, at once: not one level of recursion per operator."""
    return [x for a in e.args for x in (_chain(a, op) if a.op == op else [a])]


def _python_values(v: Value) -> list:
    return v.data.to_pylist() if v.arrow else v.data.tolist()


def _null_propagating(fn: Callable, parts: list) -> list:
    """``fn`` of each row's values, NULL (``None``, by identity: a value may be an array) where any is NULL."""
    if len(parts) == 1:
        return [None if a is None else fn(a) for a in parts[0]]
    if len(parts) == 2:
        return [None if a is None or b is None else fn(a, b) for a, b in zip(*parts)]
    return [None if any(x is None for x in args) else fn(*args) for args in zip(*parts)]


def _nulls(values: np.ndarray) -> np.ndarray:
    """Which of an object array's values are NULL (None, or NaN: the only value unequal to itself), at C speed."""
    with np.errstate(invalid="ignore"):
        unequal = np.asarray(np.not_equal(values, values), dtype=bool)
    return np.fromiter((x is None for x in values), bool, len(values)) | unequal


def _arrow_in(column: pa.Array, keys) -> pa.Array:
    """``value_key(v) in keys`` for each value of a column of a scalar type, NULL for NULL, by Arrow's hash: integral
    keys are ints (``value_key``), so an integer column matches only them, a float column any number."""
    wanted: list
    if pa.types.is_string(column.type) or pa.types.is_boolean(column.type):
        wanted = [k for k in keys if type(k) is (str if pa.types.is_string(column.type) else bool)]
    elif pa.types.is_integer(column.type):  # an integral float or decimal key is an int already
        column = pc.cast(column, pa.int64())
        wanted = [int(k) for k in keys if type(k) in (int, bool) and -(1 << 63) <= k < 1 << 63]
    else:  # as Python compares them: a decimal equals the float only where it is exactly that float
        column = pc.cast(column, pa.float64())
        wanted = [float(k) for k in keys if type(k) in (int, bool, float) or (type(k) is Decimal and float(k) == k)]
    found = pc.is_in(column, value_set=pa.array(wanted, column.type))
    return pc.if_else(pc.is_null(column), _NULL_BOOL, found)


def _java_remainder(a, b):
    """``semantics.remainder`` over integer arrays: a - trunc(a / b) * b (pyarrow's integer division truncates)."""
    return pc.subtract_checked(a, pc.multiply_checked(pc.divide_checked(a, b), b))


def _truth(v: Value, length: int) -> tuple[np.ndarray, np.ndarray]:
    """(the rows where a boolean value is TRUE, those where it is FALSE); NULL rows are neither."""
    if v.literal:
        return np.full(length, v.data is True), np.full(length, v.data is False)
    values = as_objects(v, length)  # Python's booleans: each operation makes True, False and None
    return np.fromiter((x is True for x in values), bool, length), \
        np.fromiter((x is False for x in values), bool, length)


def _kleene_or(x, y):
    return True if x is True or y is True else None if x is None or y is None else False


def _wrap(found, spark_type: str | None) -> Value:
    """An Arrow kernel's result as a value: a scalar (from literals alone) is a literal."""
    if isinstance(found, pa.Scalar):
        return Value(found.as_py(), spark_type, True)
    return Value(found.combine_chunks() if isinstance(found, pa.ChunkedArray) else found, spark_type)


def _first_arrow(values: list[Value]) -> Value | None:
    return next((v for v in values if v.arrow), None)


def _integral(v: Value) -> bool:
    return pa.types.is_integer(v.data.type) if v.arrow else v.data is None or isinstance(v.data, int)


def _slice_bounds(start: int, length: int) -> tuple[int, int | None]:
    """``substring``'s bounds as Arrow's slice takes them (Python's, a negative start from the end)."""
    if length <= 0:
        return 0, 0
    if start > 0:
        return start - 1, start - 1 + length
    if start == 0:
        return 0, length  # 0 counts as 1, but the end is counted from 0
    return start, None if start + length >= 0 else start + length


def _python_type(value) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    return type(value).__name__


def _known_type(*values: Value) -> str | None:
    found = next((v.type for v in values if v.type not in (None, "void")), None)
    if found is None:
        found = next((spark_type_of(v.data.type) for v in values if v.arrow), None)
    return found
