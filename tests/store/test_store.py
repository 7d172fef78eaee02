"""The Parquet edge store: round trip, exactly once per offset range, recovery after a cut write."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from headwater.store.edges import STORE_SCHEMA, EdgeStore


def edges(seed: int, n: int = 500, sets: int = 40) -> pa.Table:
    rng = np.random.default_rng(seed)
    dst_set = rng.integers(-(1 << 62), 1 << 62, sets)[rng.integers(0, sets, n)]
    src_set = np.where(rng.random(n) < 0.7, dst_set, rng.integers(-(1 << 62), 1 << 62, n))
    return pa.table({
        "src": rng.integers(-(1 << 62), 1 << 62, n), "dst": rng.integers(-(1 << 62), 1 << 62, n),
        "query": ["q"] * n, "batch": rng.integers(0, 5, n), "op": np.full(n, 7, np.int32),
        "exact": rng.random(n) < 0.9, "cols": np.full(n, 3), "src_set": src_set, "dst_set": dst_set,
    }, schema=STORE_SCHEMA)


def as_set(table: pa.Table) -> set:
    return set(zip(*[table[c].to_pylist() for c in STORE_SCHEMA.names]))


def test_round_trip_and_reading_by_set(tmp_path):
    store = EdgeStore(tmp_path, buckets=8)
    a, b = edges(1), edges(2)
    assert store.append(a, "edges", 0, 0, 9) > 0
    assert store.append(b, "edges", 1, 0, 4) > 0
    assert as_set(store.read()) == as_set(a) | as_set(b)
    wanted = set(a["dst_set"].to_pylist()[:3])
    expected = {row for row in as_set(a) | as_set(b) if row[-1] in wanted}
    assert as_set(store.read(wanted)) == expected
    assert len(store.files(wanted)) < len(store.files())  # only their buckets are read


def test_a_replayed_range_is_not_written_twice(tmp_path):
    store = EdgeStore(tmp_path, buckets=4)
    a = edges(3)
    store.append(a, "edges", 0, 10, 19)
    assert store.append(a, "edges", 0, 10, 19) == 0
    assert store.read().num_rows == a.num_rows
    assert store.recover() == {("edges", 0): 20}


def test_a_write_cut_short_is_undone_and_resumed(tmp_path, monkeypatch):
    """A crash after some bucket files but before the commit: recovery removes them, the replay lands once."""
    store = EdgeStore(tmp_path, buckets=8)
    first = edges(4)
    store.append(first, "edges", 0, 0, 9)
    cut = edges(5)
    real = EdgeStore._write_atomically
    calls = []

    def crash_after_three(self, path, write):
        calls.append(path)
        if len(calls) > 3:
            raise OSError("killed")
        real(self, path, write)

    monkeypatch.setattr(EdgeStore, "_write_atomically", crash_after_three)
    with pytest.raises(OSError):
        store.append(cut, "edges", 0, 10, 19)
    monkeypatch.setattr(EdgeStore, "_write_atomically", real)
    assert len(list((tmp_path / "edges").glob("bucket=*/*~000000000010~*"))) == 3  # orphans of the cut write
    assert as_set(store.read()) == as_set(first)  # readers never see them

    assert store.recover() == {("edges", 0): 10}
    assert not list((tmp_path / "edges").glob("bucket=*/*~000000000010~*"))
    store.append(cut, "edges", 0, 10, 19)
    assert store.read().num_rows == first.num_rows + cut.num_rows
    assert as_set(store.read()) == as_set(first) | as_set(cut)


def test_topic_names_that_cannot_name_files_are_refused(tmp_path):
    with pytest.raises(ValueError, match="cannot name store files"):
        EdgeStore(tmp_path).append(edges(6), "a~b", 0, 0, 1)


def test_records_commit_with_their_edges(tmp_path, monkeypatch):
    store = EdgeStore(tmp_path, buckets=4)
    rows = pa.table({"rid": [1, 2], "set": [1, 1]})
    store.append(edges(7), "edges", 0, 0, 4, records={"rows": rows})
    real = EdgeStore._write_atomically

    def crash_on_commit(self, path, write):
        if path.parent.name == "commits":
            raise OSError("killed")
        real(self, path, write)

    monkeypatch.setattr(EdgeStore, "_write_atomically", crash_on_commit)
    with pytest.raises(OSError):
        store.append(edges(8), "edges", 0, 5, 9, records={"rows": pa.table({"rid": [3], "set": [3]})})
    monkeypatch.setattr(EdgeStore, "_write_atomically", real)
    assert store.records("rows").to_pylist() == rows.to_pylist()  # the uncommitted one is not seen
    store.recover()
    assert [p.name for p in (tmp_path / "rows").iterdir()] == ["edges~0~000000000000~000000000004.parquet"]
    assert store.records("aliases") is None
    with pytest.raises(ValueError, match="unknown record kind"):
        store.append(edges(9), "edges", 0, 10, 11, records={"other": rows})


def test_dropped_ranges_stay_resumed_past_and_are_not_written_again(tmp_path):
    store = EdgeStore(tmp_path, buckets=4)
    parts = [edges(10 + i) for i in range(4)]
    for i, part in enumerate(parts):
        store.append(part, "edges", 0, 10 * i, 10 * i + 9)
    store.append(edges(20), "edges", 1, 0, 9)  # another partition's range is not dropped
    size = store.size_bytes()
    stamp = store.compacted_stamp()
    below_20 = sum(p.stat().st_size for p in store.files() if p.name.split("~")[1:3] in (["0", "000000000000"],
                                                                                       ["0", "000000000010"]))

    assert store.drop("edges", 0, 20) == (2, below_20)  # the ranges ending at 9 and 19
    assert store.compacted_stamp() != stamp
    assert as_set(store.read()) == as_set(parts[2]) | as_set(parts[3]) | as_set(edges(20))
    assert len(store.committed()) == 3 and store.size_bytes() < size
    assert not any(name.startswith("edges~0~000000000000") for name in
                   [p.name for kind in ("rows", "edges/bucket=0", "edges/bucket=1")
                    for p in (tmp_path / kind).glob("*")])
    assert store.drop("edges", 0, 15) == (0, 0)  # already dropped below 20
    store.drop("edges", 1, 10)
    assert store.committed() == [n for n in store.committed() if n.startswith("edges~0~")]
    # Nothing left of partition 1, yet the store resumes past what it dropped, and a replay is skipped.
    assert store.recover() == {("edges", 0): 40, ("edges", 1): 10}
    assert store.append(edges(20), "edges", 1, 0, 9) == 0
    assert EdgeStore(tmp_path, buckets=4).recover() == {("edges", 0): 40, ("edges", 1): 10}


def test_a_store_keeps_its_id_and_refuses_other_buckets(tmp_path):
    store = EdgeStore(tmp_path, buckets=4)
    store.append(edges(1), "edges", 0, 0, 0)
    assert EdgeStore(tmp_path, buckets=4).identity() == store.identity()
    assert EdgeStore(tmp_path / "other", buckets=4).identity() != store.identity()
    with pytest.raises(ValueError, match="written with 4 buckets, not 8"):
        EdgeStore(tmp_path, buckets=8).identity()
