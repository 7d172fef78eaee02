"""The level-by-level walk on a small DAG whose aggregates over paths are worked out by hand."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from headwater.core.schema import EDGE_SCHEMA
from headwater.query.walk import walk

A, B, C = 1, 2, 3
# a -> b -> c (exact), and a -> c directly through a black box (inexact)
EDGES = pa.table({"src": [A, B, A], "dst": [B, C, C], "query": ["q"] * 3, "batch": [7, 8, 9],
                  "op": [1, 2, 3], "exact": [True, True, False], "cols": [0b001, 0b010, 0b100]},
                 schema=EDGE_SCHEMA)


def step(column: str):
    return lambda frontier: EDGES.filter(pc.is_in(EDGES[column], pa.array(frontier, pa.int64())))


def as_dicts(walked) -> dict:
    return {rid: (r.cols, r.exact, sorted(r.ops), sorted(r.batches)) for rid, r in walked.found.items()}


def test_backward_aggregates_every_path_within_the_depth():
    # Backward, the mask is the edge into the asked row's: c's edges from b (0b010) and a (0b100).
    assert as_dicts(walk([C], 1, True, step("dst"))) == {B: (0b010, True, [2], [8]), A: (0b100, False, [3], [9])}
    assert as_dicts(walk([C], 2, True, step("dst"))) == {B: (0b010, True, [2], [8]),
                                                       A: (0b110, False, [1, 2, 3], [7, 8, 9])}


def test_forward_takes_each_paths_last_edge_mask():
    assert as_dicts(walk([A], 1, False, step("src"))) == {B: (0b001, True, [1], [7]), C: (0b100, False, [3], [9])}
    # c by a -> c (0b100, inexact) and by a -> b -> c (0b010, exact)
    assert as_dicts(walk([A], 2, False, step("src"))) == {B: (0b001, True, [1], [7]),
                                                        C: (0b110, False, [1, 2, 3], [7, 8, 9])}
    assert walk([C], 5, False, step("src")).found == {}
