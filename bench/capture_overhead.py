"""Capture overhead: the demo pipeline over the same Kafka topic, traced and untraced, interleaved.

Starts its own local stack on free ports and a local Spark, produces ``--rows`` orders,
then runs the demo pipeline (parse, filter, project, static join, Parquet sink) from a
fresh checkpoint ``--rounds`` times in three modes in turn, ``--batch`` rows per
micro-batch, as fast as Spark takes them:

- ``bare``: no headwater at all;
- ``off``: ``attach`` done (listeners registered), the query not traced;
- ``on``: the query traced.

Compares the micro-batch durations Spark reports (``triggerExecution``), after one
uncounted warm-up run of each, leaving out each run's first batch: ``ratio_*`` is on
over off (capture overhead), ``attach_ratio_median`` off over bare (what attaching
costs a job that is not traced). ``capture_job_share`` is, from the JVM job listener,
capture's part of the traced batches' job time: where the overhead goes. The last line
printed is one JSON object.

    .venv/bin/python bench/capture_overhead.py [--rows 60000] [--batch 10000] [--rounds 2]

Not yet the full reference stream of issue 4 (a windowed aggregation and a stream-stream
join beside the demo shape): the ratios printed are for the demo shape alone.
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


def run_once(spark, config, workdir: Path, topic: str, until: dict, batch: int, mode: str, tag: str):
    from headwater.capture import attach
    from headwater.capture.kafka_source import KafkaSource
    from headwater.demo.pipeline import enriched_orders
    from headwater.demo.run import run_until

    spark.dataSource.register(KafkaSource)
    tracer = attach(spark, config) if mode != "bare" else None
    try:
        df = enriched_orders(spark, config.bootstrap, topic, str(workdir / "customers.parquet"), batch)
        writer = tracer.trace(df, name=f"bench-{tag}", keys={"customers": "customer_id"}) if mode == "on" else df
        query = (writer.writeStream.format("parquet").option("checkpointLocation", str(workdir / f"cp-{tag}"))
                 .trigger(processingTime="0 seconds").start(str(workdir / f"sink-{tag}")))
        started = time.monotonic()
        run_until(query, until, say=lambda _: None, timeout_s=900)
        elapsed = time.monotonic() - started
    finally:
        if tracer is not None:
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
            modes = ("bare", "off", "on")
            batches = {mode: [] for mode in modes}
            seconds = dict.fromkeys(modes, 0.0)
            for mode in modes:  # warm-up: JIT, Python workers, caches; not counted
                run_once(spark, config, home, topic, until, args.batch, mode, f"warm-{mode}")
            for round_ in range(args.rounds):
                for mode in modes:
                    durations, elapsed = run_once(spark, config, home, topic, until, args.batch, mode,
                                                  f"{mode}{round_}")
                    batches[mode].extend(durations)
                    seconds[mode] += elapsed
                    say(f"round {round_} {mode}: {len(durations)} batches, median "
                        f"{statistics.median(durations):.0f} ms, run {elapsed:.1f} s")
            spark.stop()
        finally:
            stack.down()

    def total(metric: str, **labels) -> float:
        return sum(REGISTRY.get_sample_value(metric, {"query": f"bench-on{r}", **labels}) or 0
                   for r in range(args.rounds))

    edges = total("headwater_capture_edges_total")
    size = total("headwater_capture_bytes_total")
    capture_jobs = total("headwater_capture_job_seconds_total", part="capture")
    user_jobs = total("headwater_capture_job_seconds_total", part="user")
    bare, off, on = batches["bare"], batches["off"], batches["on"]
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
        "median_ms_bare": statistics.median(bare),
        "attach_ratio_median": round(statistics.median(off) / statistics.median(bare), 3),
        "capture_job_share": round(capture_jobs / (capture_jobs + user_jobs), 3) if user_jobs else None,
        "edges_per_s": round(edges / seconds["on"], 1),
        "bytes_per_edge": round(size / edges, 1) if edges else None,
        "offered_rows_per_s": round(args.rows * args.rounds / seconds["off"], 1),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
