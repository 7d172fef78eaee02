"""The edge store: an edges topic's lineage in Delta tables, written exactly once per offset range.

An edges topic's tables live under ``<store>/<topic>/`` (``store/tables.py`` opens them, locally or in S3):

    edges/generation=G/bucket=B/…   the edges (``STORE_SCHEMA``) and, per file, the range that wrote it
    rows/generation=G/…              rows records: each rid's set, kind, dataset and coordinates
    members/generation=G/bucket=B/…  a generation's rows records again, by set (``generation.py``)
    records/kind=K/…                 the shards' other set-index records (aliases, dependencies, cut)
    exits/…, dependencies/…          a compacted generation's crossings between sets (``generation.py``)

Generation 0 is what the indexer's shards write; a compaction writes generation N > 0 (``generation.py``)
and, in the same Delta commit, removes the generation-0 files it took in and the generation before, and
records N (application transaction ``<topic>/generation``: ``LineageTables.switch``).

A shard is one edges partition's writer (``EdgeStore``). It tags what it writes with its store id
(``store``: the partition and its epoch, ``p3.e0``; a shard set aside starts the next epoch, so its data stay
in the same tables, told apart by the id) and the range (``first``, ``last``: Kafka offsets). One ``append``
holds the edges of messages ``first..last``: its rows go to the buckets of their dst sets
(``B = dst_set mod buckets``), sorted by ``(dst_set, dst)`` so a set's edges are contiguous and row-group
statistics skip the rest. The set index's records are committed first, then the edges, in a Delta commit
whose application transaction (``txn``, app id ``<topic>/<store id>``) records ``last``: the table itself
says where the shard resumes (``resume``), and a replay of a committed range commits nothing, even when a
former owner of the partition writes it at the same time (``tables.Table.commit``). A commit is made only
from the version its writer read (``after``): a writer whose view is behind (another committed ranges
meanwhile, around a rebalance) commits nothing, removes the records it committed for the range, and raises
``ShardMoved`` unless the table holds its whole range; it then reopens the shard and writes what is left.
A write's files (edges and records) share one name (``write_of``): records whose write never committed its
edges (a crash between the commits, before the replay) are never read, and a compaction removes them
(``orphan_records``).

``src_set`` is stored only where it differs from ``dst_set`` (null otherwise): most edges stay inside a set,
and a null costs a bit, not 8 bytes. ``store``, ``first`` and ``last`` are one value per file: a dictionary
page each.
"""

from __future__ import annotations

import os
import uuid
from concurrent.futures import ThreadPoolExecutor
from functools import cached_property
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headwater.core.schema import EDGE_SCHEMA, NODE_SCHEMA

from .tables import FilesGone, Location, Table, Written

STORE_SCHEMA = pa.schema(list(EDGE_SCHEMA) + [pa.field("src_set", pa.int64()),
                                             pa.field("dst_set", pa.int64(), nullable=False)])
# What the set index records beside the edges, committed with them (``set_index.Recorded``).
RECORDS = ("rows", "aliases", "dependencies", "cut")
# Buckets of a shard's writes: each write puts one file in each bucket its sets fall in, so fewer
# buckets mean bigger files (on the bench workload, 8 buckets: 11.7 bytes per edge in
# the edge files at 198,000 edges/s; 64 buckets: 18.2 bytes at 85,000 edges/s).
SHARD_BUCKETS = 8
SHARD_GENERATION = 0  # the generation the shards write; compactions write 1, 2, …
# A row's dataset is kept with its set (compaction splits large components along
# datasets), and what the query tier answers with: its kind and where it came from.
ROW_FIELDS = ("kind", "dataset", "topic", "partition", "offset", "key", "path", "position")
ROWS_SCHEMA = pa.schema([pa.field("rid", pa.int64()), pa.field("set", pa.int64())]
                        + [NODE_SCHEMA.field(name).with_nullable(True) for name in ROW_FIELDS])
ALIASES_SCHEMA = pa.schema([("old", pa.int64()), ("new", pa.int64())])
DEPENDENCIES_SCHEMA = pa.schema([("src_set", pa.int64()), ("dst_set", pa.int64())])
CUT_SCHEMA = pa.schema([("src_dataset", pa.string()), ("dst_dataset", pa.string())])

# Each file's writer and range: the shard's store id and its Kafka offsets (null in a generation's files).
RANGE_FIELDS = [pa.field("store", pa.string()), pa.field("first", pa.int64()), pa.field("last", pa.int64())]
EDGES_TABLE = pa.schema(list(STORE_SCHEMA) + RANGE_FIELDS
                        + [pa.field("generation", pa.int64()), pa.field("bucket", pa.int64())])
# A generation's rows records: whether the row has edges in and out too (shards' records leave them null).
MEMBERS_SCHEMA = pa.schema(list(ROWS_SCHEMA) + [pa.field("has_in", pa.bool_()), pa.field("has_out", pa.bool_())])
ROWS_TABLE = pa.schema(list(MEMBERS_SCHEMA) + RANGE_FIELDS + [pa.field("generation", pa.int64())])
# The same records by set (a generation's only): a walk reads the records of a set's rows with its edges.
MEMBERS_TABLE = pa.schema(list(MEMBERS_SCHEMA) + [pa.field("generation", pa.int64()), pa.field("bucket", pa.int64())])
# aliases (a: old, b: new), dependencies (a: src_set, b: dst_set), cut (the two datasets)
RECORDS_TABLE = pa.schema([pa.field("a", pa.int64()), pa.field("b", pa.int64()),
                           pa.field("src_dataset", pa.string()), pa.field("dst_dataset", pa.string())]
                          + RANGE_FIELDS + [pa.field("kind", pa.string())])
_RECORD_COLUMNS = {"aliases": ("a", "b"), "dependencies": ("a", "b"), "cut": ("src_dataset", "dst_dataset")}
_RECORD_SCHEMAS = {"aliases": ALIASES_SCHEMA, "dependencies": DEPENDENCIES_SCHEMA, "cut": CUT_SCHEMA}
GENERATIONS_TABLE = pa.schema([("generation", pa.int64()), ("buckets", pa.int64()), ("manifest", pa.string())])
EXITS_TABLE = pa.schema([("src", pa.int64()), ("dst_set", pa.int64()), ("generation", pa.int64())])
DEPENDENCIES_TABLE = pa.schema([("src_set", pa.int64()), ("dst_set", pa.int64()), ("generation", pa.int64())])
# Writes a shard's files and its records' commits at once (``EdgeStore.append``).
_WRITERS = ThreadPoolExecutor(max_workers=8, thread_name_prefix="headwater-store")
_Committed = tuple[Table, list[Written]]  # a records table and the files a write committed to it
# The edge files' encodings: dictionaries for the columns of few values, plain for rids and sets.
EDGE_DICTIONARY = ["query", "op", "cols", "exact", "batch", "store", "first", "last"]


def bucket_of(sets: np.ndarray, buckets: int) -> np.ndarray:
    return np.mod(np.asarray(sets, dtype=np.int64), buckets)


def with_src_sets(table: pa.Table) -> pa.Table:
    """``src_set`` filled in again where the files leave it null (equal to ``dst_set``)."""
    return table.set_column(table.schema.get_field_index("src_set"), "src_set",
                            pc.coalesce(table["src_set"], table["dst_set"]))


def _constant(table: pa.Table, store: str, first: int, last: int) -> pa.Table:
    n = table.num_rows  # ``pa.repeat``: a Python list of n strings cost ~7 ms a write of 28,000 edges
    return (table.append_column("store", pa.repeat(pa.scalar(store, pa.string()), n))
            .append_column("first", pa.repeat(pa.scalar(first, pa.int64()), n))
            .append_column("last", pa.repeat(pa.scalar(last, pa.int64()), n)))


class LineageTables:
    """The Delta tables of one edges topic's lineage."""

    def __init__(self, store: "str | os.PathLike | Location", topic: str):
        if "/" in topic:
            raise ValueError(f"topic name {topic!r} cannot name a store folder (no '/')")
        self.location = Location.of(store).child(topic)
        self.topic = topic
        self.edges = Table(self.location.child("edges"), EDGES_TABLE, ["generation", "bucket"])
        self.rows = Table(self.location.child("rows"), ROWS_TABLE, ["generation"])
        self.members = Table(self.location.child("members"), MEMBERS_TABLE, ["generation", "bucket"])
        self.records = Table(self.location.child("records"), RECORDS_TABLE, ["kind"])
        self.exits = Table(self.location.child("exits"), EXITS_TABLE, ["generation"])
        self.dependencies = Table(self.location.child("dependencies"), DEPENDENCIES_TABLE, ["generation"])
        self.generations = Table(self.location.child("generations"), GENERATIONS_TABLE)  # one row per generation

    def switch(self, added: list[Written], removed: list[str], number: int, operation: str) -> bool:
        """Add generation ``number``'s edge files and remove ``removed`` in one commit, recording ``number``
        (``generation``); False if the table records that generation or a later one already."""
        return self.edges.commit(added, removed, txn=(f"{self.topic}/generation", number),
                                 metadata={"headwater.operation": operation})

    def generation(self) -> int:
        """The newest generation the edges table switched to (``switch``), 0 for none: one look at the log,
        where the files' partitions would be read one by one (each shard's write asks)."""
        return self.edges.applied(f"{self.topic}/generation") or 0

    def epoch(self, partition: int) -> int:
        """The partition's shard epoch: 0 until one is set aside (``set_aside``)."""
        return self.edges.applied(f"{self.topic}/epoch/p{partition}") or 0

    def set_aside(self, partition: int) -> str:
        """Start the partition's next epoch: its shard's data stay, under the old store id; returns the new id."""
        epoch = self.epoch(partition) + 1
        self.edges.commit(txn=(f"{self.topic}/epoch/p{partition}", epoch))
        return store_id(partition, epoch)


class ShardMoved(Exception):
    """Another writer of the partition (its former or new owner, around a rebalance) committed ranges since
    this one read where the shard stood: the write is not committed, and the writer must look again (reopen
    the shard) before it writes what the table does not hold yet."""


def store_id(partition: int, epoch: int) -> str:
    return f"p{partition}.e{epoch}"


def range_of(file: dict) -> tuple[str, int, int]:
    """A shard file's (store id, first, last), from its statistics (one value each per file)."""
    return file["min.store"], int(file["min.first"]), int(file["min.last"])


def write_of(file: dict) -> tuple[str, int, int, str]:
    """A shard file's range and the write that made it: the files of one ``append`` (edges and records) have
    one name before their first ``-`` (``<store id>.w<token>``), so the records of a range written twice (a
    crash between the commits, then the replay) are told from the replay's."""
    return (*range_of(file), file["path"].rsplit("/", 1)[-1].split("-", 1)[0])


def orphan_records(tables: "LineageTables", files: list[dict], live: set[tuple]) -> list[dict]:
    """Those of a records table's ``files`` (shards' ones) whose write never committed and never will: its
    range (``range_of``) and its write (``write_of``) not in ``live`` (the committed writes, and the ranges a
    reader of an earlier generation may still read), and ended at or before where the edges table says its
    shard stands, so no writer can commit it any more."""
    applied: dict[str, int] = {}
    found = []
    for f in files:
        if f.get("partition.generation", SHARD_GENERATION) != SHARD_GENERATION or not f.get("min.store"):
            continue
        store, _, last = range_of(f)
        if range_of(f) in live or write_of(f) in live:
            continue
        if store not in applied:
            version = tables.edges.applied(f"{tables.topic}/{store}")
            applied[store] = -1 if version is None else version
        if last <= applied[store]:
            found.append(f)
    return found


class EdgeStore:
    """One edges partition's shard: its writes into the topic's tables, and its reads of them."""

    def __init__(self, store: "str | os.PathLike | Location", topic: str, partition: int,
                 buckets: int = SHARD_BUCKETS):
        self.tables = LineageTables(store, topic)
        self.topic = topic
        self.partition = partition
        self.buckets = buckets

    @cached_property
    def _id(self) -> str:
        return store_id(self.partition, self.tables.epoch(self.partition))

    def identity(self) -> str:
        """This shard's store id: the partition and its epoch."""
        return self._id

    @property
    def app_id(self) -> str:
        return f"{self.topic}/{self.identity()}"

    def append(self, edges: pa.Table, first: int, last: int, records: dict[str, pa.Table] | None = None,
               before_commit: Callable[[], None] | None = None, looked: bool = False) -> int:
        """Add the edges of messages ``first..last``; returns the bytes written (0: the store holds them).

        ``edges`` has ``EDGE_SCHEMA``'s columns plus ``src_set`` and ``dst_set``; ``records`` are tables of
        ``RECORDS`` kinds committed with them (the set index's). ``before_commit`` runs once the files are
        written, before the edges' commit; if it raises, the edges are not committed (the indexer waits
        there for the graph's write). ``looked``: the caller read the edges table just before (``generation``),
        so where the shard stands is read from that look, not from another (the commit checks it all the same).
        """
        unknown = set(records or {}) - set(RECORDS)
        if unknown:
            raise ValueError(f"unknown record kind {sorted(unknown)}; known: {', '.join(RECORDS)}")
        applied = self.resume(latest=not looked) - 1
        if last <= applied:
            return 0  # already in the store (a replay after a crash)
        if first <= applied:
            raise ShardMoved(f"{self.app_id}: the table holds offsets to {applied}, past this write's first, "
                             f"{first}: another writer of the partition wrote them since this one last looked")
        store = self.identity()
        name = f"{store}.w{uuid.uuid4().hex[:12]}"  # this write's files' name (``write_of``)
        # The records' two commits, the bucket files then, all at once: writing Parquet and S3's round trips
        # leave the interpreter free, and only the edges' commit must wait for the records' (the longest: each
        # a file and a commit, so they go first). Records of a write whose edges never commit are never read.
        recorded = [_WRITERS.submit(commit, store, first, last, name)
                    for commit in self._record_commits(records or {})]
        table = edges.select(STORE_SCHEMA.names).cast(STORE_SCHEMA)
        table = table.set_column(table.schema.get_field_index("src_set"), "src_set",
                                 pc.if_else(pc.equal(table["src_set"], table["dst_set"]),
                                            pa.scalar(None, pa.int64()), table["src_set"]))
        # Sorted by bucket, then (dst_set, dst): each bucket's file is a slice.
        dst_set = table["dst_set"].to_numpy()
        buckets = bucket_of(dst_set, self.buckets)
        order = np.lexsort((table["dst"].to_numpy(), dst_set, buckets))
        table, buckets = _constant(table.take(order), store, first, last), buckets[order]
        starts = np.flatnonzero(np.r_[True, buckets[1:] != buckets[:-1]]).tolist()
        edge_files = [_WRITERS.submit(self.tables.edges.write_file, table.slice(start, end - start),
                                      {"generation": SHARD_GENERATION, "bucket": int(buckets[start])}, name=name,
                                      use_dictionary=EDGE_DICTIONARY)
                      for start, end in zip(starts, starts[1:] + [table.num_rows])] if table.num_rows else []
        files = [f.result() for f in edge_files]
        committed = [r.result() for r in recorded]
        written = sum(f.size for f in files) + sum(f.size for _, kept in committed for f in kept)
        if before_commit is not None:
            before_commit()
        if not self.tables.edges.commit(files, txn=(self.app_id, last), after=applied):
            # Another writer (the partition's former or new owner, around a rebalance) committed first: its
            # records stand, this write's go, so no row is recorded twice.
            for table, kept in committed:
                try:
                    table.commit(removed=[f.path for f in kept])
                except FilesGone:  # a compaction took them meanwhile
                    pass
            moved = self.resume() - 1
            if moved < last:
                raise ShardMoved(f"{self.app_id}: another writer of the partition committed offsets to {moved} "
                                 f"while this one wrote {first}..{last}")
            return 0  # it holds the whole range
        return written

    def _record_commits(self, records: dict[str, pa.Table]) -> list[Callable[[str, int, int, str], _Committed]]:
        """One function per records table that writes and commits a write's records there (its files named
        ``name``); each returns the table and the files it committed."""
        commits: list[Callable[[str, int, int, str], _Committed]] = []
        rows = records.get("rows")
        if rows is not None and rows.num_rows:  # a file of no rows has no statistics, so no range (``range_of``)
            def commit_rows(store: str, first: int, last: int, name: str) -> _Committed:
                file = self.tables.rows.write_file(_complete(_constant(rows, store, first, last),
                                                             self.tables.rows.file_schema),
                                                   {"generation": SHARD_GENERATION}, name=name)
                self.tables.rows.commit([file])
                return self.tables.rows, [file]
            commits.append(commit_rows)
        others = {kind: found for kind in ("aliases", "dependencies", "cut")
                  if (found := records.get(kind)) is not None and found.num_rows}
        if others:
            def commit_others(store: str, first: int, last: int, name: str) -> _Committed:
                files = [self.tables.records.write_file(
                    _complete(_constant(found.rename_columns(list(_RECORD_COLUMNS[kind])), store, first, last),
                              self.tables.records.file_schema), {"kind": kind}, name=name)
                         for kind, found in others.items()]
                self.tables.records.commit(files)
                return self.tables.records, files
            commits.append(commit_others)
        return commits

    def resume(self, latest: bool = True) -> int:
        """The next offset the store does not hold (past every range this shard committed). Records of writes
        whose edges never committed (a crash between the commits) stay where they are, unread (``records``),
        until a compaction removes them (``orphan_records``): deleting them here could delete a former owner's
        records of a range it is about to commit."""
        applied = self.tables.edges.applied(self.app_id, latest)
        return 0 if applied is None else applied + 1

    def shard_files(self, sets=None) -> list[dict]:
        """This shard's committed edge files that no generation holds yet (of the buckets of ``sets`` only,
        when given): the add actions ``tables.Table.files`` lists."""
        files = self.tables.edges.files().to_pylist()
        buckets = None if sets is None else set(bucket_of(np.asarray(list(sets)), self.buckets).tolist())
        return [f for f in files if f["partition.generation"] == SHARD_GENERATION
                and f.get("min.store") == self.identity()
                and (buckets is None or f["partition.bucket"] in buckets)]

    def committed(self) -> list[tuple[int, int]]:
        """The (first, last) ranges of this shard's edges that no generation holds yet."""
        return sorted({range_of(f)[1:] for f in self.shard_files()})

    def read(self, sets=None) -> pa.Table:
        """Committed edges no generation holds yet (of the dst sets ``sets``, when given), ``src_set`` filled in."""
        table = self.tables.edges.read([f["path"] for f in self.shard_files(sets)], STORE_SCHEMA.names)
        if sets is not None:
            table = table.filter(pc.is_in(table["dst_set"], pa.array(list(sets), pa.int64())))
        return with_src_sets(table)

    def records(self, kind: str) -> pa.Table | None:
        """This shard's committed records of one ``RECORDS`` kind that no generation holds yet, in commit
        order; None if there is none."""
        store = self.identity()
        writes = {write_of(f) for f in self.shard_files()}  # a write whose edges never committed has none
        if kind == "rows":
            files = [f for f in self.tables.rows.files().to_pylist()
                     if f["partition.generation"] == SHARD_GENERATION and f.get("min.store") == store
                     and write_of(f) in writes]
            found = self.tables.rows.read([f["path"] for f in files], ROWS_SCHEMA.names + ["last"])
            names = ROWS_SCHEMA.names
        else:
            files = [f for f in self.tables.records.files().to_pylist()
                     if f["partition.kind"] == kind and f.get("min.store") == store and write_of(f) in writes]
            found = self.tables.records.read([f["path"] for f in files], [*_RECORD_COLUMNS[kind], "last"])
            found = found.rename_columns([*_RECORD_SCHEMAS[kind].names, "last"])
            names = _RECORD_SCHEMAS[kind].names
        if not found.num_rows:
            return None
        order = pc.sort_indices(found["last"])  # a file's rows in the order written, files by range
        return found.take(order).select(names)

    def size_bytes(self) -> int:
        return sum(int(f["size_bytes"]) for f in self.shard_files())


def _complete(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` in ``schema``: its columns cast, those it lacks as nulls (a shard's rows have no ``has_in``)."""
    n = table.num_rows
    return pa.table([table[f.name].cast(f.type) if f.name in table.column_names else pa.nulls(n, f.type)
                     for f in schema], schema=schema)
