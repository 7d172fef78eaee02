"""Capture's cost against the age of a stream: does the work per batch stay flat?

Stateful shapes run for ``--batches`` micro-batches each at a constant input rate
(``rate-micro-batch``: ``--rows-per-batch`` rows a batch, event time moving one minute a
batch), traced and untraced:

- ``keyed_update``: a count and sum per key over ``--keys`` keys, update mode;
- ``sliding_window``: a one-hour window sliding every ten minutes per region (eight
  regions), ten-minute watermark, update mode: windows close and leave the state;
- ``global_complete``: one count over everything, complete mode;
- ``stream_join``: two streams joined within ten minutes of event time (watermarks), append;

and with ``--shapes``, the rest of the stateful operators' audit:

- ``dedup``: dropDuplicates by key and minute, ten-minute watermark, half of each batch dropped;
- ``stateful_black_box``: applyInPandasWithState keeping a running count per key, update mode.

Per batch it records the edges and payload bytes capture published (its batch log
record), Spark's state rows and memory (``stateOperators`` of the query progress, summed
over operators) and the batch's duration (and its ``addBatch`` part, and capture's own seconds
from the batch log); one JSON line per shape and mode. Growth is the
median of the last 20 batches over the median of batches 20 to 40. The last line is one
JSON object: ``edges_growth`` and ``state_bytes_growth`` (worst shape, traced),
``state_bytes_growth_untraced`` (worst shape), ``duration_ratio_last`` (traced over
untraced, median of the last 20 batches, worst shape) and the same per shape.

    .venv/bin/python bench/capture_longrun.py [--batches 200] [--rows-per-batch 200] [--keys 300]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from capture_overhead import bench_stack  # noqa: E402

from headwater.adapters.spark_lines import recent_progress

SHAPES = ("keyed_update", "sliding_window", "global_complete", "stream_join")
# The rest of the stateful operators' audit, run with ``--shapes``: rows a batch keep or drop by a
# key seen before (state: keys), and a stateful black box keeping a running count per key.
MORE_SHAPES = ("dedup", "stateful_black_box")
MINUTE_MS = 60_000


def shape_query(spark, shape: str, rows_per_batch: int, keys: int):
    """(DataFrame, output mode) of one shape; plain PySpark, as a user writes it."""
    from pyspark.sql import functions as F

    def rate():
        return (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", rows_per_batch)
                .option("advanceMillisPerBatch", MINUTE_MS).load())

    if shape == "keyed_update":
        return rate().groupBy((F.col("value") % keys).alias("k")) \
            .agg(F.count("*").alias("n"), F.sum("value").alias("total")), "update"
    if shape == "sliding_window":
        return rate().withWatermark("timestamp", "10 minutes") \
            .groupBy(F.window("timestamp", "1 hour", "10 minutes"), (F.col("value") % 8).alias("region")) \
            .agg(F.count("*").alias("n"), F.sum("value").alias("total")), "update"
    if shape == "global_complete":
        return rate().groupBy().agg(F.count("*").alias("n")), "complete"
    if shape == "dedup":  # each batch (one minute) keeps one row of each pair of rows with the same key
        return rate().select((F.col("value") % (rows_per_batch // 2)).alias("k"), "value",
                             F.date_trunc("minute", "timestamp").alias("minute")) \
            .withWatermark("minute", "10 minutes").dropDuplicates(["k", "minute"]), "append"
    if shape == "stateful_black_box":
        from pyspark.sql.streaming.state import GroupStateTimeout

        def running_count(key, frames, state):
            import pandas as pd

            n = (state.get[0] if state.exists else 0) + sum(len(f) for f in frames)
            state.update((n,))
            yield pd.DataFrame({"k": [key[0]], "n": [n]})

        return rate().select((F.col("value") % keys).alias("k")).groupBy("k").applyInPandasWithState(
            running_count, "k long, n long", "n long", "update", GroupStateTimeout.NoTimeout), "update"
    left = rate().select(F.col("value").alias("order_id"), F.col("timestamp").alias("ordered_at")) \
        .withWatermark("ordered_at", "10 minutes")
    right = rate().where(F.col("value") % 2 == 0) \
        .select(F.col("value").alias("paid_id"), F.col("timestamp").alias("paid_at")) \
        .withWatermark("paid_at", "10 minutes")
    joined = left.join(right, F.expr(
        "order_id = paid_id AND paid_at BETWEEN ordered_at AND ordered_at + interval 10 minutes"))
    return joined.select("order_id", "paid_at"), "append"


def batch_records(config, query: str) -> dict[int, dict]:
    """The capture records (``LOG_BATCH``) of ``query`` on the log topic, by batch."""
    from kafka import KafkaConsumer, TopicPartition

    from headwater.core.schema import LOG_BATCH, decode_log

    consumer = KafkaConsumer(bootstrap_servers=config.bootstrap, enable_auto_commit=False,
                             consumer_timeout_ms=3000)
    try:
        partitions = [TopicPartition(config.log_topic, p) for p in consumer.partitions_for_topic(config.log_topic)]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        found = {}
        for message in consumer:
            record = decode_log(message.value)
            if record.get("schema") == LOG_BATCH and record.get("query") == query:
                found[record["batch"]] = record
        return found
    finally:
        consumer.close()


def run(spark, config, workdir: Path, shape: str, traced: bool, args) -> list[dict]:
    """One shape for ``args.batches`` batches; a dict per batch with data (batch 0, warm-up, left out)."""
    from headwater.capture import attach

    name = f"longrun-{shape}-{'on' if traced else 'off'}"
    df, mode = shape_query(spark, shape, args.rows_per_batch, args.keys)
    tracer = attach(spark, config) if traced else None
    try:
        sink = str(workdir / f"sink-{name}")
        writer = (tracer.trace(df, name=name) if traced else df).writeStream.outputMode(mode).queryName(name) \
            .option("checkpointLocation", str(workdir / f"cp-{name}"))
        if traced or mode == "append":
            query = writer.format("parquet").start(sink)
        else:  # Spark's file sinks take append only: each batch's emissions appended, as traced
            query = writer.foreachBatch(lambda batch, _: batch.write.mode("append").parquet(sink)).start()
        progress: dict[int, dict] = {}
        started = time.monotonic()
        try:
            while len(progress) < args.batches:
                if query.exception():
                    raise RuntimeError(f"{name} failed: {query.exception()}")
                for p in recent_progress(query):
                    if p.numInputRows:
                        progress[p.batchId] = p
                time.sleep(0.5)
        finally:
            # Between triggers: a query stopped mid-trigger may fail to stop cleanly.
            deadline = time.monotonic() + 30
            while query.status["isTriggerActive"] and time.monotonic() < deadline:
                time.sleep(0.01)
            query.stop()
        print(f"{name}: {args.batches} batches in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    finally:
        if tracer is not None:
            tracer.close()
    logged = batch_records(config, name) if traced else {}
    rows = []
    for batch in sorted(progress)[1:args.batches]:
        p = progress[batch]
        operators = p.stateOperators
        record = logged.get(batch, {})
        rows.append({"batch": batch, "duration_ms": p.durationMs["triggerExecution"],
                     "add_batch_ms": p.durationMs.get("addBatch"), "capture_s": record.get("capture_seconds"),
                     "state_rows": sum(o.numRowsTotal for o in operators),
                     "state_bytes": sum(o.memoryUsedBytes for o in operators),
                     "edges": record.get("edges"), "bytes": record.get("bytes"), "status": record.get("status")})
    return rows


def growth(rows: list[dict], field: str) -> float | None:
    """Median of the last 20 batches over the median of batches 20 to 40."""
    early = [r[field] for r in rows if 20 <= r["batch"] < 40 and r[field] is not None]
    late = [r[field] for r in rows[-20:] if r[field] is not None]
    if not early or not late:
        return None
    base = statistics.median(early)
    return round(statistics.median(late) / base, 3) if base else None


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--rows-per-batch", type=int, default=200)
    parser.add_argument("--keys", type=int, default=300)
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"any of {', '.join(SHAPES + MORE_SHAPES)}")
    args = parser.parse_args(argv)
    if args.batches < 60:
        parser.error("--batches must be at least 60: growth compares the last 20 batches with batches 20 to 40")
    shapes = args.shapes.split(",")

    per_shape = {}
    with bench_stack("headwater-longrun", **{"spark.sql.streaming.numRecentProgressUpdates": str(args.batches + 20)}) \
            as (home, config, spark):
        for shape in shapes:
            runs = {}
            for traced in (False, True):
                rows = run(spark, config, home, shape, traced, args)
                runs[traced] = rows
                mode = "on" if traced else "off"
                print(json.dumps({"shape": shape, "mode": mode, "batches": rows}))
            on, off = runs[True], runs[False]
            last_on = statistics.median(r["duration_ms"] for r in on[-20:])
            last_off = statistics.median(r["duration_ms"] for r in off[-20:])
            per_shape[shape] = {
                "edges_growth": growth(on, "edges"), "payload_bytes_growth": growth(on, "bytes"),
                "state_bytes_growth": growth(on, "state_bytes"), "state_rows_growth": growth(on, "state_rows"),
                "state_bytes_growth_untraced": growth(off, "state_bytes"),
                "edges_last_median": statistics.median(r["edges"] or 0 for r in on[-20:]),
                "state_bytes_last_traced": statistics.median(r["state_bytes"] for r in on[-20:]),
                "state_bytes_last_untraced": statistics.median(r["state_bytes"] for r in off[-20:]),
                "duration_ratio_last": round(last_on / last_off, 3),
                "duration_growth_traced": growth(on, "duration_ms"),
            }

    def worst(field: str) -> float | None:
        values = [s[field] for s in per_shape.values() if s[field] is not None]
        return max(values) if values else None

    print(json.dumps({
        "bench": "capture_longrun", "batches": args.batches, "rows_per_batch": args.rows_per_batch,
        "keys": args.keys, "edges_growth": worst("edges_growth"), "state_bytes_growth": worst("state_bytes_growth"),
        "state_bytes_growth_untraced": worst("state_bytes_growth_untraced"),
        "duration_ratio_last": worst("duration_ratio_last"), "shapes": per_shape,
    }))


if __name__ == "__main__":
    main()
