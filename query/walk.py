"""Lineage by walking edges level by level: the answer every backend must give, from any source of edges.

A lineage answer is, for each row reached from the asked row by a path of 1 to
``depth`` edges (upstream for ``backward``, downstream for ``forward``) that is a
target (of the kind ``to`` names, or of the dataset ``to`` names), aggregated over all
those paths:

- ``ops``, ``batches``: every operator and batch on them (sorted);
- ``exact``: every edge on every one of them exact;
- ``cols``: the attribute mask of each path's most downstream edge, OR-ed.

Lineage graphs are DAGs (an output row's rid is derived from its inputs'), so these
aggregates are computed per level, one state per row reached at that length, without
enumerating paths: each is a union, an AND or an OR, which a merge of paths keeps
exact. ``walk`` takes a ``step`` function giving the edges adjacent to a frontier;
the backends differ only in how they find them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import pyarrow as pa

KINDS = ("source", "state", "output")


@dataclass
class Reach:
    """The aggregate over the paths that reach one row."""

    cols: int
    exact: bool = True
    ops: set[int] = field(default_factory=set)
    batches: set[int] = field(default_factory=set)

    def merge(self, other: "Reach") -> None:
        self.cols |= other.cols
        self.exact = self.exact and other.exact
        self.ops |= other.ops
        self.batches |= other.batches


# step(frontier rids) -> the edges with their dst (backward) or src (forward) in the frontier
Step = Callable[[list[int]], pa.Table]


def walk(rid: int, depth: int, backward: bool, step: Step) -> dict[int, Reach]:
    """Every row reached from ``rid`` in 1..``depth`` edges, with its aggregate over those paths."""
    found: dict[int, Reach] = {}
    level: dict[int, Reach | None] = {rid: None}  # None: the asked row (no path yet)
    near, far = ("dst", "src") if backward else ("src", "dst")
    for _ in range(depth):
        edges = step(list(level))
        if not edges.num_rows:
            break
        nxt: dict[int, Reach] = {}
        columns = [edges[c].to_pylist() for c in (near, far, "op", "batch", "exact", "cols")]
        for at, to, op, batch, exact, cols in zip(*columns):
            before = level.get(at, False)
            if before is False:
                continue  # an edge of the same set, not of the frontier
            # The most downstream edge's mask: backward, the first edge walked; forward, the last.
            mask = cols if before is None or not backward else before.cols
            reach = Reach(mask, exact, {op}, {batch})
            if before is not None:
                reach.exact = reach.exact and before.exact
                reach.ops |= before.ops
                reach.batches |= before.batches
            if to in nxt:
                nxt[to].merge(reach)
            else:
                nxt[to] = reach
        for row, reach in nxt.items():
            copy = Reach(reach.cols, reach.exact, set(reach.ops), set(reach.batches))  # found's own, merged later
            if row in found:
                found[row].merge(copy)
            else:
                found[row] = copy
        level = dict(nxt)
    return found


def is_target(to: str, kind: str | None, dataset: str | None) -> bool:
    """``to`` names a kind of row (source, state, output) or else a dataset."""
    return kind == to if to in KINDS else dataset == to
