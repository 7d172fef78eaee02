"""Which files a static table is made of, and the partition values their folders give.

Spark lists a root folder recursively, leaving out its own markers and hidden files, reads a
folder a streaming file sink wrote through the sink's log instead, and takes ``name=value``
folders between the root (or ``basePath``) and a file as partition columns. This module
lists the files as Spark does, without reading them (but a sink's log), and adds a file's
partition values to the rows read from it.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import unquote, urlparse

import pyarrow as pa

from headwater.core.sink_log import batch_files

from .location import TableUnreadable, flag


@dataclass(frozen=True)
class DataFile:
    path: str
    size: int
    mtime_ns: int
    partition: tuple[tuple[str, str | None], ...]  # (column, value) from the folders' names


def local_path(path: str) -> str:
    """The local path of a Spark path: ``file:/a``, ``file:///a`` and ``/a`` are ``/a``."""
    # Not urlparse: a Spark path is no URL, and a '#' or '?' in it is part of a file's name.
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


def data_files(location: dict, options: dict) -> list[DataFile]:
    """The table's data files, in order: each root's by name (or as its sink's log committed them)."""
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
        spec = () if flag(options, "recursivefilelookup") else _partition_spec(path, base or root)
        files.append(DataFile(path, stat.st_size, stat.st_mtime_ns, spec))
    return files


def _hidden(name: str) -> bool:
    """Names Spark's file index leaves out: its own markers and temporary files, checksums."""
    return (name.startswith("_") and "=" not in name) or name.startswith(".") or name.endswith("._COPYING_")


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
    log, batches = _sink_log(root)
    first = max((n for n, name in batches.items() if name.endswith(".compact")), default=0)
    added: dict[str, None] = {}
    deleted = set()
    for number in sorted(n for n in batches if n >= first):
        for file, adds in _log_entry(os.path.join(log, batches[number])):
            if adds:
                added[file] = None
            else:
                deleted.add(file)
    return [path for path in added if path not in deleted]


def sink_batch_files(root: str, batch: int) -> list[str] | None:
    """The files batch ``batch`` added to the streaming file sink at ``root``, from its
    ``_spark_metadata`` log (``headwater.core.sink_log``); None if the log no longer tells."""
    log, batches = _sink_log(root)

    def entry(number: int) -> list[str] | None:
        name = batches.get(number)
        return None if name is None else [file for file, adds in _log_entry(os.path.join(log, name)) if adds]
    return batch_files(batch, entry, (n for n, name in batches.items() if name.endswith(".compact")))


def uri_path(path: str) -> str:
    """The local path of a file as Spark's logs name it: a URI (``file:/a%20b``) or a plain path."""
    return unquote(urlparse(path).path)


def _sink_log(root: str) -> tuple[str, dict[int, str]]:
    """A sink's log folder and its entries' names by batch (``<n>`` or ``<n>.compact``)."""
    log = os.path.join(root, "_spark_metadata")
    try:
        return log, {int(name.split(".")[0]): name for name in os.listdir(log)
                     if re.fullmatch(r"\d+(\.compact)?", name)}
    except OSError as e:
        raise TableUnreadable(f"{log}: cannot be listed: {e.strerror}") from None


def _log_entry(path: str) -> list[tuple[str, bool]]:
    """One entry of a sink's log: each file it names and whether it adds it (else deletes it).
    A version line comes first, then one JSON line per file."""
    try:
        with open(path, encoding="utf-8") as f:
            version, *lines = f.read().splitlines() or [""]
        if not re.fullmatch(r"v\d+", version):
            raise ValueError(f"it starts with {version!r}, not a version")
        return [(uri_path(status["path"]), status.get("action") != "delete")
                for status in map(json.loads, lines) if not status.get("isDir")]
    except (OSError, UnicodeError, ValueError, KeyError, AttributeError) as e:
        raise TableUnreadable(f"{path}: not a readable file sink log batch: {e}") from None


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
    # Spark escapes characters that cannot be in a folder name as %XX, each one char: latin-1.
    return unquote(name, encoding="latin-1")


def partition_names(files: list[DataFile]) -> list[str]:
    """The partition columns, the same for every file (Spark refuses a table whose differ)."""
    names: list[str] = []
    for file in files:
        these = [column for column, _ in file.partition]
        if these and names and [n.lower() for n in these] != [n.lower() for n in names]:
            raise TableUnreadable(f"{file.path}: its partition folders ({these}) differ from the "
                                  f"other files' ({names}), which Spark refuses to read")
        names = names or these
    return names


def with_partitions(table: pa.Table, file: DataFile, typed: list[tuple[str, pa.DataType]],
                    parsers: dict[str, Callable[[str], Any]]) -> pa.Table:
    """``table`` with the file's partition values added, in the order of ``typed``; ``parsers``:
    each partition column's (lower-cased) text parser."""
    raw = {column.lower(): value for column, value in file.partition}
    arrays = []
    for name, t in typed:
        key = name.lower()
        if key not in parsers:
            arrays.append(table.column(name))
            continue
        text = raw.get(key)
        try:
            value = None if text is None else parsers[key](text)
        except ValueError:
            value = None
        arrays.append(pa.nulls(table.num_rows, t) if value is None
                      else pa.repeat(pa.scalar(value, t), table.num_rows))
    return pa.table(arrays, names=[name for name, _ in typed])
