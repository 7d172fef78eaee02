"""Connected sets (CSProv) against brute force on randomized lineage graphs."""

from __future__ import annotations

import random
from collections import defaultdict

import numpy as np
import pytest

from headwater.indexer.sets import components, connected_sets, set_dependencies


def random_lineage(seed: int) -> tuple[np.ndarray, np.ndarray, dict]:
    """A pipeline's lineage: orders and a dimension table into an aggregate, into a sink.

    Shapes the real graphs have: a dimension row joined by many orders (a hub), groups
    of 1 to 30 inputs (fan-in), 1:1 rows, and chains through an intermediate dataset.
    """
    rng = random.Random(seed)
    rid = iter({rng.getrandbits(64) - (1 << 63) for _ in range(5000)})
    dataset: dict = {}

    def rows(name: str, n: int) -> list[int]:
        made = [next(rid) for _ in range(n)]
        dataset.update(dict.fromkeys(made, name))
        return made

    orders, dims = rows("kafka:orders", rng.randint(20, 300)), rows("customers", rng.randint(1, 6))
    payments = rows("kafka:payments", rng.randint(0, 50))
    edges = []
    joined = rows("state:join", len(orders))
    for order, row in zip(orders, joined):
        edges.append((order, row))
        if rng.random() < 0.9:
            edges.append((rng.choice(dims), row))
        if payments and rng.random() < 0.3:
            edges.append((rng.choice(payments), row))
    todo = list(joined)
    rng.shuffle(todo)
    while todo:
        group = todo[: rng.randint(1, 30)]
        todo = todo[len(group):]
        (out,) = rows("sink", 1)
        edges.extend((g, out) for g in group)
    src, dst = (np.array(x, dtype=np.int64) for x in zip(*edges))
    return src, dst, dataset


def brute_components(src, dst, nodes) -> dict:
    """Each node's component, named by its smallest node: a plain union-find."""
    parent = {n: n for n in nodes}

    def root(n):
        while parent[n] != n:
            n = parent[n]
        return n

    for a, b in zip(src.tolist(), dst.tolist()):
        ra, rb = root(a), root(b)
        parent[max(ra, rb)] = min(ra, rb)
    roots = {n: root(n) for n in parent}
    smallest: dict = {}
    for n, r in roots.items():
        smallest[r] = min(smallest.get(r, n), n)
    return {n: smallest[r] for n, r in roots.items()}


def reach(start: set, step: dict) -> set:
    seen, todo = set(), list(start)
    while todo:
        node = todo.pop()
        for nxt in step.get(node, ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


@pytest.mark.parametrize("seed", range(40))
def test_components_equal_brute_force(seed):
    src, dst, dataset = random_lineage(seed)
    lonely = np.array([r for r in dataset if r not in set(src.tolist()) | set(dst.tolist())], dtype=np.int64)
    rids, labels = components(src, dst, lonely)
    assert dict(zip(rids.tolist(), labels.tolist())) == brute_components(src, dst, dataset)


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("threshold", [5, 40, 10_000])
def test_connected_sets_hold_every_lineage(seed, threshold):
    src, dst, dataset = random_lineage(seed)
    rids, set_of = connected_sets(src, dst, dataset, threshold)
    set_by_rid = dict(zip(rids.tolist(), set_of.tolist()))
    assert set(set_by_rid) == set(src.tolist()) | set(dst.tolist())

    members = defaultdict(set)
    for r, s in set_by_rid.items():
        members[s].add(r)
    inside = [(a, b) for a, b in zip(src.tolist(), dst.tolist()) if set_by_rid[a] == set_by_rid[b]]
    for s, rows in members.items():
        assert s == min(rows)  # a set is named by its smallest rid
        # A set is weakly connected, and too large only when one dataset holds it.
        assert set(brute_components(*map(np.array, zip(*[(a, b) for a, b in inside if a in rows] or [(s, s)])),
                                    rows).values()) == {s}
        assert len(rows) <= threshold or len({dataset[r] for r in rows}) == 1
    if threshold >= len(set_by_rid):
        assert members.keys() == set(brute_components(src, dst, set_by_rid).values())

    deps = set_dependencies(src, dst, rids, set_of)
    parents, children = defaultdict(set), defaultdict(set)
    for a, b in deps.tolist():
        parents[b].add(a)
        children[a].add(b)
    up, down = defaultdict(set), defaultdict(set)
    for a, b in zip(src.tolist(), dst.tolist()):
        up[b].add(a)
        down[a].add(b)
    for row in random.Random(seed).sample(sorted(set_by_rid), 25):
        home = set_by_rid[row]
        # CSProv: the edges ending in the row's set and its set ancestors hold all its lineage.
        for step, sets, reverse in ((up, parents, False), (down, children, True)):
            readable = {home} | reach({home}, sets)
            local = defaultdict(set)
            for a, b in zip(src.tolist(), dst.tolist()):
                if set_by_rid[b] in readable if not reverse else set_by_rid[a] in readable:
                    if reverse:
                        local[a].add(b)
                    else:
                        local[b].add(a)
            assert reach({row}, local) == reach({row}, step)


def test_a_dimension_hub_becomes_its_own_split():
    """Every order joins one of two customers: one giant component, cut at the customers."""
    orders = np.arange(1, 101, dtype=np.int64)
    outputs = orders + 1000
    customers = np.array([5000, 5001], dtype=np.int64)
    src = np.concatenate([orders, customers[orders % 2]])
    dst = np.concatenate([outputs, outputs])
    dataset = {**dict.fromkeys(orders.tolist(), "orders"), **dict.fromkeys(outputs.tolist(), "sink"),
               **dict.fromkeys(customers.tolist(), "customers")}
    rids, set_of = connected_sets(src, dst, dataset, threshold=10)
    set_by_rid = dict(zip(rids.tolist(), set_of.tolist()))
    assert set_by_rid[5000] == 5000 and set_by_rid[5001] == 5001
    assert all(set_by_rid[o] == set_by_rid[o + 1000] == o for o in orders.tolist())
    assert len(set_dependencies(src, dst, rids, set_of)) == 100  # each output's set from its customer's


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("cut", [frozenset(), frozenset({("customers", "state:join")})])
def test_sets_kept_up_as_edges_arrive_hold_every_lineage(seed, cut):
    """Edges in random writes, a restart from what the store recorded halfway: files are never
    rewritten, yet a row's set, its aliases and the dependencies still lead to all its lineage."""
    from headwater.indexer.set_index import SetIndex

    src, dst, dataset = random_lineage(seed)
    rng = random.Random(seed)
    order = list(range(len(src)))
    rng.shuffle(order)
    index = SetIndex(cut)
    stored, rows, aliases, deps = [], [], [], set()  # what the store recorded
    at, restarted = 0, False
    while at < len(order):
        chosen = order[at: at + rng.randint(1, 60)]
        at += len(chosen)
        s, d = src[chosen], dst[chosen]
        got = index.add(s, d, [dataset[r] for r in s.tolist()], [dataset[r] for r in d.tolist()])
        stored += list(zip(s.tolist(), d.tolist(), got.dst_set.tolist()))
        rows += got.rows
        aliases += got.aliases
        deps |= got.dependencies
        assert all(index.find(r) == x for r, x in zip(d.tolist(), got.dst_set.tolist()))
        if at > len(order) // 2 and not restarted:
            index, restarted = SetIndex.restore(rows, aliases, cut), True  # the indexer restarted

    first_set = dict(rows)
    assert set(first_set) == set(src.tolist()) | set(dst.tolist())
    members = SetIndex.members(aliases, index.resolve)
    parents, children = defaultdict(set), defaultdict(set)
    for a, b in deps:
        parents[index.resolve(b)].add(index.resolve(a))
        children[index.resolve(a)].add(index.resolve(b))
    up, down = defaultdict(set), defaultdict(set)
    for a, b in zip(src.tolist(), dst.tolist()):
        up[b].add(a)
        down[a].add(b)
    for row in rng.sample(sorted(first_set), 20):
        home = index.resolve(first_set[row])
        for step, sets, forward in ((up, parents, False), (down, children, True)):
            readable = {home} | reach({home}, sets)
            ids = set().union(*[members.get(s, set()) | {s} for s in readable])
            local = defaultdict(set)
            for a, b, written_under in stored:  # only the files of those sets are read
                if written_under in ids:
                    (local[a].add(b) if forward else local[b].add(a))
            assert reach({row}, local) == reach({row}, step)
