"""Every lineage backend against a brute-force oracle that enumerates paths, on random multi-level pipelines.

The same messages go into the graph (the indexer's ``GraphWriter``) and into two shards
of the Parquet store; half of them are compacted into a generation before the rest
arrive, so the Parquet backends read a generation and the shards' recent ranges at once.
"""

from __future__ import annotations

import random
import uuid
from collections import defaultdict

import numpy as np
import pyarrow as pa
import pytest

from bench.workload import _edges, _nodes
from headwater.indexer.compaction import compact
from headwater.indexer.graph import GraphWriter
from headwater.indexer.shard import Shard, shard_root
from headwater.query.backend import LineageError
from headwater.query.cypher import CypherBackend
from headwater.query.parquet import CSProvBackend, RecursiveBackend, StoreView
from headwater.query.walk import is_target


def pipeline(seed: int, batches: int, tag: str):
    """Messages of three chained queries, one per batch and query, with their edges and rows.

    ``tag.enrich``: orders (Kafka) joined with customers (static, hubs), 1:1;
    ``tag.totals``: enrich's rows aggregated (fan-in 1 to 40, some inexact: a black box);
    ``tag.alerts``: totals' rows through a state row of each batch (many to one to many).
    """
    rng = np.random.default_rng(seed)
    ids = iter(rng.permutation(np.unique(rng.integers(-(1 << 62), 1 << 62, 20_000))).tolist())
    customers = [next(ids) for _ in range(12)]
    messages, rows = [], {}
    offset = 0

    def node(rid_list, kind, dataset, **values):
        table = _nodes(rid_list, kind, dataset, **values)
        rows.update({r: (kind, dataset) for r in rid_list})
        return table

    def edges(src, dst, query, batch, op, cols, exact=None):
        table = _edges(src, dst, query, batch, op, 0)
        table = table.set_column(6, "cols", pa.array(cols, pa.int64()))
        if exact is not None:
            table = table.set_column(5, "exact", pa.array(exact))
        return table

    for batch in range(batches):
        n = int(rng.integers(5, 30))
        orders = [next(ids) for _ in range(n)]
        offsets = list(range(offset, offset + n))
        offset += n
        which = rng.integers(0, len(customers), n)
        joined = [next(ids) for _ in range(n)]
        q = f"{tag}.enrich"
        messages.append((pa.concat_tables([
            node(orders, "source", f"{tag}:orders", topic=[f"{tag}-orders"] * n, partition=[0] * n, offset=offsets),
            node([customers[i] for i in sorted(set(which.tolist()))], "source", f"{tag}:customers",
                 key=[f"c{i}" for i in sorted(set(which.tolist()))]),
            node(joined, "output", q, query=[q] * n, batch=[batch] * n)]),
            pa.concat_tables([edges(orders, joined, q, batch, 1, rng.integers(1, 8, n)),
                              edges([customers[i] for i in which], joined, q, batch, 2, rng.integers(1, 8, n))])))
        # totals: groups of the enrich rows of this batch and the one before
        pool = joined + (messages[-4][0]["rid"].to_pylist()[-5:] if batch else [])
        rng.shuffle(pool)
        q = f"{tag}.totals"
        src, dst, outs = [], [], []
        while pool:
            take = int(min(len(pool), rng.integers(1, 40)))
            group, pool = pool[:take], pool[take:]
            outs.append(next(ids))
            src += group
            dst += [outs[-1]] * len(group)
        exact = (rng.random(len(src)) < 0.85).tolist()
        messages.append((pa.concat_tables([
            node(outs, "output", q, query=[q] * len(outs), batch=[batch] * len(outs)),
            _nodes(sorted(set(src)), "output", f"{tag}.enrich")]),
            edges(src, dst, q, batch, 3, rng.integers(1, 4, len(src)), exact)))
        # alerts: every totals row into the batch's state row, which feeds each alert
        state, alerts = next(ids), [next(ids) for _ in range(int(rng.integers(1, 4)))]
        q = f"{tag}.alerts"
        messages.append((pa.concat_tables([
            node([state], "state", f"{tag}:state"), node(alerts, "output", q, query=[q] * len(alerts),
                                                        batch=[batch] * len(alerts)),
            _nodes(outs, "output", f"{tag}.totals")]),
            pa.concat_tables([edges(outs, [state] * len(outs), q, batch, 4, [1] * len(outs)),
                              edges([state] * len(alerts), alerts, q, batch, 5, rng.integers(1, 16, len(alerts)))])))
    return messages, rows


def oracle(produced: list[dict], rows: dict, rid: int, to: str, depth: int, backward: bool) -> list[dict]:
    """Every path of 1..depth edges, enumerated one by one, aggregated per target row."""
    near, far = ("dst", "src") if backward else ("src", "dst")
    adjacent = defaultdict(list)
    for e in produced:
        adjacent[e[near]].append(e)
    found: dict[int, dict] = {}

    def follow(at: int, path: list[dict]) -> None:
        if len(path) == depth:
            return
        for e in adjacent[at]:
            longer = path + [e]
            end = e[far]
            kind, dataset = rows[end]
            if is_target(to, kind, dataset):
                downstream = longer[0] if backward else longer[-1]
                item = found.setdefault(end, {"cols": 0, "exact": True, "ops": set(), "batches": set()})
                item["cols"] |= downstream["cols"]
                item["exact"] = item["exact"] and all(x["exact"] for x in longer)
                item["ops"] |= {x["op"] for x in longer}
                item["batches"] |= {x["batch"] for x in longer}
            follow(end, longer)

    follow(rid, [])
    return sorted(({"rid": r, "cols": v["cols"], "exact": v["exact"], "ops": sorted(v["ops"]),
                    "batches": sorted(v["batches"])} for r, v in found.items()), key=lambda x: x["rid"])


def summary(answer) -> list[dict]:
    return sorted(({"rid": x.rid, "cols": x.cols, "exact": x.exact, "ops": x.ops, "batches": x.batches}
                   for x in answer), key=lambda x: x["rid"])


@pytest.mark.spark
@pytest.mark.stack
def test_every_backend_gives_the_oracles_lineage(spark, stack_config, tmp_path):
    tag = "q" + uuid.uuid4().hex[:6]
    config = stack_config.with_overrides(store_dir=str(tmp_path), edges_topic=f"{tag}.edges")
    messages, rows = pipeline(seed=3, batches=8, tag=tag)
    writer = GraphWriter(config)
    shards = [Shard(shard_root(tmp_path, config.edges_topic, p), config.edges_topic, p).open() for p in range(2)]
    produced = []
    try:
        writer.ensure_schema()
        for i, (nodes, edges) in enumerate(messages):
            writer.write_lineage(nodes, edges)
            shard = shards[i % 2]
            shard.write(nodes, edges, shard.resume, shard.resume)
            produced += edges.to_pylist()
            if i == len(messages) // 2:
                compact(spark, tmp_path, config.edges_topic, threshold=30, buckets=4)
    finally:
        writer.close()
    view = StoreView(tmp_path, config.edges_topic)
    assert view.generation is not None and 0 < view.recent_edges.num_rows < len(produced)
    backends = {"cypher": CypherBackend(config), "csprov": CSProvBackend(config, view),
                "rq": RecursiveBackend(config, view)}
    rng = random.Random(3)
    by_kind = defaultdict(list)
    for rid, (kind, dataset) in rows.items():
        by_kind[dataset.split(":")[-1].split(".")[-1]].append(rid)
    asked = 0
    try:
        for _ in range(30):
            start = rng.choice(by_kind[rng.choice(["alerts", "totals", "enrich", "state"])])
            to = rng.choice(["source", "state", f"{tag}:orders", f"{tag}.enrich"])
            depth = rng.choice([1, 2, 3, 16])
            expected = oracle(produced, rows, start, to, depth, True)
            for name, backend in backends.items():
                assert summary(backend.backward(start, to=to, depth=depth)) == expected, (name, start, to, depth)
            asked += bool(expected)
            source = rng.choice(by_kind[rng.choice(["orders", "customers", "enrich"])])
            to = rng.choice(["output", f"{tag}.alerts", "state"])
            expected = oracle(produced, rows, source, to, depth, False)
            answers = {name: backend.forward(source, to=to, depth=depth) for name, backend in backends.items()}
            for name, got in answers.items():
                assert summary(got) == expected, (name, source, to, depth)
            assert [x.to_dict() for x in answers["csprov"]] == [x.to_dict() for x in answers["cypher"]]
            asked += bool(expected)
        assert asked > 30  # most questions had an answer
        for backend in backends.values():
            with pytest.raises(LineageError, match="not in the lineage"):
                backend.backward(12345, depth=3)
            with pytest.raises(LineageError, match="depth"):
                backend.backward(start, depth=0)
    finally:
        for backend in backends.values():
            backend.close()
