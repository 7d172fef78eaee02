"""JSON files read as Spark reads them: Jackson's parsing with Spark's defaults.

One value per line (an array gives a row per object) unless ``multiLine``; fields by exact
name; single quotes, ``NaN`` and ``Infinity`` allowed. A number read into a string column is
its text as written, an object or array its JSON text as written; a record that does not
parse is a row of NULLs, and a value that does not fit its column is NULL with the rest of
the row kept.
"""

from __future__ import annotations

import base64
import json
import math
import re
from datetime import datetime, timezone
from typing import Any, Callable, Iterator

import pyarrow as pa

from .listing import DataFile
from .location import TableUnreadable, flag
from .text import file_text, kept_rows, rows_table, split_lines
from .types import INT, bounded, fail, fit_decimal, java_decimal, text_parser


class _JsonObject(dict):
    text = ""  # as written: Spark reads an object into a string column as its source text


class _JsonArray(list):
    text = ""


class _JsonNumber(str):
    """A JSON number (or NaN, Infinity) as written."""


_SPACE = re.compile(r"[ \t\r\n]*")
# The json module's own reader of a string's body; typeshed leaves it out of json.decoder (it is _json's C one, or
# the pure-Python py_scanstring).
_scanstring: Callable[[str, int, bool], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]
_LITERAL = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?|NaN|-?Infinity|true|false|null")
_WORDS = {"true": True, "false": False, "null": None}
_NON_NUMBERS = {"NaN": math.nan, "Infinity": math.inf, "+Infinity": math.inf, "+INF": math.inf,
                "-Infinity": -math.inf, "-INF": -math.inf}  # the strings Spark reads as doubles


def read_json(path: str, data: list, options: dict) -> pa.Table:
    parsers = [(name, _nullable(_parser(t, options))) for name, t in data]

    def typed() -> Iterator[tuple[list, bool]]:
        for objects in _objects(file_text(path, options), options):
            if objects is None:
                yield [None] * len(data), True
                continue
            for obj in objects:
                row, bad = [], False
                for name, parse in parsers:
                    try:
                        row.append(parse(obj.get(name)))
                    except (ValueError, ArithmeticError, KeyError, OSError):
                        row.append(None)  # Spark 4 keeps the rest of the row (partial results)
                        bad = True
                yield row, bad
    return rows_table(kept_rows(path, typed(), options), data)


def json_columns(files: list[DataFile], options: dict) -> list[tuple[str, str]]:
    """Without the relation's columns: every field seen, sorted, scalars typed and the rest strings."""
    seen: dict[str, set[str]] = {}
    for file in files:
        for objects in _objects(file_text(file.path, options), options):
            for obj in objects or []:
                for key, value in obj.items():
                    seen.setdefault(key, set()).add(_kind(value))
    return [(key, _widest(kinds - {"void"})) for key, kinds in sorted(seen.items())]


def _objects(text: str, options: dict) -> Iterator[list | None]:
    """Each record's objects (an array of objects is a row per object), None for a corrupt one."""
    for chunk in [text] if flag(options, "multiline") else split_lines(text, options):
        if not chunk.strip(" \t\r\n"):
            continue
        try:
            record = _value(chunk, 0)[0]
        except (ValueError, IndexError):
            yield None
            continue
        if isinstance(record, _JsonObject):
            yield [record]
        elif isinstance(record, _JsonArray) and all(isinstance(x, _JsonObject) for x in record):
            yield record
        else:
            yield None


# Not json or pyarrow.json: Jackson takes {'i': 9} and gives an object's text as written (JSON_EDGES, test_json_lines).
def _value(text: str, i: int) -> tuple[Any, int]:
    """One JSON value from ``text[i]`` as Jackson reads it with Spark's defaults (single quotes
    and NaN/Infinity allowed), and where it ends."""
    i = _after_space(text, i)
    c = text[i]
    if c in "{[":
        node: _JsonObject | _JsonArray = _JsonObject() if c == "{" else _JsonArray()
        close = "}" if c == "{" else "]"
        start, i = i, _after_space(text, i + 1)
        while text[i] != close:
            if isinstance(node, _JsonObject):
                key, i = _string(text, _after_space(text, i))
                i = _after_space(text, i)
                if text[i] != ":":
                    raise ValueError(f"expected ':' at {i}")
                node[key], i = _value(text, i + 1)
            else:
                value, i = _value(text, i)
                node.append(value)
            i = _after_space(text, i)
            if text[i] == ",":
                i += 1
            elif text[i] != close:
                raise ValueError(f"expected ',' or {close!r} at {i}")
        node.text = text[start:i + 1]
        return node, i + 1
    if c in "\"'":
        return _string(text, i)
    m = _LITERAL.match(text, i)
    if m is None:
        raise ValueError(f"no JSON value at {i}")
    word = m.group(0)
    return (_WORDS[word] if word in _WORDS else _JsonNumber(word)), m.end()


def _after_space(text: str, i: int) -> int:
    """Where the whitespace from ``text[i]`` on ends."""
    found = _SPACE.match(text, i)
    assert found is not None  # the pattern matches the empty string, at any position
    return found.end()


def _string(text: str, i: int) -> tuple[str, int]:
    if text[i] == '"':
        return _scanstring(text, i + 1, True)
    if text[i] != "'":
        raise ValueError(f"expected a string at {i}")
    end = i + 1
    while text[end] != "'":
        end += 2 if text[end] == "\\" else 1
    # The escapes of double quotes, and \' besides: rewrite it as a double-quoted string.
    body = re.sub(r'\\(.)|"', lambda m: "'" if m.group(1) == "'" else m.group(0) if m.group(1) else '\\"',
                  text[i + 1:end], flags=re.DOTALL)
    return _scanstring('"' + body + '"', 1, True)[0], end + 1


def _parser(t: pa.DataType, options: dict) -> Callable[[Any], Any]:
    """How Spark's JacksonParser turns a JSON value into a value of ``t``; ValueError where it fails."""
    def plain(v: Any) -> bool:
        return isinstance(v, str) and not isinstance(v, _JsonNumber)

    def number(v: Any) -> bool:
        return isinstance(v, _JsonNumber)

    if pa.types.is_string(t):
        # A number, object or array read into a string column is its JSON text as written.
        return lambda v: ("true" if v else "false") if isinstance(v, bool) else str(getattr(v, "text", v))
    if pa.types.is_integer(t):
        low, high = -(1 << (t.bit_width - 1)), (1 << (t.bit_width - 1)) - 1
        return lambda v: bounded(int(v), low, high) if number(v) and INT.fullmatch(v) else fail(v)
    if pa.types.is_floating(t):
        return lambda v: float(v) if number(v) else _NON_NUMBERS[v] if plain(v) and v in _NON_NUMBERS else fail(v)
    if pa.types.is_decimal(t):
        return lambda v: fit_decimal(java_decimal(v if number(v) else v.replace(",", "")), t) \
            if isinstance(v, str) else fail(v)
    if pa.types.is_boolean(t):
        return lambda v: v if isinstance(v, bool) else fail(v)
    if pa.types.is_binary(t):
        return lambda v: base64.b64decode(v, validate=True) if plain(v) else fail(v)
    if pa.types.is_timestamp(t) and t.tz is not None:
        text = text_parser(t, options)
        # Jackson reads a whole number into a timestamp as seconds since the epoch.
        return lambda v: datetime.fromtimestamp(int(v), timezone.utc) if number(v) and INT.fullmatch(v) \
            else text(v) if plain(v) else fail(v)
    if pa.types.is_date32(t) or pa.types.is_timestamp(t) or pa.types.is_null(t):
        text = text_parser(t, options)
        return lambda v: text(v) if plain(v) else fail(v)
    if pa.types.is_list(t):
        item = _nullable(_parser(t.value_type, options))
        return lambda v: [item(x) for x in v] if isinstance(v, _JsonArray) else fail(v)
    if pa.types.is_map(t):
        key, item = text_parser(t.key_type, options), _nullable(_parser(t.item_type, options))
        return lambda v: [(key(k), item(x)) for k, x in v.items()] if isinstance(v, _JsonObject) else fail(v)
    if pa.types.is_struct(t):
        fields = [(f.name, _nullable(_parser(f.type, options))) for f in t]
        return lambda v: {name: parse(v.get(name)) for name, parse in fields} if isinstance(v, _JsonObject) \
            else fail(v)
    raise TableUnreadable(f"{t} values cannot be read from JSON")


def _nullable(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda v: None if v is None else parse(v)


def _kind(value: Any) -> str:
    if value is None:
        return "void"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, _JsonNumber):
        return "bigint" if INT.fullmatch(value) else "double"
    return "string"


def _widest(kinds: set[str]) -> str:
    if len(kinds) == 1:
        return next(iter(kinds))
    return "double" if kinds == {"bigint", "double"} else "string"
