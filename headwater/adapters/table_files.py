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

Spark's rules followed here (checked against Spark in ``tests/test_table_files.py``):

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
"""

from __future__ import annotations

import base64
import bz2
import decimal
import fnmatch
import gzip
import hashlib
import json
import math
import os
import re
import zlib
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone, tzinfo
from typing import Any, Callable, Iterator
from urllib.parse import unquote, urlparse
from zoneinfo import ZoneInfo

import pyarrow as pa
import pyarrow.parquet as pq

FORMATS = ("parquet", "csv", "json", "text", "orc")


class TableUnreadable(ValueError):
    """A static table's files cannot be read here; the message names the path and why."""


# ---- public surface -----------------------------------------------------------------------

def read_table(location: dict, columns: list[tuple[str, str]] | None = None) -> pa.Table:
    """The table's rows as Spark reads them: the union of its root paths' files, in order.

    ``columns``: the relation's output as Spark gives it, ``(name, DataType.simpleString())``,
    partition columns last; the result then has exactly these columns, typed as Spark types
    them (``int`` → int32, ``decimal(15,2)`` → decimal128(15, 2), ``timestamp`` →
    timestamp[us, UTC], ...). Without it, the types are a best effort.
    """
    fmt = _format(location)
    options = _options(location)
    files = _data_files(location, options)
    partitions = _partition_names(files)
    if columns is None:
        columns = _best_effort_columns(fmt, files, options, partitions)
    typed = [(name, _arrow_type(spark_type)) for name, spark_type in columns]
    folded = {p.lower() for p in partitions}
    data = [(name, t) for name, t in typed if name.lower() not in folded]
    # Partition values are not CSV or JSON text: only the session's zone applies to them.
    zone = {k: v for k, v in options.items() if k == "timezone"}
    values = {name.lower(): _text_parser(t, zone) for name, t in typed if name.lower() in folded}
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
        pieces.append(_with_partitions(table, file, typed, values))
    if not pieces:
        return pa.schema([pa.field(name, t) for name, t in typed]).empty_table()
    return pa.concat_tables(pieces)


def table_version(location: dict) -> dict:
    """What the table's files are now: ``{"files": [[path, size, mtime_ns], ...], "digest": ...}``.

    Only the data files ``read_table`` reads, sorted; a listing, no file is read (but a
    streaming sink's log, which says which files are the table's). A file rewritten in
    place, added or removed changes the 16-hex ``digest``.
    """
    files = sorted([f.path, f.size, f.mtime_ns] for f in _data_files(location, _options(location)))
    digest = hashlib.sha256(json.dumps(files).encode()).hexdigest()[:16]
    return {"files": files, "digest": digest}


def local_path(path: str) -> str:
    """The local path of a Spark path: ``file:/a``, ``file:///a`` and ``/a`` are ``/a``."""
    scheme = re.match(r"([A-Za-z][A-Za-z0-9+.-]+):", path)
    if scheme is None:
        return path
    if scheme.group(1).lower() != "file":
        raise TableUnreadable(f"{path}: the {scheme.group(1)}: file system cannot be read from here "
                              f"(only local files)")
    rest = path[scheme.end():]
    if rest.startswith("//"):
        host, _, rest = rest[2:].partition("/")
        if host not in ("", "localhost"):
            raise TableUnreadable(f"{path}: a file on host {host!r} cannot be read from here (only local files)")
        rest = "/" + rest
    return rest


# ---- the location ---------------------------------------------------------------------------

def _format(location: dict) -> str:
    fmt = str(location.get("format", "")).lower()
    if fmt not in FORMATS:
        raise TableUnreadable(f"{location.get('paths')}: the {fmt or 'missing'} format is not supported here "
                              f"(only {', '.join(FORMATS)})")
    return fmt


def _options(location: dict) -> dict[str, str]:
    # Spark's reader options are case-insensitive and its values strings.
    return {str(k).lower(): str(v) for k, v in (location.get("options") or {}).items()}


def _flag(options: dict, name: str) -> bool:
    return options.get(name, "false").strip().lower() == "true"


# ---- which files, and their partition values -----------------------------------------------

@dataclass(frozen=True)
class _DataFile:
    path: str
    size: int
    mtime_ns: int
    partition: tuple[tuple[str, str | None], ...]  # (column, value) from the folders' names


def _hidden(name: str) -> bool:
    """Names Spark's file index leaves out: its own markers and temporary files, checksums."""
    return (name.startswith("_") and "=" not in name) or name.startswith(".") or name.endswith("._COPYING_")


def _data_files(location: dict, options: dict) -> list[_DataFile]:
    roots = [local_path(p) for p in location.get("paths") or []]
    if not roots:
        raise TableUnreadable(f"{location}: the location names no paths")
    for root in roots:
        if not os.path.exists(root):
            raise TableUnreadable(f"{root}: no such file or folder")
    if len(roots) == 1 and os.path.isdir(os.path.join(roots[0], "_spark_metadata")):
        found = [(path, roots[0]) for path in _sink_log_files(roots[0])]
    else:
        found = [(path, root) for root in roots for path in _listed(root)]
    pattern = options.get("pathglobfilter")
    base = local_path(options["basepath"]) if "basepath" in options else None
    files = []
    for path, root in found:
        if pattern and not fnmatch.fnmatchcase(os.path.basename(path), pattern):
            continue
        try:
            stat = os.stat(path)
        except OSError as e:
            raise TableUnreadable(f"{path}: cannot be listed: {e.strerror}") from None
        if stat.st_size == 0:  # Spark skips empty files: no rows, and no Parquet footer to read
            continue
        spec = () if _flag(options, "recursivefilelookup") else _partition_spec(path, base or root)
        files.append(_DataFile(path, stat.st_size, stat.st_mtime_ns, spec))
    return files


def _listed(root: str) -> list[str]:
    if os.path.isfile(root):  # Spark leaves out a hidden file even when it is named as the root
        return [] if _hidden(os.path.basename(root)) else [root]
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError as e:
        raise TableUnreadable(f"{root}: cannot be listed: {e.strerror}") from None
    paths = []
    for entry in entries:
        if _hidden(entry.name):
            continue
        paths.extend(_listed(entry.path) if entry.is_dir() else [entry.path])
    return paths


def _sink_log_files(root: str) -> list[str]:
    """The files a streaming file sink committed to ``root``, from its ``_spark_metadata`` log.

    Spark reads such a folder through the log alone, so a file a failed batch left behind is
    not the table's. The log's batches are files ``<n>`` and ``<n>.compact``; the latest
    compact batch holds everything before it, and each line after a version line is one file.
    """
    log = os.path.join(root, "_spark_metadata")
    try:
        batches = {int(name.split(".")[0]): name for name in os.listdir(log) if re.fullmatch(r"\d+(\.compact)?", name)}
    except OSError as e:
        raise TableUnreadable(f"{log}: cannot be listed: {e.strerror}") from None
    first = max((n for n, name in batches.items() if name.endswith(".compact")), default=0)
    added: dict[str, None] = {}
    deleted = set()
    for number in sorted(n for n in batches if n >= first):
        path = os.path.join(log, batches[number])
        try:
            with open(path, encoding="utf-8") as f:
                version, *lines = f.read().splitlines() or [""]
            if not re.fullmatch(r"v\d+", version):
                raise ValueError(f"it starts with {version!r}, not a version")
            statuses = [json.loads(line) for line in lines]
            for status in statuses:
                if status.get("isDir"):
                    continue
                file = unquote(urlparse(status["path"]).path)
                if status.get("action") == "delete":
                    deleted.add(file)
                else:
                    added[file] = None
        except (OSError, UnicodeError, ValueError, KeyError, AttributeError) as e:
            raise TableUnreadable(f"{path}: not a readable file sink log batch: {e}") from None
    return [path for path in added if path not in deleted]


def _partition_spec(path: str, base: str) -> tuple[tuple[str, str | None], ...]:
    """Partition values from the folders between ``base`` and the file, as Spark parses them.

    Spark walks up from the file's folder: folders that are not ``name=value`` below the
    first one that is are skipped; above it, the first one that is not ends the walk.
    """
    folder = os.path.dirname(path)
    relative = os.path.relpath(folder, base) if os.path.isdir(base) else "."
    if relative == "." or relative.startswith(".."):
        return ()
    spec: list[tuple[str, str | None]] = []
    for name in reversed(relative.split(os.sep)):
        column, equals, value = name.partition("=")
        if not equals or not column:
            if spec:
                break
            continue
        value = _unescape(value)
        spec.append((_unescape(column), None if value == "__HIVE_DEFAULT_PARTITION__" else value))
    return tuple(reversed(spec))


def _unescape(name: str) -> str:
    # Spark escapes characters that cannot be in a folder name as %XX.
    return re.sub(r"%([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), name)


def _partition_names(files: list[_DataFile]) -> list[str]:
    names: list[str] = []
    for file in files:
        these = [column for column, _ in file.partition]
        if these and names and [n.lower() for n in these] != [n.lower() for n in names]:
            raise TableUnreadable(f"{file.path}: its partition folders ({these}) differ from the "
                                  f"other files' ({names}), which Spark refuses to read")
        names = names or these
    return names


def _with_partitions(table: pa.Table, file: _DataFile, typed: list, parsers: dict) -> pa.Table:
    """``table`` with the file's partition values added, in the order of ``typed``."""
    raw = {column.lower(): value for column, value in file.partition}
    arrays = []
    for name, t in typed:
        key = name.lower()
        if key not in parsers:
            arrays.append(table.column(name))
            continue
        try:
            value = None if raw.get(key) is None else parsers[key](raw[key])
        except ValueError:
            value = None
        arrays.append(pa.nulls(table.num_rows, t) if value is None
                      else pa.repeat(pa.scalar(value, t), table.num_rows))
    return pa.table(arrays, names=[name for name, _ in typed])


# ---- Spark types ----------------------------------------------------------------------------

_SIMPLE_TYPES = {
    "boolean": pa.bool_(), "tinyint": pa.int8(), "byte": pa.int8(), "smallint": pa.int16(), "short": pa.int16(),
    "int": pa.int32(), "integer": pa.int32(), "bigint": pa.int64(), "long": pa.int64(),
    "float": pa.float32(), "double": pa.float64(), "string": pa.string(), "binary": pa.binary(),
    "date": pa.date32(), "timestamp": pa.timestamp("us", tz="UTC"), "timestamp_ltz": pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": pa.timestamp("us"), "void": pa.null(),
}


def _arrow_type(spark_type: str) -> pa.DataType:
    """The Arrow type of a Spark ``simpleString`` type: ``decimal(15,2)``, ``array<struct<a:int>>``, ..."""
    text = spark_type.strip()
    low = text.lower()
    if low in _SIMPLE_TYPES:
        return _SIMPLE_TYPES[low]
    if m := re.fullmatch(r"decimal\((\d+),\s*(\d+)\)", low):
        return pa.decimal128(int(m.group(1)), int(m.group(2)))
    if re.fullmatch(r"(var)?char\(\d+\)", low):
        return pa.string()
    if low.startswith("array<") and low.endswith(">"):
        return pa.list_(_arrow_type(text[6:-1]))
    if low.startswith("map<") and low.endswith(">"):
        key, value = _top_level(text[4:-1])
        return pa.map_(_arrow_type(key), _arrow_type(value))
    if low.startswith("struct<") and low.endswith(">"):
        fields = [field.partition(":") for field in _top_level(text[7:-1])] if text[7:-1] else []
        return pa.struct([pa.field(name, _arrow_type(t)) for name, _, t in fields])
    raise TableUnreadable(f"the Spark type {spark_type!r} cannot be read here")


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


# ---- values written as text (CSV, JSON strings, partition folders) -------------------------

_INT = re.compile(r"[+-]?[0-9]+")
_JAVA_DOUBLE = re.compile(r"[+-]?(NaN|Infinity|([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?)[fFdD]?")
_JAVA_DECIMAL = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")
_JAVA_SPACE = "".join(chr(c) for c in range(33))  # String.trim() strips every char up to ' '
_DATE = re.compile(r"([+-]?[0-9]{4,7})(?:-([0-9]{1,2})(?:-([0-9]{1,2})(?:[T ].*)?)?)?", re.DOTALL)
_TIMESTAMP = re.compile(r"([+-]?[0-9]{4,7})(?:-([0-9]{1,2})(?:-([0-9]{1,2}))?)?"
                        r"(?:[T ]([0-9]{1,2}):([0-9]{1,2})(?::([0-9]{1,2})(?:\.([0-9]*))?)?)?\s*(.*)", re.DOTALL)
_OFFSET = re.compile(r"(?:UTC|GMT|UT)?([+-])([0-9]{1,2})(?::?([0-9]{2}))?(?::?([0-9]{2}))?")
_DECIMALS = decimal.Context(prec=100, rounding=decimal.ROUND_HALF_UP)
_BOOLEANS = {"true": True, "false": False}


def _text_parser(t: pa.DataType, options: dict) -> Callable[[str], Any]:
    """How Spark turns a text value into a value of ``t``; it raises ValueError where Spark gets NULL."""
    if pa.types.is_string(t):
        return str
    if pa.types.is_integer(t):
        low, high = -(1 << (t.bit_width - 1)), (1 << (t.bit_width - 1)) - 1
        return lambda s: _bounded(int(s) if _INT.fullmatch(s) else _fail(s), low, high)
    if pa.types.is_floating(t):
        specials = {options.get("nanvalue", "NaN"): math.nan, options.get("positiveinf", "Inf"): math.inf,
                    options.get("negativeinf", "-Inf"): -math.inf}
        return lambda s: specials[s] if s in specials else _java_double(s)
    if pa.types.is_decimal(t):
        # Spark's default (US) locale parser drops thousands separators before BigDecimal.
        return lambda s: _fit_decimal(_java_decimal(s.replace(",", "")), t)
    if pa.types.is_boolean(t):
        return lambda s: _BOOLEANS[s.lower()] if s.lower() in _BOOLEANS else _fail(s)  # Scala's toBoolean
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


def _fail(s: str):
    raise ValueError(f"cannot parse {s!r}")


def _bounded(value: int, low: int, high: int) -> int:
    return value if low <= value <= high else _fail(str(value))


def _java_double(s: str) -> float:
    s = s.strip(_JAVA_SPACE)
    if not _JAVA_DOUBLE.fullmatch(s):
        _fail(s)
    return float(s.rstrip("fFdD"))


def _java_decimal(s: str) -> decimal.Decimal:
    return decimal.Decimal(s) if _JAVA_DECIMAL.fullmatch(s) else _fail(s)


def _fit_decimal(value: decimal.Decimal, t: pa.Decimal128Type) -> decimal.Decimal:
    """``value`` rounded half up to the type's scale; one with more digits than it holds is NULL."""
    fitted = _DECIMALS.quantize(value, decimal.Decimal(1).scaleb(-t.scale))
    integer_digits = fitted.adjusted() + 1 if fitted else 0
    return _fail(str(value)) if integer_digits > t.precision - t.scale else fitted


def _parse_date(s: str) -> date:
    m = _DATE.fullmatch(s.strip())
    if m is None:
        _fail(s)
    return date(int(m.group(1)), int(m.group(2) or 1), int(m.group(3) or 1))


def _parse_timestamp(s: str, zone: tzinfo | None, naive: bool = False) -> datetime:
    m = _TIMESTAMP.fullmatch(s.strip())
    if m is None:
        _fail(s)
    year, month, day, hour, minute, second, fraction, zone_text = m.groups()
    micros = int((fraction or "")[:6].ljust(6, "0"))
    value = datetime(int(year), int(month or 1), int(day or 1), int(hour or 0), int(minute or 0),
                     int(second or 0), micros)
    if naive:
        return value if not zone_text else _fail(s)
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
        return _fail(text)


def _default_zone(options: dict) -> tzinfo | None:
    if "timezone" not in options:
        return None
    try:
        return _zone(options["timezone"])
    except ValueError:
        raise TableUnreadable(f"the timeZone option ({options['timezone']!r}) is not a zone") from None


# ---- Parquet and ORC ------------------------------------------------------------------------

def _read_parquet(path: str, data: list, options: dict) -> pa.Table:
    # Spark writes timestamps as INT96 by default; pyarrow would read them as nanoseconds,
    # which overflow before year 1677 and after 2262.
    file = pq.ParquetFile(path, coerce_int96_timestamp_unit="us")
    return _typed_columns(path, file.schema_arrow, lambda names: file.read(columns=names), data)


def _read_orc(path: str, data: list, options: dict) -> pa.Table:
    from pyarrow import orc

    file = orc.ORCFile(path)
    return _typed_columns(path, file.schema, lambda names: file.read(columns=names), data, wall_clock=True)


def _typed_columns(path: str, schema: pa.Schema, read: Callable, data: list, wall_clock: bool = False) -> pa.Table:
    """The columns ``data`` names, matched by name as Spark does (ignoring case), cast to their
    types; a column the file lacks is NULL. ``wall_clock``: the file's zone-less timestamps
    are wall clocks, not UTC."""
    by_name: dict[str, str] = {}
    for name in schema.names:
        by_name.setdefault(name.lower(), name)
    wanted = {name: by_name.get(name.lower()) for name, _ in data}
    table = read([n for n in dict.fromkeys(wanted.values()) if n is not None])
    arrays = []
    for name, t in data:
        found = wanted[name]
        if found is None:
            arrays.append(pa.nulls(table.num_rows, t))
            continue
        column = table.column(found)
        if wall_clock and pa.types.is_timestamp(t) and t.tz is not None and column.type.tz is None:
            column = _local_to_utc(column)
        try:
            arrays.append(column.cast(t))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise TableUnreadable(f"{path}: column {found} ({table.column(found).type}) cannot be read "
                                  f"as {t}: {e}") from None
    return pa.table(arrays, names=[name for name, _ in data]) if data else table.select([])


def _local_to_utc(column: pa.ChunkedArray) -> pa.Array:
    """Wall clocks as instants. ORC keeps a timestamp as its wall clock in the writer's zone,
    which pyarrow does not tell: this machine's zone stands in for it (Spark writes in its
    JVM's zone, which is this machine's when Spark ran here)."""
    values = column.cast(pa.timestamp("us")).to_pylist()
    return pa.array([None if v is None else v.astimezone(timezone.utc) for v in values], pa.timestamp("us", tz="UTC"))


# ---- text files: reading, lines, rows -----------------------------------------------------

_DECOMPRESS = {".gz": gzip.decompress, ".bz2": bz2.decompress, ".deflate": zlib.decompress}
_UNSUPPORTED_CODECS = (".snappy", ".lz4", ".zst", ".br", ".lzo")
_NEWLINE = re.compile(r"\r\n|\r|\n")


def _text(path: str, options: dict, errors: str = "strict") -> str:
    """The file's text; Hadoop decompresses by extension, so Spark reads ``x.csv.gz`` as CSV."""
    extension = os.path.splitext(path)[1].lower()
    if extension in _UNSUPPORTED_CODECS:
        raise TableUnreadable(f"{path}: {extension} compressed files cannot be read here")
    with open(path, "rb") as f:
        raw = f.read()
    if extension in _DECOMPRESS:
        raw = _DECOMPRESS[extension](raw)
    return raw.decode(options.get("encoding", options.get("charset", "utf-8")), errors=errors)


def _lines(text: str, options: dict) -> list[str]:
    """Lines as Hadoop's line reader splits them: at \\n, \\r\\n or \\r (or ``lineSep``), with no
    empty line after a final separator."""
    separator = options.get("linesep")
    lines = text.split(separator) if separator else _NEWLINE.split(text)
    return lines[:-1] if lines and lines[-1] == "" else lines


def _rows(path: str, records: Iterator[tuple[list, bool]], options: dict) -> list[list]:
    """The records' rows under the reader's ``mode``: PERMISSIVE keeps what parsed of a bad
    record, DROPMALFORMED drops it, FAILFAST stops."""
    mode = options.get("mode", "PERMISSIVE").upper()
    rows = []
    for values, bad in records:
        if bad and mode == "FAILFAST":
            raise TableUnreadable(f"{path}: a malformed record, and the mode option is FAILFAST")
        if not (bad and mode == "DROPMALFORMED"):
            rows.append(values)
    return rows


def _table(rows: list[list], data: list) -> pa.Table:
    columns = list(zip(*rows)) if rows else [()] * len(data)
    return pa.table([pa.array(list(c), t) for c, (_, t) in zip(columns, data)], names=[n for n, _ in data])


def _read_text(path: str, data: list, options: dict) -> pa.Table:
    # Spark's text source replaces bytes that are not UTF-8 rather than failing.
    text = _text(path, {}, errors="replace")
    return _table([[line] for line in ([text] if _flag(options, "wholetext") else _lines(text, options))], data)


# ---- CSV ------------------------------------------------------------------------------------

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
                    empty_value=options.get("emptyvalue", ""), header=_flag(options, "header"),
                    multi_line=_flag(options, "multiline"),
                    lead=_flag(options, "ignoreleadingwhitespace"), trail=_flag(options, "ignoretrailingwhitespace"))

    def skipped(self, line: str) -> bool:
        """Blank and comment lines are no records."""
        return not line.strip(_JAVA_SPACE) or bool(self.comment and line.startswith(self.comment))


def _csv_records(text: str, o: _Csv, options: dict) -> Iterator[list[str]]:
    """Each record's values as univocity hands them to Spark, the header included: an empty
    value as ``nullValue``, a quoted empty one as ``emptyValue``."""
    if not o.multi_line:
        stop = re.compile(re.escape(o.sep))
        for line in _lines(text, options):
            if not o.skipped(line):
                yield _csv_record(line, 0, o, stop)[0]
        return
    # The whole file goes to univocity, which takes the first line's ending (or lineSep) as
    # the only one and turns it into \n, in quoted values too; it skips empty lines only.
    first = _NEWLINE.search(text)
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
        values, i = _csv_record(text, i, o, stop)
        yield values


def _csv_record(text: str, i: int, o: _Csv, stop: re.Pattern) -> tuple[list[str], int]:
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


def _csv_header(values: list[str], o: _Csv) -> list[str]:
    """Column names from a header as Spark makes them: ``_c<i>`` for an empty one, and its
    position appended to each name that repeats (ignoring case)."""
    names = [v if v not in ("", o.null_value) else f"_c{i}" for i, v in enumerate(values)]
    counts: dict[str, int] = {}
    for name in names:
        counts[name.lower()] = counts.get(name.lower(), 0) + 1
    return [f"{name}{i}" if counts[name.lower()] > 1 else name for i, name in enumerate(names)]


def _read_csv(path: str, data: list, options: dict) -> pa.Table:
    o = _Csv.of(options)
    parsers = [_text_parser(t, options) for _, t in data]
    records = _csv_records(_text(path, options), o, options)
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
    return _table(_rows(path, typed(), options), data)


# ---- JSON -----------------------------------------------------------------------------------

class _JsonObject(dict):
    text = ""  # as written: Spark reads an object into a string column as its source text


class _JsonArray(list):
    text = ""


class _JsonNumber(str):
    """A JSON number (or NaN, Infinity) as written."""


_JSON_SPACE = re.compile(r"[ \t\r\n]*")
_JSON_LITERAL = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?|NaN|-?Infinity|true|false|null")
_JSON_WORDS = {"true": True, "false": False, "null": None}
_NON_NUMBERS = {"NaN": math.nan, "Infinity": math.inf, "+Infinity": math.inf, "+INF": math.inf,
                "-Infinity": -math.inf, "-INF": -math.inf}  # the strings Spark reads as doubles


def _json_value(text: str, i: int) -> tuple[Any, int]:
    """One JSON value from ``text[i]`` as Jackson reads it with Spark's defaults (single quotes
    and NaN/Infinity allowed), and where it ends."""
    i = _JSON_SPACE.match(text, i).end()
    c = text[i]
    if c in "{[":
        node, close = (_JsonObject(), "}") if c == "{" else (_JsonArray(), "]")
        start, i = i, _JSON_SPACE.match(text, i + 1).end()
        while text[i] != close:
            if close == "}":
                key, i = _json_string(text, _JSON_SPACE.match(text, i).end())
                i = _JSON_SPACE.match(text, i).end()
                if text[i] != ":":
                    raise ValueError(f"expected ':' at {i}")
                node[key], i = _json_value(text, i + 1)
            else:
                value, i = _json_value(text, i)
                node.append(value)
            i = _JSON_SPACE.match(text, i).end()
            if text[i] == ",":
                i += 1
            elif text[i] != close:
                raise ValueError(f"expected ',' or {close!r} at {i}")
        node.text = text[start:i + 1]
        return node, i + 1
    if c in "\"'":
        return _json_string(text, i)
    m = _JSON_LITERAL.match(text, i)
    if m is None:
        raise ValueError(f"no JSON value at {i}")
    word = m.group(0)
    return (_JSON_WORDS[word] if word in _JSON_WORDS else _JsonNumber(word)), m.end()


def _json_string(text: str, i: int) -> tuple[str, int]:
    if text[i] == '"':
        return json.decoder.scanstring(text, i + 1, True)
    if text[i] != "'":
        raise ValueError(f"expected a string at {i}")
    end = i + 1
    while text[end] != "'":
        end += 2 if text[end] == "\\" else 1
    # The escapes of double quotes, and \' besides: rewrite it as a double-quoted string.
    body = re.sub(r'\\(.)|"', lambda m: "'" if m.group(1) == "'" else m.group(0) if m.group(1) else '\\"',
                  text[i + 1:end], flags=re.DOTALL)
    return json.decoder.scanstring('"' + body + '"', 1, True)[0], end + 1


def _json_objects(text: str, options: dict) -> Iterator[list | None]:
    """Each record's objects (an array of objects is a row per object), None for a corrupt one."""
    for chunk in [text] if _flag(options, "multiline") else _lines(text, options):
        if not chunk.strip(" \t\r\n"):
            continue
        try:
            record = _json_value(chunk, 0)[0]
        except (ValueError, IndexError):
            yield None
            continue
        if isinstance(record, _JsonObject):
            yield [record]
        elif isinstance(record, _JsonArray) and all(isinstance(x, _JsonObject) for x in record):
            yield record
        else:
            yield None


def _json_parser(t: pa.DataType, options: dict) -> Callable[[Any], Any]:
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
        return lambda v: _bounded(int(v), low, high) if number(v) and _INT.fullmatch(v) else _fail(v)
    if pa.types.is_floating(t):
        return lambda v: float(v) if number(v) else _NON_NUMBERS[v] if plain(v) and v in _NON_NUMBERS else _fail(v)
    if pa.types.is_decimal(t):
        return lambda v: _fit_decimal(_java_decimal(v if number(v) else v.replace(",", "")), t) \
            if isinstance(v, str) else _fail(v)
    if pa.types.is_boolean(t):
        return lambda v: v if isinstance(v, bool) else _fail(v)
    if pa.types.is_binary(t):
        return lambda v: base64.b64decode(v, validate=True) if plain(v) else _fail(v)
    if pa.types.is_timestamp(t) and t.tz is not None:
        text = _text_parser(t, options)
        # Jackson reads a whole number into a timestamp as seconds since the epoch.
        return lambda v: datetime.fromtimestamp(int(v), timezone.utc) if number(v) and _INT.fullmatch(v) \
            else text(v) if plain(v) else _fail(v)
    if pa.types.is_date32(t) or pa.types.is_timestamp(t) or pa.types.is_null(t):
        text = _text_parser(t, options)
        return lambda v: text(v) if plain(v) else _fail(v)
    if pa.types.is_list(t):
        item = _nullable(_json_parser(t.value_type, options))
        return lambda v: [item(x) for x in v] if isinstance(v, _JsonArray) else _fail(v)
    if pa.types.is_map(t):
        key, item = _text_parser(t.key_type, options), _nullable(_json_parser(t.item_type, options))
        return lambda v: [(key(k), item(x)) for k, x in v.items()] if isinstance(v, _JsonObject) else _fail(v)
    if pa.types.is_struct(t):
        fields = [(f.name, _nullable(_json_parser(f.type, options))) for f in t]
        return lambda v: {name: parse(v.get(name)) for name, parse in fields} if isinstance(v, _JsonObject) \
            else _fail(v)
    raise TableUnreadable(f"{t} values cannot be read from JSON")


def _nullable(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda v: None if v is None else parse(v)


def _read_json(path: str, data: list, options: dict) -> pa.Table:
    parsers = [(name, _nullable(_json_parser(t, options))) for name, t in data]

    def typed() -> Iterator[tuple[list, bool]]:
        for objects in _json_objects(_text(path, options), options):
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
    return _table(_rows(path, typed(), options), data)


_READERS = {"parquet": _read_parquet, "orc": _read_orc, "csv": _read_csv, "json": _read_json, "text": _read_text}


# ---- without the relation's columns: a best effort ----------------------------------------

def _best_effort_columns(fmt: str, files: list[_DataFile], options: dict,
                         partitions: list[str]) -> list[tuple[str, str]]:
    """Columns as Spark would infer them, roughly: CSV all strings, JSON scalars typed and the
    rest strings, Parquet and ORC as their first file says; partition columns after them."""
    if fmt in ("parquet", "orc"):
        data = _file_schema_columns(fmt, files)
    elif fmt == "text":
        data = [("value", "string")]
    elif fmt == "csv":
        data = _csv_columns(files, options)
    else:
        data = _json_columns(files, options)
    folded = {p.lower() for p in partitions}
    data = [(name, t) for name, t in data if name.lower() not in folded]
    return data + [(p, _partition_type([v for f in files for c, v in f.partition if c == p])) for p in partitions]


def _file_schema_columns(fmt: str, files: list[_DataFile]) -> list[tuple[str, str]]:
    if not files:
        return []
    path = files[0].path
    try:
        if fmt == "parquet":
            file = pq.ParquetFile(path, coerce_int96_timestamp_unit="us")
            schema = file.schema_arrow
            # INT96 (Spark's default) holds instants, though pyarrow reads them zone-less.
            instants = {column.path for column in file.schema if column.physical_type == "INT96"}
        else:
            from pyarrow import orc
            schema = orc.ORCFile(path).schema
            instants = set(schema.names)  # ORC's zone-less timestamp is Spark's timestamp
    except (OSError, pa.ArrowException) as e:
        raise TableUnreadable(f"{path}: cannot be read as {fmt}: {e}") from None
    # Spark notes its type beside an ORC column whose ORC type does not say it (timestamp_ntz is a long).
    said = {field.name: (field.metadata or {}).get(b"spark.sql.catalyst.type") for field in schema}
    return [(field.name, said[field.name].decode() if said[field.name] else
             _spark_type(field.type, field.name in instants)) for field in schema]


def _spark_type(t: pa.DataType, instant: bool = False) -> str:
    """The Spark ``simpleString`` of an Arrow type (the inverse of ``_arrow_type``); ``instant``:
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
        return f"array<{_spark_type(t.value_type)}>"
    if pa.types.is_map(t):
        return f"map<{_spark_type(t.key_type)},{_spark_type(t.item_type)}>"
    if pa.types.is_struct(t):
        return "struct<" + ",".join(f"{f.name}:{_spark_type(f.type)}" for f in t) + ">"
    if pa.types.is_integer(t):  # unsigned: the next wider signed type, as Spark reads them
        return {8: "smallint", 16: "int", 32: "bigint"}.get(t.bit_width, "decimal(20,0)")
    raise TableUnreadable(f"Arrow type {t} has no Spark type here")


def _csv_columns(files: list[_DataFile], options: dict) -> list[tuple[str, str]]:
    o = _Csv.of(options)
    for file in files:
        first = next(_csv_records(_text(file.path, options), o, options), None)
        if first is not None:
            names = _csv_header(first, o) if o.header else [f"_c{i}" for i in range(len(first))]
            return [(name, "string") for name in names]
    return []


def _json_columns(files: list[_DataFile], options: dict) -> list[tuple[str, str]]:
    seen: dict[str, set[str]] = {}
    for file in files:
        for objects in _json_objects(_text(file.path, options), options):
            for obj in objects or []:
                for key, value in obj.items():
                    seen.setdefault(key, set()).add(_json_kind(value))
    return [(key, _widest(kinds - {"void"})) for key, kinds in sorted(seen.items())]


def _json_kind(value: Any) -> str:
    if value is None:
        return "void"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, _JsonNumber):
        return "bigint" if _INT.fullmatch(value) else "double"
    return "string"


def _widest(kinds: set[str]) -> str:
    if len(kinds) == 1:
        return next(iter(kinds))
    return "double" if kinds == {"bigint", "double"} else "string"


def _partition_type(values: list[str | None]) -> str:
    """Spark's inference of a partition column's type from its values, for the common types."""
    present = [v for v in values if v is not None]
    if not present:
        return "string"
    if all(_INT.fullmatch(v) for v in present):
        widest = max(abs(int(v)) for v in present)
        return "int" if widest < 2 ** 31 else "bigint" if widest < 2 ** 63 else "decimal(38,0)"
    if all(_JAVA_DOUBLE.fullmatch(v) for v in present):
        return "double"
    if all(re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", v) for v in present):
        return "date"
    return "string"
