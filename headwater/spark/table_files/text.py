"""Text files as Hadoop hands them to Spark: decompressed, decoded, split into lines.

CSV, JSON and text files share this: Hadoop decompresses by extension (``x.csv.gz``), its
line reader splits at ``\\n``, ``\\r\\n`` or ``\\r`` (or ``lineSep``), and the reader's ``mode``
decides what a malformed record becomes. The text format's own reader is here too: a row per
line, or one per file with ``wholetext``.
"""

from __future__ import annotations

import bz2
import gzip
import os
import re
import zlib
from typing import Callable, Iterator

import pyarrow as pa

from .location import TableUnreadable, flag

_DECOMPRESS: dict[str, Callable[[bytes], bytes]] = {".gz": gzip.decompress, ".bz2": bz2.decompress,
                                                     ".deflate": zlib.decompress}
_UNSUPPORTED_CODECS = (".snappy", ".lz4", ".zst", ".br", ".lzo")
NEWLINE = re.compile(r"\r\n|\r|\n")


def file_text(path: str, options: dict, errors: str = "strict") -> str:
    """The file's text; Hadoop decompresses by extension, so Spark reads ``x.csv.gz`` as CSV."""
    extension = os.path.splitext(path)[1].lower()
    if extension in _UNSUPPORTED_CODECS:
        raise TableUnreadable(f"{path}: {extension} compressed files cannot be read here")
    with open(path, "rb") as f:
        raw = f.read()
    if extension in _DECOMPRESS:
        raw = _DECOMPRESS[extension](raw)
    return raw.decode(options.get("encoding", options.get("charset", "utf-8")), errors=errors)


def split_lines(text: str, options: dict) -> list[str]:
    """Lines as Hadoop's line reader splits them: at \\n, \\r\\n or \\r (or ``lineSep``), with no
    empty line after a final separator."""
    # Not str.splitlines: it also splits at \v, \f, \x1c-\x1e, \x85 and \u2028, which Hadoop keeps.
    separator = options.get("linesep")
    found = text.split(separator) if separator else NEWLINE.split(text)
    return found[:-1] if found and found[-1] == "" else found


def kept_rows(path: str, records: Iterator[tuple[list, bool]], options: dict) -> list[list]:
    """The records' rows under the reader's ``mode``: PERMISSIVE keeps what parsed of a bad
    record, DROPMALFORMED drops it, FAILFAST stops."""
    mode = options.get("mode", "PERMISSIVE").upper()
    kept = []
    for values, bad in records:
        if bad and mode == "FAILFAST":
            raise TableUnreadable(f"{path}: a malformed record, and the mode option is FAILFAST")
        if not (bad and mode == "DROPMALFORMED"):
            kept.append(values)
    return kept


def rows_table(rows: list[list], data: list[tuple[str, pa.DataType]]) -> pa.Table:
    """The rows as a table of the columns ``data`` names and types."""
    columns = list(zip(*rows)) if rows else [()] * len(data)
    return pa.table([pa.array(list(c), t) for c, (_, t) in zip(columns, data)], names=[n for n, _ in data])


def read_text(path: str, data: list, options: dict) -> pa.Table:
    # Spark's text source replaces bytes that are not UTF-8 rather than failing.
    content = file_text(path, {}, errors="replace")
    found = [content] if flag(options, "wholetext") else split_lines(content, options)
    return rows_table([[line] for line in found], data)
