"""A store shard: writes, failed writes taken back, restarts, and lineage read set by set."""

from __future__ import annotations

import random
from collections import defaultdict

import numpy as np
import pyarrow as pa
import pytest

from bench.workload import lineage_messages
from headwater.indexer.set_index import SetIndex
from headwater.indexer.shard import Shard
from tests.indexer.test_sets import reach


def pairs(table: pa.Table) -> list[tuple[int, int]]:
    return list(zip(table["src"].to_pylist(), table["dst"].to_pylist()))


class Refused(Exception):
    pass


def refuse():
    raise Refused("the graph write failed")


@pytest.mark.parametrize("seed", range(4))
def test_shard_writes_restarts_and_reads_lineage_by_set(tmp_path, seed):
    rng = random.Random(seed)
    messages = list(lineage_messages(30_000, seed=seed, edges_per_message=1500))
    customers = {r for n, _ in messages for r, d in zip(n["rid"].to_pylist(), n["dataset"].to_pylist())
                 if d == "customers"}
    shard = Shard(tmp_path, "edges", 0, buckets=8).open()
    offset, produced = 0, []
    while messages:
        take = messages[: rng.randint(1, 4)]
        messages = messages[len(take):]
        nodes = pa.concat_tables([n for n, _ in take])
        edges = pa.concat_tables([e for _, e in take])
        first, last = offset, offset + len(take) - 1
        if rng.random() < 0.3:  # the graph failed: nothing committed, the index as before
            before = dict(shard.index.parent)
            with pytest.raises(Refused):
                shard.write(nodes, edges, first, last, before_commit=refuse)
            assert shard.index.parent == before and shard.resume == first
        if rng.random() < 0.2:  # the indexer restarted
            shard = Shard(tmp_path, "edges", 0, buckets=8).open()
            assert shard.resume == first
        shard.write(nodes, edges, first, last)
        assert shard.write(nodes, edges, first, last) == 0  # a replay is skipped
        produced += pairs(edges)
        offset = last + 1

    store = shard.store
    assert sorted(pairs(store.read())) == sorted(produced)
    stored = store.read()
    # Every edge is filed under its dst's set as it was when written.
    rows = store.records("rows")
    first_set = dict(zip(rows["rid"].to_pylist(), rows["set"].to_pylist()))
    index = Shard(tmp_path, "edges", 0, buckets=8).open().index
    assert all(index.resolve(first_set[d]) == index.resolve(s)
               for d, s in zip(stored["dst"].to_pylist(), stored["dst_set"].to_pylist()))
    # The customers hub was cut: its rows stay sets of their own.
    assert customers and all(index.find(c) == c for c in customers)

    aliases = store.records("aliases")
    alias_pairs = list(zip(aliases["old"].to_pylist(), aliases["new"].to_pylist())) if aliases else []
    members = SetIndex.members(alias_pairs, index.resolve)
    deps = store.records("dependencies")
    parents, children = defaultdict(set), defaultdict(set)
    for a, b in zip(deps["src_set"].to_pylist(), deps["dst_set"].to_pylist()):
        parents[index.resolve(b)].add(index.resolve(a))
        children[index.resolve(a)].add(index.resolve(b))
    up, down = defaultdict(set), defaultdict(set)
    for a, b in produced:
        up[b].add(a)
        down[a].add(b)
    for row in rng.sample(sorted(first_set), 30) + sorted(customers)[:3]:
        home = index.resolve(first_set[row])
        for step, sets, forward in ((up, parents, False), (down, children, True)):
            readable = {home} | reach({home}, sets)
            ids = set().union(*[members.get(s, set()) | {s} for s in readable])
            local = defaultdict(set)
            for a, b in pairs(store.read(ids)):  # only the buckets of those sets
                (local[a].add(b) if forward else local[b].add(a))
            assert reach({row}, local) == reach({row}, step)


def test_a_write_cut_short_leaves_nothing_and_the_range_is_written_again(tmp_path):
    (n1, e1), (n2, e2) = list(lineage_messages(4000, seed=9, edges_per_message=2000))[:2]
    shard = Shard(tmp_path, "edges", 3, buckets=4).open()
    shard.write(n1, e1, 0, 0)
    with pytest.raises(Refused):
        shard.write(n2, e2, 1, 1, before_commit=refuse)  # bucket files written and the records committed
    folder = tmp_path / "edges" / "edges"
    on_disk = {str(p.relative_to(folder)) for p in folder.rglob("*.parquet")}
    committed = set(shard.store.tables.edges.files()["path"].to_pylist())
    assert committed < on_disk  # the cut write's files are there, never part of the table
    rows = shard.store.tables.rows
    assert set(rows.read(rows.files()["path"].to_pylist(), ["rid"])["rid"].to_pylist()) & set(n2["rid"].to_pylist())
    assert set(shard.store.records("rows")["rid"].to_pylist()) <= set(n1["rid"].to_pylist())  # not read: no edges
    reopened = Shard(tmp_path, "edges", 3, buckets=4).open()
    assert reopened.resume == 1
    assert set(reopened.store.records("rows")["rid"].to_pylist()) <= set(n1["rid"].to_pylist())
    reopened.write(n2, e2, 1, 1)
    assert sorted(pairs(reopened.store.read())) == sorted(pairs(e1) + pairs(e2))
    assert np.array_equal(np.sort(reopened.store.read()["dst"].to_numpy()),
                          np.sort(np.concatenate([e1["dst"].to_numpy(), e2["dst"].to_numpy()])))
