"""The user's sink, written one micro-batch at a time, the way Spark writes it untraced.

A traced query runs as a ``foreachBatch`` query (its hook needs each batch's rows and
id; but for log-only capture into a file sink, which Spark writes itself: ``log_only.py``),
so the sink the user asked for is written here, and wherever Spark has code for
it, by that code: a file sink is Spark's own ``FileStreamSink``, with its ``_spark_metadata``
commit log, so a retried batch is written once and readers see committed batches only.

Each kind of sink is a ``Sink`` in a module of its own; ``open_sink`` picks one at
``start()``, so whatever headwater cannot honour fails there, before the stream runs: a
table's, the one registered for the format (``register_sink``), else Spark's own.
To add a kind: subclass ``Sink`` (``open`` and ``write``; ``latest_batch`` and ``files`` if
the sink keeps a commit log) and name its format with ``@register_sink("FORMAT")``; in a
package of its own, name the module in its entry points, group ``headwater.sinks``.
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
    register_sink,
    registered_sinks,
)

__all__ = ["AT_LEAST_ONCE", "CONSOLE", "CONTINUOUS_TRIGGERS", "EXACTLY_ONCE", "FOREACH", "FOREACH_BATCH", "MEMORY",
           "NONE", "NOOP", "Sink", "SinkError", "SinkSpec", "open_sink", "option", "register_sink", "registered_sinks"]


def open_sink(spark: SparkSession, spec: SinkSpec, schema: StructType, output_mode: str) -> Sink:
    """The sink the writer's settings name, built as Spark would build it at ``start()``."""
    from . import memory, python_sinks, spark_sinks, tables  # noqa: F401 (capture's own sinks register themselves)

    if spec.table:
        return tables.table_sink(spark, spec, schema, output_mode)
    if spec.format is None:
        raise ValueError("open_sink needs the spec's format: start() resolves none to spark.sql.sources.default")
    registered = registered_sinks().get(spec.format)
    if registered is not None:
        return registered.open(spark, spec, schema, output_mode.lower())
    if spec.format.lower() == "hive":
        raise SinkError("a Hive table's files cannot be written by a streaming query (format 'hive')")
    return spark_sinks.spark_sink(spark, spec.format, spec.options, spec.partition_by, spec.cluster_by,
                                  output_mode, schema)
