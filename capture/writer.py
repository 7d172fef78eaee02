"""``Traced.writeStream``: the traced query's ``DataStreamWriter``.

Every method of PySpark's ``DataStreamWriter`` is here with its arguments and checks; the
settings name the user's sink, which ``start()``/``toTable()`` open as Spark would
(``capture.sinks``) before the traced query runs as a ``foreachBatch`` query (or, log-only
into a file sink, as Spark's file sink query: ``log_only.py``). What
headwater cannot honour (a continuous trigger, a sink it cannot write as Spark would)
fails at ``start()`` with a ``SinkError`` that names it. What Spark itself refuses of the user's
query at start (an operation its output mode does not allow, a missing checkpoint) fails with
Spark's own error, raised from the user's plan before anything of the traced query is made
(``spark_refusal``); a start that fails later leaves no registration of the attempt behind.
"""

from __future__ import annotations

import logging
import time

from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import LongType, StructField, StructType
from pyspark.sql.utils import to_str

from headwater.core import signing
from headwater.core.plan import column_lineage, column_transformations
from headwater.core.schema import LOG_PLAN

from . import checkpoint, log_only, metrics
from .batch_hook import BatchHook
from .rewrite import RID_COLUMN
from .sinks import (
    CONSOLE,
    CONTINUOUS_TRIGGERS,
    FOREACH,
    FOREACH_BATCH,
    MEMORY,
    NOOP,
    SinkError,
    SinkSpec,
    open_sink,
    option,
)
from .sinks.jvm import OUTPUT_MODES, output_mode
from .sinks.python_sinks import partition_writer

log = logging.getLogger("headwater.capture")

ONE_TIME_SINKS = (MEMORY, FOREACH, FOREACH_BATCH, CONSOLE, NOOP)  # Spark lets these run without a checkpoint
UNPARTITIONED_SINKS = (MEMORY, FOREACH, FOREACH_BATCH)  # Spark refuses partitionBy for these


class TracedWriter:
    """Mirrors ``DataStreamWriter``; every method returns the writer, ``start``/``toTable`` the query."""

    def __init__(self, traced):
        self._traced = traced
        self._sink = SinkSpec()
        self._output_mode = "append"
        self._trigger: dict = {}
        self._checkpoint: str | None = None

    def format(self, source: str) -> "TracedWriter":
        self._sink.format = source
        return self

    def option(self, key: str, value) -> "TracedWriter":
        if key.lower() == "checkpointlocation":
            self._checkpoint = to_str(value)
            return self
        for name in [k for k in self._sink.options if k.lower() == key.lower()]:  # Spark's keys ignore case
            del self._sink.options[name]
        self._sink.options[key] = to_str(value)
        return self

    def options(self, **options) -> "TracedWriter":
        for key, value in options.items():
            self.option(key, value)
        return self

    def outputMode(self, outputMode: str) -> "TracedWriter":
        if not isinstance(outputMode, str) or outputMode.lower() not in OUTPUT_MODES:
            raise SinkError(f"unknown output mode {outputMode!r}: one of {', '.join(OUTPUT_MODES)}")
        self._output_mode = outputMode
        return self

    def partitionBy(self, *cols) -> "TracedWriter":
        self._sink.partition_by = _columns(cols)
        return self

    def clusterBy(self, *cols) -> "TracedWriter":
        self._sink.cluster_by = _columns(cols)
        return self

    def queryName(self, queryName: str) -> "TracedWriter":
        if not isinstance(queryName, str) or not queryName.strip():
            raise SinkError("queryName needs a non-empty string")
        return self.option("queryName", queryName)

    def trigger(self, **trigger) -> "TracedWriter":
        # Checked by PySpark's own writer, so a bad trigger fails here as it does untraced.
        self._traced.threaded.df.writeStream.trigger(**trigger)
        self._trigger = trigger
        return self

    def foreach(self, f) -> "TracedWriter":
        partition_writer(f)  # checks f as Spark does
        self._sink.format, self._sink.function = FOREACH, f
        return self

    def foreachBatch(self, func) -> "TracedWriter":
        if not callable(func):
            raise SinkError("foreachBatch needs a function of (DataFrame, batch id)")
        self._sink.format, self._sink.function = FOREACH_BATCH, func
        return self

    def start(self, path: str | None = None, format: str | None = None, outputMode: str | None = None,
              partitionBy=None, queryName: str | None = None, **options) -> StreamingQuery:
        self._settings(format, outputMode, partitionBy, queryName, options)
        if path is not None:
            legacy = self._traced.spark.conf.get("spark.sql.legacy.pathOptionBehavior.enabled", "false")
            if option(self._sink.options, "path") is not None and legacy.lower() != "true":
                raise SinkError("the path is given twice, as start(path) and as option('path'): give it once")
            self.option("path", path)
        return self._start()

    def toTable(self, tableName: str, format: str | None = None, outputMode: str | None = None,
                partitionBy=None, queryName: str | None = None, **options) -> StreamingQuery:
        self._settings(format, outputMode, partitionBy, queryName, options)
        self._sink.table = tableName
        return self._start()

    def _settings(self, format, output_mode, partition_by, query_name, options) -> None:
        """``start``'s and ``toTable``'s own arguments, applied in PySpark's order."""
        self.options(**options)
        if output_mode is not None:
            self.outputMode(output_mode)
        if partition_by is not None:
            self.partitionBy(partition_by)
        if format is not None:
            self.format(format)
        if query_name is not None:
            self.queryName(query_name)

    def _start(self) -> StreamingQuery:
        traced = self._traced
        traced.tracer.check_open()  # before anything of the start: the checkpoint's plan file, the plan record
        spark = traced.spark
        spec = self._sink
        if spec.format is None:
            spec.format = spark.conf.get("spark.sql.sources.default")
        schema = self._sink_schema()
        self._check(spark, schema)
        refusal = spark_refusal(spark, traced.user_plan, self._output_mode, self._needs_checkpoint(spark))
        if refusal is not None:
            raise refusal
        if self._output_mode.lower() == "complete":
            traced = traced.in_complete_mode()
        query_name = option(spec.options, "queryName") or traced.name
        metrics.OVERHEAD_BUDGET.labels(traced.name).set(traced.config.overhead_budget)
        hook = BatchHook(traced, spec, open_sink(spark, spec, schema, self._output_mode))
        if log_only.spark_writes(hook.log_only, spec, hook.sink, self._output_mode, traced.threaded.black_boxes):
            logged = log_only.LoggedBatches(hook, hook.sink.latest_batch())
            writer = log_only.writer(hook, spec, self._output_mode)
        else:
            logged = None
            writer = hook.hooked_frame().writeStream.foreachBatch(hook).outputMode(self._output_mode)
        if self._trigger:
            writer = writer.trigger(**self._trigger)
        writer = writer.queryName(query_name)
        if self._checkpoint:
            writer = writer.option("checkpointLocation", self._checkpoint)
        ir = traced.threaded.ir
        reads = column_lineage(ir)
        key = signing.key_of(traced.config)
        folder = checkpoint.local_folder(self._checkpoint)
        recorded = checkpoint.record_plan(folder, traced.fingerprint) if folder else None
        previous = recorded.previous if recorded else None
        traced.shipper.publish_log(
            LOG_PLAN, query=traced.name, sink=spec.describe(), sink_guarantee=hook.sink.guarantee, ir=ir.to_dict(),
            fingerprint=traced.fingerprint, previous_fingerprint=previous,
            from_batch=recorded.from_batch if recorded else 0,
            changed=previous is not None and previous != traced.fingerprint,
            plan_since=recorded.since if recorded else None,
            previous_plan_since=recorded.previous_since if recorded else None,
            sources=[{**s.to_dict(), "columns_read": reads.get(s.node_id)} for s in traced.threaded.read],
            column_lineage=column_transformations(ir), sink_location=self._sink_location(spark),
            sink_schema=[[f.name, f.dataType.simpleString()] for f in schema.fields],
            state=[op.to_dict() for op in traced.threaded.state_ops],
            output_columns=[a.name for a in ir.output], at=time.time(), optimized=traced.optimized,
            black_boxes=[{**box.to_dict(), **signing.signed(traced.name, box.node_id, box.function, key)}
                         for box in traced.threaded.black_boxes],
        )
        query = traced.tracer.start_query(writer, query_name, traced.name, logged)
        hook.sink.started(query_name)
        return query

    def _check(self, spark, schema: StructType) -> None:
        """What ``DataStreamWriter`` refuses at start, and what headwater cannot honour."""
        spec = self._sink
        continuous = [k for k in CONTINUOUS_TRIGGERS if self._trigger.get(k) is not None]
        if continuous:
            raise SinkError(f"trigger({continuous[0]}=…) cannot be traced: headwater reads each micro-batch "
                            f"(foreachBatch), which Spark runs with processingTime, once or availableNow triggers")
        if spec.partition_by and spec.cluster_by:
            raise SinkError("partitionBy and clusterBy cannot both be given")
        if spec.partition_by and not spec.table and spec.format in UNPARTITIONED_SINKS:
            raise SinkError(f"the {spec.format} sink does not take partitionBy")
        if spec.format == "text" and not spec.table and self._traced.emit_rid:
            raise SinkError("the text sink takes one string column, and headwater adds _hw_rid to it: trace the "
                            "query with emit_rid=False to write text")
        if spec.format == MEMORY and self._output_mode.lower() != "complete" and _has_offsets(self._checkpoint):
            # Spark's rule: only a complete-mode memory sink can be rebuilt from a checkpoint.
            raise SinkError(f"a memory sink in {self._output_mode} mode does not recover from a checkpoint: delete "
                            f"{self._checkpoint}/offsets to start over")
        columns = [f.name for f in schema.fields]
        spec.partition_by = _normalized(spark, spec.partition_by, columns, "partition")
        spec.cluster_by = _normalized(spark, spec.cluster_by, columns, "clustering")

    def _sink_location(self, spark) -> dict:
        """Where the sink's rows go, as OpenLineage names datasets (``capture/openlineage.py``): a path as Spark
        qualifies it (``file:/abs/out``, ``s3a://bucket/out``), a Kafka topic and its brokers, or a catalog
        table's name; empty for the user's own code and Spark's console and memory sinks."""
        spec = self._sink
        if spec.table:
            return {"table": spec.table}
        if (spec.format or "").lower() == "kafka":
            topic = option(spec.options, "topic")
            servers = option(spec.options, "kafka.bootstrap.servers")
            return {"kafka": {"bootstrap": servers, "topic": topic}} if topic and servers else {}
        if not spec.path:
            return {}
        try:
            jvm = spark._jvm
            path = jvm.org.apache.hadoop.fs.Path(spec.path)
            hadoop = spark._jsparkSession.sessionState().newHadoopConf()
            return {"path": str(path.getFileSystem(hadoop).makeQualified(path).toString())}
        except Exception:  # a file system Spark cannot reach yet: named as given
            log.warning("the sink path %s could not be qualified; its OpenLineage name is the path as given",
                        spec.path, exc_info=True)
            return {"path": spec.path}

    def _needs_checkpoint(self, spark) -> bool:
        """Spark's rule: a sink other than the one-time ones needs a checkpoint, since a restart would
        begin at batch 0 again and a sink with a commit log would take its batches for ones it holds."""
        spec = self._sink
        return bool((spec.table or spec.format not in ONE_TIME_SINKS) and not self._checkpoint
                    and not spark.conf.get("spark.sql.streaming.checkpointLocation", None))

    def _sink_schema(self) -> StructType:
        """The columns the sink gets: the user's, and ``_hw_rid`` unless ``emit_rid=False``."""
        threaded = self._traced.threaded
        fields = list(threaded.df.schema.fields[:threaded.user_columns])
        if self._traced.emit_rid:
            fields.append(StructField(RID_COLUMN, LongType(), False))
        return StructType(fields)


def spark_refusal(spark, plan, mode: str, checkpoint_missing: bool) -> Exception | None:
    """Spark's own error for what it refuses of a streaming query at start, as PySpark raises it: a missing
    checkpoint, then an operation of ``plan`` (the user's analyzed plan) that output ``mode`` does not allow
    (Spark's ``UnsupportedOperationChecker``, unless ``spark.sql.streaming.unsupportedOperationCheck`` is
    off). None if Spark would start it. Asked of the user's plan, not the traced one, so that the message
    (which may print the plan) is the one the query gets untraced."""
    from pyspark.errors.exceptions.captured import CapturedException, convert_exception

    jvm = spark._jvm
    if checkpoint_missing:
        errors = jvm.org.apache.spark.sql.errors.QueryCompilationErrors
        return convert_exception(errors.checkpointLocationNotSpecifiedError())
    if spark.conf.get("spark.sql.streaming.unsupportedOperationCheck", "true").lower() != "true":
        return None
    try:
        jvm.org.apache.spark.sql.catalyst.analysis.UnsupportedOperationChecker.checkForStreaming(
            plan, output_mode(jvm, mode))
    except CapturedException as refused:  # PySpark's own conversion of the JVM's AnalysisException
        return refused
    return None


def _has_offsets(location: str | None) -> bool:
    folder = checkpoint.local_folder(location)
    offsets = folder / "offsets" if folder else None
    return bool(offsets and offsets.is_dir() and any(offsets.iterdir()))


def _columns(cols) -> list[str]:
    """``partitionBy("a", "b")`` or ``partitionBy(["a", "b"])``, as PySpark takes them."""
    if len(cols) == 1 and isinstance(cols[0], (list, tuple)):
        cols = cols[0]
    if not all(isinstance(c, str) for c in cols):
        raise SinkError(f"column names must be strings, not {cols!r}")
    return list(cols)


def _normalized(spark, names: list[str] | None, columns: list[str], kind: str) -> list[str] | None:
    """Each name as the output column it resolves to (Spark's resolver ignores case unless told not to)."""
    if not names:
        return names
    sensitive = spark.conf.get("spark.sql.caseSensitive", "false").lower() == "true"
    resolved = []
    for name in names:
        found = [c for c in columns if (c == name if sensitive else c.lower() == name.lower())]
        if not found:
            raise SinkError(f"{kind} column {name!r} is not among the output's columns {columns}")
        resolved.append(found[0])
    return resolved
