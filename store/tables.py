"""The store's tables: Delta Lake tables (delta-rs) on a local disk or in S3, the one place that opens them.

Every table of the store lives under one ``store_uri`` (the ``store_dir`` setting: a local path, or
``s3://bucket/prefix``). A ``Location`` is such a place; ``Table`` is one Delta table there, with the few
operations the store needs, each a Delta transaction (delta-rs commits it: a put-if-absent of the next
``_delta_log`` entry, so writers on many hosts need no lock service):

- ``write_file``: a Parquet file written into the table's folder by pyarrow (our writer options: sorted
  rows, small row groups, dictionaries where they pay), not yet part of the table; ``commit`` then adds
  files (and removes others) in one transaction, with application transactions (``txn``: an app id and
  a version, Delta's record of how far a writer got) and metadata. A file written but never committed
  (a crash in between) is never read, and ``vacuum`` deletes it;
- ``applied``: the version a writer recorded under its app id, read from the table, not from a file of ours;
- ``files``: the data files of a version, with their partition values and statistics;
- ``delete``: rows matching a predicate (whole files where every row matches, as ours are).

S3's endpoint, region and credentials come from the environment (``AWS_ENDPOINT_URL``, ``AWS_REGION``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_ALLOW_HTTP``), as for the AWS
tools, never from headwater's settings, and they are never written to a log: ``Location`` prints its URI only.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterable, Mapping
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.exceptions import CommitFailedError, TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction

# What the S3 clients (delta-rs's object store, pyarrow's) read from the environment.
S3_ENVIRONMENT = ("AWS_ENDPOINT_URL", "AWS_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                  "AWS_SESSION_TOKEN", "AWS_ALLOW_HTTP")
# A commit is a put-if-absent of its log entry (S3's conditional writes, which SeaweedFS, MinIO and AWS
# honour): no DynamoDB lock table, and two writers never both take one version.
CONDITIONAL_PUT = {"AWS_CONDITIONAL_PUT": "etag"}
# Reads files at once (``Table.read_each``, ``sorted_files.SortedFiles.read``): in object storage each read is a
# round trip, and they overlap.
READERS = ThreadPoolExecutor(max_workers=8, thread_name_prefix="headwater-read")
# Every table commits often (a shard's write, a batch's log record): its log entries older than a day go at
# the next checkpoint, or listing the log would slow with the stream's age. A checkpoint every 10 commits, not
# Delta's 100: delta-rs reads every entry since the last checkpoint at each commit and refresh, so a commit's
# cost swung from 12 to 31 ms over each hundred (8 files a commit, local disk; into SeaweedFS 38 to 79 ms,
# 55 ms on average); every 10, 8.5 to 12 ms (SeaweedFS: 35 ms on average).
TABLE_CONFIGURATION = {"delta.logRetentionDuration": "interval 1 day", "delta.enableExpiredLogCleanup": "true",
                       "delta.checkpointInterval": "10"}
# Commits tried when others keep landing first with the same app id (delta-rs retries the rest itself).
COMMIT_ATTEMPTS = 5
# Old files a vacuum leaves: a reader opened on an older version still finds its files for this long.
KEEP_HOURS = 1.0


@dataclass(frozen=True)
class Location:
    """A place in the store: a local folder or an ``s3://bucket/prefix``."""

    uri: str

    @classmethod
    def of(cls, where: "str | os.PathLike | Location") -> "Location":
        if isinstance(where, Location):
            return where
        text = os.fspath(where)
        if "://" in text and not text.startswith("file://"):
            if urlparse(text).scheme != "s3":
                raise ValueError(f"store {text!r}: expected a local path or s3://bucket/prefix")
            return cls(text.rstrip("/"))
        return cls(os.path.abspath(text.removeprefix("file://")))

    def __str__(self) -> str:
        return self.uri

    @property
    def is_s3(self) -> bool:
        return self.uri.startswith("s3://")

    def child(self, *parts: str) -> "Location":
        return Location("/".join([self.uri, *parts]))

    def storage_options(self) -> dict[str, str] | None:
        """delta-rs's options for this place: S3's from the environment; None for a local folder."""
        if not self.is_s3:
            return None
        found = {name: value for name in S3_ENVIRONMENT if (value := os.environ.get(name))}
        if found.get("AWS_ENDPOINT_URL", "").startswith("http://"):
            found["AWS_ALLOW_HTTP"] = "true"
        return {**found, **CONDITIONAL_PUT}

    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        """pyarrow's filesystem for this place, and the path within it."""
        if not self.is_s3:
            return pafs.LocalFileSystem(), self.uri
        endpoint = os.environ.get("AWS_ENDPOINT_URL") or ""
        parsed = urlparse(endpoint)
        s3 = pafs.S3FileSystem(
            access_key=os.environ.get("AWS_ACCESS_KEY_ID"), secret_key=os.environ.get("AWS_SECRET_ACCESS_KEY"),
            session_token=os.environ.get("AWS_SESSION_TOKEN"), region=os.environ.get("AWS_REGION") or "us-east-1",
            endpoint_override=parsed.netloc or None, scheme=parsed.scheme or "https",
            allow_bucket_creation=False,
            # A file smaller than a part goes up in one PUT when it is closed, not in three requests of a
            # multipart upload: a shard's write of 11 small files, 2-3x faster into SeaweedFS.
            allow_delayed_open=True)
        return s3, self.uri.removeprefix("s3://")


class FilesGone(RuntimeError):
    """A commit would remove files another writer removed since they were read."""


@dataclass
class Written:
    """A data file written into a table's folder and not yet committed."""

    path: str  # relative to the table's root
    size: int
    partition: dict[str, str]
    rows: int
    stats: str


class Table:
    """One Delta table of the store."""

    def __init__(self, location: Location, schema: pa.Schema, partition_by: Iterable[str] = ()):
        self.location = location
        self.schema = schema  # the table's columns; the partition columns' values are only in paths
        self.partition_by = list(partition_by)
        self.file_schema = pa.schema([f for f in schema if f.name not in self.partition_by])
        self._fs, self._root = location.filesystem()
        self._table: DeltaTable | None = None

    def __repr__(self) -> str:
        return f"Table({self.location})"

    def delta(self, version: int | None = None, latest: bool = True) -> DeltaTable | None:
        """The table at ``version`` (else its latest; with ``latest`` False, as last read, which a blind append
        may commit on: delta-rs puts it after whatever landed since), None if it was never created. At the
        version last read, it is that same object, which the next read of the latest moves on: read it at once."""
        options = self.location.storage_options()
        if version is not None:
            if self._table is not None and self._table.version() == version:
                return self._table  # the one last read: no second load of the log
            try:
                return DeltaTable(self.location.uri, version=version, storage_options=options)
            except TableNotFoundError:
                return None
        if self._table is None:
            try:
                self._table = DeltaTable(self.location.uri, storage_options=options)
            except TableNotFoundError:
                return None
        elif latest:
            self._table.update_incremental()
        return self._table

    def ensure(self, latest: bool = True) -> DeltaTable:
        """The table, created empty first if it is not there yet (by whichever writer gets there first)."""
        table = self.delta(latest=latest)
        if table is None:
            try:
                DeltaTable.create(self.location.uri, self.schema, partition_by=self.partition_by or None,
                                  mode="ignore", storage_options=self.location.storage_options(),
                                  configuration=TABLE_CONFIGURATION)
            except Exception:  # another writer created it meanwhile: its version 0 holds
                if self.delta() is None:
                    raise
            table = self.delta()
            assert table is not None
        return table

    def version(self) -> int | None:
        table = self.delta()
        return None if table is None else table.version()

    def applied(self, app_id: str, latest: bool = True) -> int | None:
        """The version the writer ``app_id`` last committed with (``commit(txn=…)``), None if it never did (with
        ``latest`` False, as the table was last read)."""
        table = self.delta(latest=latest)
        return None if table is None else table.transaction_version(app_id)

    def write_file(self, data: pa.Table, partition: Mapping[str, int | str] | None = None, name: str = "",
                   **options) -> Written:
        """Write ``data`` (``file_schema``'s columns) as one Parquet file in its partition's folder; not committed.

        ``options`` go to ``pyarrow.parquet.write_table`` (zstd unless said)."""
        values, relative, path = self._new_file(partition or {}, name)
        data = data.select(self.file_schema.names).cast(self.file_schema)
        options.setdefault("compression", "zstd")
        footers: list[pq.FileMetaData] = []
        with self._fs.open_output_stream(path) as out:  # its size as written: no request to S3 to ask it
            pq.write_table(data, out, metadata_collector=footers, **options)
            size = out.tell()
        return Written(relative, size, values, data.num_rows, file_stats(footers[0]))

    def add_file(self, local_path: str, partition: Mapping[str, int | str], name: str = "") -> Written:
        """Copy a Parquet file written elsewhere (by Spark, on a local disk) into the table's folder; not
        committed."""
        values, relative, path = self._new_file(partition, name)
        pafs.copy_files(local_path, path, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=self._fs)
        footer = pq.read_metadata(local_path)
        return Written(relative, int(self._fs.get_file_info(path).size), values, footer.num_rows, file_stats(footer))

    def _new_file(self, partition: Mapping[str, int | str], name: str) -> tuple[dict[str, str], str, str]:
        """A new data file's partition values, path from the table's root, and path in ``filesystem`` (its
        folder made on a local disk)."""
        values = {key: str(value) for key, value in partition.items()}
        if sorted(values) != sorted(self.partition_by):
            raise ValueError(f"{self}: a file needs a value of each of {self.partition_by}, not {sorted(values)}")
        folder = "/".join(f"{key}={values[key]}" for key in self.partition_by)
        relative = "/".join(filter(None, [folder, f"{name}{'-' if name else ''}{uuid.uuid4().hex}.parquet"]))
        path = self.file_path(relative)
        if not self.location.is_s3:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        return values, relative, path

    def commit(self, written: Iterable[Written] = (), removed: Iterable[str] = (), txn: tuple[str, int] | None = None,
               metadata: Mapping[str, str] | None = None, after: int | None = None) -> bool:
        """Add ``written`` files and remove the files at ``removed`` paths in one transaction; False if it was
        not made (``txn``'s writer had committed that far already, or not from ``after``).

        ``txn``: the writer's app id and the version it records (``applied`` reads it back). A writer whose app
        id the table already records at ``txn``'s version or later commits nothing (False); with ``after``
        (the version the writer read, -1 for none), nor does one whose app id the table records at any other
        version than that: another writer moved it meanwhile. The check and the commit are made on one
        snapshot, and delta-rs refuses a commit when another with the same app id landed after that snapshot,
        so two writers of one range never both commit it: with ``after``, the first attempt is made on the
        snapshot ``after`` was read from (the table as last read), and the table is not read again after the
        commit (the writer looks before its next write), two looks at the log fewer."""
        written, removed = list(written), list(removed)
        for attempt in range(COMMIT_ATTEMPTS):
            # A blind append (no txn, nothing removed) needs no fresh snapshot either.
            table = self.ensure(latest=bool((txn and after is None) or removed) or attempt > 0)
            if txn is not None:
                recorded = table.transaction_version(txn[0])
                recorded = -1 if recorded is None else recorded
                if recorded >= txn[1] or (after is not None and recorded != after):
                    return False
            present: dict[str, dict] = {}
            if removed:
                present = {f["path"]: f for f in _files_of(table).to_pylist()}
                gone = [path for path in removed if path not in present]
                if gone:
                    raise FilesGone(f"{self}: {len(gone)} of the files to remove were removed by another "
                                    f"writer meanwhile, e.g. {gone[0]}")
            try:
                self._commit(table, written, [present[path] for path in removed], txn, metadata,
                             refresh=after is None)
                return True
            except CommitFailedError:
                if attempt == COMMIT_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    def _commit(self, table: DeltaTable, written: list[Written], removed: list[dict], txn: tuple[str, int] | None,
                metadata: Mapping[str, str] | None, refresh: bool = True) -> None:
        now = int(time.time() * 1000)
        actions: list[AddAction | RemoveAction] = [
            AddAction(w.path, w.size, w.partition, now, True, w.stats) for w in written]
        actions += [RemoveAction(f["path"], True, now, int(f["size_bytes"]),
                                 {key: None if f[f"partition.{key}"] is None else str(f[f"partition.{key}"])
                                  for key in self.partition_by})
                    for f in removed]
        properties = CommitProperties(
            app_transactions=[Transaction(*txn)] if txn else None,
            custom_metadata=dict(metadata) if metadata else None)
        table.create_write_transaction(actions, "append", self.schema, self.partition_by or None,
                                       commit_properties=properties)
        # The snapshot moved past this commit (it does not move by itself): the next blind append then commits
        # on it at once, where from a stale one delta-rs reads every commit since to put it after them. A
        # compare-and-set writer (``after``) looks at the table again before its next write anyway.
        if refresh:
            table.update_incremental()

    def files(self, version: int | None = None) -> pa.Table:
        """The data files of ``version`` (else the latest): ``path`` (from the table's root), ``size_bytes``,
        ``num_records``, ``partition.<column>``, ``min.<column>``, ``max.<column>``."""
        table = self.delta(version)
        return pa.table({"path": pa.array([], pa.string())}) if table is None else _files_of(table)

    def file_path(self, relative: str) -> str:
        """A file's path in ``filesystem``."""
        return f"{self._root}/{relative}"

    @property
    def filesystem(self) -> pafs.FileSystem:
        return self._fs

    def read(self, relative_paths: Iterable[str], columns: list[str] | None = None,
             filter: pc.Expression | None = None) -> pa.Table:
        """The rows of those files (partition columns are not in them)."""
        paths = [self.file_path(p) for p in relative_paths]
        if not paths:
            empty = self.file_schema.empty_table()
            return empty if columns is None else empty.select(columns)
        return ds.dataset(paths, schema=self.file_schema, format="parquet", filesystem=self._fs).to_table(
            columns=columns, filter=filter)

    def read_each(self, relative_paths: list[str], columns: list[str]) -> dict[str, pa.Table]:
        """The rows of each of those files, by its path; the files read at once (S3's round trips overlap)."""
        def read(relative: str) -> pa.Table:
            return pq.read_table(self.file_path(relative), columns=columns, filesystem=self._fs,
                                 schema=self.file_schema)
        return dict(zip(relative_paths, READERS.map(read, relative_paths)))

    def delete(self, predicate: str) -> int:
        """Remove the rows ``predicate`` (SQL) matches, in one transaction; returns the rows removed."""
        table = self.delta()
        if table is None:
            return 0
        return int(table.delete(predicate).get("num_deleted_rows", 0))

    def vacuum(self, keep_hours: float = KEEP_HOURS) -> list[str]:
        """Delete files no version within ``keep_hours`` reads (removed ones, and ones never committed)."""
        table = self.delta()
        if table is None:
            return []
        return table.vacuum(retention_hours=int(keep_hours), enforce_retention_duration=False, dry_run=False)


def _files_of(table: DeltaTable) -> pa.Table:
    """The data files of the snapshot ``table`` holds (``Table.files``)."""
    found = pa.table(table.get_add_actions(flatten=True))
    root = table.table_uri.rstrip("/") + "/"
    paths = [p.removeprefix(root) for p in found["path"].to_pylist()]
    return found.set_column(found.schema.get_field_index("path"), "path", pa.array(paths, pa.string()))


def file_stats(footer: pq.FileMetaData) -> str:
    """Delta's statistics of a Parquet file from its footer: its row count, and each number or text column's
    min, max and nulls over its row groups (what Spark, DuckDB and delta-rs skip files by)."""
    low: dict = {}
    high: dict = {}
    nulls: dict = {}
    for group in range(footer.num_row_groups):
        chunks = footer.row_group(group)
        for i in range(chunks.num_columns):
            chunk = chunks.column(i)
            name, stats = chunk.path_in_schema, chunk.statistics
            if stats is None or chunk.physical_type not in ("INT32", "INT64", "BYTE_ARRAY", "BOOLEAN"):
                continue
            nulls[name] = nulls.get(name, 0) + (stats.null_count or 0)
            if stats.has_min_max and chunk.physical_type != "BOOLEAN":
                low[name] = stats.min if name not in low else min(low[name], stats.min)
                high[name] = stats.max if name not in high else max(high[name], stats.max)
    return json.dumps({"numRecords": footer.num_rows, "minValues": low, "maxValues": high, "nullCount": nulls})
