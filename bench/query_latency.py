"""Lineage query latency: every backend on lineage graphs of 1M and 10M edges of realistic shape.

For each size, ``bench.workload``'s lineage (orders joined with a static customers table,
and aggregations of fan-in 1 to 1,000 over the same orders) goes into the graph (the
indexer's ``GraphWriter``) and into two shards of the Parquet store, which are compacted
(local Spark) once 99% of it has arrived: the rest stays in the shards, as a running
indexer's store has recent ranges a compaction has not taken yet.

Then ``--queries`` lineage questions, the same for every backend: half backward from
random output rows to the sources, half forward from random source rows (one in twenty
a customers row, a hub) to the outputs, at depths drawn from 1, 2, 3, 4, 8 and 16. Each
backend is one long-lived client, as in ``headwater serve``. A backend stops early when
it has spent ``--budget-s`` on a size (the recursive baseline, RQ, scans the whole store
at every level of every query); its figures then cover the questions it answered. Every
question answered by several backends must get the same answer from each, or the bench
fails.

Figures per size and backend, by direction: ``p50_ms``, ``p99_ms``, ``mean_ms``,
``queries``. ``csprov_speedup_vs_rq``: RQ's median over CSProv's on the questions both
answered; ``csprov_speedup_vs_rq_large``: the same on those whose answer has at least
100 rows (large components). One JSON line per size; the last line is the summary of the
largest size, with every size's figures under ``sizes``.

    .venv/bin/python bench/query_latency.py [--sizes 1000000,10000000] [--queries 1000] [--budget-s 300]
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.workload import lineage_messages  # noqa: E402

DEPTHS = (1, 2, 3, 4, 8, 16)
TOPIC = "bench.edges"
LARGE = 100  # answer rows from which a question counts as one over a large component


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def build(size: int, store_dir: Path, config, spark, graph: bool) -> dict:
    """The size's lineage into the graph and the store; the rows to ask about."""
    from headwater.core.schema import concat_lineage
    from headwater.indexer.compaction import compact
    from headwater.indexer.graph import GraphWriter
    from headwater.indexer.shard import Shard, shard_root

    messages = list(lineage_messages(size, seed=size, edges_per_message=5000, prefix=f"s{size}-"))
    outputs, orders, customers = [], [], []
    for nodes, _ in messages:
        for rid, kind, dataset in zip(*(nodes[c].to_pylist() for c in ("rid", "kind", "dataset"))):
            if kind == "output":
                outputs.append(rid)
            elif dataset == "kafka:orders":
                orders.append(rid)
            elif kind == "source":
                customers.append(rid)
    figures = {"edges": sum(e.num_rows for _, e in messages)}

    started = time.monotonic()
    shards = [Shard(shard_root(store_dir, TOPIC, p), TOPIC, p).open() for p in range(2)]
    cut = int(len(messages) * 0.99)
    for i in range(0, len(messages), 6):
        if i <= cut < i + 6:
            manifest = compact(spark, store_dir, TOPIC, say=say)
            figures.update(compaction_seconds=manifest["seconds"], sets=manifest["sets"],
                           largest_set=manifest["largest_set"])
        shard = shards[(i // 6) % 2]
        shard.write(*concat_lineage(messages[i: i + 6]), shard.resume, shard.resume)
    figures["store_seconds"] = round(time.monotonic() - started, 1)
    say(f"{size}: store written and compacted in {figures['store_seconds']}s")

    if graph:
        started = time.monotonic()
        writer = GraphWriter(config)
        try:
            writer.ensure_schema()
            for i in range(0, len(messages), 6):
                writer.write_lineage(*concat_lineage(messages[i: i + 6]))
                if i % 300 == 0:
                    say(f"{size}: graph {i}/{len(messages)} messages ({time.monotonic() - started:.0f}s)")
        finally:
            writer.close()
        figures["graph_seconds"] = round(time.monotonic() - started, 1)
    # Hubs: the customers rows recur in every message; each once.
    return figures, outputs, orders, sorted(set(customers))


def questions(n: int, outputs: list[int], orders: list[int], customers: list[int], seed: int) -> list[tuple]:
    rng = random.Random(seed)
    asked = []
    for i in range(n):
        depth = rng.choice(DEPTHS)
        if i % 2 == 0:
            asked.append(("backward", rng.choice(outputs), "source", depth))
        else:
            pool = customers if rng.random() < 0.05 else orders
            asked.append(("forward", rng.choice(pool), "output", depth))
    return asked


def summary(answer) -> list[tuple]:
    return sorted((x.rid, x.cols, x.exact, tuple(x.ops), tuple(x.batches)) for x in answer)


def run_backend(backend, asked: list[tuple], budget_s: float) -> dict[int, tuple[float, list]]:
    """Seconds and answer of each question answered, by its index, until the budget is spent."""
    done = {}
    started = time.monotonic()
    for i, (direction, rid, to, depth) in enumerate(asked):
        if time.monotonic() - started > budget_s:
            break
        t = time.perf_counter()
        answer = getattr(backend, direction)(rid, to=to, depth=depth)
        done[i] = (time.perf_counter() - t, summary(answer))
    return done


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def figures_of(done: dict, asked: list[tuple]) -> dict:
    found = {}
    for direction in ("backward", "forward"):
        ms = [done[i][0] * 1000 for i in done if asked[i][0] == direction]
        if ms:
            found[direction] = {"p50_ms": round(statistics.median(ms), 2), "p99_ms": round(percentile(ms, 0.99), 2),
                                "mean_ms": round(statistics.fmean(ms), 2), "queries": len(ms)}
    return found


def speedup(fast: dict, slow: dict, only=None) -> float | None:
    both = [i for i in fast if i in slow and (only is None or only(i))]
    if not both:
        return None
    return round(statistics.median(slow[i][0] for i in both) / statistics.median(fast[i][0] for i in both), 1)


def measure(size: int, home: Path, config, spark, args) -> dict:
    from headwater.query.cypher import CypherBackend
    from headwater.query.parquet import CSProvBackend, RecursiveBackend, StoreView

    store_dir = home / f"store-{size}"
    figures, outputs, orders, customers = build(size, store_dir, config, spark, not args.skip_graph)
    asked = questions(args.queries, outputs, orders, customers, seed=size)
    config = config.with_overrides(store_dir=str(store_dir), edges_topic=TOPIC)
    started = time.monotonic()
    view = StoreView(store_dir, TOPIC)
    figures["store_open_ms"] = round((time.monotonic() - started) * 1000, 1)
    backends = {"csprov": lambda: CSProvBackend(config, view), "rq": lambda: RecursiveBackend(config, view)}
    if not args.skip_graph:
        backends["cypher"] = lambda: CypherBackend(config)
    done = {}
    for name, make in backends.items():
        backend = make()
        try:
            done[name] = run_backend(backend, asked, args.budget_s)
        finally:
            backend.close()
        figures[name] = figures_of(done[name], asked)
        say(f"{size}: {name} {json.dumps(figures[name])}")
    for name, answers in done.items():
        for i, (_, answer) in answers.items():
            if answer != done["csprov"][i][1]:
                raise SystemExit(f"{name} and csprov disagree on question {i}: {asked[i]}")
    figures["csprov_speedup_vs_rq"] = speedup(done["csprov"], done["rq"])
    figures["csprov_speedup_vs_rq_large"] = speedup(done["csprov"], done["rq"],
                                                    lambda i: len(done["csprov"][i][1]) >= LARGE)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000000,10000000", help="edges of each lineage graph, comma-separated")
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--budget-s", type=float, default=300.0, help="most seconds a backend spends on one size")
    parser.add_argument("--skip-graph", action="store_true", help="the Parquet backends only (no graph server)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the stack below is stopped

    from headwater.demo.run import spark_session
    from headwater.deploy.stack import Stack, free_port

    sizes = [int(s) for s in args.sizes.split(",")]
    results = {}
    with tempfile.TemporaryDirectory(prefix="query-bench-") as tmp:
        home = Path(tmp)
        stack = None
        if not args.skip_graph:
            stack = Stack(home / "stack", ports={"broker": free_port(), "bolt": free_port(), "graph_http": free_port()})
            stack.up()
        spark = spark_session("headwater-bench-queries", **{"spark.driver.memory": "6g"})
        try:
            from headwater.core.config import Config
            config = stack.config() if stack else Config()
            for size in sizes:
                results[size] = measure(size, home, config, spark, args)
                print(json.dumps({"bench": "query_latency", "size": size, **results[size]}), flush=True)
        finally:
            spark.stop()
            if stack is not None:
                stack.down()
    largest = results[max(sizes)]
    backward = {name: largest[name]["backward"] for name in ("csprov", "rq", "cypher")
                if name in largest and "backward" in largest[name]}
    best = min(backward, key=lambda name: backward[name]["p50_ms"])
    print(json.dumps({
        "bench": "query_latency", "edges": largest["edges"], "queries": args.queries,
        "best_backend": best, "best_backward_p50_ms": backward[best]["p50_ms"],
        "best_backward_p99_ms": backward[best]["p99_ms"],
        "csprov_speedup_vs_rq": largest["csprov_speedup_vs_rq"],
        "csprov_speedup_vs_rq_large": largest["csprov_speedup_vs_rq_large"],
        **{name: largest[name] for name in ("csprov", "rq", "cypher") if name in largest},
        "sizes": {str(size): figures for size, figures in results.items()},
    }))


if __name__ == "__main__":
    main()
