"""Sinks Spark builds for a format: file sinks, ``StreamSinkProvider`` sinks and V2 streaming writers.

``spark_sink`` makes the decision ``DataStreamWriter.start()`` makes, through the same
Spark calls, and each batch is written by the sink's own code: ``addBatch`` of a V1 sink
(Spark's ``FileStreamSink`` for file formats, with its ``_spark_metadata`` log), or, for a
table with a streaming writer (Kafka, Python data sources, catalogs' V2 tables), the
plan Spark's micro-batch engine runs (``WriteToMicroBatchDataSource`` with the batch id,
which Spark turns into a ``MicroBatchWrite``: the writer's ``commit`` gets the batch id).
What a sink writes, and whether a retried batch is written again, is Spark's code or
the connector's, as untraced.
"""

from __future__ import annotations

import json
from collections import OrderedDict

from py4j.protocol import Py4JError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from headwater.adapters import spark_lines
from headwater.core.sink_log import batch_files

from ..spark_plan import Jvm, session_jvm
from . import kafka_sink
from .base import EXACTLY_ONCE, Sink, SinkError, option
from .jvm import case_insensitive, is_instance, java_schema, message, scala_map
from .jvm import output_mode as java_output_mode
from .streaming_write import AS_THE_CONNECTOR, StreamingWriteSink

FILE_SINK = "FileStreamSink"  # in its line's package (spark_lines.SparkLine.streaming_sinks)
ENTRIES_KEPT = 64  # FileSink's log entries kept read at most: 6 times Spark's default compaction interval


class SparkSink(Sink):
    """A V1 sink of Spark's (``StreamSinkProvider``): each batch goes to its ``addBatch``."""

    reads_every_row = False  # its addBatch may skip a batch it holds (Delta does)

    def __init__(self, jsink, guarantee: str = AS_THE_CONNECTOR):
        self._jsink = jsink
        self.guarantee = guarantee

    def write(self, df: DataFrame, batch_id: int) -> None:
        self._jsink.addBatch(batch_id, df._jdf)


class FileSink(SparkSink):
    """Spark's file sink: files written under the path, then the batch's list of them added to
    ``_spark_metadata``; readers of the path read that log, so they see committed batches only,
    and a batch the log already holds is not written again."""

    reads_every_row = True  # FileStreamSink skips only batches its log holds, as ``latest_batch`` says

    def __init__(self, spark: SparkSession, jsink, path: str):
        super().__init__(jsink, EXACTLY_ONCE)
        jvm = session_jvm(spark)
        # The classes ``files`` uses every batch, looked up once: naming a class over py4j costs a call into
        # the JVM for each part of its name (on the window shape ``files`` took 8 ms a batch so, 4 without).
        self._path_class = jvm.org.apache.hadoop.fs.Path
        self._bytes_class = jvm.java.io.ByteArrayOutputStream
        self._arrays = jvm.java.util.Arrays
        root = self._path_class(path)
        self._fs = root.getFileSystem(spark._jsparkSession.sessionState().newHadoopConf())
        sinks = getattr(jvm, spark_lines.running(spark).streaming_sinks)
        self._log_path = sinks.FileStreamSink.getMetadataLogPath(self._fs, root,
                                                                 spark._jsparkSession.sessionState().conf())
        # A reader of the sink's log, opened as Spark's readers open it.
        self._log = sinks.FileStreamSinkLog(1, spark._jsparkSession, self._log_path.toString(),
                                            jvm.scala.Option.empty())
        # The entries ``files`` read since the latest compaction (and it), by batch: a compaction's files take
        # them all, and each batch's ``files`` has read its own already (an entry never changes once written).
        self._read: OrderedDict[int, set[str]] = OrderedDict()
        # The log's latest batch, read once a run: this sink, opened for one query's run, is the log's one
        # writer where the hook writes (Spark's file sink has one), so after that only ``write`` moves it.
        # (Log-only's Spark sink writes the log itself, and asks the latest batch once, at start.) Reading it
        # lists ``_spark_metadata``, a LIST on object storage (1.5-2.3 ms a batch on a local disk).
        self._latest: int | None = None

    def write(self, df: DataFrame, batch_id: int) -> None:
        super().write(df, batch_id)
        if self._latest is not None:  # Spark's sink wrote the batch, or skipped it as a batch its log holds
            self._latest = max(self._latest, batch_id)

    def latest_batch(self) -> int:
        if self._latest is None:
            latest = self._log.getLatestBatchId()
            self._latest = int(latest.get()) if latest.isDefined() else -1
        return self._latest

    def files(self, batch_id: int) -> list[str] | None:
        """The batch's files as its log entry lists them (``headwater.core.sink_log``). The log
        is looked at beyond the batch's entry only after a compaction, which Spark writes every few batches."""
        compactions = self._compactions(batch_id) if self._compacted(batch_id) else []
        files = batch_files(batch_id, self._entries, compactions)
        if compactions:  # what the next compaction needs starts here
            for earlier in [b for b in self._read if b < batch_id]:
                del self._read[earlier]
        return files

    def _compacted(self, batch_id: int) -> bool:
        return bool(self._fs.exists(self._path_class(self._log_path, f"{batch_id}.compact")))

    def _compactions(self, batch_id: int) -> list[int]:
        """Compaction ``batch_id`` and the compaction before it, if any: what ``batch_files`` needs of the
        log's compactions. The one before is the log's latest batch before this one that is a compaction,
        tried downwards from the log's batch ids, had in one call. (Naming each of the log's files over py4j
        took two calls a file, and reading again the entries since the compaction before: on the window shape
        a compaction's ``files`` took about 110 ms so, 40 ms with this and the entries kept.)"""
        listed = str(self._arrays.toString(self._log.listBatches())).strip("[]")
        ids = [int(part) for part in listed.split(",") if part.strip()]
        before = next((b for b in sorted(ids, reverse=True) if b < batch_id and self._compacted(b)), None)
        return [batch_id] if before is None else [before, batch_id]

    def _entries(self, batch_id: int) -> set[str] | None:
        if batch_id in self._read:
            return self._read[batch_id]
        files = self._entry(batch_id)
        if files is not None:  # an entry not written yet may be by the time it is asked again
            self._read[batch_id] = files
            while len(self._read) > ENTRIES_KEPT:
                self._read.popitem(last=False)
        return files

    def _entry(self, batch_id: int) -> set[str] | None:
        entry = self._log.get(batch_id)
        if not entry.isDefined():
            return None
        # In one call, as the log's own text (a version line, then a JSON object per file): a compaction
        # lists every file so far, and reading it file by file over py4j grew with the stream's age
        # (800 files: 0.88 s, against 0.05 s so).
        text = self._bytes_class()
        self._log.serialize(entry.get(), text)
        return {json.loads(line)["path"] for line in text.toString("UTF-8").splitlines()[1:] if line}


def spark_sink(spark: SparkSession, source: str, options: dict, partition_by: list[str] | None,
               cluster_by: list[str] | None, output_mode: str, schema: StructType) -> Sink:
    """The sink ``DataStreamWriter`` would start for the format ``source``, with these options."""
    jvm = session_jvm(spark)
    jspark = spark._jsparkSession
    conf = jspark.sessionState().conf()
    datasources = jvm.org.apache.spark.sql.execution.datasources
    try:
        cls = datasources.DataSource.lookupDataSource(source, conf)
    except Exception as exc:
        raise SinkError(f"no data source {source!r} to write the traced query to: {message(exc)}") from exc
    kafka = source.lower() == kafka_sink.KAFKA
    given = kafka_sink.connector_options(options) if kafka else options
    table = _streaming_table(spark, cls, source, given, schema)
    line = spark_lines.running(spark)
    if table is not None:
        none = jvm.scala.Option.empty()
        relation = line.v2_relation(jvm, table, none, none, case_insensitive(jvm, given))
        if kafka:
            return kafka_sink.KafkaSink(spark, relation, options, output_mode, kafka_sink.rid_place(options))
        return StreamingWriteSink(spark, relation, options, output_mode)
    scala = Jvm(spark)
    if cluster_by:  # DataStreamWriter.clusterBy is Spark 4's
        clustering = datasources.DataSourceUtils.CLUSTERING_COLUMNS_KEY()
        options = {k: v for k, v in options.items() if k != clustering}  # as DataStreamWriter.createV1Sink
        options[clustering] = datasources.DataSourceUtils.encodePartitioningColumns(scala.seq(cluster_by))
    data_source = line.data_source(jvm, jspark, source, scala.seq(partition_by or []), scala_map(jvm, options))
    file_format = jvm.java.lang.Class.forName("org.apache.spark.sql.execution.datasources.FileFormat")
    if file_format.isAssignableFrom(data_source.providingClass()):
        # Spark takes only appends into files. Traced, an update or complete query's emissions
        # are appended as each batch's files, once each: the history its lineage is about.
        output_mode = "append"
    try:
        mode = java_output_mode(jvm, output_mode)
        jsink = data_source.createSink(mode, java_schema(spark, schema)) if _takes_schema(data_source) \
            else data_source.createSink(mode)
    except Exception as exc:
        raise SinkError(f"the traced query cannot write to {source!r}: {message(exc)}") from exc
    if jsink.getClass().getName() == f"{line.streaming_sinks}.{FILE_SINK}":
        path = option(options, "path")
        if path is None:  # Spark's createSink refuses a file sink of no path before this
            raise SinkError(f"a {source!r} sink needs a path: .option('path', …) or .start(path)")
        return FileSink(spark, jsink, path)
    return SparkSink(jsink)


def _takes_schema(data_source) -> bool:
    """Whether ``DataSource.createSink`` takes the query's schema beside the output mode (Spark 4.3 on)."""
    return any(m.getName() == "createSink" and m.getParameterCount() == 2
               for m in data_source.getClass().getMethods())


def _streaming_table(spark: SparkSession, cls, source: str, options: dict, schema: StructType):
    """The table a V2 provider gives for the options, if ``DataStreamWriter`` would write it with
    its streaming writer (as it decides: a ``TableProvider``, not file source V2, not disabled,
    whose table supports ``STREAMING_WRITE``); else None."""
    jvm = session_jvm(spark)
    conf = spark._jsparkSession.sessionState().conf()
    provider_class = jvm.java.lang.Class.forName("org.apache.spark.sql.connector.catalog.TableProvider")
    file_v2 = jvm.java.lang.Class.forName("org.apache.spark.sql.execution.datasources.v2.FileDataSourceV2")
    disabled = {s.strip() for s in (conf.disabledV2StreamingWriters() or "").split(",")}
    if not provider_class.isAssignableFrom(cls) or file_v2.isAssignableFrom(cls) or cls.getCanonicalName() in disabled:
        return None
    provider = cls.getConstructor(None).newInstance(None)
    if is_instance(jvm, "org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2", provider):
        provider.setShortName(source)
    v2 = jvm.org.apache.spark.sql.execution.datasources.v2.DataSourceV2Utils
    session = {k: v for k, v in Jvm.mapping(v2.extractSessionConfigs(provider, conf)).items()
               if option(options, k) is None}
    given = jvm.scala.Some(java_schema(spark, schema)) if _supports_external_metadata(provider) \
        else jvm.scala.Option.empty()
    try:
        table = v2.getTableFromProvider(provider, case_insensitive(jvm, {**session, **options}), given)
    except Exception as exc:
        raise SinkError(f"the traced query cannot write to {source!r}: {message(exc)}") from exc
    return table if supports_streaming_write(jvm, table) else None


def _supports_external_metadata(provider) -> bool:
    """``TableProvider.supportsExternalMetadata``; py4j does not find the interface's default (false) on a
    provider that keeps it, as Kafka's does."""
    try:
        return bool(provider.supportsExternalMetadata())
    except Py4JError:
        return False


def supports_streaming_write(jvm, table) -> bool:
    capability = jvm.org.apache.spark.sql.connector.catalog.TableCapability.STREAMING_WRITE
    return is_instance(jvm, "org.apache.spark.sql.connector.catalog.SupportsWrite", table) \
        and bool(table.capabilities().contains(capability))

