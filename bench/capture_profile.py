"""Where a traced batch's time goes: one query of the reference stream, step by step.

Runs one shape of ``capture_overhead``'s reference stream (``--shape``, the demo shape
by default) in five variants, interleaved, ``--rounds`` times after one uncounted round:

- ``native``: untraced, Spark's own file sink;
- ``foreachBatch``: untraced, the same write inside ``foreachBatch`` (what tracing
  turns the sink into);
- ``arrow_udf``: untraced, that write through a filter that is a Python Arrow UDF of two
  narrow columns and keeps every row: what any Python in the write's tasks costs, however
  little it does (the old hot path's floor: capture/README.md, "The hot path");
- ``log-only``: traced with ``capture="log-only"``: rid columns threaded through the
  plan, output rids computed in it, the sink written by Spark's own file sink query (no
  per-batch hook, capture/README.md), the batch log from progress; no edges;
- ``full``: traced, a ``foreachBatch`` query whose hook writes the sink through Spark's file
  sink, lineage journaled from the JVM by the sink's write tasks.

Prints one JSON line: per variant the median batch duration and Spark's phases
(``addBatch`` is the sink's part), and the steps between variants in milliseconds, so
the overhead ``full / native`` splits into what each step adds.

    .venv/bin/python bench/capture_profile.py [--shape demo] [--rounds 3] [--batches 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Iterator

import pyarrow as pa
from pyspark.sql import functions as F
from pyspark.sql.functions import arrow_udf
from pyspark.sql.types import BooleanType

sys.path.insert(0, str(Path(__file__).parent))
from capture_overhead import SHAPES, bench_stack, reference_query  # noqa: E402

from headwater.adapters.spark_lines import recent_progress

VARIANTS = ("native", "foreachBatch", "arrow_udf", "log-only", "full")


def _keep_every_row(batches: Iterator[pa.Array]) -> Iterator[pa.Array]:
    for rows in batches:
        yield pa.repeat(pa.scalar(True), len(rows))


_keep = arrow_udf(_keep_every_row, BooleanType()).asNondeterministic()  # a type, not DDL: no session at import


def run_once(spark, tracers: dict, home: Path, shape: str, variant: str, tag: str, batches: int) -> list[dict]:
    df, output_mode = reference_query(spark, shape, str(home / "customers.parquet"), 10_000)
    sink = str(home / f"sink-{tag}")
    if variant == "native":
        writer = df.writeStream.format("parquet").option("path", sink)
    elif variant == "foreachBatch":
        writer = df.writeStream.foreachBatch(lambda batch, _, path=sink: batch.write.mode("append").parquet(path))
    elif variant == "arrow_udf":
        narrow = F.struct(*[F.col(c) for c in df.columns[:2]])
        writer = df.writeStream.foreachBatch(
            lambda batch, _, path=sink: batch.where(_keep(narrow)).write.mode("append").parquet(path))
    else:
        traced = tracers[variant].trace(df, name=f"profile-{tag}", keys={"customers": "customer_id"})
        writer = traced.writeStream.format("parquet").option("path", sink)
    query = (writer.outputMode(output_mode).option("checkpointLocation", str(home / f"cp-{tag}"))
             .trigger(processingTime="1 second").start())
    try:
        while len([p for p in recent_progress(query) if p.numInputRows]) < batches:
            if query.exception():
                raise RuntimeError(f"{variant} failed: {query.exception()}")
            time.sleep(0.2)
    finally:
        query.stop()
    return [p.durationMs for p in recent_progress(query) if p.numInputRows][1:batches]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=SHAPES, default="demo")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=8)
    args = parser.parse_args(argv)

    from headwater.capture import attach

    phases: dict = {v: [] for v in VARIANTS}
    with bench_stack("headwater-profile") as (home, config, spark):
        tracers = {"full": attach(spark, config), "log-only": attach(spark, config, capture="log-only")}
        try:
            for round_ in range(-1, args.rounds):  # round -1 warms up
                for variant in VARIANTS:
                    got = run_once(spark, tracers, home, args.shape, variant, f"{variant}{round_}", args.batches)
                    if round_ >= 0:
                        phases[variant].extend(got)
                    print(f"round {round_} {variant}: median "
                          f"{statistics.median(p['triggerExecution'] for p in got):.0f} ms",
                          file=sys.stderr, flush=True)
        finally:
            for tracer in tracers.values():
                tracer.close()

    medians = {v: {k: statistics.median(p.get(k, 0) for p in phases[v])
                   for k in ("triggerExecution", "addBatch", "queryPlanning", "walCommit", "commitOffsets")}
               for v in VARIANTS}
    batch = {v: medians[v]["triggerExecution"] for v in VARIANTS}
    print(json.dumps({
        "bench": "capture_profile",
        "shape": args.shape,
        "batches_per_variant": len(phases["full"]),
        "median_ms": batch,
        "phases_ms": medians,
        # What each step adds to the median batch, in ms; they sum to full - native.
        "steps_ms": {
            "rids_in_the_plan": batch["log-only"] - batch["native"],
            "hook_and_journal": batch["full"] - batch["log-only"],
        },
        # Beside the steps: what the hook's foreachBatch route costs the same write untraced.
        "sink_in_foreachBatch_ms": batch["foreachBatch"] - batch["native"],
        # Beside the steps: what a Python UDF in the write's tasks costs, doing nothing.
        "python_in_tasks_ms": batch["arrow_udf"] - batch["foreachBatch"],
        "ratio_full_over_native": round(batch["full"] / batch["native"], 3),
        "ratio_log_only_over_native": round(batch["log-only"] / batch["native"], 3),
    }))


if __name__ == "__main__":
    main()
