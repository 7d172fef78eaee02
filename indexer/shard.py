"""One partition of the edges topic in the store: its writes into the topic's tables and its set index.

Each partition of the edges topic is a shard of its own (``EdgeStore``: what it writes is tagged with its
store id), so replicas that own different partitions never write the same range, and a partition that
moves between replicas takes its whole state with it: the new owner ``open``s the shard, which recovers the
store and rebuilds the set index from what the store committed.

``write`` adds the edges of one offset range. Rows of static tables (nodes with a
``key``) are dimension rows that every order may join; their edges are cut from the
start (they join no sets, and are recorded as set dependencies instead), which is the
split ``sets.connected_sets`` makes of such a hub. The pairs cut are recorded beside
the other set-index records, so a restart cuts the same ones.

Once a compaction takes the shard's ranges into a generation (``generation.py``), the next
write rebuilds the set index from the ranges left: the index holds the rows of what
no generation holds yet, not every row the stream ever had. A row seen again after
that gets a rows record in a second set; a reader of the shard takes every rows
record of a rid (the sets it names are all the row's).
"""

from __future__ import annotations

import os
from typing import Callable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from headwater.store.edges import (
    ALIASES_SCHEMA,
    CUT_SCHEMA,
    DEPENDENCIES_SCHEMA,
    ROW_FIELDS,
    ROWS_SCHEMA,
    SHARD_BUCKETS,
    EdgeStore,
    ShardMoved,
)
from headwater.store.tables import Location

from .set_index import Ends, Recorded, SetIndex


class NodeLookup:
    """The rows of one write's messages (every edge's ends are among them), found by rid."""

    def __init__(self, nodes: pa.Table):
        self.nodes = nodes
        self._rids = nodes["rid"].to_numpy()
        in_order = bool(np.all(self._rids[1:] > self._rids[:-1]))  # as ``concat_lineage`` leaves them, mostly
        self._order = np.arange(len(self._rids)) if in_order else np.argsort(self._rids, kind="stable")
        self._sorted = self._rids[self._order]  # searched as it is: 1.4-3x faster than through ``sorter``
        # Datasets by code: an edge end's dataset as a string object cost ~3 ms a write's end.
        encoded = nodes["dataset"].fill_null("").combine_chunks().dictionary_encode()
        self._dataset_codes = encoded.indices.to_numpy()
        self._dataset_names = encoded.dictionary.to_pylist()

    def positions(self, rids: np.ndarray) -> np.ndarray:
        order, node_rids = self._order, self._rids
        at = order[np.minimum(np.searchsorted(self._sorted, rids), len(order) - 1)] \
            if len(order) else np.zeros(len(rids), dtype=np.int64)
        if len(rids) and (not len(order) or not np.array_equal(node_rids[at], rids)):
            missing = rids[~np.isin(rids, node_rids)][:3].tolist()
            raise ValueError(f"edges name rows their message does not describe, e.g. rids {missing}")
        return at

    def datasets(self, rids: np.ndarray) -> pd.Categorical:
        """Each row's dataset, by code (the categories are the write's datasets)."""
        return pd.Categorical.from_codes(self._dataset_codes[self.positions(rids)], self._dataset_names)

    def rows(self, rids: np.ndarray, sets: np.ndarray) -> pa.Table:
        """Rows records: each rid's set and its ``ROW_FIELDS``."""
        found = self.nodes.take(pa.array(self.positions(rids), pa.int64()))
        columns = [pa.array(rids, pa.int64()), pa.array(sets, pa.int64())]
        return pa.table(columns + [found[name].cast(ROWS_SCHEMA.field(name).type) for name in ROW_FIELDS],
                        schema=ROWS_SCHEMA)


def static_datasets(nodes: pa.Table) -> set[str]:
    keyed = nodes.filter(pc.is_valid(nodes["key"]))
    return set(keyed["dataset"].drop_null().to_pylist())


class Shard:
    def __init__(self, store: "str | os.PathLike | Location", topic: str, partition: int,
                 buckets: int = SHARD_BUCKETS):
        self.topic = topic
        self.partition = partition
        self.store = EdgeStore(store, topic, partition, buckets)
        self.index = SetIndex()
        self.resume = 0  # the next offset the store does not hold
        self._compacted: int | None = None  # the store's generation the index was built at

    def open(self) -> "Shard":
        """Recover the store after a crash and rebuild the set index from its records."""
        self.resume = self.store.resume()
        self._compacted = self.store.tables.generation()
        self.index = self._restored()
        return self

    def _restored(self) -> SetIndex:
        cut = self.store.records("cut")
        pairs = set(zip(cut["src_dataset"].to_pylist(), cut["dst_dataset"].to_pylist())) if cut else set()
        rows = self.store.records("rows")
        aliases = self.store.records("aliases")
        return SetIndex.restore(
            zip(rows["rid"].to_numpy().tolist(), rows["set"].to_numpy().tolist()) if rows else (),
            zip(aliases["old"].to_pylist(), aliases["new"].to_pylist()) if aliases else (),
            pairs)

    def write(self, nodes: pa.Table, edges: pa.Table, first: int, last: int,
              before_commit: Callable[[], None] | None = None) -> int:
        """Add the edges of offsets ``first..last`` (``nodes``: their rows); returns bytes written.

        A range the store already holds is skipped. If the write fails (or
        ``before_commit`` raises), the set index is put back as it was, so it never runs
        ahead of what the store committed.
        """
        if last < self.resume:
            return 0  # the store holds it (a replay), or held it and a generation does now
        generation = self.store.tables.generation()
        if generation != self._compacted:  # a compaction took ranges: forget their rows
            self.index, self._compacted = self._restored(), generation
        src = edges["src"].to_numpy()
        dst = edges["dst"].to_numpy()
        lookup = NodeLookup(nodes)
        ends = Ends.of(src, dst)
        datasets = lookup.datasets(ends.rids)
        src_ds, dst_ds = datasets[ends.src], datasets[ends.dst]
        cut = self._new_cut(static_datasets(nodes), src_ds, dst_ds)
        self.index.cut |= cut
        try:
            recorded = self.index.add(src, dst, src_ds, dst_ds, ends)
        except BaseException:
            self.index = self._restored()
            raise
        try:
            table = edges.append_column("src_set", pa.array(recorded.src_set, pa.int64())) \
                         .append_column("dst_set", pa.array(recorded.dst_set, pa.int64()))
            written = self.store.append(table, first, last, _records(recorded, lookup, cut), before_commit,
                                        looked=True)
        except ShardMoved:
            self.open()  # where the table stands now, and the set index as the other writer left it
            raise
        except BaseException:
            self.index.undo(recorded)
            self.index.cut -= cut
            raise
        self.resume = last + 1
        return written

    def _new_cut(self, static: set[str], src_ds: pd.Categorical, dst_ds: pd.Categorical) -> set[tuple[str, str]]:
        """The dataset pairs of edges from static datasets' rows that the index does not cut yet (both ends'
        datasets by the same codes, ``NodeLookup.datasets``)."""
        if not static or not len(src_ds):
            return set()
        names = list(src_ds.categories)
        src, dst = src_ds.codes.astype(np.int64), dst_ds.codes.astype(np.int64)
        from_static = np.isin(src, [code for code, name in enumerate(names) if name in static])
        pairs = {(names[c // len(names)], names[c % len(names)])
                 for c in np.unique(src[from_static] * len(names) + dst[from_static]).tolist()}
        return pairs - self.index.cut


def _records(recorded: Recorded, lookup: NodeLookup, cut: set[tuple[str, str]]) -> dict[str, pa.Table]:
    def table(columns, schema: pa.Schema) -> pa.Table:
        return pa.table([pa.array(c, f.type) for c, f in zip(columns, schema)], schema=schema)

    # Aliases sorted by the set they joined: a merge's many absorbed sets share one ``new``.
    order = np.lexsort((recorded.absorbed, recorded.absorbed_into))
    pairs = sorted(cut)
    return {"rows": lookup.rows(recorded.new_rows, recorded.new_sets),
            "aliases": table([recorded.absorbed[order], recorded.absorbed_into[order]], ALIASES_SCHEMA),
            "dependencies": table([recorded.dependencies_array[:, 0], recorded.dependencies_array[:, 1]],
                                  DEPENDENCIES_SCHEMA),
            "cut": table([[a for a, _ in pairs], [b for _, b in pairs]], CUT_SCHEMA)}
