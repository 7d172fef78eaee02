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

from .backend import Lineage, LineageError, UnknownRow, check_depth, ordered
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

    def rows(self, rids, held: dict[int, dict] | None = None) -> pa.Table:
        """Rows records of ``rids`` (one per rid: the generation's, else the shards'); ``held``: the
        generation's records already read, by rid."""
        wanted = pa.array(sorted(set(rids)), pa.int64())
        recent = self.recent_rows.filter(pc.is_in(self.recent_rows["rid"], wanted))
        if self.generation is None:
            return recent
        held = held or {}
        read = self.generation.rows([r for r in wanted.to_pylist() if r not in held]).select(ROWS_SCHEMA.names)
        found = pa.concat_tables([read.cast(ROWS_SCHEMA),
                                  pa.Table.from_pylist([held[r] for r in wanted.to_pylist() if r in held],
                                                       ROWS_SCHEMA)])
        recent = recent.filter(pc.invert(pc.is_in(recent["rid"], found["rid"])))
        return pa.concat_tables([found, recent])

    def answer(self, rid: int, to: str, depth: int, backward: bool, step, held: dict[int, dict] | None = None
               ) -> list[Lineage]:
        check_depth(depth)
        if not isinstance(rid, int) or not -(1 << 63) <= rid < 1 << 63:
            raise LineageError(f"a rid is a signed 64-bit integer, not {rid!r}")
        if not self.rows([rid], held).num_rows:
            raise UnknownRow(f"rid {rid} is not in the lineage store (not captured, or not indexed yet)")
        found = walk(rid, depth, backward, step)
        return lineage_of(rid, found, self.rows(found, held), to)


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
        return self._answer(rid, to, depth, True)

    def forward(self, rid: int, to: str = "output", depth: int = 16) -> list[Lineage]:
        return self._answer(rid, to, depth, False)

    def _answer(self, rid: int, to: str, depth: int, backward: bool) -> list[Lineage]:
        return self.view.answer(rid, to, depth, backward, self._step(backward))


class CSProvBackend(_ParquetBackend):
    def _answer(self, rid: int, to: str, depth: int, backward: bool) -> list[Lineage]:
        held: dict[int, dict] = {}  # the generation's rows records read so far, by rid
        return self.view.answer(rid, to, depth, backward, self._step(backward, held), held)

    def _step(self, backward: bool, held: dict[int, dict]):
        gen, recent = self.view.generation, self.view.recent_edges
        near, onward = ("dst", "has_in") if backward else ("src", "has_out")
        read: set[int] = set()  # sets whose edges are loaded
        looked_up: set[int] = set()  # rows asked of the generation (the recent ones are not in it)
        loaded: list[pa.Table] = []

        def load(frontier: list[int]) -> None:
            unknown = [r for r in frontier if r not in held and r not in looked_up]
            looked_up.update(unknown)
            if unknown:
                held.update((record["rid"], record) for record in gen.rows(unknown).to_pylist())
            going = [r for r in frontier if r in held and held[r][onward]]
            # An edge lies in its dst's set: backward, a row's edges are in its own set;
            # forward, in its own or those its edges cross into.
            sets = {held[r]["set"] for r in going}
            new = (sets if backward else sets | gen.exits(going)) - read
            if new:
                read.update(new)
                loaded.append(gen.edges(new).select(EDGE_COLUMNS))

        def step(frontier: list[int]) -> pa.Table:
            if gen is not None:
                load(frontier)
            return pa.concat_tables([_adjacent(t, near, frontier) for t in loaded + [recent]])
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
