"""Connected sets kept up to date as edges arrive (union-find), between compactions.

``SetIndex.add`` takes one write's edges, unions the rows each edge joins (unless the
edge crosses a dataset pair compaction cut, see ``sets.py``), and returns what the
store must record so that lineage stays complete without ever rewriting a file:

- each edge's ``src_set`` and ``dst_set`` as they are after this write;
- ``rows``: the set of every row seen for the first time (the rid → set index);
- ``aliases``: sets seen before that a merge absorbed, ``(old id, new id)``: files
  written earlier under the old id belong to the new set (a row first seen in the
  write has its new set in its rows record, and no file under its own id);
- ``dependencies``: ``(src set, dst set)`` of edges that cross sets.

A set is named by its smallest rid, as in ``sets.connected_sets``. ``resolve`` follows
aliases to a set's current id; ``members`` lists every id a current set was ever
written under. ``restore`` rebuilds the index from what the store recorded.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from .sets import components, unique_pairs

_NONE = np.empty(0, dtype=np.int64)


@dataclass(frozen=True)
class Ends:
    """A write's edge ends: each rid once, sorted, and where each edge's src and dst are among them (found
    once for the write, by the set index and by the lookup of the rows' datasets)."""

    rids: np.ndarray
    src: np.ndarray
    dst: np.ndarray

    @classmethod
    def of(cls, src: np.ndarray, dst: np.ndarray) -> "Ends":
        src = np.asarray(src, dtype=np.int64)
        # The inverse of ``unique``: a sixth of the cost of searching each end among the rids.
        rids, at = np.unique(np.concatenate([src, np.asarray(dst, dtype=np.int64)]), return_inverse=True)
        return cls(rids, at[:len(src)], at[len(src):])


@dataclass
class Recorded:
    src_set: np.ndarray
    dst_set: np.ndarray
    new_rows: np.ndarray = field(default_factory=lambda: _NONE)  # rows first seen (sorted)
    new_sets: np.ndarray = field(default_factory=lambda: _NONE)  # … and their sets
    absorbed: np.ndarray = field(default_factory=lambda: _NONE)  # sets seen before that a merge absorbed
    absorbed_into: np.ndarray = field(default_factory=lambda: _NONE)  # … and the set each joined
    dependencies_array: np.ndarray = field(default_factory=lambda: np.empty((0, 2), np.int64))  # (src set, dst set)

    @property
    def rows(self) -> list[tuple[int, int]]:
        """(rid, set) of the rows first seen."""
        return list(zip(self.new_rows.tolist(), self.new_sets.tolist()))

    @property
    def aliases(self) -> list[tuple[int, int]]:
        """(absorbed set, set it joined)."""
        return list(zip(self.absorbed.tolist(), self.absorbed_into.tolist()))

    @property
    def dependencies(self) -> set[tuple[int, int]]:
        return set(map(tuple, self.dependencies_array.tolist()))


def _factorized(datasets) -> tuple[np.ndarray, list]:
    """Codes and names of datasets given as a ``pandas.Categorical`` (its own) or as strings."""
    import pandas as pd

    if isinstance(datasets, pd.Categorical):
        return datasets.codes, list(datasets.categories)
    codes, names = pd.factorize(np.asarray(datasets, dtype=object))
    return codes, list(names)


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

    def add(self, src: np.ndarray, dst: np.ndarray, src_ds=None, dst_ds=None, ends: Ends | None = None) -> Recorded:
        """Record one write's edges (``src_ds``/``dst_ds``: their rows' datasets, for the cut; ``ends``: the
        edges' ``Ends``, if the caller found them already)."""
        ends = ends or Ends.of(src, dst)
        parent = self.parent
        rids = ends.rids
        listed = rids.tolist()
        known = np.fromiter(map(parent.__contains__, listed), dtype=bool, count=len(listed))
        new = rids[~known]
        # Once per row seen before, not per edge: each row's set before this write.
        roots = rids.copy()
        seen = np.flatnonzero(known)
        roots[seen] = np.fromiter((self.find(r) for r in rids[seen].tolist()), dtype=np.int64, count=len(seen))
        src_root, dst_root = roots[ends.src], roots[ends.dst]
        joins = np.ones(len(src), dtype=bool)
        if src_ds is not None and self.cut:
            joins = self._joins(src_ds, dst_ds)
        # The sets this write joins, merged in one go: each into the smallest set it meets.
        set_ids, merged_into = components(src_root[joins], dst_root[joins])
        # A row first seen here is a set of its own only within this write: the set it joined is its rows
        # record, and no file was written under its id, so only sets seen before are recorded absorbed
        # (a write of 28,000 edges absorbs ~20,000 new rows' sets).
        moved = (set_ids != merged_into) & ~np.isin(set_ids, new, assume_unique=True)
        absorbed, absorbed_into = set_ids[moved], merged_into[moved]
        parent.update(zip(absorbed.tolist(), absorbed_into.tolist()))

        def after(root: np.ndarray) -> np.ndarray:
            """Sets as they are after this write's merges."""
            if not len(set_ids):
                return root
            at = np.minimum(np.searchsorted(set_ids, root), len(set_ids) - 1)
            return np.where(set_ids[at] == root, merged_into[at], root)

        src_set, dst_set = after(src_root), after(dst_root)
        crossing = ~joins & (src_set != dst_set)
        dependencies = unique_pairs(src_set[crossing], dst_set[crossing])
        new_sets = after(new)  # a new row's set before this write: itself
        parent.update(zip(new.tolist(), new_sets.tolist()))
        return Recorded(src_set, dst_set, new, new_sets, absorbed, absorbed_into, dependencies)

    def undo(self, recorded: Recorded) -> None:
        """Take back the ``add`` that returned ``recorded`` (the last one): its store write failed.

        ``add`` compresses paths only before it merges, so every row seen before still
        points into its own pre-write set; un-merging and forgetting the new rows is all.
        """
        absorbed = recorded.absorbed.tolist()
        self.parent.update(zip(absorbed, absorbed))
        for rid in recorded.new_rows.tolist():
            del self.parent[rid]

    def _joins(self, src_ds, dst_ds) -> np.ndarray:
        """Which edges join sets: those whose dataset pair is not cut (checked once per pair)."""
        a, a_names = _factorized(src_ds)
        b, b_names = _factorized(dst_ds)
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
        rows = list(rows)
        # Every set id is a root, unless a row record or an alias says otherwise.
        set_ids = {set_id for _, set_id in rows}
        index.parent = dict(zip(set_ids, set_ids))
        index.parent.update(rows)
        for old, new in aliases:
            index.parent.setdefault(new, new)
            index.parent[old] = new
        return index
