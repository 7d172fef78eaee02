"""Log-only capture written by Spark's own sink: no per-batch hook.

With ``capture="log-only"`` no edges are journaled, so a batch needs nothing of a hook but its
output rids and its capture record. Where Spark's streaming writer can write the user's sink as
asked (a file sink of a path, in append mode, no black boxes), the traced query is that writer's
query over the rid-threaded plan: each output row's rid, ``_hw_rid``, is computed in the streaming
plan from its row hash and the id of the micro-batch computing it (``Hook.java``'s
``streamingSinkRows``: the same rid as the hook's), and the capture record of each batch
(``log-only``; ``failed`` or ``sink_written_before`` as the hook says them) is published from the
batch's progress, on the progress listener's thread, off the stream's time.

A ``foreachBatch`` query costs every batch a call into Python and back, and the hook's Dataset
steps on the stream's own thread: on the window shape of the overhead bench, +19 ms of that
thread's CPU a batch over the same query untraced (capture/README.md, "The hot path").
"""

from __future__ import annotations

import functools

from pyspark.sql import DataFrame

from headwater.core.schema import LOG_BATCH

from . import metrics
from .budget import LOG_ONLY
from .sinks import SinkSpec
from .sinks.spark_sinks import FileSink


def spark_writes(log_only: bool, spec: SinkSpec, sink, output_mode: str, black_boxes) -> bool:
    """Whether Spark's streaming writer writes the traced query's sink itself (log-only capture, a file
    sink of a path in append mode, no black boxes, whose rows the hook would have to split off)."""
    return (log_only and not black_boxes and isinstance(sink, FileSink) and spec.table is None
            and not spec.cluster_by and output_mode.lower() == "append")


def sink_frame(hook) -> DataFrame:
    """The streaming frame Spark's writer writes: the user's columns and ``_hw_rid`` (unless left out)."""
    frame = hook.frame
    return DataFrame(hook.jvm.streamingSinkRows(frame._jdf), frame.sparkSession)


def writer(hook, spec: SinkSpec, output_mode: str):
    """Spark's ``DataStreamWriter`` of the user's sink, as the user set it up (trigger, name and
    checkpoint are the caller's)."""
    if spec.format is None:
        raise ValueError("log_only.writer needs the spec's format: start() resolves none to spark.sql.sources.default")
    w = sink_frame(hook).writeStream.format(spec.format).options(**spec.options).outputMode(output_mode)
    return w.partitionBy(*spec.partition_by) if spec.partition_by else w


class LoggedBatches:
    """The capture records of a traced query whose sink Spark writes (``spark_writes``), one for each
    batch Spark ran, from its progress record. ``held`` is the last batch the sink's log held when the
    query started: Spark's sink skips a batch its log holds, as the hook would say."""

    def __init__(self, hook, held: int):
        self.hook = hook
        self.held = held

    def ran(self, progress: dict) -> None:
        """Publish the capture record of the batch whose progress record is ``progress``; a trigger
        that ran no batch (no ``addBatch`` in its durations) has none."""
        durations = progress.get("durations_ms") or {}
        if "addBatch" not in durations:
            return
        hook, batch = self.hook, progress["batch"]
        name = hook.traced.name
        versions = hook.table_versions()
        seconds = round(durations["addBatch"] / 1000, 3)
        if batch < self.held:
            hook.refuse(batch, versions, seconds)
            return
        extra = {"sink_written_before": True} if batch == self.held else {}
        metrics.TASK_SECONDS.labels(name).inc(0)
        metrics.record_batch(name, LOG_ONLY, {}, 0.0)
        metrics.OVERHEAD_RATIO.labels(name).set(0.0)
        hook.traced.shipper.publish_log(
            LOG_BATCH, later=functools.partial(hook.files, batch), query=name, batch=batch, status=LOG_ONLY,
            seconds=seconds, capture_seconds=0.0, **extra, tables=versions)
