"""Compacted generations of the Parquet store: their layout, the atomic switch, and reading them.

A compaction (``compaction.compact``) recomputes the connected sets over every shard of
an edges topic and writes them as one generation:

    <store_dir>/<topic>/compacted/gen=<N>/
        edges/bucket=B/*.parquet   the edges, B = dst set mod buckets, sorted by (dst set, dst)
        rows/*.parquet             rid → set, with the row's kind, dataset and coordinates and whether
                                   it has edges in (has_in) and out (has_out), sorted by rid
        dependencies/*.parquet     (src set, dst set) of the edges that cross sets
        exits/*.parquet            (src, dst set) of the edges that cross sets, sorted by src
        manifest.json              what it covers (by shard, set-aside ones too: its store id, the
                                   offset below which the generation holds its ranges), sizes, duration
    <store_dir>/<topic>/compacted/CURRENT   {"generation": N}

A generation is written under a temporary name and renamed whole; ``CURRENT`` is then
replaced (``os.replace``), which is the switch: a reader sees the old generation or the
new one, never a mix, and a compaction killed at any point leaves the old one current.
The generation before the current one is kept (a reader may still be in it); older
ones are removed by the next compaction.

Edge files have the shards' schema (``store.STORE_SCHEMA``): ``src_set`` is null
where it equals ``dst_set``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import deque
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds

from .edges import SHARD_BUCKETS, STORE_SCHEMA, EdgeStore, bucket_of, parse_range, with_src_sets
from .sorted_files import SortedFiles

CURRENT = "CURRENT"
TMP_MARK = ".tmp-"
SET_ASIDE = "set-aside"  # where ``Indexer.set_aside`` moves a shard: <store_dir>/<topic>/set-aside/<name>-<time>-<pid>
SET_ASIDE_KEY = "set-aside:"  # a generation's covers of set-aside shards: this, then the store id


def compacted_root(store_dir: str | Path, topic: str) -> Path:
    return Path(store_dir) / topic / "compacted"


def generation_dir(root: Path, number: int) -> Path:
    return root / f"gen={number}"


def current_number(root: Path) -> int | None:
    try:
        return int(json.loads((root / CURRENT).read_text())["generation"])
    except FileNotFoundError:
        return None


def next_number(root: Path) -> int:
    numbers = [int(p.name.split("=", 1)[1].split(TMP_MARK)[0]) for p in root.glob("gen=*")]
    return max(numbers, default=0) + 1


def switch(root: Path, number: int) -> None:
    """Make generation ``number`` current (atomically), then drop all but it and the one before."""
    tmp = root / f".{CURRENT}.tmp"
    tmp.write_text(json.dumps({"generation": number}))
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    previous = current_number(root)
    os.replace(tmp, root / CURRENT)
    keep = {number, previous}
    for path in root.glob("gen=*"):
        name = path.name.split("=", 1)[1]
        if TMP_MARK in name or int(name) not in keep:
            shutil.rmtree(path, ignore_errors=True)


def store_version(store_dir: Path, topic: str) -> tuple:
    """Changes whenever what a reader of ``topic``'s store would read does: a new generation, a shard's range
    committed or dropped (the query service's Parquet backends open the store again then)."""
    shards = tuple((folder.name, tuple(EdgeStore(folder).committed()))
                   for folder in sorted((Path(store_dir) / topic).glob("partition=*")))
    return current_number(compacted_root(store_dir, topic)), shards


def snapshot(store_dir: Path, topic: str, previous: dict | None = None, create: bool = False
             ) -> tuple[dict, list[str], list[str]]:
    """What each shard of ``topic`` has committed now that the ``previous`` generation's covers do not hold.

    Returns the covers of a generation built from both (by partition: the shard's store
    id and the offset below which the generation holds its ranges), and the new
    ranges' edge files and rows-record files. A shard that is not the store the
    previous generation covered (set aside and rebuilt) is taken whole. ``create``: give
    a shard that has no store id yet one (compaction does, to cover it; readers do not).

    Shards set aside (``Indexer.set_aside``) are read too, after the live ones: they may
    hold ranges no generation holds yet, whose edges the graph holds. A set-aside shard
    keeps its store id, so what a generation took from it while it was live counts;
    their covers are keyed ``SET_ASIDE_KEY`` and the store id, which names no partition,
    so compaction drops nothing from them (``compaction.drop_covered``). An edge may
    then be both in a set-aside shard and in its successor (a new group read the topic
    again): a lineage walk's aggregates (unions, ANDs, ORs) are the same over it twice.
    """
    root = Path(store_dir) / topic
    previous = previous or {}
    covers, edge_files, row_files = {}, [], []

    def take(key, store: EdgeStore, store_id: str | None, held: int, **more) -> None:
        following, edges, rows = _uncovered(store, topic, held, Path(store_dir))
        covers[key] = {"store": store_id, "next": following, **more}
        edge_files.extend(edges)
        row_files.extend(rows)

    for folder in sorted(root.glob("partition=*")):
        partition = int(folder.name.split("=", 1)[1])
        store = EdgeStore(folder, SHARD_BUCKETS)
        store_id = store.identity(create=create)
        before = previous.get(partition, {})
        take(partition, store, store_id, int(before["next"]) if before.get("store") == store_id else 0)
    aside = root / SET_ASIDE
    if aside.is_dir():  # one stat where no shard was ever set aside
        held: dict[str, int] = {}  # by store id, of live and set-aside covers alike
        for covered in previous.values():
            held[covered["store"]] = max(held.get(covered["store"], 0), int(covered["next"]))
        for folder in sorted(p for p in aside.iterdir() if p.is_dir()):
            store = EdgeStore(folder, SHARD_BUCKETS)
            store_id = store.identity(create=False)
            if store_id is not None:  # else it never committed a range (a commit makes the id first)
                take(SET_ASIDE_KEY + store_id, store, store_id, held.get(store_id, 0), folder=folder.name)
    return covers, edge_files, row_files


def _uncovered(store: EdgeStore, topic: str, held: int, store_dir: Path) -> tuple[int, list[str], list[str]]:
    """The offset past ``store``'s committed ranges, and the edge and rows-record files of those at or past ``held``."""
    dropped = max((below for (t, _), below in store.compacted().items() if t == topic), default=0)
    if dropped > held:
        raise RuntimeError(f"shard {store.root} dropped its ranges below offset {dropped}, which a compacted "
                           f"generation held, but the current generation does not hold them: "
                           f"restore {compacted_root(store_dir, topic)} from a backup")
    ends = {name: parse_range(name)[3] for name in store.committed()}
    names = [name for name, last in ends.items() if last >= held]
    new = set(names)
    return (max([held] + [ends[name] + 1 for name in names]),
            [str(p) for p in store.files() if p.name[: -len(".parquet")] in new],
            [str(p) for p in store.record_files("rows", names)])


class Generation:
    """One compacted generation, read with pyarrow."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.manifest = json.loads((self.path / "manifest.json").read_text())
        self.buckets = int(self.manifest["buckets"])
        self._dependencies: pa.Table | None = None
        self._adjacency: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # by direction: (from, to), sorted by from
        self._rows: SortedFiles | None = None
        self._exits: SortedFiles | None = None
        self._edges: dict[int, SortedFiles] = {}  # by bucket

    @classmethod
    def current(cls, store_dir: str | Path, topic: str) -> "Generation | None":
        root = compacted_root(store_dir, topic)
        number = current_number(root)
        return None if number is None else cls(generation_dir(root, number))

    @property
    def number(self) -> int:
        return int(self.manifest["generation"])

    def covers(self) -> dict:
        """By partition: ``{"store": the shard's store id, "next": the offset below which the generation holds
        its ranges}``; set-aside shards' by ``SET_ASIDE_KEY`` and store id (``snapshot``)."""
        return {int(p) if p.isdigit() else p: covered for p, covered in self.manifest["covers"].items()}

    def edge_files(self) -> list[str]:
        return [str(p) for p in sorted(self.path.glob("edges/bucket=*/*.parquet"))]

    def row_files(self) -> list[str]:
        return [str(p) for p in sorted(self.path.glob("rows/*.parquet"))]

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
            self._rows = SortedFiles(self.row_files(), "rid")
        return self._rows

    def exits(self, rids) -> set[int]:
        """The sets other than their own that edges from ``rids`` lead into."""
        if self._exits is None:
            self._exits = SortedFiles(sorted((self.path / "exits").glob("*.parquet")), "src")
        return set(self._exits.read(rids, ["dst_set"])["dst_set"].to_pylist())

    def dependencies(self) -> pa.Table:
        if self._dependencies is None:
            self._dependencies = ds.dataset(self.path / "dependencies", format="parquet").to_table()
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
        wanted = np.unique(np.asarray(list(sets), np.int64))
        buckets = bucket_of(wanted, self.buckets)
        parts = [self._bucket(b).read(wanted[buckets == b]) for b in np.unique(buckets).tolist()]
        return with_src_sets(pa.concat_tables(parts) if parts else STORE_SCHEMA.empty_table())

    def _bucket(self, bucket: int) -> SortedFiles:
        """A bucket's files: each holds sets of every range, so only the set's bucket narrows a lookup to its files."""
        if bucket not in self._edges:
            files = sorted((self.path / "edges" / f"bucket={bucket}").glob("*.parquet"))
            self._edges[bucket] = SortedFiles(files, "dst_set", STORE_SCHEMA)
        return self._edges[bucket]

    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.path.rglob("*.parquet"))
