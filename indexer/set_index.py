"""Connected sets kept up to date as edges arrive (union-find), between compactions.

``SetIndex.add`` takes one write's edges, unions the rows each edge joins (unless the
edge crosses a dataset pair compaction cut, see ``sets.py``), and returns what the
store must record so that lineage stays complete without ever rewriting a file:

- each edge's ``src_set`` and ``dst_set`` as they are after this write;
- ``rows``: the set of every row seen for the first time (the rid → set index);
- ``aliases``: sets absorbed by a merge, ``(old id, new id)``: files written earlier
  under the old id belong to the new set;
- ``dependencies``: ``(src set, dst set)`` of edges that cross sets.

A set is named by its smallest rid, as in ``sets.connected_sets``. ``resolve`` follows
aliases to a set's current id; ``members`` lists every id a current set was ever
written under. ``restore`` rebuilds the index from what the store recorded.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Recorded:
    src_set: np.ndarray
    dst_set: np.ndarray
    rows: list[tuple[int, int]] = field(default_factory=list)  # (rid, set) of rows first seen
    aliases: list[tuple[int, int]] = field(default_factory=list)  # (absorbed set, set it joined)
    dependencies: set[tuple[int, int]] = field(default_factory=set)


class SetIndex:
    def __init__(self, cut: set[tuple[str, str]] | frozenset = frozenset()):
        self.cut = set(cut)  # (src dataset, dst dataset) pairs whose edges join no sets
        self.parent: dict[int, int] = {}

    def find(self, rid: int) -> int:
        parent = self.parent
        root = rid
        while parent[root] != root:
            root = parent[root]
        while parent[rid] != root:  # path compression
            parent[rid], rid = root, parent[rid]
        return root

    def add(self, src: np.ndarray, dst: np.ndarray, src_ds=None, dst_ds=None) -> Recorded:
        parent = self.parent
        src_l, dst_l = np.asarray(src).tolist(), np.asarray(dst).tolist()
        new = [r for r in dict.fromkeys(src_l + dst_l) if r not in parent]
        for r in new:
            parent[r] = r
        aliases = []
        crossing = []
        pairs = zip(src_ds, dst_ds) if src_ds is not None else None
        for i, (a, b) in enumerate(zip(src_l, dst_l)):
            if pairs is not None and next(pairs) in self.cut:
                crossing.append(i)
                continue
            ra, rb = self.find(a), self.find(b)
            if ra != rb:
                low, high = min(ra, rb), max(ra, rb)
                parent[high] = low
                aliases.append((high, low))
        find = self.find
        src_set = np.array([find(r) for r in src_l], dtype=np.int64)
        dst_set = np.array([find(r) for r in dst_l], dtype=np.int64)
        dependencies = {(int(src_set[i]), int(dst_set[i])) for i in crossing if src_set[i] != dst_set[i]}
        return Recorded(src_set, dst_set, [(r, find(r)) for r in new], aliases, dependencies)

    def resolve(self, set_id: int) -> int:
        return self.find(set_id) if set_id in self.parent else set_id

    @staticmethod
    def members(aliases: list[tuple[int, int]], resolve) -> dict[int, set[int]]:
        """Every id each current set was written under (itself included)."""
        found: dict[int, set[int]] = defaultdict(set)
        for old, new in aliases:
            found[resolve(new)].update((old, new))
        return found

    @classmethod
    def restore(cls, rows, aliases, cut=frozenset()) -> "SetIndex":
        """The index as the store recorded it: rows at their first set, absorbed sets under their new one."""
        index = cls(cut)
        for rid, set_id in rows:
            index.parent[rid] = set_id
            index.parent.setdefault(set_id, set_id)
        for old, new in aliases:
            index.parent.setdefault(new, new)
            index.parent[old] = new
        return index
