"""Lineage over the lineage tables: CSProv (read only the sets that matter) and the naive recursive baseline (RQ).

The store of an edges topic is, at one version of its edges table (``generation.Snapshot``), its current
compacted generation plus the shards' ranges the generation does not hold yet, set-aside shards'
(``Indexer.set_aside``) included: a ``StoreView`` reads the latter whole, into memory (they are what
arrived since the last compaction), and the generation as the backend needs it. A set-aside shard and its
successor may both hold an edge or a row: the walk takes an edge twice as once, and a row's first record is
kept. Locally or in S3 alike: the tables' files are read through pyarrow's filesystem of the store.

- ``CSProvBackend`` (CSProv §III): an edge lies in its dst's set, so a backward step
  reads the sets of the frontier's rows, and a forward step those sets and the ones the
  rows' edges cross into (the generation's ``exits``). A set is read once per question, its
  edges and its rows' records (the generation's ``members``) together, in one round of reads
  from the row groups of its bucket that hold it, and walked with the shards' recent edges.
  Only the rows a question starts from, and those of sets not read, are looked up by rid
  (the generation's ``rows``, a few small row groups): the record says the row's set and
  whether it has edges in or out at all, so a source's set is not read for a backward step.
  Backward, a row an edge reaches is in the edge's src set, so its set is read with no
  lookup at all. In object storage each round is a round trip: a question from an output
  row to its sources costs about two, whatever the output's fan-in.
- ``RecursiveBackend``: the baseline CSProv is measured against; every level of the
  walk scans every edge file of the generation.

Both give ``walk.walk``'s answer, the one the Cypher backend gives too.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from headwater.core.config import Config
from headwater.core.schema import EDGE_SCHEMA
from headwater.store.batch_log import BatchLog
from headwater.store.edges import ROWS_SCHEMA, STORE_SCHEMA
from headwater.store.generation import Generation, Snapshot
from headwater.store.tables import Location

from .backend import StoreAccess, WalkingBackend, register

EDGE_COLUMNS = EDGE_SCHEMA.names


def _adjacent(edges: pa.Table, column: str, frontier: list[int]) -> pa.Table:
    return edges.filter(pc.is_in(edges[column], pa.array(frontier, pa.int64())))


class StoreView:
    """The current generation and the shards' ranges it does not hold, as one reader sees them at its start."""

    def __init__(self, store: "str | Location", topic: str, attempts: int = 3):
        for attempt in range(attempts):
            snapshot = Snapshot.of(store, topic)
            self.generation: Generation | None = snapshot.current()
            tables = snapshot.tables
            try:
                self.recent_edges = tables.edges.read([f["path"] for f in snapshot.shard_files], EDGE_COLUMNS)
                self.recent_rows = tables.rows.read(snapshot.shard_rows_files(), ROWS_SCHEMA.names)
                if self.generation is not None:
                    self.generation.rows([])  # its rows are still there, else FileNotFoundError
                return
            except FileNotFoundError:  # two compactions switched meanwhile and removed them: look again
                if attempt == attempts - 1:
                    raise

    def records(self, rids, held: dict[int, dict] | None = None) -> dict[int, dict]:
        """Rows records of those of ``rids`` the store holds, by rid (the generation's, else the shards');
        ``held``: the generation's records read already."""
        held = held if held is not None else {}
        wanted = sorted(set(rids))
        if self.generation is not None:
            missing = [r for r in wanted if r not in held]
            if missing:
                held.update((r["rid"], r) for r in self.generation.rows(missing).to_pylist())
        found = {r: held[r] for r in wanted if r in held}
        recent = self.recent_rows.filter(pc.is_in(self.recent_rows["rid"], pa.array(wanted, pa.int64())))
        for record in recent.to_pylist():  # a row two shards saw (one set aside, maybe) has two: the first is kept
            found.setdefault(record["rid"], record)
        return found


# The generation's rows records a client keeps between questions (the view never changes under it): the
# asked row's record, read to check it is there, is then not read again by the walk. In the store's
# object storage each read is a round trip.
HELD_RECORDS = 100_000


class _ParquetBackend(WalkingBackend):
    store = "store"

    def __init__(self, config: Config, view: StoreView | None = None):
        self.config = config
        self.view = view or StoreView(config.store_uri(), config.edges_topic)
        self.log = BatchLog(config.store_uri(), config.log_topic)
        self._held: dict[int, dict] = {}  # the generation's rows records read, by rid (``HELD_RECORDS``)

    def _held_records(self) -> dict[int, dict]:
        """The generation's rows records read so far, by rid, forgotten past ``HELD_RECORDS``."""
        if len(self._held) > HELD_RECORDS:
            self._held.clear()
        return self._held

    def _records(self, rids) -> dict[int, dict]:
        return self.view.records(rids, self._held_records())

    def batch_statuses(self, pairs) -> dict[tuple[str, int], str | None]:
        return self.log.refresh().statuses(pairs)

    def gaps_between(self, query: str, first: int, last: int) -> dict[tuple[str, int], str | None]:
        log = self.log.refresh()
        statuses = log.statuses((query, b) for b in log.batches(query) if first <= b <= last)
        return {pair: status for pair, status in statuses.items() if status != "full"}

    def batch_times(self, pairs) -> dict[tuple[str, int], str | None]:
        self.log.refresh()
        return {pair: (self.log.batch(*pair) or {}).get("at") for pair in pairs}

    def datasets(self) -> dict[str, dict]:
        return self.log.refresh().datasets()

    def dataset(self, name: str) -> dict | None:
        return self.log.refresh().dataset(name)


@register("csprov")
class CSProvBackend(_ParquetBackend):
    def __init__(self, config: Config, view: StoreView | None = None):
        super().__init__(config, view)
        if self.view.generation is not None:
            self.view.generation.open()  # a long-lived client: every footer read once, at start

    def _question(self, backward: bool) -> StoreAccess:
        gen, recent = self.view.generation, self.view.recent_edges
        held = self._held_records()
        near, onward = ("dst", "has_in") if backward else ("src", "has_out")
        read: set[int] = set()  # sets whose edges are loaded
        loaded: list[pa.Table] = []
        placed: dict[int, int] = {}  # the set of rows the loaded edges reach, by rid (their records not read)
        members: pa.Table | None = None  # the rows records of the sets read, grown as sets are read

        def known(rids) -> None:
            """The records of those of ``rids`` the sets read so far hold, into ``held`` (only those asked for:
            a hub's walk reads a million rows' records, and makes a Python dict of a few thousand)."""
            missing = [r for r in rids if r not in held]
            if missing and members is not None:
                found = members.filter(pc.is_in(members["rid"], pa.array(missing, pa.int64())))
                for record in found.to_pylist():
                    held.setdefault(record["rid"], record)

        def records(rids) -> dict[int, dict]:
            known(rids)
            return self.view.records(rids, held)

        def load(frontier: list[int], gen: Generation) -> None:
            nonlocal members
            # Backward, a row reached by an edge is in the edge's src set: its set's edges and rows' records
            # are read together, in one round, with no lookup of the row by rid first.
            known(frontier)
            records([r for r in frontier if r not in held and not (backward and r in placed)])
            going = [r for r in frontier if r in held and held[r][onward]]
            # An edge lies in its dst's set: backward, a row's edges are in its own set;
            # forward, in its own or those its edges cross into.
            sets = {held[r]["set"] for r in going} | {placed[r] for r in frontier if r not in held and r in placed}
            new = (sets if backward else sets | gen.exits(going)) - read
            if new:
                read.update(new)
                edges, records_of_sets = gen.sets(new)
                loaded.append(edges.select(EDGE_COLUMNS))
                if records_of_sets is not None and records_of_sets.num_rows:
                    # Chunks, not a copy of all read so far at each set read (a hub question, 10M edges in S3,
                    # back to back: 6.2 s, against 7.3 s copying).
                    members = records_of_sets if members is None else pa.concat_tables([members, records_of_sets])
                if backward:
                    sets_of = pc.coalesce(edges["src_set"], edges["dst_set"])
                    placed.update(zip(edges["src"].to_pylist(), sets_of.to_pylist()))

        def step(frontier: list[int]) -> pa.Table:
            if gen is not None:
                load(frontier, gen)
            return pa.concat_tables([_adjacent(t, near, frontier) for t in loaded + [recent]])
        return StoreAccess(step, records)


@register("rq")
class RecursiveBackend(_ParquetBackend):
    def _step(self, backward: bool):
        gen, recent = self.view.generation, self.view.recent_edges
        near = "dst" if backward else "src"
        files = gen.edge_files() if gen is not None else []
        everything = ds.dataset(files, format="parquet", schema=STORE_SCHEMA,
                                filesystem=gen.tables.edges.filesystem) if gen is not None and files else None

        def step(frontier: list[int]) -> pa.Table:
            wanted = pa.array(frontier, pa.int64())
            parts = [_adjacent(recent, near, frontier)]
            if everything is not None:
                parts.append(everything.to_table(columns=EDGE_COLUMNS, filter=pc.field(near).isin(wanted)))
            return pa.concat_tables(parts)
        return step
