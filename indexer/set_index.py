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

from .sets import components


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
        """Record one write's edges (``src_ds``/``dst_ds``: their rows' datasets, for the cut)."""
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        parent = self.parent
        rids = np.unique(np.concatenate([src, dst]))
        new = sorted(set(rids.tolist()) - parent.keys())
        parent.update(zip(new, new))
        # Once per row seen before, not per edge: each row's set before this write.
        roots = rids.copy()
        seen = np.flatnonzero(~np.isin(rids, np.array(new, dtype=np.int64), assume_unique=True))
        roots[seen] = np.fromiter((self.find(r) for r in rids[seen].tolist()), dtype=np.int64, count=len(seen))
        src_root = roots[np.searchsorted(rids, src)]
        dst_root = roots[np.searchsorted(rids, dst)]
        joins = np.ones(len(src), dtype=bool)
        if src_ds is not None and self.cut:
            joins = self._joins(src_ds, dst_ds)
        # The sets this write joins, merged in one go: each into the smallest set it meets.
        set_ids, merged_into = components(src_root[joins], dst_root[joins])
        aliases = [(old, new_id) for old, new_id in zip(set_ids.tolist(), merged_into.tolist()) if old != new_id]
        for old, new_id in aliases:
            parent[old] = new_id

        def after(root: np.ndarray) -> np.ndarray:
            """Sets as they are after this write's merges."""
            if not len(set_ids):
                return root
            at = np.minimum(np.searchsorted(set_ids, root), len(set_ids) - 1)
            return np.where(set_ids[at] == root, merged_into[at], root)

        src_set, dst_set = after(src_root), after(dst_root)
        crossing = ~joins & (src_set != dst_set)
        dependencies = set(zip(src_set[crossing].tolist(), dst_set[crossing].tolist()))
        new_sets = after(np.array(new, dtype=np.int64)).tolist()  # a new row's set before: itself
        return Recorded(src_set, dst_set, list(zip(new, new_sets)), aliases, dependencies)

    def _joins(self, src_ds, dst_ds) -> np.ndarray:
        """Which edges join sets: those whose dataset pair is not cut (checked once per pair)."""
        import pandas as pd

        a, a_names = pd.factorize(np.asarray(src_ds, dtype=object))
        b, b_names = pd.factorize(np.asarray(dst_ds, dtype=object))
        pair_codes, at = np.unique(a.astype(np.int64) * len(b_names) + b, return_inverse=True)
        allowed = np.array([(a_names[c // len(b_names)], b_names[c % len(b_names)]) not in self.cut
                            for c in pair_codes.tolist()], dtype=bool)
        return allowed[at]

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
