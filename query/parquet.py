"""Lineage over the Parquet store: CSProv (read only the sets that matter) and the naive recursive baseline (RQ).

The store of an edges topic is its current compacted generation plus each shard's
ranges the generation does not hold yet (``generation.snapshot``): a ``StoreView``
reads the latter whole, into memory (they are what arrived since the last
compaction), and the generation as the backend needs it.

- ``CSProvBackend`` (CSProv §III): finds the asked row's set in the generation, the
  sets it depends on (``backward``) or that depend on it (``forward``) from the set
  dependencies, reads only those sets' buckets, and walks them with the shards' recent
  edges. A row the walk reaches through recent edges whose own sets are not read yet
  has them read then.
- ``RecursiveBackend``: the baseline CSProv is measured against; every level of the
  walk scans every edge file of the generation.

Both give ``walk.walk``'s answer, the one the Cypher backend gives too.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from headwater.core.config import Config
from headwater.core.schema import EDGE_SCHEMA
from headwater.indexer.generation import Generation, snapshot
from headwater.indexer.shard import ROWS_SCHEMA
from headwater.indexer.store import STORE_SCHEMA

from .backend import Lineage, LineageError, check_depth, ordered
from .walk import Reach, is_target, walk

EDGE_COLUMNS = EDGE_SCHEMA.names


def _read(files: list[str], schema: pa.Schema) -> pa.Table:
    return ds.dataset(files, format="parquet", schema=schema).to_table() if files else schema.empty_table()


def _adjacent(edges: pa.Table, column: str, frontier: list[int]) -> pa.Table:
    return edges.filter(pc.is_in(edges[column], pa.array(frontier, pa.int64())))


class StoreView:
    """The current generation and the shards' ranges it does not hold, as one reader sees them at its start."""

    def __init__(self, store_dir: str | Path, topic: str, attempts: int = 3):
        for attempt in range(attempts):
            self.generation = Generation.current(store_dir, topic)
            held = self.generation.covers() if self.generation else None
            _, edge_files, row_files = snapshot(Path(store_dir), topic, held)
            try:
                self.recent_edges = _read(edge_files, STORE_SCHEMA).select(EDGE_COLUMNS)
                self.recent_rows = _read(row_files, ROWS_SCHEMA)
                return
            except FileNotFoundError:  # two compactions switched meanwhile and dropped them: look again
                if attempt == attempts - 1:
                    raise

    def rows(self, rids) -> pa.Table:
        """Rows records of ``rids`` (one per rid: the generation's, else the shards')."""
        wanted = pa.array(sorted(set(rids)), pa.int64())
        recent = self.recent_rows.filter(pc.is_in(self.recent_rows["rid"], wanted))
        if self.generation is None:
            return recent
        held = self.generation.rows(wanted.to_pylist())
        recent = recent.filter(pc.invert(pc.is_in(recent["rid"], held["rid"])))
        return pa.concat_tables([held.select(ROWS_SCHEMA.names).cast(ROWS_SCHEMA), recent])

    def answer(self, rid: int, to: str, depth: int, backward: bool, step) -> list[Lineage]:
        check_depth(depth)
        if not isinstance(rid, int) or not -(1 << 63) <= rid < 1 << 63:
            raise LineageError(f"a rid is a signed 64-bit integer, not {rid!r}")
        if not self.rows([rid]).num_rows:
            raise LineageError(f"rid {rid} is not in the lineage store (not captured, or not indexed yet)")
        found = walk(rid, depth, backward, step)
        return lineage_of(rid, found, self.rows(found), to)


def lineage_of(rid: int, found: dict[int, Reach], rows: pa.Table, to: str) -> list[Lineage]:
    """The targets among the rows ``walk`` found, as ``Lineage`` records in the Cypher backend's order."""
    # Rows records first seen by two shards may be recorded twice: the first is kept.
    records = {}
    for record in rows.to_pylist():
        records.setdefault(record["rid"], record)
    answer = []
    for row, reach in found.items():
        record = records.get(row, {})
        if not is_target(to, record.get("kind"), record.get("dataset")):
            continue
        answer.append(Lineage(
            of=rid, rid=row, kind=record.get("kind"), dataset=record.get("dataset"), topic=record.get("topic"),
            partition=record.get("partition"), offset=record.get("offset"), key=record.get("key"),
            path=record.get("path"), position=record.get("position"), ops=sorted(reach.ops), cols=reach.cols,
            batches=sorted(reach.batches), exact=reach.exact, via="edges"))
    return ordered(answer)


class _ParquetBackend:
    def __init__(self, config: Config, view: StoreView | None = None):
        self.config = config
        self.view = view or StoreView(config.store_path(), config.edges_topic)

    def close(self) -> None:
        pass

    def dataset(self, name: str) -> dict | None:
        return None  # datasets' descriptions live in the graph store's log records

    def backward(self, rid: int, to: str = "source", depth: int = 16) -> list[Lineage]:
        return self.view.answer(rid, to, depth, True, self._step(True))

    def forward(self, rid: int, to: str = "output", depth: int = 16) -> list[Lineage]:
        return self.view.answer(rid, to, depth, False, self._step(False))


class CSProvBackend(_ParquetBackend):
    def _step(self, backward: bool):
        gen, recent = self.view.generation, self.view.recent_edges
        near = "dst" if backward else "src"
        direction = "backward" if backward else "forward"
        read: set[int] = set()  # sets whose edges are loaded, with their whole closure
        set_of: dict[int, int] = {}  # rid -> set, for rows in the loaded edges
        looked_up: set[int] = set()  # rows asked of the generation's rid -> set index
        loaded: list[pa.Table] = []

        def load(sets: set[int]) -> None:
            new = gen.related_sets(sets, direction) - read
            if not new:
                return
            read.update(new)
            edges = gen.edges(new)
            set_of.update(zip(edges["src"].to_pylist(), edges["src_set"].to_pylist()))
            set_of.update(zip(edges["dst"].to_pylist(), edges["dst_set"].to_pylist()))
            loaded.append(edges.select(EDGE_COLUMNS))

        def step(frontier: list[int]) -> pa.Table:
            if gen is not None:
                unknown = [r for r in frontier if r not in set_of and r not in looked_up]
                looked_up.update(unknown)
                if unknown:
                    set_of.update(gen.set_of(unknown))
                load({set_of[r] for r in frontier if r in set_of} - read)
            parts = [_adjacent(t, near, frontier) for t in loaded + [recent]]
            return pa.concat_tables(parts)
        return step


class RecursiveBackend(_ParquetBackend):
    def _step(self, backward: bool):
        gen, recent = self.view.generation, self.view.recent_edges
        near = "dst" if backward else "src"
        files = gen.edge_files() if gen is not None else []
        everything = ds.dataset(files, format="parquet", schema=STORE_SCHEMA) if files else None

        def step(frontier: list[int]) -> pa.Table:
            wanted = pa.array(frontier, pa.int64())
            parts = [_adjacent(recent, near, frontier)]
            if everything is not None:
                parts.append(everything.to_table(columns=EDGE_COLUMNS, filter=pc.field(near).isin(wanted)))
            return pa.concat_tables(parts)
        return step
