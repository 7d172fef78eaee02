"""Lineage query latency: every backend on lineage graphs of 1M, 10M and 100M edges of realistic shape.

For each size, ``bench.workload``'s lineage (orders joined with a static customers table,
and aggregations of fan-in 1 to 1,000 over the same orders) goes into two shards of the
Parquet store, which are compacted (local Spark) once 99% of it has arrived: the rest
stays in the shards, as a running indexer's store has recent ranges a compaction has not
taken yet; from ``--compact-below`` edges (20M) on, the store is not compacted at all (a
compaction of 100M edges does not fit this box's session), and the Parquet backends read it
all as recent ranges: there they are the cross-check of the graph's answers, not contenders.
Into the graph (Neo4j, the local stack's) it goes by the indexer's ``GraphWriter`` below
``--import-from`` edges (20M); at and above, where the indexer would take hours, by **bulk
import** (``bench.graph_import``: Neo4j's own ``neo4j-admin database import full`` from CSV
files written as the indexer writes the graph, before the server's first start; then the
indexer's constraints and indexes, awaited online). ``graph_build`` says which; the lineage
is generated afresh for each use, never held whole in memory.

Then ``--queries`` lineage questions, the same for every backend: half backward from
random output rows to the sources, half forward from random source rows (one in twenty
a customers row, a hub) to the outputs, at depths drawn from 1, 2, 3, 4, 8 and 16. Each
backend is one long-lived client, as in ``headwater serve``, and answers ``--warmup``
questions of its own first, not counted (a fresh graph server compiles its plans on the
first ones: p99s ran to 900 ms on 100 questions without). A backend stops early when
it has spent ``--budget-s`` on a size (the recursive baseline, RQ, scans the whole store
at every level of every query); its figures then cover the questions it answered. Every
question answered by several backends must get the same answer from each, or the bench
fails (``compared``: the questions at least two backends answered). The whole graph is read once
(``headwater.adapters.graph.warm_up``, ``graph_warm_seconds``) before the Cypher backend's questions, as ``headwater
serve`` does at start, into a page cache that holds the store where ``--graph-page-cache`` is its size (Neo4j's
advice); with ``--cold-graph`` not: a question then reads from disk what the Parquet backends' and the compaction's
reads pushed out of the machine's file cache.

Figures per size and backend: ``backward``, ``forward`` and ``forward_from_hubs`` (the
hub questions of ``forward``), each ``p50_ms``, ``p99_ms``, ``mean_ms``, ``queries``.
``csprov_speedup_vs_rq``: RQ's median over CSProv's on the questions both answered;
``csprov_speedup_vs_rq_large``: the same on those whose answer has at least 100 rows
(large components). One JSON line per size; the last line is the summary of the largest
size, with every size's figures under ``sizes``.

    .venv/bin/python bench/query_latency.py [--sizes 1000000,10000000,100000000] [--queries 1000]
        [--warmup 20] [--budget-s 300] [--import-from 20000000] [--compact-below 20000000]
        [--components large-star|graphx] [--graph-page-cache 4g] [--cold-graph] [--skip-graph] [--s3]

``--s3``: the lineage tables in a real S3 server (SeaweedFS, started by the bench on 127.0.0.1), read by the
Parquet backends through pyarrow's S3 filesystem, as a query service reads a bucket.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.workload import lineage_messages  # noqa: E402

DEPTHS = (1, 2, 3, 4, 8, 16)
TOPIC = "bench.edges"
LARGE = 100  # answer rows from which a question counts as one over a large component


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def messages_of(size: int):
    """The size's lineage, afresh each call (the same messages every time)."""
    return lambda: lineage_messages(size, seed=size, edges_per_message=5000, prefix=f"s{size}-")


def writes_of(size: int, per_write: int = 6):
    """The size's lineage as writes of ``per_write`` messages each (the last may hold fewer), concatenated."""
    from headwater.core.schema import concat_lineage

    messages = iter(messages_of(size)())
    while group := list(itertools.islice(messages, per_write)):
        yield concat_lineage(group)


def pools(messages) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows to ask about: output rows, orders rows, and the customers rows (hubs: in every enrich message)."""
    outputs, orders, customers = [], [], []
    for nodes, _ in messages():
        kind, dataset = nodes["kind"], nodes["dataset"]
        outputs.append(nodes.filter(pc.equal(kind, "output"))["rid"].to_numpy())
        orders.append(nodes.filter(pc.equal(dataset, "kafka:orders"))["rid"].to_numpy())
        customers.append(nodes.filter(pc.equal(dataset, "customers"))["rid"].to_numpy())
    return np.concatenate(outputs), np.concatenate(orders), np.unique(np.concatenate(customers))


def build_store(size: int, store_dir: str, spark, args) -> dict:
    """The size's lineage into two shards of the lineage tables, compacted once 99% has arrived."""
    from headwater.indexer.compaction import compact
    from headwater.indexer.shard import Shard

    started = time.monotonic()
    figures: dict = {}
    shards = [Shard(store_dir, TOPIC, p).open() for p in range(2)]
    written = 0
    for i, (nodes, edges) in enumerate(writes_of(size)):
        if size < args.compact_below and written < 0.99 * size <= written + edges.num_rows:
            manifest = compact(spark, store_dir, TOPIC, say=say, components=args.components)
            figures.update(compaction_seconds=manifest["seconds"], sets=manifest["sets"],
                           largest_set=manifest["largest_set"], components=manifest["components"])
        shard = shards[i % 2]
        shard.write(nodes, edges, shard.resume, shard.resume)
        written += edges.num_rows
    figures["edges"] = written
    figures["store_seconds"] = round(time.monotonic() - started, 1)
    say(f"{size}: store written{' and compacted' if 'compaction_seconds' in figures else ''} in "
        f"{figures['store_seconds']}s")
    return figures


def write_graph(size: int, config) -> float:
    """The size's lineage into the running graph by the indexer's ``GraphWriter``; its seconds."""
    from headwater.store.graph import GraphWriter

    started = time.monotonic()
    writer = GraphWriter(config)
    try:
        writer.ensure_schema()
        for i, write in enumerate(writes_of(size)):
            writer.write_lineage(*write)
            if i % 50 == 0:
                say(f"{size}: graph {i} writes ({time.monotonic() - started:.0f}s)")
    finally:
        writer.close()
    return round(time.monotonic() - started, 1)


def import_graph(sizes: list[int], stack, folder: Path) -> dict:
    """Bulk import (``bench.graph_import``: Neo4j's own ``neo4j-admin database import full``, not the indexer)
    of the lineage of ``sizes`` into the stack's graph server before its first start; its figures."""
    from bench.graph_import import write_csv
    from headwater.deploy import tools
    from headwater.deploy.stack import graph_server

    started = time.monotonic()
    files = write_csv(lambda: itertools.chain.from_iterable(messages_of(size)() for size in sizes), folder, say)
    csv_seconds = time.monotonic() - started
    say(f"import CSV of {sizes}: {files['edges']:,} edges, {files['rows']:,} rows in {csv_seconds:.0f}s")
    report = graph_server(stack.home, stack.requested_ports).import_full(tools.neo4j(), files["nodes"],
                                                                         files["relationships"])
    say(report)
    for path in folder.glob("*.csv"):
        path.unlink()
    return {"graph_build": "neo4j-admin database import full", "graph_csv_seconds": round(csv_seconds, 1),
            "graph_import_seconds": round(time.monotonic() - started - csv_seconds, 1)}


def await_schema(config) -> float:
    """The indexer's constraints and indexes made on the graph and online; their seconds."""
    from headwater.adapters.graph import driver
    from headwater.store.graph import GraphWriter

    started = time.monotonic()
    writer = GraphWriter(config)
    try:
        writer.ensure_schema()
    finally:
        writer.close()
    with driver(config) as d, d.session(database=config.graph_database) as session:
        session.run("CALL db.awaitIndexes(7200)").consume()
    return round(time.monotonic() - started, 1)


def questions(n: int, outputs: np.ndarray, orders: np.ndarray, customers: np.ndarray, seed: int) -> list[tuple]:
    """``(direction, rid, to, depth, hub)``: half backward from output rows, half forward from source rows,
    one in twenty of those a customers row (a hub)."""
    rng = random.Random(seed)
    asked = []
    for i in range(n):
        depth = rng.choice(DEPTHS)
        if i % 2 == 0:
            asked.append(("backward", int(outputs[rng.randrange(len(outputs))]), "source", depth, False))
        else:
            hub = rng.random() < 0.05
            pool = customers if hub else orders
            asked.append(("forward", int(pool[rng.randrange(len(pool))]), "output", depth, hub))
    return asked


def summary(answer) -> list[tuple]:
    return sorted((x.rid, x.cols, x.exact, tuple(x.ops), tuple(x.batches)) for x in answer)


def run_backend(backend, asked: list[tuple], budget_s: float) -> dict[int, tuple[float, list]]:
    """Seconds and answer of each question answered, by its index, until the budget is spent."""
    done = {}
    started = time.monotonic()
    for i, (direction, rid, to, depth, _) in enumerate(asked):
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
    kinds = {"backward": lambda q: q[0] == "backward", "forward": lambda q: q[0] == "forward",
             "forward_from_hubs": lambda q: q[0] == "forward" and q[4]}
    for kind, chosen in kinds.items():
        ms = [done[i][0] * 1000 for i in done if chosen(asked[i])]
        if ms:
            found[kind] = {"p50_ms": round(statistics.median(ms), 2), "p99_ms": round(percentile(ms, 0.99), 2),
                                "mean_ms": round(statistics.fmean(ms), 2), "queries": len(ms)}
    return found


def speedup(fast: dict, slow: dict, only=None) -> float | None:
    both = [i for i in fast if i in slow and (only is None or only(i))]
    if not both:
        return None
    return round(statistics.median(slow[i][0] for i in both) / statistics.median(fast[i][0] for i in both), 1)


def compare(done: dict[str, dict], asked: list[tuple]) -> int:
    """Fails the bench if two backends answered a question differently; the questions at least two answered
    (a backend out of budget answered only the first ones)."""
    compared = 0
    for i in range(len(asked)):
        answers = {name: found[i][1] for name, found in done.items() if i in found}
        if not answers:
            continue
        (first, answer), *others = answers.items()
        for name, other in others:
            if other != answer:
                raise SystemExit(f"{name} and {first} disagree on question {i}: {asked[i]}")
        compared += bool(others)
    return compared


def measure(size: int, home: Path, config, spark, args, s3=None) -> dict:
    from headwater.adapters.graph import warm_up
    from headwater.query.cypher import CypherBackend
    from headwater.query.parquet import CSProvBackend, RecursiveBackend, StoreView

    store_dir = s3.uri(f"store-{size}") if s3 is not None else str(home / f"store-{size}")
    outputs, orders, customers = pools(messages_of(size))
    figures = build_store(size, store_dir, spark, args)
    if not args.skip_graph and size < args.import_from:
        figures.update(graph_build="indexer", graph_seconds=write_graph(size, config))
    asked = questions(args.queries, outputs, orders, customers, seed=size)
    config = config.with_overrides(store_dir=str(store_dir), edges_topic=TOPIC)
    started = time.monotonic()
    view = StoreView(store_dir, TOPIC)
    figures["store_open_ms"] = round((time.monotonic() - started) * 1000, 1)
    backends = {"csprov": lambda: CSProvBackend(config, view), "rq": lambda: RecursiveBackend(config, view)}
    if not args.skip_graph:
        backends["cypher"] = lambda: CypherBackend(config)
    done = {}
    warmup = questions(args.warmup, outputs, orders, customers, seed=size + 1)
    del outputs, orders
    for name, make in backends.items():
        if name == "cypher" and not args.cold_graph:
            figures["graph_warm_seconds"] = round(warm_up(config), 1)
        backend = make()
        try:
            run_backend(backend, warmup, args.budget_s)  # plans compiled, caches filled: not counted
            # What the bench holds (the earlier backends' answers, for compare) is frozen out of Python's
            # collector: each full collection walked it all and was charged to whichever question set it off
            # (a hub's forward question on 10M edges, 5M objects held: p50 162 ms, against 69 frozen).
            gc.collect()
            gc.freeze()
            try:
                done[name] = run_backend(backend, asked, args.budget_s)
            finally:  # frozen objects are never collected: what this size leaves must be, before the next's store
                gc.unfreeze()
        finally:
            backend.close()
        figures[name] = figures_of(done[name], asked)
        say(f"{size}: {name} {json.dumps(figures[name])}")
    figures["compared"] = compare(done, asked)
    figures["csprov_speedup_vs_rq"] = speedup(done["csprov"], done["rq"])
    figures["csprov_speedup_vs_rq_large"] = speedup(done["csprov"], done["rq"],
                                                    lambda i: len(done["csprov"][i][1]) >= LARGE)
    return figures


def best_of(figures: dict, kind: str) -> float | None:
    """The least p99 of ``kind`` among the backends that answered all its questions (not one stopped early)."""
    answered = {name: figures[name][kind] for name in ("csprov", "rq", "cypher") if kind in figures.get(name, {})}
    most = max((f["queries"] for f in answered.values()), default=0)
    return min((f["p99_ms"] for f in answered.values() if f["queries"] == most), default=None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000000,10000000,100000000",
                        help="edges of each lineage graph, comma-separated")
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--budget-s", type=float, default=300.0, help="most seconds a backend spends on one size")
    parser.add_argument("--skip-graph", action="store_true", help="the Parquet backends only (no graph server)")
    parser.add_argument("--import-from", type=int, default=20_000_000,
                        help="sizes of at least this many edges go into the graph by Neo4j's bulk import "
                             "(neo4j-admin database import full, before the server starts), not the indexer")
    parser.add_argument("--components", default="large-star", help="compaction's components algorithm")
    parser.add_argument("--compact-below", type=int, default=20_000_000,
                        help="sizes of at least this many edges stay in the shards, not compacted (large-star "
                             "took 17 min for 10M edges here; the Parquet backends then read them as recent ranges)")
    parser.add_argument("--s3", action="store_true",
                        help="the lineage tables in a real S3 server (SeaweedFS, started on 127.0.0.1), not on disk")
    parser.add_argument("--warmup", type=int, default=20, help="questions each backend answers first, not counted")
    parser.add_argument("--cold-graph", action="store_true",
                        help="ask the Cypher backend without first reading the whole graph once, as headwater serve "
                             "does at start (headwater.adapters.graph.warm_up)")
    parser.add_argument("--graph-page-cache", default="", help="Neo4j's page cache, e.g. 4g (default: the stack's, "
                                                               "512m; Neo4j's advice is the store's size)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the stack below is stopped

    from headwater.adapters.spark import spark_session
    from headwater.deploy.stack import Stack, free_port

    sizes = [int(s) for s in args.sizes.split(",")]
    results = {}
    with tempfile.TemporaryDirectory(prefix="query-bench-") as tmp:
        home = Path(tmp)
        stack, imported = None, {}
        if args.graph_page_cache:
            from headwater.deploy.neo4j_server import PAGE_CACHE_ENV
            os.environ[PAGE_CACHE_ENV] = args.graph_page_cache
        if not args.skip_graph:
            stack = Stack(home / "stack", ports={"broker": free_port(), "bolt": free_port(), "graph_http": free_port()})
            bulk = [size for size in sizes if size >= args.import_from]
            if bulk:
                imported = import_graph(bulk, stack, home / "import")
            stack.up()
        # Spark compacts the stores below --compact-below, and is stopped once none is left to compact: its JVM
        # (6.7 GB) is memory the 100M store's building and the graph server need.
        s3 = None
        if args.s3:
            from headwater.deploy.s3_server import S3Server
            s3 = S3Server(home / "s3").start()
            os.environ.update(s3.environment())
            say(f"S3 server (SeaweedFS) at {s3.endpoint}")
        compacting = [size for size in sizes if size < args.compact_below]
        spark = spark_session("headwater-bench-queries", **{"spark.driver.memory": "6g"}) if compacting else None
        try:
            from headwater.core.config import Config
            config = stack.config() if stack else Config()
            if imported:
                imported["graph_schema_seconds"] = await_schema(config)
                say(f"graph imported: {imported}")
            for size in sizes:
                results[size] = measure(size, home, config, spark, args, s3)
                if size >= args.import_from and imported:
                    results[size].update(imported)
                print(json.dumps({"bench": "query_latency", "size": size, **results[size]}), flush=True)
                if spark is not None and size == compacting[-1]:
                    spark.stop()
                    spark = None
        finally:
            try:
                if spark is not None:
                    spark.stop()
            finally:  # the stack and the S3 server are stopped even when Spark is gone
                if s3 is not None:
                    s3.stop()
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
        "best_forward_from_hubs_p99_ms": {str(size): best_of(f, "forward_from_hubs") for size, f in results.items()},
        "csprov_speedup_vs_rq": largest["csprov_speedup_vs_rq"],
        "csprov_speedup_vs_rq_large": largest["csprov_speedup_vs_rq_large"],
        **{name: largest[name] for name in ("csprov", "rq", "cypher") if name in largest},
        "sizes": {str(size): figures for size, figures in results.items()},
    }))


if __name__ == "__main__":
    main()
