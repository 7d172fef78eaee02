"""Compacted generations in the lineage tables: what a reader sees at one snapshot, and reading a generation.

A compaction (``compaction.compact``) recomputes the connected sets over every edge of an edges topic and
writes them as generation N (1, 2, …) into the topic's tables (``edges.LineageTables``):

    edges/generation=N/bucket=B/   the edges, B = dst set mod the generation's buckets, sorted by (dst set, dst)
    rows/generation=N/             rid → set, with the row's kind, dataset and coordinates and whether it has
                                   edges in (has_in) and out (has_out), sorted by rid
    members/generation=N/bucket=B/ the same records, B = set mod the generation's buckets, sorted by (set, rid):
                                   a walk reads a set's rows' records with its edges, in the same round of
                                   reads, and looks up by rid only the rows it starts from (a set's rows are
                                   scattered over the rid order: looked up by rid, an aggregate's thousand
                                   inputs read most of the rows table)
    dependencies/generation=N/     (src set, dst set) of the edges that cross sets
    exits/generation=N/            (src, dst set) of the edges that cross sets, sorted by src
    generations                    one row per generation: its number, buckets, and its manifest (JSON)

The rows, members, dependencies, exits and the generation's row are committed first; then one Delta commit
of the edges table adds generation N's files and removes generation N-1's and the shards' files (generation
0) it took in. That commit is the switch: a reader of the edges table sees the old generation and the shards'
ranges, or the new one and the ranges it did not take, never a mix, and a compaction killed at any point
leaves the old one current. The previous generation's rows, members, dependencies and exits, and the shards' records
of the ranges it took, are removed by the next compaction (a reader that opened the edges table before the
switch still finds them), and ``vacuum`` deletes files no version read within the last hour needs. Older
generations stay readable as the tables' earlier versions (time travel) until then.

Edge files have the shards' columns (``edges.STORE_SCHEMA``): ``src_set`` is null where it equals
``dst_set``; their ``store``, ``first`` and ``last`` are null.
"""

from __future__ import annotations

import json
import os
from collections import deque
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .edges import (
    MEMBERS_SCHEMA,
    SHARD_GENERATION,
    STORE_SCHEMA,
    LineageTables,
    bucket_of,
    range_of,
    with_src_sets,
    write_of,
)
from .sorted_files import SortedFiles, read_many
from .tables import READERS, Location, Table


@dataclass
class Snapshot:
    """The edges table at one version: the current generation's files and the shards' (generation 0)."""

    tables: LineageTables
    version: int | None
    generation: int  # 0: none yet
    shard_files: list[dict] = field(default_factory=list)
    generation_files: list[dict] = field(default_factory=list)

    @classmethod
    def of(cls, store: "str | os.PathLike | Location", topic: str) -> "Snapshot":
        tables = LineageTables(store, topic)
        version = tables.edges.version()
        files = tables.edges.files(version).to_pylist() if version is not None else []
        number = max((f["partition.generation"] for f in files), default=SHARD_GENERATION)
        return cls(tables, version, number,
                   [f for f in files if f["partition.generation"] == SHARD_GENERATION],
                   [f for f in files if number and f["partition.generation"] == number])

    def shard_ranges(self) -> set[tuple[str, int, int]]:
        """The (store id, first, last) of the shards' ranges no generation holds."""
        return {range_of(f) for f in self.shard_files}

    def shard_rows_files(self) -> list[str]:
        """The rows records of the shards' ranges no generation holds (of the writes that committed them)."""
        writes = {write_of(f) for f in self.shard_files}
        return [f["path"] for f in self.tables.rows.files().to_pylist()
                if f["partition.generation"] == SHARD_GENERATION and f.get("min.store") and write_of(f) in writes]

    def current(self) -> "Generation | None":
        return Generation(self) if self.generation else None


class Generation:
    """One compacted generation, as a snapshot of the edges table holds it."""

    def __init__(self, snapshot: Snapshot):
        self.snapshot = snapshot
        self.tables = snapshot.tables
        self.number = snapshot.generation
        self._dependencies: pa.Table | None = None
        self._adjacency: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # by direction: (from, to), sorted by from
        self._rows: SortedFiles | None = None
        self._exits: SortedFiles | None = None
        self._edges: dict[int, SortedFiles] = {}  # by bucket
        self._by_set: dict[int, SortedFiles] = {}  # the members table's, by bucket
        self._member_files: dict[int, list[str]] | None = None

    @classmethod
    def current(cls, store: "str | os.PathLike | Location", topic: str) -> "Generation | None":
        return Snapshot.of(store, topic).current()

    @cached_property
    def manifest(self) -> dict:
        table = self.tables.generations
        found = table.read(table.files()["path"].to_pylist(), filter=pc.field("generation") == self.number)
        if not found.num_rows:
            raise RuntimeError(f"generation {self.number} of {self.tables.location} has no row in its "
                               f"generations table: restore the store from a backup")
        return json.loads(found["manifest"][0].as_py())

    @property
    def buckets(self) -> int:
        return int(self.manifest["buckets"])

    def edge_files(self) -> list[str]:
        """The generation's edge files, as paths within the edges table's filesystem."""
        return [self.tables.edges.file_path(f["path"]) for f in self.snapshot.generation_files]

    def _files(self, table: Table) -> list[str]:
        return [table.file_path(f["path"]) for f in table.files().to_pylist()
                if f["partition.generation"] == self.number]

    def row_files(self) -> list[str]:
        return self._files(self.tables.rows)

    def set_of(self, rids) -> dict[int, int]:
        """The set of each of ``rids`` that the generation holds."""
        table = self._rows_files().read(rids, ["rid", "set"])
        return dict(zip(table["rid"].to_pylist(), table["set"].to_pylist()))

    def rows(self, rids) -> pa.Table:
        """The rows records (``edges.ROWS_SCHEMA``, ``has_in``, ``has_out``) of those of ``rids`` the generation
        holds."""
        return self._rows_files().read(rids)

    def _rows_files(self) -> SortedFiles:
        if self._rows is None:
            files = self.row_files()
            if not files:  # a reader that opened the edges table before two compactions: look again
                raise FileNotFoundError(f"generation {self.number}'s rows are gone from {self.tables.rows}")
            self._rows = SortedFiles(files, "rid", MEMBERS_SCHEMA, self.tables.rows.filesystem)
        return self._rows

    def exits(self, rids) -> set[int]:
        """The sets other than their own that edges from ``rids`` lead into."""
        if self._exits is None:
            schema = pa.schema([("src", pa.int64()), ("dst_set", pa.int64())])
            self._exits = SortedFiles(self._files(self.tables.exits), "src", schema, self.tables.exits.filesystem)
        return set(self._exits.read(rids, ["dst_set"])["dst_set"].to_pylist())

    def dependencies(self) -> pa.Table:
        if self._dependencies is None:
            table = self.tables.dependencies
            self._dependencies = table.read([f["path"] for f in table.files().to_pylist()
                                             if f["partition.generation"] == self.number], ["src_set", "dst_set"])
        return self._dependencies

    def related_sets(self, sets, direction: str = "backward") -> set[int]:
        """``sets`` and every set they depend on (``backward``) or that depends on them (``forward``)."""
        if direction not in self._adjacency:
            deps = self.dependencies()
            src, dst = deps["src_set"].to_numpy(), deps["dst_set"].to_numpy()
            frm, to = (dst, src) if direction == "backward" else (src, dst)
            order = np.argsort(frm, kind="stable")
            self._adjacency[direction] = frm[order], to[order]
        frm, to = self._adjacency[direction]
        found, todo = set(sets), deque(sets)
        while todo:
            at = todo.popleft()
            lo, hi = np.searchsorted(frm, at, "left"), np.searchsorted(frm, at, "right")
            for nxt in to[lo:hi].tolist():
                if nxt not in found:
                    found.add(nxt)
                    todo.append(nxt)
        return found

    def edges(self, sets) -> pa.Table:
        """The edges whose dst lies in ``sets``, read from the row groups holding those sets only, ``src_set``
        filled in."""
        return self.sets(sets, members=False)[0]

    def sets(self, sets, members: bool = True) -> tuple[pa.Table, pa.Table | None]:
        """The edges whose dst lies in ``sets`` (as ``edges``) and, with ``members``, the rows records of
        every row of ``sets`` (as ``rows``), read together: one round of reads. The records are None where the
        generation has no members table (a generation migrated from the store's former layout)."""
        wanted = np.unique(np.asarray(list(sets), np.int64))
        buckets = bucket_of(wanted, self.buckets)
        chosen = [(b, wanted[buckets == b]) for b in np.unique(buckets).tolist()]
        lookups: list = [(self._bucket(b), keys, None) for b, keys in chosen]
        members = members and bool(self.manifest.get("members"))
        if members:
            lookups += [(self._members(b), keys, None) for b, keys in chosen]
        found = read_many(lookups)
        edges = [t for t in found[:len(chosen)] if t.num_rows]
        edges_table = with_src_sets(pa.concat_tables(edges) if edges else STORE_SCHEMA.empty_table())
        if not members:
            return edges_table, None
        records = [t for t in found[len(chosen):] if t.num_rows]
        return edges_table, pa.concat_tables(records) if records else MEMBERS_SCHEMA.empty_table()

    def open(self) -> "Generation":
        """Read every footer a lookup needs (each bucket's edges and members, the rows and the exits) now, at
        once, so that no question pays for its bucket's first open: in object storage each is a round trip."""
        opened: list[Callable[[], object]] = [partial(self._bucket, b) for b in range(self.buckets)]
        if self.manifest.get("members"):
            opened += [partial(self._members, b) for b in range(self.buckets)]
        opened += [self._rows_files, partial(self.exits, [])]
        list(READERS.map(lambda open_one: open_one(), opened))
        return self

    def _bucket(self, bucket: int) -> SortedFiles:
        """A bucket's files: each holds sets of every range, so only the set's bucket narrows a lookup to its files."""
        if bucket not in self._edges:
            files = [self.tables.edges.file_path(f["path"]) for f in self.snapshot.generation_files
                     if f["partition.bucket"] == bucket]
            self._edges[bucket] = SortedFiles(files, "dst_set", STORE_SCHEMA, self.tables.edges.filesystem)
        return self._edges[bucket]

    def _members(self, bucket: int) -> SortedFiles:
        """A bucket's rows records, by set."""
        if self._member_files is None:
            found: dict[int, list[str]] = {}  # filled before it is set: threads open buckets at once (``open``)
            for f in self.tables.members.files().to_pylist():
                if f["partition.generation"] == self.number:
                    found.setdefault(f["partition.bucket"], []).append(self.tables.members.file_path(f["path"]))
            self._member_files = found
        if bucket not in self._by_set:
            self._by_set[bucket] = SortedFiles(self._member_files.get(bucket, []), "set", MEMBERS_SCHEMA,
                                               self.tables.members.filesystem)
        return self._by_set[bucket]

    def size_bytes(self) -> int:
        return sum(int(f["size_bytes"]) for f in self.snapshot.generation_files)
