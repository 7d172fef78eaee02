"""The edge store: round trip, exactly once per offset range, recovery after a cut write; locally and in S3."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pytest

from headwater.store.edges import SHARD_GENERATION, STORE_SCHEMA, EdgeStore, LineageTables, ShardMoved, with_src_sets
from headwater.store.generation import Snapshot


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.stack)])
def where(request, tmp_path):
    """The store's root: a local folder, or a fresh prefix of the session's S3 server's bucket."""
    if request.param == "local":
        return str(tmp_path)
    return request.getfixturevalue("s3").uri(tmp_path.name)


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


def test_round_trip_and_reading_by_set(where):
    zero, one = EdgeStore(where, "edges", 0), EdgeStore(where, "edges", 1)
    a, b = edges(1), edges(2)
    assert zero.append(a, 0, 9) > 0
    assert one.append(b, 0, 4) > 0
    assert as_set(zero.read()) == as_set(a) and as_set(one.read()) == as_set(b)
    wanted = set(a["dst_set"].to_pylist()[:3])
    assert as_set(zero.read(wanted)) == {row for row in as_set(a) if row[-1] in wanted}
    assert len(zero.shard_files(wanted)) < len(zero.shard_files())  # only their buckets are read
    assert zero.committed() == [(0, 9)] and one.committed() == [(0, 4)]


def test_a_replayed_range_is_not_written_twice(where):
    store = EdgeStore(where, "edges", 0, buckets=4)
    a = edges(3)
    store.append(a, 10, 19)
    assert store.append(a, 10, 19) == 0
    assert EdgeStore(where, "edges", 0, buckets=4).append(a, 12, 19) == 0  # another writer of it: the table says
    assert store.read().num_rows == a.num_rows
    assert store.resume() == 20


def test_a_write_of_no_rows_records_leaves_the_rows_readable(where):
    """A range whose batch recorded no rows writes no rows file; one that an earlier writer wrote empty (no
    statistics, so no range) is passed over by every reader of the shards' rows."""
    store = EdgeStore(where, "edges", 0)
    store.append(edges(4), 0, 9, records={"rows": pa.table({"rid": pa.array([], pa.int64()),
                                                             "set": pa.array([], pa.int64())})})
    assert store.tables.rows.version() is None
    store.append(edges(5), 10, 19, records={"rows": pa.table({"rid": [7], "set": [7]})})
    rows = store.tables.rows
    empty = rows.write_file(rows.file_schema.empty_table(), {"generation": SHARD_GENERATION}, name="p0.e0.wempty")
    rows.commit([empty])
    assert len(Snapshot.of(where, "edges").shard_rows_files()) == 1
    assert store.records("rows")["rid"].to_pylist() == [7]


def test_two_writers_of_one_range_at_once_commit_it_once(where):
    """A partition's former owner and its new one write the same range at the same moment: the edges land
    once, and so do the range's rows records (the writers that lose remove theirs)."""
    a = edges(4, n=2000)
    rows = pa.table({"rid": [1, 2, 3], "set": [1, 1, 3]})
    errors = []

    def write() -> None:
        try:
            EdgeStore(where, "edges", 0).append(a, 0, 9, records={"rows": rows})
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    store = EdgeStore(where, "edges", 0)
    table = store.read()
    assert table.num_rows == a.num_rows and as_set(table) == as_set(a)
    assert sorted(store.records("rows")["rid"].to_pylist()) == [1, 2, 3]


def test_a_writer_behind_another_commits_nothing_of_an_overlapping_range(where):
    """Around a rebalance, two owners of a partition read it at offset 0: one commits 0..4 while the other,
    its files and records written, is about to commit 0..9. The late one commits nothing (``ShardMoved``, its
    records removed), and, having looked again, writes 5..9 alone: every edge once, every row recorded once."""
    a, b = edges(1), edges(2)
    late, other = EdgeStore(where, "edges", 0), EdgeStore(where, "edges", 0)
    with pytest.raises(ShardMoved, match="committed offsets to 4"):
        late.append(pa.concat_tables([a, b]), 0, 9, records={"rows": pa.table({"rid": [1, 2, 3], "set": [1, 1, 3]})},
                    before_commit=lambda: other.append(a, 0, 4, records={"rows": pa.table({"rid": [1], "set": [1]})}))
    assert late.read().num_rows == a.num_rows and as_set(late.read()) == as_set(a)
    with pytest.raises(ShardMoved, match="holds offsets to 4"):  # nor from a view still behind
        late.append(pa.concat_tables([a, b]), 0, 9)
    assert late.resume() == 5
    late.append(b, 5, 9, records={"rows": pa.table({"rid": [2, 3], "set": [1, 3]})})
    table = late.read()
    assert table.num_rows == a.num_rows + b.num_rows and as_set(table) == as_set(a) | as_set(b)
    assert sorted(late.records("rows")["rid"].to_pylist()) == [1, 2, 3]
    rows = late.tables.rows
    assert sorted(rows.read(rows.files()["path"].to_pylist(), ["rid"])["rid"].to_pylist()) == [1, 2, 3]


def test_a_write_cut_short_is_never_read_and_its_records_are_undone(where):
    """A crash after the files and the records but before the edges' commit: readers never see the files
    nor the records (their range never committed), the replay lands once."""
    store = EdgeStore(where, "edges", 0, buckets=8)
    first = edges(4)
    store.append(first, 0, 9, records={"rows": pa.table({"rid": [1, 2], "set": [1, 1]})})

    def crash():
        raise OSError("killed")

    cut = edges(5)
    with pytest.raises(OSError):
        store.append(cut, 10, 19, records={"rows": pa.table({"rid": [3], "set": [3]}),
                                           "aliases": pa.table({"old": [3], "new": [1]})}, before_commit=crash)
    assert as_set(store.read()) == as_set(first)  # readers never see the cut write's edges
    everything = store.tables.rows.read(store.tables.rows.files()["path"].to_pylist(), ["rid"])
    assert sorted(everything["rid"].to_pylist()) == [1, 2, 3]  # its records committed first, and are not read
    assert store.resume() == 10
    assert store.records("rows")["rid"].to_pylist() == [1, 2] and store.records("aliases") is None
    store.append(cut, 10, 19, records={"rows": pa.table({"rid": [3], "set": [3]})})
    assert as_set(store.read()) == as_set(first) | as_set(cut)
    assert store.records("rows")["rid"].to_pylist() == [1, 2, 3]
    with pytest.raises(ValueError, match="unknown record kind"):
        store.append(edges(9), 20, 21, records={"other": pa.table({"rid": [1]})})


def test_topic_names_that_cannot_name_folders_are_refused(tmp_path):
    with pytest.raises(ValueError, match="cannot name a store folder"):
        EdgeStore(tmp_path, "a/b", 0)


def test_a_set_aside_shard_starts_a_new_store_and_keeps_its_data(where):
    store = EdgeStore(where, "edges", 2)
    assert store.identity() == "p2.e0"
    store.append(edges(6), 0, 9)
    assert LineageTables(where, "edges").set_aside(2) == "p2.e1"
    again = EdgeStore(where, "edges", 2)
    assert again.identity() == "p2.e1" and again.resume() == 0 and again.read().num_rows == 0
    again.append(edges(7), 0, 4)
    assert as_set(EdgeStore(where, "edges", 2).read()) == as_set(edges(7))
    tables = LineageTables(where, "edges")
    everything = with_src_sets(tables.edges.read(tables.edges.files()["path"].to_pylist(), STORE_SCHEMA.names))
    assert as_set(everything) == as_set(edges(6)) | as_set(edges(7))  # the old store's edges stay in the table
