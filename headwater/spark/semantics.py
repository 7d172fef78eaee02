"""Spark's rules for one value at a time: what the evaluator (``evaluate.py``) computes in Python's form, and the
rules its Arrow form must agree with.

Each function is one rule of Spark's, named for it: how values compare and key sets (``value_key``), Java's
remainder, ``substring``'s bounds, a LIKE pattern as a regular expression, ``round`` half up, ``CAST``,
``from_json``, ``split``, what a generator yields. NULL is ``None``; ``missing`` takes a float NaN for NULL too
(pandas' NULL in a float column, in literals bound from a frame and in collections read through pandas). Only the
standard library and numpy (for numpy's scalars in ``value_key``).
"""

from __future__ import annotations

import datetime
import functools
import json
import math
import re
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Any, Callable

import numpy as np

from .expr import Expr, int_value

INTEGRAL = ("byte", "short", "integer", "long")
FLOATING = ("float", "double")
NUMERIC = (*INTEGRAL, *FLOATING)  # Spark's numeric precedence, narrowest first


class NotEvaluable(ValueError):
    """An expression holds a node the evaluator does not model (an opaque function, an aggregate…)."""


class NotExact(NotEvaluable):
    """With ``exact=True``: here the answer could differ from Spark's; Spark must evaluate it."""


def missing(v) -> bool:
    """Whether a Python value is NULL: None, or a float NaN (pandas' NULL in a float column)."""
    return v is None or (isinstance(v, float) and math.isnan(v))


def value_key(v):
    """A value as set members and join keys compare: Spark compares 1 and 1.0 and Decimal('1.0') equal; so must sets."""
    if type(v) in (int, str, bool, datetime.date):  # exactly these: subclasses (numpy's, pandas') are converted
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
    if hasattr(v, "to_pydatetime"):  # a pandas Timestamp: a date column pandas converted
        return v.date()
    return v


def numbers(x, y):
    """Two numbers as Spark computes them together: a decimal beside a float is a double."""
    if type(x) is type(y):
        return x, y
    if isinstance(x, Decimal) and isinstance(y, (float, np.floating)):
        return float(x), y
    if isinstance(y, Decimal) and isinstance(x, (float, np.floating)):
        return x, float(y)
    return x, y


def remainder(x, y):
    """Spark's ``%``, Java's remainder: the dividend's sign (-7 % 3 is -1, where Python's is 2); NULL for % 0."""
    x, y = numbers(x, y)
    if y == 0:
        return None
    if isinstance(x, (float, np.floating)) or isinstance(y, (float, np.floating)):
        return math.fmod(x, y)
    if isinstance(x, Decimal) or isinstance(y, Decimal):
        return Decimal(x) % Decimal(y)  # Decimal's remainder is truncated already
    found = abs(x) % abs(y)
    return -found if x < 0 else found


def divide(x, y):
    x, y = numbers(x, y)
    return None if y == 0 else x / y  # NULL, as Spark without ANSI mode


def arithmetic(fn):
    return lambda x, y: fn(*numbers(x, y))


def substring(s: str, pos: int, length: int) -> str:
    """Spark's ``substring`` (``UTF8String.substringSQL``): 1-based; 0 counts as 1; negative counts from the end,
    and the end is counted before a start before the string is clamped to it (``substring('abcde', -7, 3)`` is
    ``'a'``)."""
    start = pos - 1 if pos > 0 else (len(s) + pos if pos < 0 else 0)
    end = start + length
    start = max(start, 0)
    return s[start:end] if start < end else ""


_REGEX_SPECIAL = set("\\.^$|?*+()[]{}-/#&~")


def like_regex(pattern: str, escape: str) -> str:
    """Spark's LIKE pattern as a regular expression (RE2's and Python's alike) matching the whole of a string when
    anchored: ``_`` one character, ``%`` any run (newlines too); ``escape`` before ``_``, ``%`` or itself takes it
    literally. Before anything else Spark refuses the pattern: ``NotEvaluable``."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == escape:
            if i + 1 == len(pattern) or pattern[i + 1] not in ("_", "%", escape):
                raise NotEvaluable(f"the LIKE pattern {pattern!r}: Spark refuses it")
            out.append(_regex_literal(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if c == "%" else "." if c == "_" else _regex_literal(c))
        i += 1
    return "(?s:" + "".join(out) + ")"


def _regex_literal(c: str) -> str:
    return "\\" + c if c in _REGEX_SPECIAL else c


@functools.lru_cache(maxsize=1024)
def like_pattern(pattern: str, escape: str) -> re.Pattern:
    return re.compile(like_regex(pattern, escape))


def round_half_up(x, scale):
    """Spark's ``round``: half up, on the decimal value (so 2.675 rounds to 2.68)."""
    quantum = Decimal(1).scaleb(-int(scale))
    if isinstance(x, Decimal):
        return x.quantize(quantum, rounding=ROUND_HALF_UP)
    if isinstance(x, float):
        return float(Decimal(repr(x)).quantize(quantum, rounding=ROUND_HALF_UP))
    return int(Decimal(x).quantize(quantum, rounding=ROUND_HALF_UP))


_DECIMAL = re.compile(r"decimal\((\d+),\s*(\d+)\)")


def caster(dtype: str) -> Callable[[Any], Any]:
    """Spark's ``CAST(v AS dtype)`` of one non-NULL value, for the types inference meets."""
    found = _DECIMAL.fullmatch(dtype)
    if found:
        quantum = Decimal(1).scaleb(-int(found.group(2)))

        def to_decimal(v):
            try:
                return Decimal(str(v) if isinstance(v, float) else v).quantize(quantum, rounding=ROUND_HALF_UP)
            except (InvalidOperation, TypeError, ValueError):
                return None
        return to_decimal
    if dtype in FLOATING:
        return float
    if dtype in INTEGRAL:
        return lambda v: int(v) if not isinstance(v, str) else int(float(v))
    if dtype == "string":
        return text
    if dtype == "date":
        return lambda v: v if isinstance(v, datetime.date) else datetime.date.fromisoformat(str(v)[:10])
    if dtype == "boolean":
        return bool
    raise NotEvaluable(f"cannot cast to {dtype}")


def text(v) -> str:
    """A value as Spark renders it as a string."""
    if type(v) is str:
        return v
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).decode("utf-8", errors="replace")
    return v.isoformat() if isinstance(v, datetime.date) else str(v)


@functools.lru_cache(maxsize=1 << 14)  # a batch of 16k records; a few MB in a long-running service
def from_json(record: str, fields: tuple) -> tuple:
    """Spark's ``from_json`` in its default (permissive) mode: a malformed record gives NULL fields; a field of the
    wrong type, NULL. Kept per text: inference evaluates a plan's expressions over a batch's records again at each
    step of its refinement."""
    try:
        found = json.loads(record)
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
            elif dtype in INTEGRAL:
                out.append(int(v) if isinstance(v, int) and not isinstance(v, bool) else None)
            elif dtype in FLOATING:
                out.append(float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None)
            elif dtype == "boolean":
                out.append(v if isinstance(v, bool) else None)
            else:
                out.append(caster(dtype)(v))
        except (TypeError, ValueError, NotEvaluable):
            out.append(None)
    return tuple(out)


_REGEX_SYNTAX = re.compile(r"[.^$*+?{}\[\]|()]")


def splitter(pattern: Expr, limit: Expr) -> Callable[[Any], tuple]:
    """Spark's ``split(s, regex, limit)`` for a regex that only spells a literal separator (escapes of punctuation
    allowed): there Java's and Python's regexes cannot differ."""
    if pattern.op != "lit" or limit.op != "lit" or not isinstance(pattern.value, str) \
            or limit.value is None or not pattern.value:
        raise NotEvaluable(f"split by {pattern} limited to {limit}")
    unescaped = re.sub(r"\\([^0-9A-Za-z])", "", pattern.value)
    if "\\" in unescaped or _REGEX_SYNTAX.search(unescaped):
        raise NotEvaluable(f"split by the regex {pattern.value!r}")
    separator = re.sub(r"\\([^0-9A-Za-z])", r"\1", pattern.value)
    most = int_value(limit) - 1 if int_value(limit) > 0 else -1
    return lambda value: tuple(text(value).split(separator, most))


def generated(kind: str, collection, width: int, outer: bool = False) -> list[tuple]:
    """The rows generator ``kind`` (explode, posexplode, inline) yields for one value: an array's elements (after
    their positions, for posexplode), a map's entries, an array of structs' fields (NULLs for a NULL struct); with
    ``outer``, one row of NULLs where it yields none."""
    if kind not in ("explode", "posexplode", "inline"):
        raise NotEvaluable(f"generator {kind}")
    items: list[Any]  # a collection's values: whatever the data holds
    if collection is None:
        items = []
    elif isinstance(collection, dict):
        items = list(collection.items())
    elif isinstance(collection, (list, tuple, np.ndarray)):
        items = [None if missing(v) else v for v in collection]
    else:
        raise NotEvaluable(f"{kind} of {type(collection).__name__}")
    rows: list[tuple]
    if kind == "inline":
        if any(v is not None and not isinstance(v, (tuple, dict)) for v in items):
            raise NotEvaluable("inline of something other than structs")
        rows = [(None,) * width if v is None else tuple(v.values()) if isinstance(v, dict) else v for v in items]
    else:
        rows = [v if isinstance(collection, dict) else (v,) for v in items]
        if kind == "posexplode":
            rows = [(i, *v) for i, v in enumerate(rows)]
    if not rows and outer:
        rows = [(None,) * width]
    if any(len(row) != width for row in rows):
        raise NotEvaluable(f"{kind} yields rows of another width than its {width} columns")
    return rows


def compare(fn):
    """A comparison of two values as Spark makes it: a decimal beside a float compares as a double."""
    def compare(x, y):
        if type(x) is not type(y):
            x, y = numbers(x, y)
        return bool(fn(x, y))
    return compare
