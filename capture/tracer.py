"""The capture entry points: ``attach(spark) -> Tracer`` and ``Tracer.trace(df)``.

``trace`` wraps only the user's final DataFrame. Its ``.writeStream`` mirrors
``DataStreamWriter``; ``start()`` runs the rid-threaded plan as a ``foreachBatch``
query whose per-batch hook writes the user's rows (plus ``_hw_rid``) to the user's
sink and publishes the batch's lineage from the executors.
"""

from __future__ import annotations

import functools
import datetime as dt
import logging
import threading
import time
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import ArrayType, MapType, StructType

from headwater.adapters.kafka import ensure_topics, producer
from headwater.core import config as configuration
from headwater.core import rid as rids
from headwater.core.config import Config
from headwater.core.plan import column_lineage, column_masks
from headwater.core.schema import LOG_BATCH, LOG_PLAN, encode_log

from . import metrics
from .kafka_source import KafkaSource
from .listener import ProgressListener
from .lineage import BatchContext, SourceEdges
from .publish import STATS, STATS_SCHEMA, PublishTarget, publish_partition
from .rewrite import BLACK_BOX_MARKER, RID_COLUMN, SOURCE_PREFIX, Threaded, thread_rids
from .sinks import SinkSpec, write_batch

log = logging.getLogger("headwater.capture")


def attach(spark: SparkSession, config: Config | None = None, **settings) -> "Tracer":
    """Prepare ``spark`` for tracing: topics exist, the Kafka source is registered.

    ``settings`` override fields of ``Config`` (e.g. ``bootstrap="127.0.0.1:9092"``).
    """
    config = (config or configuration.load()).with_overrides(**settings)
    ensure_topics(config.bootstrap, [config.edges_topic, config.log_topic], config.topic_partitions)
    spark.dataSource.register(KafkaSource)
    return Tracer(spark, config)


class Tracer:
    """Traces streaming queries of one SparkSession; ``close()`` when done with it."""

    def __init__(self, spark: SparkSession, config: Config):
        self.spark = spark
        self.config = config
        self._log_producer = None
        self._log_lock = threading.Lock()
        self._queries: dict[str, str] = {}  # Spark query name → traced query name
        self._publish_seconds: dict[tuple[str, int], float] = {}  # (query, batch) → hook's publishing time
        self._listener = ProgressListener(self._queries.get, self.publish_log, self._observe_progress)
        spark.streams.addListener(self._listener)
        self._metrics_server = metrics.serve(config.metrics_port) if config.metrics_port else None

    def name_query(self, spark_name: str, traced_name: str) -> None:
        """Spark's name of a traced query's streaming query, for the progress listener."""
        self._queries[spark_name] = traced_name

    def note_publishing(self, query: str, batch: int, seconds: float) -> None:
        """The hook's publishing time of a batch, until that batch's progress arrives."""
        self._publish_seconds[(query, batch)] = seconds
        if len(self._publish_seconds) > 1000:  # progress that never came
            self._publish_seconds.pop(next(iter(self._publish_seconds)))

    def _observe_progress(self, record: dict) -> None:
        query, batch = record["query"], record["batch"]
        batch_ms = record["durations_ms"].get("triggerExecution")
        published = self._publish_seconds.pop((query, batch), None)
        if batch_ms is not None and published is not None:
            metrics.OVERHEAD_RATIO.labels(query).set(metrics.overhead_ratio(published, batch_ms / 1000))
        if batch_ms is not None and record.get("at"):
            started = dt.datetime.fromisoformat(record["at"].replace("Z", "+00:00"))
            ended = started + dt.timedelta(milliseconds=batch_ms)
            metrics.LISTENER_LAG_SECONDS.labels(query).set((dt.datetime.now(dt.timezone.utc) - ended).total_seconds())

    def trace(self, df: DataFrame, name: str, keys: dict | None = None, emit_rid: bool = True,
              black_boxes=()) -> "Traced":
        """Trace the streaming DataFrame ``df`` as query ``name``.

        ``keys`` declares static tables' primary keys, ``{"customers": "customer_id"}``
        (a tuple for composite keys); a table without one is keyed by its row content.
        ``emit_rid=False`` leaves ``_hw_rid`` out of the sink. ``black_boxes`` names
        Spark plan node classes (``{"GlobalLimit", "LocalLimit"}``) to trace as black
        boxes: superset lineage, flagged ``exact=false``, where capture cannot trace a
        node exactly.
        """
        if not df.isStreaming:
            raise ValueError("Tracer.trace needs a streaming DataFrame (spark.readStream…)")
        keys = {t: (k,) if isinstance(k, str) else tuple(k) for t, k in (keys or {}).items()}
        return Traced(self, thread_rids(df, keys, frozenset(black_boxes)), name, emit_rid)

    def close(self) -> None:
        """Stop listening and flush the log; call it after the traced queries have stopped."""
        if self._listener is not None:
            try:  # let progress events already posted reach the listener first
                self.spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(10_000)
            except Exception:
                log.warning("progress events still queued at close may not be logged", exc_info=True)
            self.spark.streams.removeListener(self._listener)
            self._listener = None
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
            self._metrics_server = None
        with self._log_lock:
            if self._log_producer is not None:
                self._log_producer.close()
                self._log_producer = None

    def publish_log(self, schema: str, **fields) -> None:
        """One record to the log topic; the hook and the listener call it from different threads."""
        with self._log_lock:
            if self._log_producer is None:
                self._log_producer = producer(self.config.bootstrap, linger_ms=0)
            key = str(fields.get("query", "")).encode()
            self._log_producer.send(self.config.log_topic, key=key, value=encode_log(schema, **fields))
            self._log_producer.flush(timeout=10)


@dataclass
class Traced:
    tracer: Tracer
    threaded: Threaded
    name: str
    emit_rid: bool

    @property
    def writeStream(self) -> "TracedWriter":
        return TracedWriter(self)


class TracedWriter:
    """Mirrors ``DataStreamWriter``; every method returns the writer, ``start`` the query."""

    def __init__(self, traced: Traced):
        self._traced = traced
        self._sink = SinkSpec()
        self._output_mode = None
        self._trigger: dict = {}
        self._query_name = None
        self._checkpoint = None

    def format(self, source: str) -> "TracedWriter":
        self._sink.format = source
        return self

    def option(self, key: str, value) -> "TracedWriter":
        if key == "checkpointLocation":
            self._checkpoint = str(value)
        else:
            self._sink.options[key] = str(value)
        return self

    def options(self, **options) -> "TracedWriter":
        for key, value in options.items():
            self.option(key, value)
        return self

    def outputMode(self, mode: str) -> "TracedWriter":
        self._output_mode = mode
        return self

    def trigger(self, **trigger) -> "TracedWriter":
        self._trigger = trigger
        return self

    def queryName(self, name: str) -> "TracedWriter":
        self._query_name = name
        return self

    def foreachBatch(self, func) -> "TracedWriter":
        self._sink.foreach_batch = func
        return self

    def toTable(self, tableName: str, **options) -> StreamingQuery:
        self._sink.table = tableName
        return self.start(**options)

    def start(self, path: str | None = None, format: str | None = None, outputMode: str | None = None,
              queryName: str | None = None, **options) -> StreamingQuery:
        if path:
            self._sink.options["path"] = path
        if format:
            self._sink.format = format
        if outputMode:
            self._output_mode = outputMode
        if queryName:
            self._query_name = queryName
        self.options(**options)

        traced = self._traced
        hook = BatchHook(traced, self._sink)
        writer = traced.threaded.df.writeStream.foreachBatch(hook)
        if self._output_mode:
            writer = writer.outputMode(self._output_mode)
        if self._trigger:
            writer = writer.trigger(**self._trigger)
        query_name = self._query_name or traced.name
        writer = writer.queryName(query_name)
        traced.tracer.name_query(query_name, traced.name)
        if self._checkpoint:
            writer = writer.option("checkpointLocation", self._checkpoint)
        ir = traced.threaded.ir
        reads = column_lineage(ir)
        traced.tracer.publish_log(
            LOG_PLAN, query=traced.name, sink=self._sink.describe(), ir=ir.to_dict(),
            sources=[{**s.to_dict(), "columns_read": reads.get(s.node_id)}
                     for s in traced.threaded.sources + traced.threaded.inputs],
            output_columns=[a.name for a in ir.output], at=time.time(),
        )
        return writer.start()


def _holds_map(dtype) -> bool:
    """Whether a Spark type is or contains a map, which ``xxhash64`` refuses."""
    if isinstance(dtype, MapType):
        return True
    if isinstance(dtype, ArrayType):
        return _holds_map(dtype.elementType)
    if isinstance(dtype, StructType):
        return any(_holds_map(f.dataType) for f in dtype.fields)
    return False


class BatchHook:
    """The per-batch hook: user's rows to the user's sink, lineage to the edges topic."""

    def __init__(self, traced: Traced, sink: SinkSpec):
        self.traced = traced
        self.sink = sink
        threaded = traced.threaded
        self.masks = column_masks(threaded.ir)
        config = traced.tracer.config
        self.target = PublishTarget(config.bootstrap, config.edges_topic)

    def _edges_from(self, sources, batch_id: int, mask: int | None = None) -> tuple[SourceEdges, ...]:
        """How each source's rows link to the rows of a batch; ``mask`` overrides the plan's masks."""
        return tuple(
            SourceEdges(s.column, s.source, s.dataset, self.masks.get(s.node_id, -1) if mask is None else mask,
                        rid=self.state_rid(s, batch_id) if s.source == "blackbox" else None,
                        exact=s.source != "blackbox")
            for s in sources
        )

    def state_rid(self, box, batch_id: int) -> int:
        """The state node of a black box: one per batch, or one for all batches if it keeps state."""
        return rids.state_rid(self.traced.name, box.node_id, None if box.stateful else batch_id)

    def output_rid(self, batch_id: int, content: list[str]):
        """rid of each output row: its query, sink, batch, input rids and content.

        The content tells apart the rows one input yields (explode); rows alike in
        content and inputs share a rid, which is their true lineage either way.
        """
        parts = [F.col(f"{s.column}.rid") for s in self.traced.threaded.sources]
        return F.xxhash64(F.lit(rids.OUTPUT), F.lit(self.traced.name), F.lit(self.sink.describe()),
                          F.lit(batch_id).cast("long"), *parts, *[F.col(c) for c in content])

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        threaded = self.traced.threaded
        names = batch_df.columns
        n_user = threaded.user_columns
        # Positional names: the user's output may repeat a column name.
        positional = [f"_hw_c{i}" for i in range(n_user)] + names[n_user:]
        user = list(zip(positional[:n_user], names[:n_user]))
        hashable = [p for p, field in zip(positional[:n_user], batch_df.schema.fields)
                    if not _holds_map(field.dataType)]
        frame = batch_df.toDF(*positional)
        boxes = threaded.black_boxes
        if boxes:
            frame = frame.persist()
            out = frame.where(F.col(BLACK_BOX_MARKER).isNull())
        else:
            out = frame
        out = out.withColumn(RID_COLUMN, self.output_rid(batch_id, hashable)).persist()
        try:
            rows = out.select(*[F.col(p).alias(n) for p, n in user], *([RID_COLUMN] if self.traced.emit_rid else []))
            write_batch(rows, self.sink, batch_id)
            publish_started = time.monotonic()
            stats = self._publish(out, self._context(batch_id, threaded.ir.id,
                                                     self._edges_from(threaded.sources, batch_id)))
            # Counted by the publishing job itself: no job of its own.
            stats["rows_out"] = stats.pop("rows", None)
            if self.sink.foreach_batch is not None:
                self._add(stats, self._publish_foreach_batch(out, batch_id))
            inputs = {s.column: s for s in threaded.inputs}
            for box in boxes:
                # What enters a black box reaches the sink's columns it feeds.
                sources = self._edges_from([inputs[c] for c in box.inputs], batch_id, self.masks.get(box.node_id, -1))
                ctx = self._context(batch_id, box.node_id, sources, dst_kind="state", dst_dataset=box.dataset,
                                    exact=False)
                entering = frame.where(F.col(BLACK_BOX_MARKER) == box.node_id) \
                    .withColumn(RID_COLUMN, F.lit(self.state_rid(box, batch_id)))
                self._add(stats, self._publish(entering, ctx))
            publishing = time.monotonic() - publish_started
        finally:
            out.unpersist()
            if boxes:
                frame.unpersist()
        status = "full" if stats["failed_edges"] == 0 and stats.get("error") is None else "failed"
        metrics.record_batch(self.traced.name, status, stats, publishing)
        self.traced.tracer.note_publishing(self.traced.name, batch_id, publishing)
        self.traced.tracer.publish_log(
            LOG_BATCH, query=self.traced.name, batch=batch_id, status=status,
            seconds=round(time.monotonic() - started, 3), **stats,
        )

    def _context(self, batch_id: int, op: int, sources: tuple[SourceEdges, ...], **destination) -> BatchContext:
        """Edges of this query's batch ``batch_id`` that end at operator ``op``'s rows."""
        return BatchContext(self.traced.name, self.traced.name, batch_id, op, sources, **destination)

    @staticmethod
    def _add(stats: dict, more: dict) -> None:
        """Add another publishing job's figures; rows out are the sink's alone."""
        more.pop("rows", None)
        for key, value in more.items():
            stats[key] = value if key == "error" else stats.get(key, 0) + value

    def _publish_foreach_batch(self, out: DataFrame, batch_id: int) -> dict:
        """Superset edges from every row handed to the user's foreachBatch to the batch's node.

        What that code writes is out of sight: rows it writes with their ``_hw_rid`` keep
        exact lineage; any other row it derives has this node's lineage, a superset.
        """
        query = self.traced.name
        column = f"{SOURCE_PREFIX}out"
        rows = out.select(F.lit(rids.state_rid(query, rids.FOREACH_BATCH_OP, batch_id)).alias(RID_COLUMN),
                          F.struct(F.col(RID_COLUMN).alias("rid")).alias(column))
        ctx = self._context(batch_id, rids.FOREACH_BATCH_OP, (SourceEdges(column, "output", query, -1, exact=False),),
                            dst_kind="state", dst_dataset=f"foreachBatch#{query}", exact=False)
        return self._publish(rows, ctx)

    def _publish(self, rows: DataFrame, ctx: BatchContext) -> dict:
        fn = functools.partial(publish_partition, ctx=ctx, target=self.target)
        columns = [RID_COLUMN, *[s.column for s in ctx.sources]]
        try:
            return rows.select(*columns).mapInArrow(fn, STATS_SCHEMA).agg(
                *[F.coalesce(F.sum(c), F.lit(0)).alias(c) for c in STATS]
            ).collect()[0].asDict()
        except Exception as exc:  # lineage must never stop the user's stream
            log.exception("publishing lineage of batch %s failed", ctx.batch)
            return {**{c: 0 for c in STATS if c != "rows"}, "error": str(exc)[:500]}

