"""Indexing into a black box's node: the graph write's time per write as the node gains edges.

A black box batch of ``n`` rows is written into the local graph server the way the indexer writes it,
in writes of ``--step`` rows: each write has that many Kafka records entering the black box's node (a
state node, gaining an edge from every row entering it), the node's edges to as many output rows of the
box, and theirs to sink rows. The edges into the node are merged from their src
(``graph.MERGE_EDGES_FROM_SRC``); the baseline, in the same run under another query name, merges them
from the node (``graph.MERGE_EDGES_FROM_DST``, as before), which scans every edge the node has so far.
Then the first write again: a replay adds no edge. Prints one JSON line: each write's seconds,
``growth`` (the last write's time over the second's: 1 when the cost per write stays flat), the edges
counted in the graph against those expected.

    .venv/bin/python bench/graph_hub_writes.py [--rows 100000] [--step 10000] [--baseline-rows 8000]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from headwater.core.schema import EDGE_SCHEMA, NODE_SCHEMA
from headwater.store import graph

GROWTH_BAR = 2.0  # the last write over the second: merged from the node, 8,000 rows in 4 writes already grow 2.6×
BOX = 7  # the black box node's rid
SOURCE, BOX_OUTPUT, OUTPUT = 10**12, 2 * 10**12, 3 * 10**12  # rid ranges of the records, box outputs, sink rows


def _nodes(rid: np.ndarray, kind: str, dataset: str, query=None, batch=None, **values) -> pa.Table:
    k = len(rid)
    columns = {"rid": pa.array(rid, pa.int64()), "kind": pa.array([kind] * k), "dataset": pa.array([dataset] * k),
               "query": pa.array([query] * k, pa.string()), "batch": pa.array([batch] * k, pa.int64()), **values}
    return pa.table([columns[f.name] if f.name in columns else pa.nulls(k, f.type) for f in NODE_SCHEMA],
                    schema=NODE_SCHEMA)


def _edges(src: np.ndarray, dst: np.ndarray, query: str, batch: int, op: int, exact: bool) -> pa.Table:
    k = len(src)
    return pa.table([pa.array(src, pa.int64()), pa.array(dst, pa.int64()), pa.array([query] * k),
                     pa.array([batch] * k, pa.int64()), pa.array([op] * k, pa.int32()), pa.array([exact] * k),
                     pa.array([0] * k, pa.int64())], schema=EDGE_SCHEMA)


def black_box_write(lo: int, hi: int, query: str = "q", batch: int = 0, base: int = 0) -> tuple[pa.Table, pa.Table]:
    """Rows ``lo`` to ``hi`` of one black box batch as the indexer writes them: (nodes, edges), 3 edges a row;
    every rid moved by ``base`` (a graph other writers share)."""
    index = np.arange(lo, hi, dtype=np.int64)
    records, outs, sink = index + SOURCE + base, index + BOX_OUTPUT + base, index + OUTPUT + base
    box = np.full(len(index), BOX + base, dtype=np.int64)
    nodes = pa.concat_tables([
        _nodes(records, "source", "kafka:t", topic=pa.array(["t"] * len(index)),
               partition=pa.array([0] * len(index), pa.int32()), offset=pa.array(index)),
        _nodes(box[:1], "state", "box"),
        _nodes(outs, "state", "box", query, batch),
        _nodes(sink, "output", "sink", query, batch),
    ])
    edges = pa.concat_tables([_edges(records, box, query, batch, 1, False), _edges(box, outs, query, batch, 2, False),
                              _edges(outs, sink, query, batch, 3, True)])
    return nodes, edges


def edge_count(writer: graph.GraphWriter, query: str) -> int:
    with writer._session() as s:
        return s.run("MATCH ()-[e:DERIVED]->() WHERE e.query = $q RETURN count(e) AS c", q=query).single()["c"]


def writes(config, rows: int, step: int, query: str) -> dict:
    """Write ``rows`` rows in writes of ``step``, then the first write again; each write's seconds and the
    edges the graph then holds for ``query``."""
    writer = graph.GraphWriter(config)
    try:
        writer.ensure_schema()
        seconds = []
        for lo in range(0, rows, step):
            nodes, edges = black_box_write(lo, min(rows, lo + step), query)
            started = time.perf_counter()
            writer.write_lineage(nodes, edges)
            seconds.append(round(time.perf_counter() - started, 2))
            print(json.dumps({"query": query, "rows": lo + step, "s": seconds[-1]}), file=sys.stderr)
        nodes, edges = black_box_write(0, min(rows, step), query)
        started = time.perf_counter()
        writer.write_lineage(nodes, edges)
        replay = round(time.perf_counter() - started, 2)
        return {"rows": rows, "step": step, "seconds": seconds, "replay_s": replay,
                "growth": round(seconds[-1] / seconds[min(1, len(seconds) - 1)], 2),
                "edges": edge_count(writer, query), "edges_expected": 3 * rows}
    finally:
        writer.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--step", type=int, default=10_000)
    parser.add_argument("--baseline-rows", type=int, default=8_000)
    parser.add_argument("--baseline-step", type=int, default=2_000)
    args = parser.parse_args()
    from headwater.deploy.stack import Stack, free_port

    with tempfile.TemporaryDirectory(prefix="hub-writes-") as tmp:
        stack = Stack(Path(tmp) / "home", ports={name: free_port() for name in ("broker", "bolt", "graph_http",
                                                                                "query")})
        stack.up()
        try:
            config = stack.config()
            kept = graph.MERGE_EDGES_FROM_SRC
            graph.MERGE_EDGES_FROM_SRC = graph.MERGE_EDGES_FROM_DST  # the baseline: merged from the node
            try:
                baseline = writes(config, args.baseline_rows, args.baseline_step, "baseline")
            finally:
                graph.MERGE_EDGES_FROM_SRC = kept
            same = writes(config, args.baseline_rows, args.baseline_step, "from_src_small")
            large = writes(config, args.rows, args.step, "from_src")
        finally:
            stack.down()
    exact = all(r["edges"] == r["edges_expected"] for r in (baseline, same, large))
    print(json.dumps({"bench": "graph_hub_writes", "from_src": large, "from_src_at_baseline_size": same,
                      "baseline_from_node": baseline,
                      "speedup_at_baseline_size": round(sum(baseline["seconds"]) / sum(same["seconds"]), 1),
                      "edges_exact": exact, "passed": exact and large["growth"] <= GROWTH_BAR}))
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
