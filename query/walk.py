"""Lineage by walking edges level by level: the answer every backend must give, from any source of edges.

A lineage answer is, for each row reached from the asked row by a path of 1 to
``depth`` edges (upstream for ``backward``, downstream for ``forward``) that is a
target (of the kind ``to`` names, or of the dataset ``to`` names), aggregated over all
those paths:

- ``ops``, ``batches``: every operator and batch on them (sorted); ``hops``: every
  ``(query, op)``, which ``explain.py`` names the operators by;
- ``exact``: every edge on every one of them exact;
- ``cols``: the attribute mask of each path's most downstream edge, OR-ed;
- ``paths`` (how-provenance, when asked for): the paths themselves, each a list of
  ``(query, batch, op)`` steps in data-flow order; the first ``paths`` of them in sorted
  order, so every backend keeps the same ones.

Lineage graphs are DAGs (an output row's rid is derived from its inputs'), so these
aggregates are computed per level, one state per row reached at that length, without
enumerating paths: each is a union, an AND or an OR, which a merge of paths keeps
exact (and the first N of a union of sorted sets are the first N of the union of each
one's first N). ``walk`` takes a ``step`` function giving the edges adjacent to a
frontier; the backends differ only in how they find them.

Time: a row is reached at a moment, the batch of the edge that reached it, and a step
from it walks only the edges of its query on the right side of that moment: backward, of
batches at or before it; forward, at or after it. Within one batch this changes nothing;
across batches it is what makes state nodes exact (DESIGN §2): a state node gathers the
rows entering its group in every batch, tagged with the batch they entered, and links to
each row it emits, tagged with the batch it emitted it, so an output emitted in batch 9
derives from the inputs of batches up to 9 only, and an input of batch 3 reaches the
outputs emitted from batch 3 on. A row reached at several moments is walked once per
moment, so every aggregate below stays per path. ``Walk.moments`` keeps the moments each
row was walked from, for the answer's gaps (``api``).

An edge may carry ``via`` (the narrowing overlay's edges, ``narrow/narrower.py``): a row reached by a
path crossing one is ``reexecuted``, which its record says (``via: reexecution``).

Attribute level: ``cols`` (a mask of the asked row's columns) keeps, backward, only the
paths whose most downstream edge feeds one of those columns. Forward, the same
question is a filter on each answer row's ``cols`` (``Walk.found``'s masks already are
the answer rows' columns).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import pyarrow as pa

from .datasets import names_table
from .errors import LineageError

KINDS = ("source", "state", "output")
MAX_REACH = 1_000_000  # rows a walk may reach before it is refused as unbounded


@dataclass
class Reach:
    """The aggregate over the paths that reach one row."""

    cols: int
    exact: bool = True
    ops: set[int] = field(default_factory=set)
    batches: set[int] = field(default_factory=set)
    paths: set[tuple] = field(default_factory=set)  # only with how-provenance asked for
    paths_cut: bool = False  # more paths than kept
    hops: set[tuple[str, int]] = field(default_factory=set)  # (query, op) of every edge on them: ops by query
    reexecuted: bool = False  # some path crosses a black box by edges its re-execution narrowed (``query/narrow``)

    def merge(self, other: "Reach", keep: int) -> None:
        self.cols |= other.cols
        self.exact = self.exact and other.exact
        self.reexecuted = self.reexecuted or other.reexecuted
        self.ops |= other.ops
        self.batches |= other.batches
        self.hops |= other.hops
        if keep:
            self.paths, cut = _first(self.paths | other.paths, keep)
            self.paths_cut = self.paths_cut or other.paths_cut or cut

    def copy(self) -> "Reach":
        return Reach(self.cols, self.exact, set(self.ops), set(self.batches), set(self.paths), self.paths_cut,
                     set(self.hops), self.reexecuted)


def _first(paths: set[tuple], keep: int) -> tuple[set[tuple], bool]:
    if len(paths) <= keep:
        return paths, False
    return set(sorted(paths)[:keep]), True


@dataclass
class Walk:
    """What a walk found: the rows reached, the batches of every edge it crossed, and where it stopped short."""

    found: dict[int, Reach]
    crossed: set[tuple[str, int]]  # (query, batch) of every edge walked
    ends: set[int]  # rows reached (or asked about) before the depth ran out that have no edge onward
    # Rows walked on from, and the moments ((query, batch) of the edge that reached them) they were walked from.
    moments: dict[int, set[tuple[str, int]]] = field(default_factory=dict)


# step(frontier rids) -> the edges with their dst (backward) or src (forward) in the frontier
Step = Callable[[list[int]], pa.Table]


# outside(pairs) -> those of the (query, batch) pairs whose edges the walk must not take
Outside = Callable[[set[tuple[str, int]]], set[tuple[str, int]]]


def _within(moment, query: str, batch: int, backward: bool) -> bool:
    """Whether an edge of ``(query, batch)`` may be walked from a row reached at ``moment``."""
    if moment is None or moment[0] != query:
        return True
    return batch <= moment[1] if backward else batch >= moment[1]


def walk(starts: list[int], depth: int, backward: bool, step: Step, cols: int | None = None, paths: int = 0,
         max_reach: int = MAX_REACH, deadline: float | None = None, outside: Outside | None = None) -> Walk:
    """Every row reached from any of ``starts`` in 1..``depth`` edges, with its aggregate over those paths.

    ``cols``: backward, only paths whose most downstream edge feeds one of these
    columns. ``paths``: keep up to that many paths per row (how-provenance).
    ``max_reach``: a walk reaching more rows is refused (``LineageError``), not run on;
    so is one still walking at ``deadline`` (``time.monotonic()``), checked at each level.
    ``outside``: batches whose edges are not walked (a time window).
    """
    found: dict[int, Reach] = {}
    crossed: set[tuple[str, int]] = set()
    ends: set[int] = set()
    moments: dict[int, set[tuple[str, int]]] = {}
    # Per row of the frontier, per moment it was reached at, the aggregate of the paths there (None: asked about).
    level: dict[int, dict] = {row: {None: None} for row in starts}
    near, far = ("dst", "src") if backward else ("src", "dst")
    for _ in range(depth):
        for row, at_moments in level.items():
            if any(m is not None for m in at_moments):
                moments.setdefault(row, set()).update(m for m in at_moments if m is not None)
        edges = step(list(level))
        nxt: dict[tuple, Reach] = {}  # by (row, moment)
        touched: set[int] = set()  # frontier rows with edges onward (whether or not the columns keep them)
        columns = [edges[c].to_pylist() for c in (near, far, "query", "op", "batch", "exact", "cols")]
        columns.append(edges["via"].to_pylist() if "via" in edges.column_names else [None] * edges.num_rows)
        skipped = outside(set(zip(columns[2], columns[4]))) if outside is not None and edges.num_rows else set()
        for at, to, query, op, batch, exact, mask, via in zip(*columns):
            reached = level.get(at)
            if reached is None:
                continue  # an edge of the same set, not of the frontier
            for moment, before in reached.items():
                if not _within(moment, query, batch, backward):
                    continue  # a state node's edge of another time than the path's
                touched.add(at)
                if (query, batch) in skipped:
                    continue  # a batch outside the time window
                if before is None and backward and cols is not None and not mask & cols:
                    continue  # feeds none of the asked columns
                crossed.add((query, batch))
                # The most downstream edge's mask: backward, the first edge walked; forward, the last.
                reach = Reach(mask if before is None or not backward else before.cols, exact, {op}, {batch},
                              hops={(query, op)}, reexecuted=via is not None)
                if before is not None:
                    reach.exact = reach.exact and before.exact
                    reach.reexecuted = reach.reexecuted or before.reexecuted
                    reach.ops |= before.ops
                    reach.batches |= before.batches
                    reach.hops |= before.hops
                if paths:
                    hop = (query, batch, op)
                    reach.paths = ({(hop,)} if before is None else {(hop,) + p for p in before.paths} if backward
                                   else {p + (hop,) for p in before.paths})
                    reach.paths_cut = before is not None and before.paths_cut
                key = (to, (query, batch))
                if key in nxt:
                    nxt[key].merge(reach, paths)
                else:
                    nxt[key] = reach
        ends |= set(level) - touched
        for (row, _), reach in nxt.items():
            if row in found:
                found[row].merge(reach.copy(), paths)
            else:
                found[row] = reach.copy()
        if len(found) > max_reach:
            raise LineageError(f"the question reaches more than {max_reach:,} rows: narrow it with a smaller "
                               f"depth, a dataset as its target, or columns")
        if deadline is not None and time.monotonic() > deadline and nxt:
            raise LineageError("the question ran out of time: narrow it with a smaller depth, a dataset as its "
                               "target, or columns")
        if not nxt:
            break
        level = {}
        for (row, moment), reach in nxt.items():
            level.setdefault(row, {})[moment] = reach
    return Walk(found, crossed, ends, moments)


def is_target(to: str, kind: str | None, dataset: str | None) -> bool:
    """``to`` names a kind of row (source, state, output) or else a dataset (a static table by any of
    its names, ``datasets.names_table``)."""
    return kind == to if to in KINDS else dataset == to or names_table(to, dataset)
