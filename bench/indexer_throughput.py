"""Indexer throughput: 1M edges of realistic shape from the edges topic into the graph and the lineage tables.

Starts its own local stack (broker, Bolt graph server) on free ports, publishes
``--edges`` edges of ``bench.workload``'s shape (a join with a static dimension, and
aggregations of fan-in 1 to 1,000 over the same orders) to a two-partition edges
topic, then runs the indexer until it has caught up. Figures:

- ``graph_edges_per_s``: edges over the time spent in graph writes;
- ``parquet_edges_per_s``: the store path by itself (set index, files and Delta commits), the same
  messages in the indexer's write sizes into a fresh shard on the local disk, before the stack starts, in a
  warm process: after a first pass of the same messages into another store, as a running indexer's
  allocators (Python's, Arrow's) are warm; ``parquet_edges_per_s_first_pass``: that first pass;
  ``s3_edges_per_s`` and ``s3_bytes_per_edge``: the same into a real S3 server (SeaweedFS, started by the
  bench on 127.0.0.1, after a write of ``S3_WARM_UP_MESSAGES`` messages that makes its volumes);
  ``…_beside_graph``: edges over the time the indexer spent writing the store while the graph was written
  in the other thread (the wait for the graph before each commit not counted; the two share the
  interpreter, so this is lower);
- ``end_to_end_edges_per_s``: edges over the indexer's whole run (both stores are
  written at the same time, so this is about the slower of the two);
- ``bytes_per_edge``: the edges table's files over the edges; ``store_bytes_per_edge``:
  the lineage tables', with the rid → set index, aliases and dependencies;
- ``compaction_edges_per_s``: ``headwater compact`` over the whole store (two shards)
  on local Spark, with ``generation_bytes_per_edge``, ``sets`` and ``largest_set``;
  ``recompaction_seconds``: a second compaction, from the first generation with
  nothing new, after which the shards' records of what the first holds are removed
  (``shard_bytes_per_edge_before_drop``/``…_after_drop``: the shards' files the tables hold);
- baselines from the same run, so the ratios hold on a noisy machine: graph writes as
  the indexer made them before batching (one per message, 2,000 rows per statement) on
  ``--baseline-edges`` of the edges, in one session, and plain Parquet files of the same edges (no sets,
  one file per write) for the store, and a plain Spark copy of the shards' edge files
  (read, shuffle by bucket, write) for compaction.

The last line printed is one JSON object.

    .venv/bin/python bench/indexer_throughput.py [--edges 1000000] [--baseline-edges 100000]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.workload import lineage_messages  # noqa: E402

S3_WARM_UP_MESSAGES = 30  # about 130,000 edges


def publish(config, messages, partitions: int = 2) -> list[int]:
    from headwater.adapters.kafka import ensure_topics, producer
    from headwater.core.schema import encode_lineage

    ensure_topics(config.bootstrap, [config.edges_topic, config.log_topic, config.dlq_topic], partitions)
    client = producer(config.bootstrap)
    sizes = []
    for i, (nodes, edges) in enumerate(messages):
        payload = encode_lineage(nodes, edges)
        sizes.append(len(payload))
        client.send(config.edges_topic, key=f"m{i}".encode(), value=payload)
    client.flush()
    client.close()
    return sizes


def store_alone(store: str, messages, sizes: list[int]) -> tuple[float, int]:
    """Edges/s of the store path by itself (set index, files and Delta commits) into ``store`` (a folder or an
    S3 URI), in the indexer's write sizes; and the writes it made."""
    from headwater.core.schema import concat_lineage
    from headwater.indexer.service import WRITE_BYTES
    from headwater.indexer.shard import Shard

    shard = Shard(store, "bench.edges", 0).open()
    started = time.monotonic()
    first = writes = 0
    while first < len(messages):
        last, size = first, sizes[first]
        while last + 1 < len(messages) and size + sizes[last + 1] <= WRITE_BYTES:
            last += 1
            size += sizes[last]
        shard.write(*concat_lineage(messages[first: last + 1]), first, last)
        first, writes = last + 1, writes + 1
    return sum(e.num_rows for _, e in messages) / (time.monotonic() - started), writes


def baseline_graph(config, messages) -> float:
    """Edges/s of one graph write per message, 2,000 rows a statement, in one session (the indexer before
    batching and concurrent sessions)."""
    from headwater.store import graph

    writer = graph.GraphWriter(config.with_overrides(graph_write_sessions=1))
    chunk, graph.CHUNK = graph.CHUNK, 2000
    try:
        writer.ensure_schema()
        started = time.monotonic()
        for nodes, edges in messages:
            writer.write_lineage(nodes, edges)
        return sum(e.num_rows for _, e in messages) / (time.monotonic() - started)
    finally:
        graph.CHUNK = chunk
        writer.close()


def baseline_parquet(folder: Path, messages, per_write: int) -> float:
    """Edges/s of plain zstd Parquet files of the same edges, ``per_write`` messages a file, no sets."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True)
    started = time.monotonic()
    for i in range(0, len(messages), per_write):
        table = pa.concat_tables([e for _, e in messages[i: i + per_write]])
        pq.write_table(table, folder / f"{i}.parquet", compression="zstd")
    return sum(e.num_rows for _, e in messages) / (time.monotonic() - started)


def compaction_figures(store_dir: Path, topic: str) -> dict:
    """Compact the store on local Spark; and, as the baseline, copy its edge files with Spark alone."""
    from pyspark.sql import functions as F

    from headwater.adapters.spark import spark_session
    from headwater.indexer.compaction import BUCKETS, STORE_DDL, compact
    from headwater.store.edges import SHARD_GENERATION
    from headwater.store.generation import Generation, Snapshot

    def shards_size() -> int:
        """The shards' files the tables hold (generation 0: edges, rows and the set index's records)."""
        tables = Snapshot.of(store_dir, topic).tables
        return sum(f["size_bytes"] for table in (tables.edges, tables.rows, tables.records)
                   for f in table.files().to_pylist()
                   if f.get("partition.generation", SHARD_GENERATION) == SHARD_GENERATION)

    spark = spark_session("headwater-bench-compaction")
    try:
        before = Snapshot.of(store_dir, topic)
        files = [before.tables.edges.file_path(f["path"]) for f in before.shard_files]  # kept on disk an hour
        shard_bytes = shards_size()
        manifest = compact(spark, store_dir, topic, say=lambda s: print(s, file=sys.stderr, flush=True))
        started = time.monotonic()
        (spark.read.schema(STORE_DDL).parquet(*files).withColumn("bucket", F.pmod("dst_set", F.lit(BUCKETS)))
         .repartition("bucket").sortWithinPartitions("bucket", "dst_set", "dst")
         .write.option("compression", "zstd").partitionBy("bucket").parquet(str(store_dir / "copy")))
        copy_seconds = time.monotonic() - started
        size = Generation.current(store_dir, topic).size_bytes()
        # Again, on the first generation (nothing new): the shards' records of what it holds then go.
        again = compact(spark, store_dir, topic, say=lambda s: print(s, file=sys.stderr, flush=True))
        shard_bytes_after = shards_size()
    finally:
        spark.stop()
    return {"compaction_seconds": manifest["seconds"],
            "compaction_edges_per_s": round(manifest["edges"] / manifest["seconds"]),
            "generation_bytes_per_edge": round(size / manifest["edges"], 2),
            "sets": manifest["sets"], "largest_set": manifest["largest_set"],
            "set_dependencies": manifest["dependencies"],
            "recompaction_seconds": again["seconds"],
            "shard_bytes_per_edge_before_drop": round(shard_bytes / manifest["edges"], 2),
            "shard_bytes_per_edge_after_drop": round(shard_bytes_after / manifest["edges"], 2),
            "baseline_copy_seconds": round(copy_seconds, 3),
            "compaction_ratio_vs_copy": round(manifest["seconds"] / copy_seconds, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--edges", type=int, default=1_000_000)
    parser.add_argument("--baseline-edges", type=int, default=100_000)
    parser.add_argument("--edges-per-message", type=int, default=5000)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the stack below is stopped

    from headwater.core.schema import encode_lineage
    from headwater.deploy.s3_server import S3Server
    from headwater.deploy.stack import Stack, free_port
    from headwater.indexer.service import MAX_POLL_RECORDS, Indexer
    from headwater.store.edges import LineageTables
    from headwater.store.generation import Snapshot

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="indexer-bench-") as tmp:
        home = Path(tmp)
        started = time.monotonic()
        messages = list(lineage_messages(args.edges, seed=1, edges_per_message=args.edges_per_message))
        edges = sum(e.num_rows for _, e in messages)
        rows = sum(n.num_rows for n, _ in messages)
        say(f"generated {edges} edges, {rows} rows in {len(messages)} messages ({time.monotonic() - started:.1f}s)")
        # The Parquet path by itself before any server starts (a loaded Neo4j samples its indexes and
        # checkpoints in the background), and plain files of the same edges in as many writes.
        sizes = [len(encode_lineage(*m)) for m in messages]
        first_pass, _ = store_alone(str(home / "first-pass"), messages, sizes)
        parquet_alone, alone_writes = store_alone(str(home / "alone"), messages, sizes)
        parquet_baseline = baseline_parquet(home / "plain", messages, max(1, len(messages) // alone_writes))
        say(f"store path alone: {parquet_alone:.0f} edges/s, first pass {first_pass:.0f} "
            f"(plain files: {parquet_baseline:.0f})")
        with S3Server(home / "s3") as s3:  # the same into a real S3 server (SeaweedFS) on this machine
            os.environ.update(s3.environment())
            # A fresh SeaweedFS makes its volumes on the first writes (the first pass into it: 80-90,000
            # edges/s, the next 107-117,000); a short write first, as an object store in service has them.
            store_alone(s3.uri("warm-up"), messages[:S3_WARM_UP_MESSAGES], sizes[:S3_WARM_UP_MESSAGES])
            s3_alone, _ = store_alone(s3.uri("alone"), messages, sizes)
            s3_bytes = sum(LineageTables(s3.uri("alone"), "bench.edges").edges.files()["size_bytes"].to_pylist())
        say(f"store path alone into S3: {s3_alone:.0f} edges/s, {s3_bytes / edges:.2f} bytes per edge")
        stack = Stack(home / "stack", ports={"broker": free_port(), "bolt": free_port(), "graph_http": free_port()})
        stack.up()
        try:
            config = stack.config().with_overrides(store_dir=str(home / "store"), edges_topic="bench.edges",
                                                   log_topic="bench.log", dlq_topic="bench.dlq")
            sizes = publish(config, messages)
            payload_bytes = sum(sizes)
            say(f"published {payload_bytes / 1e6:.1f} MB")

            baseline_messages = list(lineage_messages(args.baseline_edges, seed=2,
                                                      edges_per_message=args.edges_per_message, prefix="base-"))
            graph_baseline = baseline_graph(config, baseline_messages)
            say(f"baseline graph (per message): {graph_baseline:.0f} edges/s")

            indexer = Indexer(config, say=say)
            started = time.monotonic()
            try:
                stats = indexer.run(drain=True, idle_s=2.0, max_seconds=3600)
            finally:
                indexer.close()
            wall = time.monotonic() - started
            if stats.edges != edges or stats.parquet_edges != edges:
                raise SystemExit(f"indexed {stats.edges} edges into the graph and {stats.parquet_edges} into "
                                 f"Parquet, expected {edges}")
            tables = LineageTables(home / "store", config.edges_topic)
            store_bytes = sum(sum(t.files()["size_bytes"].to_pylist()) if t.version() is not None else 0
                              for t in (tables.edges, tables.rows, tables.records))
            edge_files = sum(tables.edges.files()["size_bytes"].to_pylist())
            writes = len(Snapshot.of(home / "store", config.edges_topic).shard_ranges())
            compaction = compaction_figures(home / "store", config.edges_topic)
        finally:
            stack.down()

    graph_rate = stats.edges / stats.graph_seconds
    beside_graph = stats.parquet_edges / stats.parquet_seconds
    print(json.dumps({
        "bench": "indexer_throughput",
        "edges": edges,
        "rows": rows,
        "messages": len(messages),
        "writes": writes,
        "max_poll_records": MAX_POLL_RECORDS,
        "graph_edges_per_s": round(graph_rate),
        "parquet_edges_per_s": round(parquet_alone),
        "parquet_edges_per_s_first_pass": round(first_pass),
        "parquet_edges_per_s_beside_graph": round(beside_graph),
        "s3_edges_per_s": round(s3_alone),
        "s3_bytes_per_edge": round(s3_bytes / edges, 2),
        "end_to_end_edges_per_s": round(edges / wall),
        "bytes_per_edge": round(edge_files / edges, 2),
        "store_bytes_per_edge": round(store_bytes / edges, 2),
        "payload_bytes_per_edge": round(payload_bytes / edges, 2),
        "baseline_graph_edges_per_s": round(graph_baseline),
        "graph_speedup_vs_baseline": round(graph_rate / graph_baseline, 2),
        "baseline_parquet_edges_per_s": round(parquet_baseline),
        "parquet_ratio_vs_plain_files": round(parquet_alone / parquet_baseline, 3),
        **compaction,
        "targets": {"graph_edges_per_s": 20000, "parquet_edges_per_s": 200000, "s3_edges_per_s": 100000,
                    "bytes_per_edge": 16},
    }))


if __name__ == "__main__":
    main()
