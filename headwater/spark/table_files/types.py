"""Spark's types as Arrow types, and values written as text read as Spark reads them.

A relation's columns come as Spark ``simpleString`` types (``decimal(15,2)``,
``array<struct<a:int>>``); ``arrow_type`` gives the Arrow type each is read as, and
``spark_type`` the way back for a file's own schema. ``text_parser`` turns a CSV value, a
JSON string or a partition folder's value into a value of a type as Spark does: Java's number
syntax, decimals rounded half up to their scale, Spark's lenient dates and timestamps
(``yyyy[-m[m][-d[d]]]``, an optional ``[T ]h:m[:s[.fraction]]`` and zone), a value that does
not parse raising ValueError where Spark gives NULL.
"""

from __future__ import annotations

import decimal
import math
import re
from datetime import date, datetime, timedelta, timezone, tzinfo
from typing import Any, Callable, NoReturn
from zoneinfo import ZoneInfo

import pyarrow as pa

from .location import TableUnreadable

# ---- Spark types ----------------------------------------------------------------------------

_SIMPLE_TYPES = {
    "boolean": pa.bool_(), "tinyint": pa.int8(), "byte": pa.int8(), "smallint": pa.int16(), "short": pa.int16(),
    "int": pa.int32(), "integer": pa.int32(), "bigint": pa.int64(), "long": pa.int64(),
    "float": pa.float32(), "double": pa.float64(), "string": pa.string(), "binary": pa.binary(),
    "date": pa.date32(), "timestamp": pa.timestamp("us", tz="UTC"), "timestamp_ltz": pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": pa.timestamp("us"), "void": pa.null(),
}


def arrow_type(simple_string: str) -> pa.DataType:
    """The Arrow type of a Spark ``simpleString`` type: ``decimal(15,2)``, ``array<struct<a:int>>``, ..."""
    # Not pyspark's _parse_datatype_string: it needs a running Spark, and this module none.
    text = simple_string.strip()
    low = text.lower()
    if low in _SIMPLE_TYPES:
        return _SIMPLE_TYPES[low]
    if m := re.fullmatch(r"decimal\((\d+),\s*(\d+)\)", low):
        return pa.decimal128(int(m.group(1)), int(m.group(2)))
    if re.fullmatch(r"(var)?char\(\d+\)", low):
        return pa.string()
    if low.startswith("array<") and low.endswith(">"):
        return pa.list_(arrow_type(text[6:-1]))
    if low.startswith("map<") and low.endswith(">"):
        key, value = _top_level(text[4:-1])
        return pa.map_(arrow_type(key), arrow_type(value))
    if low.startswith("struct<") and low.endswith(">"):
        fields = [field.partition(":") for field in _top_level(text[7:-1])] if text[7:-1] else []
        return pa.struct([pa.field(name, arrow_type(t)) for name, _, t in fields])
    raise TableUnreadable(f"the Spark type {simple_string!r} cannot be read here")


def _top_level(text: str) -> list[str]:
    """``text`` split at the commas outside ``<...>`` and ``(...)``."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c in "<(":
            depth += 1
        elif c in ">)":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return parts + [text[start:]]


def spark_type(t: pa.DataType, instant: bool = False) -> str:
    """The Spark ``simpleString`` of an Arrow type (the inverse of ``arrow_type``); ``instant``:
    a zone-less timestamp is an instant all the same."""
    if pa.types.is_timestamp(t):
        return "timestamp" if t.tz is not None or instant else "timestamp_ntz"
    for name, arrow in _SIMPLE_TYPES.items():
        if t == arrow:
            return name
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_large_string(t) or pa.types.is_string_view(t) or pa.types.is_dictionary(t):
        return "string"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return f"array<{spark_type(t.value_type)}>"
    if pa.types.is_map(t):
        return f"map<{spark_type(t.key_type)},{spark_type(t.item_type)}>"
    if pa.types.is_struct(t):
        return "struct<" + ",".join(f"{f.name}:{spark_type(f.type)}" for f in t) + ">"
    if pa.types.is_integer(t):  # unsigned: the next wider signed type, as Spark reads them
        return {8: "smallint", 16: "int", 32: "bigint"}.get(t.bit_width, "decimal(20,0)")
    raise TableUnreadable(f"Arrow type {t} has no Spark type here")


# ---- values written as text (CSV, JSON strings, partition folders) -------------------------

INT = re.compile(r"[+-]?[0-9]+")
JAVA_SPACE = "".join(chr(c) for c in range(33))  # String.trim() strips every char up to ' '
_JAVA_DOUBLE = re.compile(r"[+-]?(NaN|Infinity|([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?)[fFdD]?")
_JAVA_DECIMAL = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")
_DATE = re.compile(r"([+-]?[0-9]{4,7})(?:-([0-9]{1,2})(?:-([0-9]{1,2})(?:[T ].*)?)?)?", re.DOTALL)
_TIMESTAMP = re.compile(r"([+-]?[0-9]{4,7})(?:-([0-9]{1,2})(?:-([0-9]{1,2}))?)?"
                        r"(?:[T ]([0-9]{1,2}):([0-9]{1,2})(?::([0-9]{1,2})(?:\.([0-9]*))?)?)?\s*(.*)", re.DOTALL)
_OFFSET = re.compile(r"(?:UTC|GMT|UT)?([+-])([0-9]{1,2})(?::?([0-9]{2}))?(?::?([0-9]{2}))?")
_DECIMALS = decimal.Context(prec=100, rounding=decimal.ROUND_HALF_UP)
_BOOLEANS = {"true": True, "false": False}


def text_parser(t: pa.DataType, options: dict) -> Callable[[str], Any]:
    """How Spark turns a text value into a value of ``t``; it raises ValueError where Spark gets NULL."""
    if pa.types.is_string(t):
        return str
    if pa.types.is_integer(t):
        low, high = -(1 << (t.bit_width - 1)), (1 << (t.bit_width - 1)) - 1
        return lambda s: bounded(int(s) if INT.fullmatch(s) else fail(s), low, high)
    if pa.types.is_floating(t):
        specials = {options.get("nanvalue", "NaN"): math.nan, options.get("positiveinf", "Inf"): math.inf,
                    options.get("negativeinf", "-Inf"): -math.inf}
        return lambda s: specials[s] if s in specials else _java_double(s)
    if pa.types.is_decimal(t):
        # Spark's default (US) locale parser drops thousands separators before BigDecimal.
        return lambda s: fit_decimal(java_decimal(s.replace(",", "")), t)
    if pa.types.is_boolean(t):
        return lambda s: _BOOLEANS[s.lower()] if s.lower() in _BOOLEANS else fail(s)  # Scala's toBoolean
    if pa.types.is_date32(t):
        _refuse_format(options, "dateformat")
        return _parse_date
    if pa.types.is_timestamp(t):
        _refuse_format(options, "timestampntzformat" if t.tz is None else "timestampformat")
        zone = None if t.tz is None else _default_zone(options)
        return lambda s: _parse_timestamp(s, zone, naive=t.tz is None)
    if pa.types.is_binary(t):
        return lambda s: s.encode()
    if pa.types.is_null(t):
        return lambda s: None
    raise TableUnreadable(f"{t} values cannot be read from text")


def _refuse_format(options: dict, name: str) -> None:
    for key in (name, "locale"):
        if key in options:
            raise TableUnreadable(f"the {key} option ({options[key]!r}) is not supported here")


def fail(s: str) -> NoReturn:
    raise ValueError(f"cannot parse {s!r}")


def bounded(value: int, low: int, high: int) -> int:
    return value if low <= value <= high else fail(str(value))


def _java_double(s: str) -> float:
    # float() alone would take what Java's parseDouble refuses: "inf", "nan", "1_0".
    s = s.strip(JAVA_SPACE)
    if not _JAVA_DOUBLE.fullmatch(s):
        fail(s)
    return float(s.rstrip("fFdD"))


def java_decimal(s: str) -> decimal.Decimal:
    # Decimal() alone takes "1_0", which BigDecimal refuses (CSV_VALUES' dec column shows it).
    return decimal.Decimal(s) if _JAVA_DECIMAL.fullmatch(s) else fail(s)


def fit_decimal(value: decimal.Decimal, t: pa.Decimal128Type) -> decimal.Decimal:
    """``value`` rounded half up to the type's scale; one with more digits than it holds is NULL."""
    fitted = _DECIMALS.quantize(value, decimal.Decimal(1).scaleb(-t.scale))
    integer_digits = fitted.adjusted() + 1 if fitted else 0
    return fail(str(value)) if integer_digits > t.precision - t.scale else fitted


# Not fromisoformat: Spark takes "2026-1-2", "2026", "2026-01" and zone names (CSV_VALUES in the tests).
def _parse_date(s: str) -> date:
    m = _DATE.fullmatch(s.strip())
    if m is None:
        fail(s)
    return date(int(m.group(1)), int(m.group(2) or 1), int(m.group(3) or 1))


def _parse_timestamp(s: str, zone: tzinfo | None, naive: bool = False) -> datetime:
    m = _TIMESTAMP.fullmatch(s.strip())
    if m is None:
        fail(s)
    year, month, day, hour, minute, second, fraction, zone_text = m.groups()
    micros = int((fraction or "")[:6].ljust(6, "0"))
    value = datetime(int(year), int(month or 1), int(day or 1), int(hour or 0), int(minute or 0),
                     int(second or 0), micros)
    if naive:
        return value if not zone_text else fail(s)
    if zone_text:
        return value.replace(tzinfo=_zone(zone_text))
    # No zone: the session's; None is this machine's zone, which astimezone applies to naive values.
    return value.replace(tzinfo=zone) if zone is not None else value.astimezone(timezone.utc)


def _zone(text: str) -> tzinfo:
    if text in ("Z", "UTC", "GMT", "UT"):
        return timezone.utc
    if m := _OFFSET.fullmatch(text):
        sign, hours, minutes, seconds = m.groups()
        offset = timedelta(hours=int(hours), minutes=int(minutes or 0), seconds=int(seconds or 0))
        return timezone(-offset if sign == "-" else offset)
    try:
        return ZoneInfo(text)
    except (KeyError, ValueError, OSError):  # not a zone name, or a folder of zones
        return fail(text)


def _default_zone(options: dict) -> tzinfo | None:
    if "timezone" not in options:
        return None
    try:
        return _zone(options["timezone"])
    except ValueError:
        raise TableUnreadable(f"the timeZone option ({options['timezone']!r}) is not a zone") from None


def partition_type(values: list[str | None]) -> str:
    """Spark's inference of a partition column's type from its values, for the common types."""
    present = [v for v in values if v is not None]
    if not present:
        return "string"
    if all(INT.fullmatch(v) for v in present):
        widest = max(abs(int(v)) for v in present)
        return "int" if widest < 2 ** 31 else "bigint" if widest < 2 ** 63 else "decimal(38,0)"
    if all(_JAVA_DOUBLE.fullmatch(v) for v in present):
        return "double"
    if all(re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", v) for v in present):
        return "date"
    return "string"
