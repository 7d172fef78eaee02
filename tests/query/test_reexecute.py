"""Re-running black boxes' functions (``query/narrow/reexecute.py``), without Spark: each class decided by
execution on a small batch, against the lineage the function's own logic gives (brute force)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyspark.cloudpickle as cloudpickle
import pytest
from pyspark.sql.types import DoubleType, IntegerType, LongType, StructField, StructType

from headwater.core import rid as rids
from headwater.query.narrow import reexecute

pytestmark = pytest.mark.every_line  # runs on every supported Spark line (./dev test)

DATASET = "MapInPandas#1"
_TYPES = {"long": LongType(), "int": IntegerType(), "double": DoubleType()}


def schema(ddl: str) -> StructType:
    """``"id long, k int"`` as a StructType (``StructType.fromDDL`` needs a running Spark)."""
    return StructType([StructField(n, _TYPES[t]) for n, t in (part.split() for part in ddl.split(","))])


INPUT = schema("id long, k int, v long")


def record(function, output: str, eval_type=reexecute.MAP_PANDAS, grouping=(), input_type=INPUT, **more):
    out = schema(output)
    data = list(range(len(grouping), len(input_type.fields)))
    return {"eval_type": eval_type, "command": cloudpickle.dumps((function, out)), "grouping": list(grouping),
            "data": data,
            "input": input_type.jsonValue(), "output": out.jsonValue(), "timezone": "UTC", **more}


def batch(n=40, seed=3) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({"id": pa.array(range(n), pa.int64()), "k": pa.array(rng.integers(0, 4, n), pa.int32()),
                     "v": pa.array(rng.integers(-50, 50, n), pa.int64())})


def digest(values: list, dtypes: list[str]) -> int:
    return rids.box_output_digests(DATASET, [[v] for v in values], dtypes)[0]


def split(frames):
    for frame in frames:
        kept = frame[frame["v"] % 3 != 0]
        yield pd.DataFrame({"id": np.repeat(kept["id"].to_numpy(), 2), "part": np.tile([0, 1], len(kept)),
                            "v3": np.repeat(kept["v"].to_numpy() * 3, 2)})


def test_a_row_wise_map_is_a_dispatcher_with_each_output_from_its_row():
    table = batch()
    fn = reexecute.Function(record(split, "id long, part int, v3 long"), DATASET, [0, 1, 2])
    found = reexecute.narrow_stateless(fn, table, True)
    assert (found.kind, found.exact) == ("dispatcher", True)
    rows = table.to_pylist()
    expected = {digest([r["id"], part, r["v"] * 3], ["long", "integer", "long"]): [i]
                for i, r in enumerate(rows) if r["v"] % 3 for part in (0, 1)}
    assert found.lineage == expected


def share(frame):
    return pd.DataFrame({"id": frame["id"], "s": frame["v"] / (frame["v"].abs().sum() or 1)})


def test_a_grouped_function_gets_its_groups_rows():
    table = batch()
    grouped_input = schema("k int, id long, k int, v long")
    with_key = pa.table([table["k"], table["id"], table["k"], table["v"]], names=["k", "id", "k", "v"])
    fn = reexecute.Function(record(share, "id long, s double", reexecute.GROUPED_PANDAS, [0], grouped_input),
                            DATASET, [0, 1])
    found = reexecute.narrow_stateless(fn, with_key, True)
    assert (found.kind, found.exact) == ("grouped", True)
    ks = table["k"].to_pylist()
    for positions in found.lineage.values():
        assert positions == [i for i, k in enumerate(ks) if k == ks[positions[0]]]
    assert len(found.lineage) == table.num_rows


def per_k_map(frames):
    frame = pd.concat(list(frames))
    for _, part in frame.groupby("k"):
        yield pd.DataFrame({"k": part["k"].iloc[:1], "n": [len(part)]})


def test_a_map_that_behaves_grouped_is_found_grouped_by_its_column():
    table = batch()
    found = reexecute.narrow_stateless(reexecute.Function(record(per_k_map, "k int, n long"), DATASET, [0, 1]),
                                       table, True)
    assert found.kind == "grouped" and "grouped by k" in found.reason
    ks = table["k"].to_pylist()
    assert sorted(map(tuple, found.lineage.values())) == sorted(
        tuple(i for i, k in enumerate(ks) if k == key) for key in set(ks))


def centre(frames):
    for frame in frames:
        yield pd.DataFrame({"id": frame["id"], "d": frame["v"] - frame["v"].mean()})


def jitter(frames):
    for frame in frames:
        yield pd.DataFrame({"id": frame["id"], "r": np.random.random(len(frame))})


@pytest.mark.parametrize("function, output, deterministic", [(centre, "id long, d double", True),
                                                             (jitter, "id long, r double", False)])
def test_mixing_and_random_functions_stay_supersets(function, output, deterministic):
    found = reexecute.narrow_stateless(reexecute.Function(record(function, output), DATASET, [0, 1]), batch(), True)
    assert (found.kind, found.exact, found.deterministic) == ("superset", False, deterministic)
    assert ("non-deterministic" in found.reason) == (not deterministic)


def test_a_partial_digest_is_never_exact():
    found = reexecute.narrow_stateless(reexecute.Function(record(split, "id long, part int, v3 long"), DATASET, [0]),
                                       batch(), False)
    assert found.kind == "dispatcher" and not found.exact


def count_sessions(key, frames, state):
    """Per key, emits the running count, and forgets it at a v divisible by 7."""
    n = state.get[0] if state.exists else 0
    out = []
    for v in pd.concat(list(frames))["v"]:
        n += 1
        out.append((key[0], n))
        if v % 7 == 0:
            n = 0
    if n:
        state.update((n,))
    else:
        state.remove()
    yield pd.DataFrame(out, columns=["k", "n"])


def test_a_stateful_function_is_replayed_per_key_since_its_state_began():
    fn = reexecute.Function(record(count_sessions, "k int, n long", reexecute.GROUPED_WITH_STATE, [1],
                                   state=schema("n long").jsonValue(), timeout="NoTimeout"), DATASET, [0, 1])
    fn.data = [0, 1, 2]  # the stateful function gets every column of its child
    batches = [(b, batch(12, seed=b)) for b in range(3)]
    found = reexecute.narrow_stateful(fn, batches, True)
    assert {n.kind for n in found.values()} == {"per key"}
    assert all(json.dumps(n.to_dict()) for n in found.values())
    # The oracle: each call's outputs derive from its key's rows since the key's count last restarted.
    since: dict = {}
    for b, table in batches:
        rows = table.to_pylist()
        expected = []
        for k in {r["k"] for r in rows}:
            since[k] = since.get(k, []) + [(b, i) for i, r in enumerate(rows) if r["k"] == k]
            expected.append(frozenset(since[k]))
            if _ends_clear(since[k], batches):
                since[k] = []
        assert {frozenset(map(tuple, rows_of)) for rows_of in found[b].lineage.values()} == set(expected)
        # Sorted, and the digests of one call share one list: a key's rows are held once a batch, not once per
        # output row (a 1,000,000-row sessionisation went past the worker's memory).
        assert all(rows_of == sorted(rows_of) for rows_of in found[b].lineage.values())
        assert len({id(rows_of) for rows_of in found[b].lineage.values()}) <= len(expected) < len(found[b].lineage)


def _ends_clear(rows, batches) -> bool:
    """Whether the key's count is 0 after its rows so far (the state removed)."""
    tables = dict(batches)
    n = 0
    for b, i in rows:
        n += 1
        if tables[b]["v"][i].as_py() % 7 == 0:
            n = 0
    return n == 0



def test_calls_shared_by_forked_copies_give_what_one_process_gives(monkeypatch):
    table = batch(300)
    serial = reexecute.narrow_stateless(reexecute.Function(record(split, "id long, part int, v3 long"), DATASET,
                                                           [0, 1, 2]), table, True)
    monkeypatch.setattr(reexecute, "PARALLEL_CALLS", 10)
    monkeypatch.setattr(reexecute.os, "cpu_count", lambda: 3)
    shared = reexecute.narrow_stateless(reexecute.Function(record(split, "id long, part int, v3 long"), DATASET,
                                                           [0, 1, 2]), table, True)
    assert (shared.kind, shared.lineage) == (serial.kind, serial.lineage) and shared.kind == "dispatcher"


def test_a_calls_rows_are_held_once_and_a_row_out_of_two_calls_derives_from_both():
    from collections import Counter

    lineage = reexecute._lineage([[2, 0], [1, 3], [5, 4]],
                                 [Counter({10: 1, 11: 1}), Counter({11: 1, 12: 2, 13: 1}), Counter({14: 1, 15: 1})])
    assert lineage == {10: [0, 2], 11: [0, 1, 2, 3], 12: [1, 3], 13: [1, 3], 14: [4, 5], 15: [4, 5]}
    assert lineage[14] is lineage[15], "the outputs of one call share its rows"
    held = reexecute.Narrowed("grouped", True, lineage=lineage).to_dict()
    assert held["sets"] == [[0, 2], [0, 1, 2, 3], [1, 3], [4, 5]]
    assert dict(zip(held["digests"], held["set_of"])) == {10: 0, 11: 1, 12: 2, 13: 2, 14: 3, 15: 3}


def alike_ids(frames):
    """Row-wise, each row's output twice; every 50th id's rows all give one output row alike."""
    for frame in frames:
        kept = frame[frame["v"] % 3 != 0]
        ids = np.where(kept["id"].to_numpy() % 50 == 0, -1, kept["id"].to_numpy())
        yield pd.DataFrame({"id": np.repeat(ids, 2), "v3": np.repeat(kept["v"].to_numpy() * 3, 2)})


def marks_the_first_of_a_large_frame(frames):
    """Not a dispatcher, though 32 rows alone and together agree: a frame of over 40 rows marks its first id."""
    for frame in frames:
        yield pd.DataFrame({"id": frame["id"], "f": ((frame["id"] == frame["id"].min()) & (len(frame) > 40))
                            .astype("int64")})


def per_row_in_groups(frame):
    return pd.DataFrame({"id": frame["id"], "v2": frame["v"] * 2})


def by_every_row_alone(monkeypatch, make):
    """The narrowing of ``make()``'s function with every row run alone, however many rows."""
    with monkeypatch.context() as m:
        m.setattr(reexecute, "ALONE_ROWS", 1 << 30)
        fn, table = make()
        return reexecute.narrow_stateless(fn, table, True)


@pytest.mark.parametrize("function, output, digest", [(split, "id long, part int, v3 long", [0, 1, 2]),
                                                      (alike_ids, "id long, v3 long", [0, 1])])
def test_coded_runs_find_what_running_every_row_alone_finds_in_far_fewer_calls(monkeypatch, function, output, digest):
    """Past ``ALONE_ROWS``, a dispatcher's rows are named by coded runs of chunks: the same lineage as every row
    run alone (the brute force), outputs alike across rows and chunks included, in a fraction of the calls."""
    monkeypatch.setattr(reexecute, "ALONE_ROWS", 100)
    monkeypatch.setattr(reexecute, "CHUNK_ROWS", 700)  # three chunks, the last a short one

    def make():
        return reexecute.Function(record(function, output), DATASET, digest), batch(1800, seed=5)

    fn, table = make()
    coded = reexecute.narrow_stateless(fn, table, True)
    alone = by_every_row_alone(monkeypatch, make)
    assert (coded.kind, coded.exact) == ("dispatcher", True) and "coded runs" in coded.verified
    assert coded.lineage == alone.lineage
    assert fn.calls < table.num_rows / 2
    if function is alike_ids:
        assert any(len(rows) > 1 for rows in coded.lineage.values()), "some output rows come from several rows"


def test_a_function_that_agrees_alone_and_together_on_few_rows_but_not_on_many_is_no_dispatcher(monkeypatch):
    monkeypatch.setattr(reexecute, "ALONE_ROWS", 100)
    fn = reexecute.Function(record(marks_the_first_of_a_large_frame, "id long, f long"), DATASET, [0, 1])
    found = reexecute.narrow_stateless(fn, batch(500), True)
    assert found.kind == "superset" and not found.exact


def test_an_apply_in_pandas_row_wise_within_its_groups_is_a_dispatcher_called_per_group(monkeypatch):
    monkeypatch.setattr(reexecute, "ALONE_ROWS", 100)
    table = batch(900, seed=7)
    grouped_input = schema("k int, id long, k int, v long")
    with_key = pa.table([table["k"], table["id"], table["k"], table["v"]], names=["k", "id", "k", "v"])

    def make():
        return reexecute.Function(record(per_row_in_groups, "id long, v2 long", reexecute.GROUPED_PANDAS, [0],
                                         grouped_input), DATASET, [0, 1]), with_key

    fn, _ = make()
    coded = reexecute.narrow_stateless(fn, with_key, True)
    assert coded.kind == "dispatcher" and coded.lineage == by_every_row_alone(monkeypatch, make).lineage
    assert coded.lineage == {digest([r["id"], r["v"] * 2], ["long", "long"]): [i]
                             for i, r in enumerate(table.to_pylist())}
