"""The user's sink, written one micro-batch at a time, the way Spark writes it untraced.

A traced query runs as a ``foreachBatch`` query (its hook needs each batch's rows and
id; but for log-only capture into a file sink, which Spark writes itself: ``log_only.py``),
so the sink the user asked for is written here, and wherever Spark has code for
it, by that code: a file sink is Spark's own ``FileStreamSink``, with its ``_spark_metadata``
commit log, so a retried batch is written once and readers see committed batches only.

Each kind of sink is a ``Sink`` in a module of its own; ``open_sink`` picks one at
``start()``, so whatever headwater cannot honour fails there, before the stream runs.
To add a kind: subclass ``Sink`` (``write``; ``latest_batch`` and ``files`` if the sink keeps a
commit log) and have ``open_sink`` choose it.
"""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from .base import (
    AT_LEAST_ONCE,
    CONSOLE,
    CONTINUOUS_TRIGGERS,
    EXACTLY_ONCE,
    FOREACH,
    FOREACH_BATCH,
    MEMORY,
    NONE,
    NOOP,
    Sink,
    SinkError,
    SinkSpec,
    option,
)

__all__ = ["AT_LEAST_ONCE", "CONSOLE", "CONTINUOUS_TRIGGERS", "EXACTLY_ONCE", "FOREACH", "FOREACH_BATCH", "MEMORY",
           "NONE", "NOOP", "Sink", "SinkError", "SinkSpec", "open_sink", "option"]


def open_sink(spark: SparkSession, spec: SinkSpec, schema: StructType, output_mode: str) -> Sink:
    """The sink the writer's settings name, built as Spark would build it at ``start()``."""
    from . import python_sinks, spark_sinks, tables

    if spec.table:
        return tables.table_sink(spark, spec, schema, output_mode)
    if spec.format == FOREACH_BATCH:
        return python_sinks.ForeachBatchSink(spec.function)
    if spec.format == FOREACH:
        return python_sinks.ForeachSink(spec.function)
    if spec.format == MEMORY:
        from .memory import MemorySink

        return MemorySink(spark, option(spec.options, "queryName"), schema, complete=output_mode.lower() == "complete")
    if spec.format == CONSOLE:
        return python_sinks.ConsoleSink(spec.options)
    if spec.format == NOOP:
        return python_sinks.NoopSink()
    if spec.format.lower() == "hive":
        raise SinkError("a Hive table's files cannot be written by a streaming query (format 'hive')")
    return spark_sinks.spark_sink(spark, spec.format, spec.options, spec.partition_by, spec.cluster_by,
                                  output_mode, schema)
