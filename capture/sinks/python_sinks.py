"""Sinks whose writing is Python code: the user's foreach and foreachBatch, console, noop.

Untraced, Spark calls the user's code once per batch (foreachBatch) or per partition of
a batch (foreach) and retries a failed batch by calling it again with the same batch
id: at least once, and idempotent only if the user's code makes it so. Traced, the same
calls are made with the same ids, the rows carrying ``_hw_rid`` besides.
"""

from __future__ import annotations

from pyspark.sql import DataFrame

from .base import AT_LEAST_ONCE, CONSOLE, FOREACH, FOREACH_BATCH, NONE, NOOP, Sink, SinkError, option, register_sink

RULE = "-" * 43  # ConsoleWrite's rule above and below "Batch: N"


@register_sink(FOREACH_BATCH)
class ForeachBatchSink(Sink):
    guarantee = AT_LEAST_ONCE
    reads_every_row = False  # the user's code

    @classmethod
    def open(cls, spark, spec, schema, output_mode) -> "ForeachBatchSink":
        return cls(spec.function)

    def __init__(self, function):
        if not callable(function):
            raise SinkError("foreachBatch needs a function of (DataFrame, batch id)")
        self.function = function

    def write(self, df: DataFrame, batch_id: int) -> None:
        self.function(df, batch_id)


@register_sink(FOREACH)
class ForeachSink(Sink):
    """``foreach(f)``: ``f(row)`` for every row, or a writer's ``open(partition_id, epoch_id)``,
    ``process(row)`` and ``close(error)`` per partition, as ``DataStreamWriter.foreach`` calls them."""

    guarantee = AT_LEAST_ONCE
    reads_every_row = False  # a writer's open() may skip a partition

    def __init__(self, writer):
        self.run = partition_writer(writer)

    @classmethod
    def open(cls, spark, spec, schema, output_mode) -> "ForeachSink":
        return cls(spec.function)

    def write(self, df: DataFrame, batch_id: int) -> None:
        run = self.run
        df.rdd.mapPartitionsWithIndex(lambda partition, rows: run(partition, batch_id, rows)).count()


def partition_writer(writer):
    """``run(partition_id, epoch_id, rows)`` for a foreach writer, checked as Spark checks it."""
    if callable(writer):  # as PySpark: a callable is a function of a row, whatever else it has
        def each_row(_partition, _epoch, rows):
            for row in rows:
                writer(row)
            return iter(())
        return each_row
    for name, required in (("process", True), ("open", False), ("close", False)):
        if (required or hasattr(writer, name)) and not callable(getattr(writer, name, None)):
            raise SinkError(f"the foreach writer's {name!r} must be a method: foreach takes a function of a row, or "
                            f"an object with process(row) and optional open(partition_id, epoch_id) and close(error)")

    def open_process_close(partition, epoch, rows):
        process = writer.open(partition, epoch) if hasattr(writer, "open") else True  # as PySpark: not under close
        error = None
        try:
            if process:
                for row in rows:
                    writer.process(row)
        except Exception as exc:
            error = exc
        finally:
            if hasattr(writer, "close"):
                writer.close(error)
        if error is not None:
            raise error
        return iter(())
    return open_process_close


@register_sink(CONSOLE)
class ConsoleSink(Sink):
    """What Spark's console sink prints: the batch's header, then its rows."""

    guarantee = NONE
    reads_every_row = False  # shows the first rows only

    def __init__(self, options: dict):
        self.rows = int(option(options, "numRows") or 20)
        self.truncate = (option(options, "truncate") or "true").lower() == "true"

    @classmethod
    def open(cls, spark, spec, schema, output_mode) -> "ConsoleSink":
        return cls(spec.options)

    def write(self, df: DataFrame, batch_id: int) -> None:
        print(f"{RULE}\nBatch: {batch_id}\n{RULE}")
        df.show(self.rows, truncate=self.truncate)


@register_sink(NOOP)
class NoopSink(Sink):
    guarantee = NONE

    @classmethod
    def open(cls, spark, spec, schema, output_mode) -> "NoopSink":
        return cls()

    def write(self, df: DataFrame, batch_id: int) -> None:
        df.write.format("noop").mode("overwrite").save()
