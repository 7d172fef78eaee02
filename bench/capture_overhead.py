"""Capture overhead on the reference stream: the same queries traced and untraced, interleaved.

The reference stream (``reference_query``) is three queries reading one Kafka topic of
orders (JSON values, two partitions, produced before the runs into the bench's own Apache
Kafka) through Spark's Kafka connector, ``--rows-per-batch`` records a batch
(``maxOffsetsPerTrigger``, from the earliest offset: every run reads the same records), one
trigger every ``rows_per_batch / --offered`` seconds (10,000 rows/s offered by default):

- ``demo``: the demo pipeline's shape: orders as JSON text, parsed, filtered,
  converted, joined with a static customers table, projected, to Parquet;
- ``window``: those orders in 5-second tumbling windows per region (watermark, append);
- ``join``: those orders joined with a payments stream within 10 seconds (watermarks).

Each query runs ``--warmup-batches`` then ``--batches`` micro-batches from a fresh
checkpoint, in four modes in turn, ``--rounds`` times after one uncounted warm-up round; each
round starts the turn one mode later, so no mode always runs after the same one (the JVM's
warming and a mode's leftovers, such as its garbage, fall on every mode alike):

- ``bare``: no headwater at all;
- ``off``: ``attach`` done (listeners registered), the query not traced;
- ``on``: the query traced;
- ``log``: the query traced with ``capture="log-only"`` (rids and the batch log, no edges;
  Spark's own file sink query, no per-batch hook).

Batch durations are Spark's (``triggerExecution``) of the ``--batches`` after each run's
warm-up: a stream's cost once it runs, as one that runs for months pays it. A new query's first
batches are where the JVM compiles its code paths, the traced ones more of them and for longer
(capture/README: "Overhead, measured"); ``ratio_median_warmup`` (and per query) reports them
apart, the first batch left out. ``ratio_*`` is on over off, pooled over the three queries (per
query in ``queries``); ``ratio_median_log_only`` is log over off; ``attach_ratio_median`` is off
over bare: what attaching costs a job that is not traced. ``ratio_median_paired`` (and
``_log_only_paired``) is the median of each round's traced run over its untraced run of the same
shape, and ``noise_bare_over_off`` the range of bare over off a round: the same work but for
attaching, so how far the machine moves one run. ``*_ms_per_batch`` say where a traced
batch's time goes: the JVM job listener's job time of the user's plan and of capture's own jobs,
and capture's time inside the user's tasks (summed over tasks).

``sizes`` shows how the cost grows with the work: each shape again at every ``--sizes``
batch size (``--size-rounds`` rounds, modes off, on and log; the same trigger interval, so
batches that take longer than it run back to back). Starts its own local stack (broker,
graph) on free ports. The last line printed is one JSON object.

On another Spark line, its venv runs it (``./dev line 3.5`` makes ``.venv-spark-3.5``):
``.venv-spark-3.5/bin/python bench/capture_overhead.py``; ``spark`` in the JSON says which ran.

    .venv/bin/python bench/capture_overhead.py [--rows-per-batch 10000] [--offered 10000]
        [--warmup-batches 10] [--batches 10] [--rounds 2] [--sizes 1000,10000,100000] [--size-rounds 1]
        [--openlineage INTERVAL_S]

``--openlineage 5`` runs every attached mode with OpenLineage events on (capture/openlineage.py), sent over HTTP to
a receiver of the bench's own, a RUNNING event at most every 5 s; ``openlineage`` in the JSON counts what came.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.openlineage_receiver import Receiver  # noqa: E402
from headwater.adapters.spark_lines import last_progress, recent_progress

SHAPES = ("demo", "window", "join")
MODES = ("bare", "off", "on", "log")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def turn(modes: tuple, start: int) -> tuple:
    """``modes`` in turn, starting ``start`` places on (wrapping)."""
    start %= len(modes)
    return modes[start:] + modes[:start]


TOPIC = "bench-orders"
PARTITIONS = 2  # as many tasks a batch as local[2] has cores
EPOCH_MS = 1_767_225_600_000  # 2026-01-01: the first order's event time


def produce_orders(config, count: int, offered: int) -> None:
    """``count`` orders on ``TOPIC``, round robin over its partitions (so ``maxOffsetsPerTrigger`` cuts
    batches of the same size every run), event times ``offered`` a second apart from ``EPOCH_MS``."""
    import datetime

    from headwater.adapters.kafka import ensure_topics, producer

    ensure_topics(config, [TOPIC], PARTITIONS)
    client = producer(config, linger_ms=50)
    try:
        for i in range(count):
            at = datetime.datetime.fromtimestamp((EPOCH_MS + i * 1000 // offered) / 1000, datetime.timezone.utc)
            value = json.dumps({"order_id": i, "customer_id": i % 45, "amount": float(i * 7 % 200),
                                "event_time": at.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]})
            client.send(TOPIC, value=value.encode(), partition=i % PARTITIONS)
            if i % 50_000 == 49_999:
                client.flush(timeout=120)
        client.flush(timeout=120)
    finally:
        client.close()


def reference_query(spark, shape: str, customers_path: str, rows_per_batch: int, bootstrap: str):
    """One query of the reference stream; plain PySpark, as a user writes it."""
    from pyspark.sql import functions as F

    from headwater.demo.pipeline import EUR_PER_USD, MIN_AMOUNT, ORDER_SCHEMA

    def orders_topic():
        return (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
                .option("subscribe", TOPIC).option("startingOffsets", "earliest")
                .option("maxOffsetsPerTrigger", rows_per_batch).load())

    events = orders_topic().select(F.col("value").cast("string").alias("value"))
    orders = events.select(F.from_json("value", ORDER_SCHEMA).alias("o")).select("o.*") \
        .where(F.col("amount") >= MIN_AMOUNT).withColumn("amount_eur", F.round(F.col("amount") * EUR_PER_USD, 2)) \
        .join(spark.read.parquet(customers_path), "customer_id") \
        .select("order_id", "customer_id", "region", "amount_eur", F.col("event_time").cast("timestamp"))
    if shape == "demo":
        return orders, "append"
    if shape == "window":
        return orders.withWatermark("event_time", "2 seconds") \
            .groupBy(F.window("event_time", "5 seconds"), "region") \
            .agg(F.sum("amount_eur").alias("total_eur"), F.count("*").alias("orders")), "append"
    paid = orders_topic().select(F.from_json(F.col("value").cast("string"), ORDER_SCHEMA).alias("p")).select("p.*")
    payments = paid.where(F.col("order_id") % 2 == 0) \
        .select(F.col("order_id").alias("paid_order_id"),
                (F.col("event_time").cast("timestamp") + F.expr("interval 1 second") * (F.col("order_id") % 5))
                .alias("paid_at")) \
        .withWatermark("paid_at", "5 seconds")
    joined = orders.withWatermark("event_time", "5 seconds").join(payments, F.expr(
        "order_id = paid_order_id AND paid_at BETWEEN event_time AND event_time + interval 10 seconds"))
    return joined.select("order_id", "region", "amount_eur", "paid_at"), "append"


@contextmanager
def bench_stack(app: str, **conf: str):
    """``(home, config, spark)``: a local stack on free ports, a SparkSession (with ``conf``), the customers table."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from headwater.adapters.spark import spark_session
    from headwater.demo import orders as data
    from headwater.deploy.stack import Stack, free_port

    with tempfile.TemporaryDirectory(prefix=f"{app}-") as tmp:
        home = Path(tmp)
        stack = Stack(home / "stack", ports={"broker": free_port(), "bolt": free_port(), "graph_http": free_port()})
        stack.up()
        try:
            pq.write_table(pa.Table.from_pylist(data.customers()), home / "customers.parquet")
            # Spark's default 1 GiB heap does not hold the size curve's 100,000-row join state (traced
            # rows carry their rid structs) beside the run's earlier queries: every mode gets 4 GiB.
            spark = spark_session(app, **{"spark.driver.memory": "4g", **conf})
            try:
                yield home, stack.config().with_overrides(spill_dir=str(home / "spill")), spark
            finally:
                spark.stop()
        finally:
            stack.down()


def run_once(spark, config, workdir: Path, shape: str, mode: str, tag: str, args, rows: int) \
        -> tuple[list[float], list[float], float, dict[str, float]]:
    """Run one query of the reference stream (``rows`` a batch) for ``args.warmup_batches`` then
    ``args.batches`` batches: the durations of the latter, those of the warm-up after its first
    batch, the run's seconds, and (traced) the milliseconds ``trace`` took and, of those, the
    optimizer's run for the log-only fallback's plan (once per query, not per batch)."""
    from headwater.capture import attach
    from headwater.capture.spark_plan import optimized_records

    tracer = attach(spark, config, capture="log-only" if mode == "log" else "full",
                    openlineage="on" if args.openlineage else "off") if mode != "bare" else None
    once: dict[str, float] = {}
    try:
        df, output_mode = reference_query(spark, shape, str(workdir / "customers.parquet"), rows, config.bootstrap)
        source = df
        if mode == "log":
            source = tracer.trace(df, name=f"bench-{tag}", keys={"customers": "customer_id"})
        elif mode == "on":
            t0 = time.monotonic()
            optimized_records(df)
            once["optimized_plan_ms"] = 1000 * (time.monotonic() - t0)
            t0 = time.monotonic()
            source = tracer.trace(df, name=f"bench-{tag}", keys={"customers": "customer_id"})
            once["trace_ms"] = 1000 * (time.monotonic() - t0)
        interval_ms = round(1000 * args.rows_per_batch / args.offered)
        query = (source.writeStream.format("parquet").outputMode(output_mode)
                 .option("checkpointLocation", str(workdir / f"cp-{tag}"))
                 .trigger(processingTime=f"{interval_ms} milliseconds").start(str(workdir / f"sink-{tag}")))
        started = time.monotonic()
        wanted = args.warmup_batches + args.batches

        def done() -> bool:
            # The last progress only while waiting: all of them, asked every 0.2 s, cost the driver's
            # Python more CPU as the run grows, beside the stream measured.
            last = last_progress(query)
            return last is not None and last.batchId + 1 >= wanted \
                and len([p for p in recent_progress(query) if p.numInputRows]) >= wanted

        try:
            while not done():
                if query.exception():
                    raise RuntimeError(f"{shape} failed: {query.exception()}")
                time.sleep(0.2)
        finally:
            # A traced stream that cannot keep up is never idle between triggers; stopping
            # it mid-batch is fine here: only the durations of finished batches count.
            query.stop()
        elapsed = time.monotonic() - started
    finally:
        if tracer is not None:
            tracer.close()
    durations = [p.durationMs["triggerExecution"] for p in recent_progress(query) if p.numInputRows]
    return durations[args.warmup_batches:wanted], durations[1:args.warmup_batches], elapsed, once


def summary(off: list[float], on: list[float]) -> dict:
    return {
        "median_ms_off": statistics.median(off), "median_ms_on": statistics.median(on),
        "p95_ms_off": percentile(off, 0.95), "p95_ms_on": percentile(on, 0.95),
        "ratio_median": round(statistics.median(on) / statistics.median(off), 3),
        "ratio_p95": round(percentile(on, 0.95) / percentile(off, 0.95), 3),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows-per-batch", type=int, default=10000)
    parser.add_argument("--offered", type=int, default=10000, help="rows per second each source offers")
    parser.add_argument("--batches", type=int, default=10, help="batches counted in each run, after its warm-up")
    parser.add_argument("--warmup-batches", type=int, default=10,
                        help="each run's first batches, reported apart (ratio_median_warmup)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sizes", default="1000,10000,100000", help="batch sizes of the curve; empty: none")
    parser.add_argument("--size-rounds", type=int, default=1)
    parser.add_argument("--openlineage", type=float, default=0, metavar="INTERVAL_S",
                        help="with OpenLineage events on (every attached mode), to a receiver of the bench's own, a "
                             "RUNNING event at most every INTERVAL_S seconds; 0: events off")
    args = parser.parse_args(argv)
    sizes = [int(x) for x in args.sizes.split(",") if x]

    from prometheus_client import REGISTRY

    say = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    durations = {(shape, mode): [] for shape in SHAPES for mode in MODES}
    warmups = {(shape, mode): [] for shape in SHAPES for mode in MODES}
    run_medians = {(shape, mode): [] for shape in SHAPES for mode in MODES}  # one a round
    by_size = {(shape, size, mode): [] for shape in SHAPES for size in sizes for mode in MODES}
    seconds = dict.fromkeys(MODES, 0.0)
    once: dict[str, list[float]] = {"trace_ms": [], "optimized_plan_ms": []}
    receiver = Receiver().__enter__() if args.openlineage else None
    if receiver is not None:
        os.environ["OPENLINEAGE_URL"] = receiver.url
    with bench_stack("headwater-bench") as (home, config, spark):
        if args.openlineage:
            config = config.with_overrides(openlineage_interval_s=args.openlineage)
        count = max([args.rows_per_batch, *sizes]) * (args.warmup_batches + args.batches)
        say(f"producing {count} orders to {TOPIC}")
        produce_orders(config, count, args.offered)
        spark_version = spark.version
        for round_ in range(-1, args.rounds):  # round -1 warms up JIT, Python workers, caches
            for shape in SHAPES:
                for mode in turn(MODES, round_):
                    tag = f"{shape}-{mode}{round_ if round_ >= 0 else 'warm'}"
                    got, warm, elapsed, costs = run_once(spark, config, home, shape, mode, tag, args,
                                                         args.rows_per_batch)
                    if round_ >= 0:
                        durations[(shape, mode)].extend(got)
                        warmups[(shape, mode)].extend(warm)
                        run_medians[(shape, mode)].append(statistics.median(got))
                        seconds[mode] += elapsed
                        for name, ms in costs.items():
                            once[name].append(ms)
                        if args.rows_per_batch in sizes:
                            by_size[(shape, args.rows_per_batch, mode)].extend(got)
                    say(f"round {round_} {shape} {mode}: median {statistics.median(got):.0f} ms, "
                        f"run {elapsed:.1f} s")
        for round_ in range(args.size_rounds):
            for k, size in enumerate(sizes):
                if size == args.rows_per_batch:
                    continue  # the reference rounds measured it
                for shape in SHAPES:
                    for mode in turn(("off", "on", "log"), round_ + k):
                        tag = f"{shape}-{mode}-{size}-{round_}"
                        got, _, _, _ = run_once(spark, config, home, shape, mode, tag, args, size)
                        by_size[(shape, size, mode)].extend(got)
                        say(f"size {size} {shape} {mode}: median {statistics.median(got):.0f} ms")

    def total(metric: str, **labels) -> float:
        return sum(REGISTRY.get_sample_value(metric, {"query": f"bench-{shape}-on{r}", **labels}) or 0
                   for shape in SHAPES for r in range(args.rounds))

    edges = total("headwater_capture_edges_total")
    size = total("headwater_capture_bytes_total")
    capture_jobs = total("headwater_capture_job_seconds_total", part="capture")
    user_jobs = total("headwater_capture_job_seconds_total", part="user")
    capture_tasks = total("headwater_capture_task_seconds_total")
    pooled = {mode: [d for shape in SHAPES for d in durations[(shape, mode)]] for mode in MODES}
    pooled_warmup = {mode: [d for shape in SHAPES for d in warmups[(shape, mode)]] for mode in MODES}
    traced_batches = total("headwater_capture_batches_total", status="full") or 1

    def ratio(a: list[float], b: list[float]) -> float | None:
        return round(statistics.median(a) / statistics.median(b), 3) if a and b else None

    def by_round(mode: str, base: str = "off") -> list[float]:
        """Each shape's run median in ``mode`` over its run in ``base`` of the same round."""
        return [a / b for shape in SHAPES for a, b in zip(run_medians[(shape, mode)], run_medians[(shape, base)])]

    bare_over_off = by_round("bare")
    result = {
        "bench": "capture_overhead",
        "spark": spark_version,  # the line it ran on: each line's venv runs it (./dev line, .venv-spark-<minor>)
        "stream": "reference: demo shape, 5 s windowed aggregation, stream-stream join (format kafka)",
        "rows_per_batch": args.rows_per_batch,
        "offered_rows_per_s": args.offered,
        "batches_per_mode": len(pooled["on"]),
        **summary(pooled["off"], pooled["on"]),
        "ratio_median_log_only": ratio(pooled["log"], pooled["off"]),
        # A new query's first batches (the first left out), apart: the JVM compiles its code paths then.
        "warmup_batches": args.warmup_batches,
        "ratio_median_warmup": ratio(pooled_warmup["on"], pooled_warmup["off"]),
        "ratio_median_log_only_warmup": ratio(pooled_warmup["log"], pooled_warmup["off"]),
        "median_ms_log_only": statistics.median(pooled["log"]),
        "median_ms_bare": statistics.median(pooled["bare"]),
        "attach_ratio_median": ratio(pooled["off"], pooled["bare"]),
        # The bench's own noise beside the bar: a round's traced run over its untraced run of the
        # same shape, the median of those; and the range of bare over off, which differ by
        # attaching alone (attach_ratio_median about 1), so its spread is what the machine moves a run.
        "ratio_median_paired": round(statistics.median(by_round("on")), 3),
        "ratio_median_log_only_paired": round(statistics.median(by_round("log")), 3),
        "noise_bare_over_off": [round(min(bare_over_off), 3), round(max(bare_over_off), 3)],
        # Where the traced batches' time went, per batch: jobs of the user's plan (with the
        # sink write, where lineage rides), capture's own jobs, capture's time inside tasks.
        "user_job_ms_per_batch": round(1000 * user_jobs / traced_batches, 1),
        "capture_job_ms_per_batch": round(1000 * capture_jobs / traced_batches, 1),
        "capture_task_ms_per_batch": round(1000 * capture_tasks / traced_batches, 1),
        # Once per traced query, at ``trace``: its whole cost, and the optimizer's share (the
        # plan the log-only fallback infers from), beside one traced batch's median.
        "trace_ms_median": round(statistics.median(once["trace_ms"]), 1),
        "optimized_plan_ms_median": round(statistics.median(once["optimized_plan_ms"]), 1),
        "optimized_plan_per_batch": round(statistics.median(once["optimized_plan_ms"])
                                          / statistics.median(pooled["on"]),
                                          3),
        "edges_per_s": round(edges / seconds["on"], 1),
        "bytes_per_edge": round(size / edges, 1) if edges else None,
        "queries": {shape: {**summary(durations[(shape, "off")], durations[(shape, "on")]),
                            "ratio_median_log_only": ratio(durations[(shape, "log")], durations[(shape, "off")]),
                            "ratio_median_warmup": ratio(warmups[(shape, "on")], warmups[(shape, "off")])}
                    for shape in SHAPES},
        # The cost against the work: each shape's ratios at each batch size.
        "sizes": {shape: {str(n): {"median_ms_off": statistics.median(by_size[(shape, n, "off")]),
                                   "ratio_median": ratio(by_size[(shape, n, "on")], by_size[(shape, n, "off")]),
                                   "ratio_median_log_only": ratio(by_size[(shape, n, "log")],
                                                                  by_size[(shape, n, "off")])}
                          for n in sizes if by_size[(shape, n, "off")]}
                  for shape in SHAPES},
    }
    if receiver is not None:  # events on: what the traced runs sent, as a catalog got them
        events = receiver.events()
        receiver.__exit__(None, None, None)
        result["openlineage"] = {"interval_s": args.openlineage, "events": len(events),
                                 "by_type": dict(Counter(e["eventType"] for e in events))}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
