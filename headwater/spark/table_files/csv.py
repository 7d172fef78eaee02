"""CSV files read as Spark reads them: univocity's parsing with Spark's settings.

Spark hands each line (the whole file with ``multiLine``) to univocity with quote ``"``,
escape ``\\``, separator ``,`` and no header unless the options say otherwise, then parses
each value as its column's type. A quoted or unquoted empty value and any value equal to
``nullValue`` are NULL for every type, strings included; short records are padded with NULLs,
long ones cut; a value that does not parse is NULL and the rest of the record is kept.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa

from .listing import DataFile
from .location import TableUnreadable, flag
from .text import NEWLINE, file_text, kept_rows, rows_table, split_lines
from .types import JAVA_SPACE, text_parser

_DELIMITER_ESCAPES = {"\\t": "\t", "\\r": "\r", "\\b": "\b", "\\f": "\f", '\\"': '"', "\\'": "'", "\\\\": "\\"}


@dataclass(frozen=True)
class _Csv:
    """Spark's CSV reader options (``CSVOptions``) and its defaults."""

    sep: str
    quote: str | None
    escape: str | None
    escape_escape: str | None
    comment: str | None
    null_value: str
    empty_value: str
    header: bool
    multi_line: bool
    lead: bool
    trail: bool

    @staticmethod
    def of(options: dict) -> _Csv:
        sep = options.get("sep", options.get("delimiter", ","))
        sep = "".join(_DELIMITER_ESCAPES.get(part, part) for part in re.findall(r"\\.|.", sep, re.DOTALL))
        if not sep:
            raise TableUnreadable("the CSV sep option is empty")
        quote = options.get("quote", '"') or None  # an empty quote turns quoting off
        escape = options.get("escape", "\\") or None
        return _Csv(sep=sep, quote=quote, escape=escape,
                    escape_escape=options.get("chartoescapequoteescaping", escape if escape != quote else "") or None,
                    comment=options.get("comment") or None, null_value=options.get("nullvalue", ""),
                    empty_value=options.get("emptyvalue", ""), header=flag(options, "header"),
                    multi_line=flag(options, "multiline"),
                    lead=flag(options, "ignoreleadingwhitespace"), trail=flag(options, "ignoretrailingwhitespace"))

    def skipped(self, line: str) -> bool:
        """Blank and comment lines are no records."""
        return not line.strip(JAVA_SPACE) or bool(self.comment and line.startswith(self.comment))


def read_csv(path: str, data: list, options: dict) -> pa.Table:
    o = _Csv.of(options)
    parsers = [text_parser(t, options) for _, t in data]
    records = _records(file_text(path, options), o, options)
    if o.header:  # each file's first record, as Spark drops it from each file
        next(records, None)

    def typed() -> Iterator[tuple[list, bool]]:
        for values in records:
            bad = len(values) != len(data)  # Spark pads a short record with NULLs, cuts a long one
            row = []
            for value, parse in zip(values + [o.null_value] * (len(data) - len(values)), parsers):
                try:
                    row.append(None if value == o.null_value else parse(value))
                except (ValueError, ArithmeticError):
                    row.append(None)
                    bad = True
            yield row, bad
    return rows_table(kept_rows(path, typed(), options), data)


def csv_columns(files: list[DataFile], options: dict) -> list[tuple[str, str]]:
    """Without the relation's columns: the first record's (the header's names, or ``_c<i>``),
    all strings."""
    o = _Csv.of(options)
    for file in files:
        first = next(_records(file_text(file.path, options), o, options), None)
        if first is not None:
            names = _header(first, o) if o.header else [f"_c{i}" for i in range(len(first))]
            return [(name, "string") for name in names]
    return []


# Not csv or pyarrow.csv: univocity keeps "a"b and C:\x as written, pads short rows, splits at "||" (CSV_EDGES,
# odd.csv).
def _records(text: str, o: _Csv, options: dict) -> Iterator[list[str]]:
    """Each record's values as univocity hands them to Spark, the header included: an empty
    value as ``nullValue``, a quoted empty one as ``emptyValue``."""
    if not o.multi_line:
        stop = re.compile(re.escape(o.sep))
        for line in split_lines(text, options):
            if not o.skipped(line):
                yield _record(line, 0, o, stop)[0]
        return
    # The whole file goes to univocity, which takes the first line's ending (or lineSep) as
    # the only one and turns it into \n, in quoted values too; it skips empty lines only.
    first = NEWLINE.search(text)
    separator = options.get("linesep") or (first.group(0) if first else "\n")
    text = text.replace(separator, "\n") if separator != "\n" else text
    stop = re.compile(re.escape(o.sep) + "|\n")
    i = 0
    while i < len(text):
        end = text.find("\n", i)
        end = len(text) if end < 0 else end
        if i == end or (o.comment and text.startswith(o.comment, i)):
            i = end + 1
            continue
        values, i = _record(text, i, o, stop)
        yield values


def _record(text: str, i: int, o: _Csv, stop: re.Pattern) -> tuple[list[str], int]:
    """The record starting at ``text[i]``, and where the next one starts (after its line end)."""
    values: list[str] = []
    while True:
        start = i
        if o.lead:
            while i < len(text) and text[i] in " \t":
                i += 1
        if o.quote and text.startswith(o.quote, i):
            value, after = _quoted(text, i + 1, o)
            j = after
            while j < len(text) and text[j] in " \t":
                j += 1
            if j >= len(text) or stop.match(text, j):
                values.append(o.empty_value if value == "" else value)
                i = j
            else:  # more after the closing quote: univocity keeps the whole value as written
                found = stop.search(text, after)
                i = found.start() if found else len(text)
                values.append(text[start:i])
        else:
            found = stop.search(text, i)
            end = found.start() if found else len(text)
            value = text[i:end].rstrip(" \t") if o.trail else text[i:end]
            values.append(o.null_value if value == "" else value)
            i = end
        if text.startswith(o.sep, i):
            i += len(o.sep)
            continue
        return values, i + 1


def _quoted(text: str, i: int, o: _Csv) -> tuple[str, int]:
    """A quoted value's content from just after its opening quote, and where it ends. A quote
    left open runs to the end of the line (of the file, with ``multiLine``)."""
    out = []
    while i < len(text):
        c, following = text[i], text[i + 1:i + 2]
        if c == o.escape and following == o.quote:
            out.append(o.quote)
            i += 2
        elif c == o.escape_escape and following == o.escape:
            out.append(o.escape)
            i += 2
        elif c == o.quote:
            return "".join(out), i + 1
        else:
            out.append(c)
            i += 1
    return "".join(out), i


def _header(values: list[str], o: _Csv) -> list[str]:
    """Column names from a header as Spark makes them: ``_c<i>`` for an empty one, and its
    position appended to each name that repeats (ignoring case)."""
    names = [v if v not in ("", o.null_value) else f"_c{i}" for i, v in enumerate(values)]
    counts: dict[str, int] = {}
    for name in names:
        counts[name.lower()] = counts.get(name.lower(), 0) + 1
    return [f"{name}{i}" if counts[name.lower()] > 1 else name for i, name in enumerate(names)]
