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

from dataclasses import dataclass, field

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

EXACTLY_ONCE = "exactly-once"
AT_LEAST_ONCE = "at-least-once"
NONE = "none"  # nothing is kept (console, noop)

FOREACH, FOREACH_BATCH, MEMORY, CONSOLE, NOOP = "foreach", "foreachBatch", "memory", "console", "noop"
CONTINUOUS_TRIGGERS = ("continuous", "realTime")


class SinkError(ValueError):
    """The traced query's sink is set up in a way headwater cannot write as Spark would."""


@dataclass
class SinkSpec:
    """What the user asked of ``writeStream``: the sink's source name (a format, ``foreach`` or
    ``foreachBatch``, as ``DataStreamWriter`` keeps it), options, table and columns."""

    format: str | None = None  # None: spark.sql.sources.default, resolved at start()
    options: dict = field(default_factory=dict)
    table: str | None = None
    function: object = None  # the user's foreach writer or foreachBatch function
    partition_by: list[str] | None = None
    cluster_by: list[str] | None = None

    @property
    def foreach_batch(self):
        return self.function if self.format == FOREACH_BATCH else None

    @property
    def path(self) -> str | None:
        return option(self.options, "path")

    def describe(self) -> str:
        if self.table:
            return f"table:{self.table}"
        if self.format in (FOREACH, FOREACH_BATCH):
            return self.format
        if self.format == MEMORY:
            return f"memory:{option(self.options, 'queryName') or ''}"
        if (self.format or "").lower() == "kafka":  # its topic; a topic named by each row, none
            return f"kafka:{option(self.options, 'topic') or ''}"
        return f"{self.format}:{self.path or ''}"


def option(options: dict, key: str) -> str | None:
    """An option by its name in any case, as Spark's ``CaseInsensitiveMap`` finds it."""
    for name, value in options.items():
        if name.lower() == key.lower():
            return value
    return None


class Sink:
    """One kind of sink: ``write`` puts one micro-batch's rows in it."""

    guarantee = AT_LEAST_ONCE  # what a batch retried after a crash leaves in the sink
    # Whether writing a batch reads every row of it, so its lineage can be published by the
    # tasks that write it; not where code may skip rows (the user's, a V1 sink's own).
    reads_every_row = True

    def write(self, df: DataFrame, batch_id: int) -> None:
        raise NotImplementedError

    def latest_batch(self) -> int:
        """The last batch the sink's own commit log holds (-1: none, or the sink keeps no log).
        Spark runs a batch again only if its commit did not follow the write: the log may end
        with the batch, which ``write`` then leaves as it is; a later batch is another run's."""
        return -1

    def started(self, query_name: str) -> None:
        """Called once the traced query has started."""

    def files(self, batch_id: int) -> list[str] | None:
        """The files the batch added to the sink, for sinks of files; None for others."""
        return None

    def offsets(self, batch_id: int) -> dict | None:
        """Where the batch's records went, for Kafka: ``{topic: {partition: [first, end)}}``; None for others."""
        return None


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
