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


# A state node S: inputs I1, I2, I3 enter its group in batches 1, 2, 3; it emits O1 in batch 1 and
# O3 in batch 3; O3 is read by another query's row X in that query's batch 0.
S, I1, I2, I3, O1, O3, X = 10, 11, 12, 13, 21, 23, 30
STATE = pa.table({"src": [I1, I2, I3, S, S, O3], "dst": [S, S, S, O1, O3, X], "query": ["q"] * 5 + ["r"],
                  "batch": [1, 2, 3, 1, 3, 0], "op": [5, 5, 5, 9, 9, 1], "exact": [True] * 6,
                  "cols": [1] * 6}, schema=EDGE_SCHEMA)


def state_step(column: str):
    return lambda frontier: STATE.filter(pc.is_in(STATE[column], pa.array(frontier, pa.int64())))


def test_a_state_node_is_walked_only_at_the_right_time():
    # Backward: an output emitted in batch b derives from the rows that entered by b.
    assert set(walk([O1], 2, True, state_step("dst")).found) == {S, I1}
    assert set(walk([O3], 2, True, state_step("dst")).found) == {S, I1, I2, I3}
    # Forward: a row reaches the emissions from its batch on; another query's batches are not compared.
    assert set(walk([I2], 3, False, state_step("src")).found) == {S, O3, X}
    assert set(walk([I1], 2, False, state_step("src")).found) == {S, O1, O3}
    walked = walk([O3], 2, True, state_step("dst"))
    assert walked.moments == {S: {("q", 3)}}
    assert sorted(walked.found[I2].batches) == [2, 3]
    # Two starts reaching S at batches 1 and 3 keep each path's batches apart.
    both = walk([O1, O3], 2, True, state_step("dst"))
    assert sorted(both.found[I2].batches) == [2, 3] and sorted(both.found[I1].batches) == [1, 3]
