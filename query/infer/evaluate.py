"""Evaluating expressions over a table's rows, with SQL's null semantics.

A frame is a pandas DataFrame whose columns are exprIds. Predicates evaluate to pandas'
nullable ``boolean`` (Kleene logic: ``NOT NULL`` is NULL, ``FALSE AND NULL`` is FALSE), and
a row passes a predicate only where it is TRUE, as in Spark's Filter.

Decimals stay ``Decimal`` (exact, as Spark's are), dates ``datetime.date``.
"""

from __future__ import annotations

import datetime
import functools
import json
import math
import operator
import re
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Any, Callable

import numpy as np
import pandas as pd

from headwater.spark.expr import Expr, column, int_value, str_value, yields_spec


class Unevaluable(ValueError):
    """An expression holds a node this package cannot evaluate (an opaque function, an aggregate…)."""


@dataclass
class Binding:
    """Values a predicate's free names stand for: the traced row's values, value sets, subquery results."""

    params: dict[str, object] = field(default_factory=dict)
    sets: dict[str, frozenset] = field(default_factory=dict)
    scalars: dict[int, object] = field(default_factory=dict)


_COMPARE = {"=": operator.eq, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}
def _remainder(x, y):
    """Spark's ``%``, Java's remainder: the dividend's sign (-7 % 3 is -1, where Python's is 2)."""
    if isinstance(x, (float, np.floating)) or isinstance(y, (float, np.floating)):
        return math.fmod(x, y)
    if isinstance(x, Decimal) or isinstance(y, Decimal):
        return Decimal(x) % Decimal(y)  # Decimal's remainder is truncated already
    found = abs(x) % abs(y)
    return -found if x < 0 else found


_ARITH = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv, "%": _remainder}
_DECIMAL = re.compile(r"decimal\((\d+),\s*(\d+)\)")
_STRING_TESTS: dict[str, Callable[[str, str], bool]] = {
    "startswith": str.startswith, "endswith": str.endswith, "contains": operator.contains}
_STRING_FUNCTIONS: dict[str, Callable[[str], object]] = {"upper": str.upper, "lower": str.lower, "length": len}


def holds(e: Expr, frame: pd.DataFrame, bind: Binding | None = None) -> np.ndarray:
    """Which rows ``e`` is TRUE for (NULL and FALSE rows do not pass)."""
    value = evaluate(e, frame, bind or Binding())
    return value.fillna(False).to_numpy(dtype=bool)


def evaluate(e: Expr, frame: pd.DataFrame, bind: Binding | None = None) -> pd.Series:
    return _eval(e, frame, bind or Binding())


def _const(value, frame: pd.DataFrame) -> pd.Series:
    if isinstance(value, bool):
        return pd.Series(value, index=frame.index, dtype="boolean")
    return pd.Series([value] * len(frame), index=frame.index, dtype=object)


def _null(frame: pd.DataFrame, dtype="boolean") -> pd.Series:
    if dtype == "boolean":
        return pd.Series(pd.NA, index=frame.index, dtype="boolean")
    return pd.Series([None] * len(frame), index=frame.index, dtype=object)


def _isnull(s: pd.Series) -> np.ndarray:
    return s.isna().to_numpy(dtype=bool)


def _series(values: np.ndarray, ok: np.ndarray, frame: pd.DataFrame, dtype=object) -> pd.Series:
    """A column from an object array whose rows outside ``ok`` are NULL."""
    if dtype == "boolean":
        truth = np.zeros(len(values), dtype=bool)
        truth[ok] = values[ok].astype(bool)
        return pd.Series(pd.arrays.BooleanArray(truth, ~ok), index=frame.index)
    values = values.copy()
    values[~ok] = None
    return pd.Series(values, index=frame.index, dtype=object)


def _elementwise(fn, a: pd.Series, b: pd.Series, frame: pd.DataFrame, dtype=object) -> pd.Series:
    """``fn`` on the rows where neither side is NULL; NULL elsewhere."""
    ok = ~(_isnull(a) | _isnull(b))
    values = np.full(len(frame), None, dtype=object)
    if ok.any():
        values[np.flatnonzero(ok)] = objects([fn(x, y) for x, y in zip(a[ok].tolist(), b[ok].tolist())])
    return _series(values, ok, frame, dtype)


def _map(fn, a: pd.Series, frame: pd.DataFrame, dtype=object) -> pd.Series:
    ok = ~_isnull(a)
    values = np.full(len(frame), None, dtype=object)
    if ok.any():
        values[np.flatnonzero(ok)] = objects([fn(x) for x in a[ok].tolist()])
    return _series(values, ok, frame, dtype)


def _member(a: pd.Series, values, frame: pd.DataFrame) -> pd.Series:
    """Whether each value lies in ``values`` (compared by ``value_key``), NULL for NULL;
    decided once per distinct value, since a column repeats its keys."""
    ok = ~_isnull(a)
    found = np.full(len(frame), None, dtype=object)
    if ok.any():
        codes, distinct = distinct_values(a[ok].to_numpy(dtype=object))
        member = np.array([value_key(v) in values for v in distinct] + [False], dtype=bool)
        found[np.flatnonzero(ok)] = member[codes]  # code -1 (a NaN-like value): the appended False
    return _series(found, ok, frame, "boolean")


def distinct_values(items: np.ndarray) -> tuple[np.ndarray, list]:
    """(each item's position among the distinct items, -1 for None and NaN; the distinct items).

    Python's equality decides what is distinct (1, 1.0 and Decimal('1') are one), which
    ``value_key`` agrees with; items that cannot be hashed stay each their own."""
    try:
        codes, distinct = pd.factorize(items)
        return codes, list(distinct)
    except TypeError:
        return np.arange(len(items)), list(items)


def objects(items: list) -> np.ndarray:
    """A list as a 1-d object array, even when its items are sequences themselves."""
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


def _bool(s: pd.Series) -> pd.Series:
    return s if str(s.dtype) == "boolean" else s.astype("boolean")


def _eval(e: Expr, frame: pd.DataFrame, bind: Binding) -> pd.Series:
    op = e.op
    if op == "col":
        expr_id, name = column(e)
        try:
            return frame[expr_id]
        except KeyError:
            raise Unevaluable(f"column {name}#{expr_id} is not in the table evaluated") from None
    if op == "lit":
        return _null(frame, object) if e.value is None else _const(e.value, frame)
    if op == "param":
        if e.value not in bind.params:
            raise Unevaluable(f"no value for ${e.value}")
        value = bind.params[e.value]
        return _null(frame, object) if value is None else _const(value, frame)
    if op == "scalar_subquery":
        if e.value not in bind.scalars:
            raise Unevaluable(f"no value for scalar subquery {e.value}")
        value = bind.scalars[e.value]
        return _null(frame, object) if value is None else _const(value, frame)
    if op == "alias":
        return _eval(e.args[0], frame, bind)
    if op == "and":
        return _bool(_eval(e.args[0], frame, bind)) & _bool(_eval(e.args[1], frame, bind))
    if op == "or":
        return _bool(_eval(e.args[0], frame, bind)) | _bool(_eval(e.args[1], frame, bind))
    if op == "not":
        return ~_bool(_eval(e.args[0], frame, bind))
    if op in _COMPARE:
        a, b = (_eval(x, frame, bind) for x in e.args)
        return _elementwise(_compare(_COMPARE[op]), a, b, frame, "boolean")
    if op == "<=>":
        a, b = (_eval(x, frame, bind) for x in e.args)
        both_null = _isnull(a) & _isnull(b)
        equal = _elementwise(_compare(operator.eq), a, b, frame, "boolean").fillna(False)
        return pd.Series(both_null | equal.to_numpy(dtype=bool), index=frame.index, dtype="boolean")
    if op == "isnull":
        return pd.Series(_isnull(_eval(e.args[0], frame, bind)), index=frame.index, dtype="boolean")
    if op == "isnotnull":
        return pd.Series(~_isnull(_eval(e.args[0], frame, bind)), index=frame.index, dtype="boolean")
    if op == "in":
        a = _eval(e.args[0], frame, bind)
        items = [_eval(x, frame, bind) for x in e.args[1:]]
        if all(x.op in ("lit", "param") for x in e.args[1:]):
            keys = {value_key(s.iloc[0]) for s in items if len(s) and not pd.isna(s.iloc[0])}
            found = _member(a, keys, frame)
            if any(len(s) and (s.iloc[0] is None or s.iloc[0] is pd.NA) for s in items):
                # a NULL in the list: no match is NULL, not FALSE (Spark's In)
                found = found.mask(found == False, pd.NA)  # noqa: E712 (elementwise on a boolean Series)
            return found
        out = pd.Series(False, index=frame.index, dtype="boolean")
        for s in items:
            out = out | _elementwise(_compare(operator.eq), a, s, frame, "boolean")
        return out
    if op == "in_set":
        bound = bind.sets.get(str_value(e))
        if bound is None:
            raise Unevaluable(f"no values bound for the set @{e.value}")
        return _member(_eval(e.args[0], frame, bind), bound, frame)
    if op == "tuple":  # a composite key: NULL when any part is
        parts = [_eval(x, frame, bind) for x in e.args]
        ok = ~np.logical_or.reduce([_isnull(p) for p in parts])
        values = np.full(len(frame), None, dtype=object)
        values[np.flatnonzero(ok)] = objects(list(zip(*[p[ok].tolist() for p in parts])))
        return _series(values, ok, frame)
    if op in _ARITH:
        a, b = (_eval(x, frame, bind) for x in e.args)
        return _elementwise(_arith(_ARITH[op]), a, b, frame)
    if op == "neg":
        return _map(operator.neg, _eval(e.args[0], frame, bind), frame)
    if op == "abs":
        return _map(abs, _eval(e.args[0], frame, bind), frame)
    if op in ("startswith", "endswith", "contains"):
        a, b = (_eval(x, frame, bind) for x in e.args)
        test = _STRING_TESTS[op]
        return _elementwise(lambda x, y: test(str(x), str(y)), a, b, frame, "boolean")
    if op == "like":
        a, pattern = (_eval(x, frame, bind) for x in e.args)
        escape = str_value(e)
        return _elementwise(lambda x, p: _like(p, escape).fullmatch(str(x)) is not None, a, pattern, frame, "boolean")
    if op in ("upper", "lower", "length"):
        fn = _STRING_FUNCTIONS[op]
        return _map(lambda x: fn(str(x)), _eval(e.args[0], frame, bind), frame)
    if op == "substring":
        s, pos, length = (_eval(x, frame, bind) for x in e.args)
        ok = ~(_isnull(s) | _isnull(pos) | _isnull(length))
        values = np.full(len(frame), None, dtype=object)
        values[np.flatnonzero(ok)] = objects([_substring(str(x), int(p), int(n)) for x, p, n in
                                               zip(s[ok].tolist(), pos[ok].tolist(), length[ok].tolist())])
        return _series(values, ok, frame)
    if op == "concat":
        parts = [_eval(x, frame, bind) for x in e.args]
        ok = ~np.logical_or.reduce([_isnull(p) for p in parts])
        values = np.full(len(frame), None, dtype=object)
        joined = ["".join(map(_text, row)) for row in zip(*[p[ok].tolist() for p in parts])]
        values[np.flatnonzero(ok)] = objects(joined)
        return _series(values, ok, frame)
    if op == "yields":
        return _yields(e, frame, bind)
    if op == "split":
        return _map(_splitter(e.args[1], e.args[2]), _eval(e.args[0], frame, bind), frame)
    if op in ("array", "struct"):  # arrays as tuples, so they hash; structs as tuples, as ``field`` reads them
        parts = [_eval(x, frame, bind).astype(object) for x in e.args]
        rows = zip(*[p.where(~p.isna(), None).tolist() for p in parts]) if parts else ([()] * len(frame))
        return pd.Series(objects([tuple(row) for row in rows]), index=frame.index, dtype=object)
    if op == "from_json":
        return _map(lambda text: _from_json(_text(text), e.value), _eval(e.args[0], frame, bind), frame)
    if op == "field":
        return _map(lambda struct: struct[e.value], _eval(e.args[0], frame, bind), frame)
    if op == "round":
        a, scale = (_eval(x, frame, bind) for x in e.args)
        return _elementwise(_round, a, scale, frame)
    if op in ("year", "month", "day"):
        return _map(lambda d: getattr(d, op), _eval(e.args[0], frame, bind), frame)
    if op == "cast":
        return _map(_caster(e.dtype or "string"), _eval(e.args[0], frame, bind), frame)
    if op in ("case", "if"):
        return _case(e, frame, bind)
    if op == "coalesce":
        out = _eval(e.args[0], frame, bind).astype(object)
        for other in e.args[1:]:
            missing = _isnull(out)
            if not missing.any():
                break
            out = out.where(~missing, _eval(other, frame, bind).astype(object))
        return out
    raise Unevaluable(f"cannot evaluate {op}{'[' + str(e.value) + ']' if op == 'opaque' else ''}")


def generated(kind: str, collection, width: int, outer: bool = False) -> list[tuple]:
    """The rows generator ``kind`` (explode, posexplode, inline) yields for one value: an
    array's elements (after their positions, for posexplode), a map's entries, an array of
    structs' fields (NULLs for a NULL struct); with ``outer``, one row of NULLs where it
    yields none."""
    if kind not in ("explode", "posexplode", "inline"):
        raise Unevaluable(f"generator {kind}")
    items: list[Any]  # a collection's values: whatever the data holds
    if collection is None:
        items = []
    elif isinstance(collection, dict):
        items = list(collection.items())
    elif isinstance(collection, (list, tuple, np.ndarray)):
        items = [_scalar(v) for v in collection]
    else:
        raise Unevaluable(f"{kind} of {type(collection).__name__}")
    rows: list[tuple]
    if kind == "inline":
        if any(v is not None and not isinstance(v, (tuple, dict)) for v in items):
            raise Unevaluable("inline of something other than structs")
        rows = [(None,) * width if v is None else tuple(v.values()) if isinstance(v, dict) else v for v in items]
    else:
        rows = [v if isinstance(collection, dict) else (v,) for v in items]
        if kind == "posexplode":
            rows = [(i, *v) for i, v in enumerate(rows)]
    if not rows and outer:
        rows = [(None,) * width]
    if any(len(row) != width for row in rows):
        raise Unevaluable(f"{kind} yields rows of another width than its {width} columns")
    return rows


def _scalar(v):
    """``v`` with pandas' and numpy's missing values as None."""
    return None if v is None or v is pd.NA or (isinstance(v, float) and np.isnan(v)) else v


def _yields(e: Expr, frame: pd.DataFrame, bind: Binding) -> pd.Series:
    """Whether each row's collection yields a row null-safe equal to the values wanted."""
    kind, outer, _ = yields_spec(e)
    collections = _eval(e.args[0], frame, bind).tolist()
    wanted = [_eval(v, frame, bind).tolist() for v in e.args[1:]]
    found = []
    for i, collection in enumerate(collections):
        key = tuple(value_key(_scalar(w[i])) for w in wanted)
        found.append(any(tuple(value_key(_scalar(v)) for v in row) == key
                         for row in generated(kind, _scalar(collection), len(wanted), outer)))
    return pd.Series(found, index=frame.index, dtype="boolean")


_REGEX_SYNTAX = re.compile(r"[.^$*+?{}\[\]|()]")


def _splitter(pattern: Expr, limit: Expr):
    """Spark's ``split(s, regex, limit)`` for a regex that only spells a literal separator
    (escapes of punctuation allowed): there Java's and Python's regexes cannot differ."""
    if pattern.op != "lit" or limit.op != "lit" or not isinstance(pattern.value, str) \
            or limit.value is None or not pattern.value:
        raise Unevaluable(f"split by {pattern} limited to {limit}")
    unescaped = re.sub(r"\\([^0-9A-Za-z])", "", pattern.value)
    if "\\" in unescaped or _REGEX_SYNTAX.search(unescaped):
        raise Unevaluable(f"split by the regex {pattern.value!r}")
    separator = re.sub(r"\\([^0-9A-Za-z])", r"\1", pattern.value)
    most = int_value(limit) - 1 if int_value(limit) > 0 else -1
    return lambda text: tuple(_text(text).split(separator, most))


def _case(e: Expr, frame: pd.DataFrame, bind: Binding) -> pd.Series:
    args = list(e.args)
    values = np.full(len(frame), None, dtype=object)
    undecided = np.ones(len(frame), dtype=bool)
    while len(args) >= 2:
        cond, value = args[0], args[1]
        args = args[2:]
        chosen = undecided & holds(cond, frame, bind)
        if chosen.any():
            values[chosen] = _eval(value, frame, bind).to_numpy(dtype=object)[chosen]
        undecided &= ~chosen
    if args and undecided.any():
        values[undecided] = _eval(args[0], frame, bind).to_numpy(dtype=object)[undecided]
    return pd.Series(values, index=frame.index, dtype=object)


_ITSELF = (int, str, bool, datetime.date)  # exactly these types: subclasses (numpy's, pandas') are converted


def value_key(v):
    """A value as set members and join keys compare: Spark compares 1 and 1.0 and Decimal('1.0') equal; so must sets."""
    if type(v) in _ITSELF:
        return v
    if isinstance(v, tuple):
        return tuple(value_key(x) for x in v)
    if isinstance(v, (float, np.floating)) and not np.isfinite(v):
        return None if np.isnan(v) else float(v)
    if isinstance(v, (Decimal, float, np.floating)) and v == int(v):
        return int(v)
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    if isinstance(v, pd.Timestamp):
        return v.date()
    return v


def _compare(fn):
    def compare(x, y):
        if isinstance(x, Decimal) and isinstance(y, float) or isinstance(x, float) and isinstance(y, Decimal):
            x, y = float(x), float(y)
        return bool(fn(x, y))
    return compare


def _arith(fn):
    def arith(x, y):
        if isinstance(x, Decimal) and isinstance(y, (float, np.floating)):
            x = float(x)
        elif isinstance(y, Decimal) and isinstance(x, (float, np.floating)):
            y = float(y)
        if (fn is operator.truediv or fn is _remainder) and y == 0:
            return None  # as Spark without ANSI mode; with it the batch fails, and no row of it is asked about
        return fn(x, y)
    return arith


def _caster(dtype: str):
    found = _DECIMAL.fullmatch(dtype)
    if found:
        quantum = Decimal(1).scaleb(-int(found.group(2)))

        def to_decimal(v):
            try:
                return Decimal(str(v) if isinstance(v, float) else v).quantize(quantum, rounding=ROUND_HALF_UP)
            except (InvalidOperation, TypeError, ValueError):
                return None
        return to_decimal
    if dtype in ("double", "float"):
        return float
    if dtype in ("integer", "long", "short", "byte"):
        return lambda v: int(v) if not isinstance(v, str) else int(float(v))
    if dtype == "string":
        return _text
    if dtype == "date":
        return lambda v: v if isinstance(v, datetime.date) else datetime.date.fromisoformat(str(v)[:10])
    if dtype == "boolean":
        return bool
    raise Unevaluable(f"cannot cast to {dtype}")


def _text(v) -> str:
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).decode("utf-8", errors="replace")
    return v.isoformat() if isinstance(v, datetime.date) else str(v)


@functools.lru_cache(maxsize=1 << 14)  # a batch of 16k records; a few MB in a long-running service
def _from_json(text: str, fields: tuple) -> tuple:
    """Spark's ``from_json`` in its default (permissive) mode: a malformed record gives NULL
    fields; a field of the wrong type, NULL. Kept per text: inference evaluates a plan's
    expressions over a batch's records again at each step of its refinement."""
    try:
        found = json.loads(text)
    except ValueError:
        found = None
    if not isinstance(found, dict):
        return tuple(None for _ in fields)
    out = []
    for name, dtype in fields:
        v = found.get(name)
        try:
            if v is None or dtype in ("", "string"):
                out.append(v if v is None or dtype == "" else (v if isinstance(v, str) else json.dumps(v)))
            elif dtype in ("integer", "long", "short", "byte"):
                out.append(int(v) if isinstance(v, int) and not isinstance(v, bool) else None)
            elif dtype in ("double", "float"):
                out.append(float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None)
            elif dtype == "boolean":
                out.append(v if isinstance(v, bool) else None)
            else:
                out.append(_caster(dtype)(v))
        except (TypeError, ValueError, Unevaluable):
            out.append(None)
    return tuple(out)


def _round(x, scale):
    """Spark's ``round``: half up, on the decimal value (so 2.675 rounds to 2.68)."""
    quantum = Decimal(1).scaleb(-int(scale))
    if isinstance(x, Decimal):
        return x.quantize(quantum, rounding=ROUND_HALF_UP)
    if isinstance(x, float):
        return float(Decimal(repr(x)).quantize(quantum, rounding=ROUND_HALF_UP))
    return int(Decimal(x).quantize(quantum, rounding=ROUND_HALF_UP))


def _substring(s: str, pos: int, length: int) -> str:
    """Spark's ``substring`` (``UTF8String.substringSQL``): 1-based; 0 counts as 1; negative counts from the end,
    and the end is counted before a start before the string is clamped to it (``substring('abcde', -7, 3)`` is
    ``'a'``)."""
    start = pos - 1 if pos > 0 else (len(s) + pos if pos < 0 else 0)
    end = start + length
    start = max(start, 0)
    return s[start:end] if start < end else ""


_LIKE_CACHE: dict[tuple[str, str], re.Pattern] = {}


def _like(pattern: str, escape: str) -> re.Pattern:
    key = (pattern, escape)
    if key not in _LIKE_CACHE:
        out, i = [], 0
        while i < len(pattern):
            ch = pattern[i]
            if ch == escape and i + 1 < len(pattern):
                out.append(re.escape(pattern[i + 1]))
                i += 2
                continue
            out.append(".*" if ch == "%" else "." if ch == "_" else re.escape(ch))
            i += 1
        _LIKE_CACHE[key] = re.compile("".join(out), re.S)
    return _LIKE_CACHE[key]
