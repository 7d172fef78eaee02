"""A static table's rows read from its files exactly as Spark reads them, and a fingerprint of its files.

A static table is a Spark batch DataFrame over files. Capture logs where it lives from
Spark's ``HadoopFsRelation`` as a location::

    {"paths": ["file:/tmp/x/sites.parquet"], "format": "parquet", "options": {"header": "true"}}

What Spark 4.3 gives there (read off ``df._jdf.queryExecution().analyzed()`` of
``spark.read.format(f).load(path)``, a ``LogicalRelation`` over a ``HadoopFsRelation``):

- ``relation.fileFormat().toString()`` is ``Parquet``, ``CSV``, ``JSON``, ``Text`` or ``ORC``;
  lowered, ``parquet``, ``csv``, ``json``, ``text``, ``orc``: the only formats read here.
- ``relation.options()`` is the reader's options as a case-insensitive map whose keys come
  back lower-cased (``inferSchema`` as ``inferschema``), every value a string (``"true"``,
  not ``True``), plus ``path`` when one path was loaded (as given: ``file:///abs``). Keys are
  lower-cased here again, so a location written by hand may spell them as Spark's docs do.
- ``relation.location().rootPaths()`` are qualified: ``file:/abs/path`` for
  ``.load("/abs/path")`` as for ``.load("file:///abs/path")``, globs already expanded.
- The relation's output is the data columns, then the partition columns.

Spark's rules followed here (checked against Spark in ``tests/spark/test_table_files.py``):

- Listing: a root that is a folder is listed recursively, leaving out every file and folder
  whose name starts with ``.``, or with ``_`` unless it holds ``=`` (``_SUCCESS``, ``.crc``,
  ``_temporary``), and empty files; ``pathGlobFilter`` and ``recursiveFileLookup`` apply. A
  folder a streaming file sink wrote (one root holding ``_spark_metadata``) is not listed:
  its files are the ones the sink's log committed.
- Partitions: ``name=value`` folders under the root (or under the ``basePath`` option) are
  partition columns, values unescaped, ``__HIVE_DEFAULT_PARTITION__`` NULL.
- Parquet and ORC: columns by name, ignoring case; a column a file lacks is NULL. Spark's
  Parquet timestamps are INT96 instants, which pyarrow reads zone-less.
- CSV: Spark's univocity settings (quote ``"``, escape ``\\``, no header, ``,``), lines read
  one by one unless ``multiLine``; a quoted or unquoted empty value and any value equal to
  ``nullValue`` are NULL for every type, strings included; short rows are padded with
  NULLs, long ones cut; a value that does not parse is NULL and the rest of the row is kept.
- JSON: one value per line (an array gives a row per object) unless ``multiLine``; fields by
  exact name; single quotes allowed; a number read into a string column is its text as
  written, an object or array its JSON text as written; a line that does not parse is a
  row of NULLs.
- Dates and timestamps written as text parse as Spark's default (no ``dateFormat``) does:
  ``yyyy[-m[m][-d[d]]]``, then an optional ``[T ]h:m[:s[.fraction]]`` and zone.

Limits: local files only. The session's time zone is not in the location: a timestamp
written without a zone (CSV, JSON, partition folders) is read in the ``timeZone`` option's
zone, else in this machine's, which is Spark's default session zone on the same machine;
ORC keeps timestamps as wall clocks in the writer's zone, which pyarrow does not tell, so
they too are read in this machine's zone. The ``dateFormat``, ``timestampFormat`` and
``locale`` options, and ``.snappy``/``.lz4``/``.zst`` compressed text files are refused with
``TableUnreadable`` rather than read differently; a corrupt record column stays NULL.
Without ``columns`` the types are a best effort: CSV all strings, JSON objects and arrays
as their text, partition values int, bigint, double, date or string.

The package: ``listing`` (which files, their partition values, ``local_path``), ``types``
(Spark types as Arrow types, text as typed values), ``columnar`` (Parquet, ORC), ``text``
(decompressing, lines, the text format), ``csv``, ``json``; ``location`` holds the format,
the options and ``TableUnreadable``.
"""

from __future__ import annotations

import hashlib
import zlib
from json import dumps  # by name: the package's own .json module takes the name json here

import pyarrow as pa

from .columnar import file_schema_columns, read_orc, read_parquet
from .csv import csv_columns, read_csv
from .json import json_columns, read_json
from .listing import DataFile, data_files, local_path, partition_names, sink_batch_files, uri_path, with_partitions
from .location import FORMATS, TableUnreadable, format_of, options_of
from .text import read_text
from .types import arrow_type, partition_type, text_parser

__all__ = ["FORMATS", "TableUnreadable", "local_path", "read_table", "sink_batch_files", "table_version", "uri_path"]

_READERS = {"parquet": read_parquet, "orc": read_orc, "csv": read_csv, "json": read_json, "text": read_text}


def read_table(location: dict, columns: list[tuple[str, str]] | None = None) -> pa.Table:
    """The table's rows as Spark reads them: the union of its root paths' files, in order.

    ``columns``: the relation's output as Spark gives it, ``(name, DataType.simpleString())``,
    partition columns last; the result then has exactly these columns, typed as Spark types
    them (``int`` → int32, ``decimal(15,2)`` → decimal128(15, 2), ``timestamp`` →
    timestamp[us, UTC], ...). Without it, the types are a best effort.
    """
    fmt = format_of(location)
    options = options_of(location)
    files = data_files(location, options)
    partitions = partition_names(files)
    if columns is None:
        columns = _best_effort_columns(fmt, files, options, partitions)
    typed = [(name, arrow_type(spark_type)) for name, spark_type in columns]
    folded = {p.lower() for p in partitions}
    data = [(name, t) for name, t in typed if name.lower() not in folded]
    # Partition values are not CSV or JSON text: only the session's zone applies to them.
    zone = {k: v for k, v in options.items() if k == "timezone"}
    values = {name.lower(): text_parser(t, zone) for name, t in typed if name.lower() in folded}
    read = _READERS[fmt]
    pieces = []
    for file in files:
        try:
            table = read(file.path, data, options)
        except TableUnreadable:
            raise
        except (OSError, pa.ArrowException, UnicodeError, LookupError, ValueError, ArithmeticError, EOFError,
                zlib.error) as e:
            raise TableUnreadable(f"{file.path}: cannot be read as {fmt}: {e}") from None
        pieces.append(with_partitions(table, file, typed, values))
    if not pieces:
        return pa.schema([pa.field(name, t) for name, t in typed]).empty_table()
    return pa.concat_tables(pieces)


def table_version(location: dict) -> dict:
    """What the table's files are now: ``{"files": [[path, size, mtime_ns], ...], "digest": ...}``.

    Only the data files ``read_table`` reads, sorted; a listing, no file is read (but a
    streaming sink's log, which says which files are the table's). A file rewritten in
    place, added or removed changes the 16-hex ``digest``.
    """
    files = sorted([f.path, f.size, f.mtime_ns] for f in data_files(location, options_of(location)))
    digest = hashlib.sha256(dumps(files).encode()).hexdigest()[:16]
    return {"files": files, "digest": digest}


def _best_effort_columns(fmt: str, files: list[DataFile], options: dict,
                         partitions: list[str]) -> list[tuple[str, str]]:
    """Columns as Spark would infer them, roughly: CSV all strings, JSON scalars typed and the
    rest strings, Parquet and ORC as their first file says; partition columns after them."""
    if fmt in ("parquet", "orc"):
        data = file_schema_columns(fmt, files)
    elif fmt == "text":
        data = [("value", "string")]
    elif fmt == "csv":
        data = csv_columns(files, options)
    else:
        data = json_columns(files, options)
    folded = {p.lower() for p in partitions}
    data = [(name, t) for name, t in data if name.lower() not in folded]
    return data + [(p, partition_type([v for f in files for c, v in f.partition if c == p])) for p in partitions]
