"""The Parquet edge store: edges bucketed by connected set, written exactly once per offset range.

Layout under the store's root:

    edges/bucket=B/<topic>~<partition>~<first>~<last>.parquet
    rows/…, aliases/…, dependencies/…  (the set index's records, same names)
    commits/<topic>~<partition>~<first>~<last>.json
    store.json       this store's id (a shard set aside and rebuilt is a new store) and buckets
    compacted.json   per partition, the offset below which a compacted generation holds
                     the edges and the ranges were dropped here (``drop``)

One ``append`` holds the edges of Kafka messages ``first..last`` of one partition. Its
rows go to the buckets of their dst sets (``B = dst_set mod buckets``), sorted by
``(dst_set, dst)`` so a set's edges are contiguous and row-group statistics skip the
rest. Each file is written under a temporary name and renamed; the commit file, written
last, is what makes the range part of the store. ``recover`` deletes bucket files
without a commit (a write cut short) and returns, per partition, the offset to resume
from; a restarted indexer seeks there, so a crash anywhere writes no edge twice.
Ranges a compacted generation holds are dropped (``drop``); ``compacted.json`` keeps
where they ended, so the store still resumes past them.

``src_set`` is stored only where it differs from ``dst_set`` (null otherwise): most
edges stay inside a set, and a null costs a bit, not 8 bytes.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from headwater.core.schema import EDGE_SCHEMA, NODE_SCHEMA

STORE_SCHEMA = pa.schema(list(EDGE_SCHEMA) + [pa.field("src_set", pa.int64()),
                                             pa.field("dst_set", pa.int64(), nullable=False)])
_SEP = "~"
# What the set index records beside the edges, committed with them (``set_index.Recorded``).
RECORDS = ("rows", "aliases", "dependencies", "cut")
IDENTITY = "store.json"
COMPACTED = "compacted.json"

# Buckets of a shard's store: each write puts one file in each bucket its sets fall in, so fewer
# buckets mean bigger files (on the bench workload, 8 buckets: 11.7 bytes per edge in
# the edge files at 198,000 edges/s; 64 buckets: 18.2 bytes at 85,000 edges/s).
SHARD_BUCKETS = 8
# A row's dataset is kept with its set (compaction splits large components along
# datasets), and what the query tier answers with: its kind and where it came from.
ROW_FIELDS = ("kind", "dataset", "topic", "partition", "offset", "key", "path", "position")
ROWS_SCHEMA = pa.schema([pa.field("rid", pa.int64()), pa.field("set", pa.int64())]
                        + [NODE_SCHEMA.field(name).with_nullable(True) for name in ROW_FIELDS])
ALIASES_SCHEMA = pa.schema([("old", pa.int64()), ("new", pa.int64())])
DEPENDENCIES_SCHEMA = pa.schema([("src_set", pa.int64()), ("dst_set", pa.int64())])
CUT_SCHEMA = pa.schema([("src_dataset", pa.string()), ("dst_dataset", pa.string())])


def shard_root(store_dir: str | Path, topic: str, partition: int) -> Path:
    return Path(store_dir) / topic / f"partition={partition}"


def range_name(topic: str, partition: int, first: int, last: int) -> str:
    if _SEP in topic or "/" in topic:
        raise ValueError(f"topic name {topic!r} cannot name store files (no '{_SEP}' or '/')")
    return f"{topic}{_SEP}{partition}{_SEP}{first:012d}{_SEP}{last:012d}"


def parse_range(name: str) -> tuple[str, int, int, int]:
    topic, partition, first, last = name.split(_SEP)
    return topic, int(partition), int(first), int(last)


def bucket_of(sets: np.ndarray, buckets: int) -> np.ndarray:
    return np.mod(np.asarray(sets, dtype=np.int64), buckets)


def with_src_sets(table: pa.Table) -> pa.Table:
    """``src_set`` filled in again where the files leave it null (equal to ``dst_set``)."""
    return table.set_column(table.schema.get_field_index("src_set"), "src_set",
                            pc.coalesce(table["src_set"], table["dst_set"]))


def _key(topic: str, partition: int) -> str:
    return f"{topic}{_SEP}{partition}"


class EdgeStore:
    def __init__(self, root: str | Path, buckets: int = 64):
        self.root = Path(root)
        self.buckets = buckets
        self.edges = self.root / "edges"
        self.commits = self.root / "commits"

    def _write_atomically(self, path: Path, write) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def identity(self, create: bool = True) -> str | None:
        """This store's id, made on first use (by whichever process gets there first); None if none yet and not
        ``create``."""
        path = self.root / IDENTITY
        if not path.exists():
            if not create:
                return None
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{IDENTITY}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"id": uuid.uuid4().hex, "buckets": self.buckets}))
            try:
                os.link(tmp, path)  # fails if another process made it first: then that one holds
            except FileExistsError:
                pass
            finally:
                tmp.unlink()
        found = json.loads(path.read_text())
        if found["buckets"] != self.buckets:
            raise ValueError(f"the store {self.root} was written with {found['buckets']} buckets, "
                             f"not {self.buckets}")
        return found["id"]

    def append(self, edges: pa.Table, topic: str, partition: int, first: int, last: int,
               records: dict[str, pa.Table] | None = None, before_commit: Callable[[], None] | None = None) -> int:
        """Add the edges of messages ``first..last`` of ``topic``/``partition``; returns the bytes written.

        ``edges`` has ``EDGE_SCHEMA``'s columns plus ``src_set`` and ``dst_set``;
        ``records`` are tables of ``RECORDS`` kinds committed with them (the set index's).
        ``before_commit`` runs once the files are written, before the commit file; if it
        raises, nothing is committed (the indexer waits there for the graph's write).
        """
        name = range_name(topic, partition, first, last)
        unknown = set(records or {}) - set(RECORDS)
        if unknown:
            raise ValueError(f"unknown record kind {sorted(unknown)}; known: {', '.join(RECORDS)}")
        if (self.commits / f"{name}.json").exists() or last < self.compacted().get((topic, partition), 0):
            return 0  # already in the store (a replay after a crash), or in a compacted generation
        self.identity()
        table = edges.select(STORE_SCHEMA.names).cast(STORE_SCHEMA)
        table = table.set_column(table.schema.get_field_index("src_set"), "src_set",
                                 pc.if_else(pc.equal(table["src_set"], table["dst_set"]),
                                            pa.scalar(None, pa.int64()), table["src_set"]))
        table = table.sort_by([("dst_set", "ascending"), ("dst", "ascending")])
        buckets = bucket_of(table["dst_set"].to_numpy(), self.buckets)
        written = 0
        for bucket in np.unique(buckets).tolist():
            part = table.filter(pa.array(buckets == bucket))
            path = self.edges / f"bucket={bucket}" / f"{name}.parquet"
            self._write_atomically(path, lambda tmp, part=part: pq.write_table(
                part, tmp, compression="zstd", use_dictionary=["query", "op", "cols", "exact", "batch"]))
            written += path.stat().st_size
        for kind, records_table in (records or {}).items():
            path = self.root / kind / f"{name}.parquet"
            self._write_atomically(path, lambda tmp, t=records_table: pq.write_table(t, tmp, compression="zstd"))
            written += path.stat().st_size
        if before_commit is not None:
            before_commit()
        self._write_atomically(self.commits / f"{name}.json",
                               lambda tmp: tmp.write_text(json.dumps({"edges": table.num_rows, "bytes": written})))
        return written

    def committed(self) -> list[str]:
        try:
            return sorted(p.name[: -len(".json")] for p in self.commits.iterdir() if p.name.endswith(".json"))
        except FileNotFoundError:
            return []

    def recover(self) -> dict[tuple[str, int], int]:
        """Delete what an interrupted ``append`` left; returns ``{(topic, partition): next offset}``."""
        done = set(self.committed())
        for path in [*self.edges.glob("bucket=*/*"), *[p for kind in RECORDS for p in (self.root / kind).glob("*")]]:
            stem = path.name[: -len(".parquet")] if path.name.endswith(".parquet") else None
            if path.name.startswith(".") or stem not in done:
                path.unlink(missing_ok=True)
        for path in self.commits.glob(".*.tmp"):
            path.unlink(missing_ok=True)
        resume = self.compacted()
        for name in done:
            topic, partition, _, last = parse_range(name)
            resume[(topic, partition)] = max(resume.get((topic, partition), 0), last + 1)
        return resume

    def compacted(self) -> dict[tuple[str, int], int]:
        """Per (topic, partition): the offset below which ranges were dropped (a generation holds them)."""
        try:
            found = json.loads((self.root / COMPACTED).read_text())
        except FileNotFoundError:
            return {}
        return {(key.rsplit(_SEP, 1)[0], int(key.rsplit(_SEP, 1)[1])): int(below) for key, below in found.items()}

    def compacted_stamp(self) -> int | None:
        """Changes whenever ``drop`` drops something: the set index is rebuilt then."""
        try:
            return (self.root / COMPACTED).stat().st_mtime_ns
        except FileNotFoundError:
            return None

    def drop(self, topic: str, partition: int, below: int) -> tuple[int, int]:
        """Drop the committed ranges of ``topic``/``partition`` ending below offset ``below``: a generation holds them.

        Where they ended is written first, then each commit file goes, then its data
        files (a drop cut short leaves files without a commit: ``recover`` removes
        them). Returns (ranges, bytes) dropped.
        """
        compacted = self.compacted()
        if below <= compacted.get((topic, partition), 0):
            return 0, 0
        compacted[(topic, partition)] = below
        self._write_atomically(self.root / COMPACTED, lambda tmp: tmp.write_text(
            json.dumps({_key(t, p): b for (t, p), b in sorted(compacted.items())})))
        ranges = freed = 0
        for name in self.committed():
            t, p, _, last = parse_range(name)
            if (t, p) != (topic, partition) or last >= below:
                continue
            (self.commits / f"{name}.json").unlink()
            ranges += 1
            for path in [*self.edges.glob(f"bucket=*/{name}.parquet"),
                         *(self.root / kind / f"{name}.parquet" for kind in RECORDS)]:
                if path.exists():
                    freed += path.stat().st_size
                    path.unlink()
        return ranges, freed

    def files(self, sets=None) -> list[Path]:
        """Committed bucket files; of the buckets of ``sets`` only, when given."""
        done = set(self.committed())
        buckets = None if sets is None else set(bucket_of(np.asarray(list(sets)), self.buckets).tolist())
        found: list[Path] = []
        for folder in sorted(self.edges.glob("bucket=*")):
            if buckets is not None and int(folder.name.split("=", 1)[1]) not in buckets:
                continue
            found.extend(p for p in sorted(folder.glob("*.parquet")) if p.name[: -len(".parquet")] in done)
        return found

    def read(self, sets=None) -> pa.Table:
        """Committed edges (of the dst sets ``sets``, when given), ``src_set`` filled in again."""
        paths = self.files(sets)
        if not paths:
            return STORE_SCHEMA.empty_table()
        table = pa.concat_tables(pq.read_table(p, schema=STORE_SCHEMA) for p in paths)
        if sets is not None:
            table = table.filter(pc.is_in(table["dst_set"], pa.array(list(sets), pa.int64())))
        return with_src_sets(table)

    def record_files(self, kind: str, committed=None) -> list[Path]:
        """The committed files of one ``RECORDS`` kind (of the range names ``committed``, when given), in commit
        order."""
        done = set(self.committed() if committed is None else committed)
        return sorted(p for p in (self.root / kind).glob("*.parquet") if p.name[: -len(".parquet")] in done)

    def records(self, kind: str) -> pa.Table | None:
        """Every committed table of one ``RECORDS`` kind, in commit order; None if there is none."""
        paths = self.record_files(kind)
        return pa.concat_tables(pq.read_table(p) for p in paths) if paths else None

    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.files())
