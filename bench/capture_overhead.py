"""Capture overhead: the demo pipeline over the same Kafka topic, traced and untraced, interleaved.

Starts its own local stack on free ports and a local Spark, produces ``--rows`` orders,
then runs the demo pipeline (parse, filter, project, static join, Parquet sink) from a
fresh checkpoint ``--rounds`` times with capture off and on in turn, ``--batch`` rows
per micro-batch, as fast as Spark takes them. Compares the micro-batch durations Spark
reports (``triggerExecution``), after one uncounted warm-up run of each, leaving out
each run's first batch. The last line printed is one JSON object.

    .venv/bin/python bench/capture_overhead.py [--rows 60000] [--batch 10000] [--rounds 2]

Not yet the full reference stream of issue 4 (a windowed aggregation and a stream-stream
join beside the demo shape): the ratio printed is for the demo shape alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run_once(spark, config, workdir: Path, topic: str, until: dict, batch: int, traced: bool, tag: str):
    from headwater.capture import attach
    from headwater.demo.pipeline import enriched_orders
    from headwater.demo.run import run_until

    tracer = attach(spark, config)
    try:
        df = enriched_orders(spark, config.bootstrap, topic, str(workdir / "customers.parquet"), batch)
        writer = (tracer.trace(df, name=f"bench-{tag}", keys={"customers": "customer_id"}) if traced else df)
        query = (writer.writeStream.format("parquet").option("checkpointLocation", str(workdir / f"cp-{tag}"))
                 .trigger(processingTime="0 seconds").start(str(workdir / f"sink-{tag}")))
        started = time.monotonic()
        run_until(query, until, say=lambda _: None, timeout_s=900)
        elapsed = time.monotonic() - started
    finally:
        tracer.close()
    durations = [p.durationMs["triggerExecution"] for p in query.recentProgress if p.numInputRows]
    return durations[1:], elapsed


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=60000)
    parser.add_argument("--batch", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)

    import pyarrow as pa
    import pyarrow.parquet as pq
    from prometheus_client import REGISTRY

    from headwater.adapters.kafka import ensure_topics
    from headwater.demo import orders as data
    from headwater.demo.run import end_offsets, spark_session
    from headwater.deploy.stack import Stack, free_port

    say = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="hw-bench-") as tmp:
        home = Path(tmp)
        stack = Stack(home / "stack", ports={"broker": free_port(), "bolt": free_port(), "graph_http": free_port()})
        stack.up()
        try:
            config = stack.config()
            topic = "bench-orders"
            ensure_topics(config.bootstrap, [topic], 2)
            say(f"producing {args.rows} orders")
            coordinates = data.produce(config.bootstrap, topic, data.order_events(args.rows, malformed_every=97))
            until = end_offsets(topic, coordinates)
            pq.write_table(pa.Table.from_pylist(data.customers()), home / "customers.parquet")
            spark = spark_session("headwater-bench")
            off, on, seconds = [], [], {"off": 0.0, "on": 0.0}
            for traced in (False, True):  # warm-up: JIT, Python workers, caches; not counted
                run_once(spark, config, home, topic, until, args.batch, traced, f"warm{int(traced)}")
            for round_ in range(args.rounds):
                for traced in (False, True):
                    mode = "on" if traced else "off"
                    durations, elapsed = run_once(spark, config, home, topic, until, args.batch, traced,
                                                  f"{mode}{round_}")
                    (on if traced else off).extend(durations)
                    seconds[mode] += elapsed
                    say(f"round {round_} capture {mode}: {len(durations)} batches, median "
                        f"{statistics.median(durations):.0f} ms, run {elapsed:.1f} s")
            spark.stop()
        finally:
            stack.down()

    edges = sum(REGISTRY.get_sample_value("headwater_capture_edges_total", {"query": f"bench-on{r}"}) or 0
                for r in range(args.rounds))
    size = sum(REGISTRY.get_sample_value("headwater_capture_bytes_total", {"query": f"bench-on{r}"}) or 0
               for r in range(args.rounds))
    result = {
        "bench": "capture_overhead",
        "shape": "demo pipeline (parse, filter, project, static join, parquet sink)",
        "rows": args.rows,
        "rows_per_batch": args.batch,
        "batches_off": len(off),
        "batches_on": len(on),
        "median_ms_off": statistics.median(off),
        "median_ms_on": statistics.median(on),
        "p95_ms_off": percentile(off, 0.95),
        "p95_ms_on": percentile(on, 0.95),
        "ratio_median": round(statistics.median(on) / statistics.median(off), 3),
        "ratio_p95": round(percentile(on, 0.95) / percentile(off, 0.95), 3),
        "edges_per_s": round(edges / seconds["on"], 1),
        "bytes_per_edge": round(size / edges, 1) if edges else None,
        "offered_rows_per_s": round(args.rows * args.rounds / seconds["off"], 1),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
