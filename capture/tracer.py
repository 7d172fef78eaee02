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
import queue
import threading
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import ArrayType, MapType, StructType

from headwater.adapters.kafka import ensure_topics
from headwater.adapters.table_files import TableUnreadable, table_version
from headwater.core import config as configuration
from headwater.core import rid as rids
from headwater.core.config import Config
from headwater.core.plan import column_masks, location_key, places, plan_fingerprint
from headwater.core.schema import LOG_BATCH, encode_log

from . import metrics
from .budget import FULL, LOG_ONLY, SAMPLED, OverheadBudget, Plan
from .delivery import DROPPED, Delivery, DeliverySettings, Spill
from .kafka_source import KafkaSource
from .jvm_listener import CAPTURE_PROPERTY, QUERY_ID_PROPERTY, JobListener
from .jvm_listener import register as register_job_listener
from .jvm_listener import unregister as unregister_job_listener
from .listener import ProgressListener
from .lineage import BatchContext, SourceEdges
from .publish import SAMPLE_MODULUS, STATS, STATS_SCHEMA, Counts, PublishTarget, publish_partition, publish_through
from .rewrite import BLACK_BOX_MARKER, RID_COLUMN, SOURCE_PREFIX, Threaded, thread_rids
from .state_nodes import PROPERTY, Setting, entering_column, late_watermarks, run_of
from .sinks import Sink, SinkSpec
from .spark_plan import analyzed, optimized_records

if TYPE_CHECKING:
    from .writer import TracedWriter

log = logging.getLogger("headwater.capture")

ROW_HASH = "_hw_row"  # an output row's rid but for its batch (BatchHook.row_hash)


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
        self.delivery_settings = DeliverySettings(
            config.bootstrap, config.spill_dir or str(configuration.default_home() / "spill"),
            spill_max_bytes=config.spill_max_bytes, buffer_bytes=config.buffer_bytes,
            send_timeout_s=config.send_timeout_s, breaker_cooldown_s=config.breaker_cooldown_s,
            topic_partitions=config.topic_partitions,
        )
        self._log_queue: queue.Queue = queue.Queue(maxsize=10_000)
        self._queries: dict[str, str] = {}  # Spark query name → traced query name
        self._query_ids: dict[str, str] = {}  # Spark query id → traced query name
        self._running: set[str] = set()  # Spark ids of traced queries not yet terminated
        self._listener = ProgressListener(self._queries.get, self.publish_log, self._observe_progress,
                                          self._running.discard)
        spark.streams.addListener(self._listener)
        # Registered only while traced queries run: every Spark event costs it a py4j call.
        self._job_listener = None
        self._jobs_lock = threading.Lock()
        self._metrics_server = metrics.serve(config.metrics_port) if config.metrics_port else None
        self._stop = threading.Event()
        self._shipper = threading.Thread(target=self._ship, name="headwater-log", daemon=True)
        self._shipper.start()

    def name_query(self, spark_name: str, traced_name: str) -> None:
        """Spark's name of a traced query's streaming query, for the progress listener."""
        self._queries[spark_name] = traced_name

    def start_query(self, writer, traced_name: str) -> StreamingQuery:
        """Start a traced query's ``DataStreamWriter``, the job listener listening from its first job."""
        starting = f"starting-{uuid.uuid4()}"  # keeps the listener registered until the id is known
        self._running.add(starting)
        try:
            self.listen_to_jobs(True)
            query = writer.start()
            self._query_ids[str(query.id)] = traced_name
            self._running.add(str(query.id))
            if not query.isActive:  # it ended before we noted it
                self._running.discard(str(query.id))
            return query
        finally:
            self._running.discard(starting)

    @property
    def listening_to_jobs(self) -> bool:
        return self._job_listener is not None

    def listen_to_jobs(self, listening: bool) -> None:
        """Register the job listener, or unregister it (from outside Spark's listener thread)."""
        with self._jobs_lock:
            if listening and self._job_listener is None:
                self._job_listener = register_job_listener(self.spark, JobListener(self._traced_by_id, _observe_job))
            elif not listening and self._job_listener is not None:
                unregister_job_listener(self.spark, self._job_listener)
                self._job_listener = None

    def _traced_by_id(self, spark_id: str) -> str | None:
        """The traced query of a Spark query id (None for any other), looked up once per id."""
        if spark_id not in self._query_ids:  # a first batch can run before start() returns
            active = self.spark.streams.get(spark_id)
            self._query_ids[spark_id] = self._queries.get(active.name) if active is not None else None
        return self._query_ids[spark_id]

    def _observe_progress(self, record: dict) -> None:
        batch_ms = record["durations_ms"].get("triggerExecution")
        if batch_ms is not None and record.get("at"):
            started = dt.datetime.fromisoformat(record["at"].replace("Z", "+00:00"))
            ended = started + dt.timedelta(milliseconds=batch_ms)
            lag = (dt.datetime.now(dt.timezone.utc) - ended).total_seconds()
            metrics.LISTENER_LAG_SECONDS.labels(record["query"]).set(lag)

    def _ship(self, every_s: float = 1.0) -> None:
        """The log's own thread: sends queued log records, then what was spilled.

        Neither the stream nor the listener ever waits for the broker on account of the
        log; spilled messages go out once the broker is back (topics made again if it
        lost them).
        """
        delivery = Delivery(self.delivery_settings)
        while True:
            records = []
            try:
                records.append(self._log_queue.get(timeout=every_s))
                while len(records) < 500:
                    records.append(self._log_queue.get_nowait())
            except queue.Empty:
                pass
            try:
                delivery.drain(budget_s=5.0)  # first: it is the one to probe a broker coming back
                for outcome, (_, key, _) in zip(delivery.deliver(records), records):
                    if outcome == DROPPED:
                        log.error("spill full: a log record of query %s is lost", key.decode())
                metrics.SPILL_BYTES.set(delivery.spill.size())
                metrics.BUFFER_DEPTH.set(len(delivery.spill.files()) + self._log_queue.qsize())
            except Exception:  # this thread must outlive any broker trouble
                log.exception("sending the log failed; retrying")
            if not self._running and self._job_listener is not None:
                try:  # the last traced query ended: untraced jobs pay nothing for it
                    self.listen_to_jobs(False)
                except Exception:
                    log.exception("unregistering the job listener failed")
            if self._stop.is_set() and self._log_queue.empty():
                break
        delivery.close(timeout_s=self.config.send_timeout_s)

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
        counts = self.spark.sparkContext.accumulator(Counts().zero(None), Counts())
        # With capture turned off (log-only), the aggregates get no entering filter: nothing would publish.
        entering = None if self.config.capture == LOG_ONLY else \
            functools.partial(entering_column, query=name, target=self.publish_target(), counts=counts)
        threaded = thread_rids(df, keys, frozenset(black_boxes), name, entering)
        fingerprint = plan_fingerprint(analyzed(df).toJSON(), places(threaded.ir))
        return Traced(self, threaded, name, emit_rid, fingerprint, counts, _optimized_plan(df, name))

    def publish_target(self) -> PublishTarget:
        """Where the executors publish lineage."""
        return PublishTarget(self.delivery_settings, self.config.edges_topic)

    def close(self) -> None:
        """Stop listening and flush the log; call it after the traced queries have stopped.

        What the broker has not taken stays in the spill folder; the next tracer on this
        host sends it.
        """
        if self._listener is not None:
            try:  # let progress events already posted reach the listener first
                self.spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(10_000)
            except Exception:
                log.warning("progress events still queued at close may not be logged", exc_info=True)
            self.spark.streams.removeListener(self._listener)
            self._listener = None
            self.listen_to_jobs(False)
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
            self._metrics_server = None
        self._stop.set()
        self._shipper.join(timeout=60)

    def publish_log(self, schema: str, **fields) -> None:
        """Queue one record for the log topic; never waits for the broker.

        The hook and the listener call it from different threads.
        """
        message = (self.config.log_topic, str(fields.get("query", "")).encode(), encode_log(schema, **fields))
        try:
            self._log_queue.put_nowait(message)
        except queue.Full:  # the log thread is far behind: keep the record on disk instead
            if Spill(self.delivery_settings.spill_dir, self.config.spill_max_bytes).put(*message) is None:
                log.error("spill full: log record %s of %s lost", schema, fields.get("query"))


def _optimized_plan(df: DataFrame, name: str) -> list | None:
    """The user's plan, optimized, for the log-only fallback; None (logged) if Spark cannot
    give it: the query is traced all the same, and its gaps are answered as whole batches."""
    try:
        return optimized_records(df)
    except Exception:
        log.warning("no optimized plan for %s: lineage of its uncaptured batches will be whole batches", name,
                    exc_info=True)
        return None


@dataclass
class Traced:
    tracer: Tracer
    threaded: Threaded
    name: str
    emit_rid: bool
    fingerprint: str  # of the user's plan, equal across runs of the same code
    counts: object  # what the executors published for it, and their time on it (``publish.Counts``)
    optimized: list | None = None  # the user's optimized plan records (``spark_plan.optimized_records``)

    @property
    def writeStream(self) -> "TracedWriter":
        from .writer import TracedWriter

        return TracedWriter(self)


def _observe_job(query: str, batch: int, part: str, seconds: float) -> None:
    metrics.JOB_SECONDS.labels(query, part).inc(seconds)


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

    def __init__(self, traced: Traced, spec: SinkSpec):
        self.traced = traced
        self.spec = spec
        self.sink: Sink | None = None  # opened from the spec at start()
        threaded = traced.threaded
        self.masks = column_masks(threaded.ir)
        config = traced.tracer.config
        self.target = traced.tracer.publish_target()
        self.budget = OverheadBudget(config.overhead_budget)
        self.log_only = config.capture == LOG_ONLY  # the operator turned edges off, the log stays
        context = traced.tracer.spark.sparkContext
        self.counts = traced.counts
        self.parallelism = max(1, context.defaultParallelism)
        self._kept_schema = None  # of the sink's rows with their rid, once known
        # Everything below is the same for every batch: built once, so a batch costs
        # the driver few calls into the JVM.
        fields = threaded.df.schema.fields
        n_user = threaded.user_columns
        # Positional names: the user's output may repeat a column name.
        self.positional = [f"_hw_c{i}" for i in range(n_user)] + [f.name for f in fields[n_user:]]
        self.user = [(p, f.name) for p, f in zip(self.positional, fields[:n_user])]
        self.hashable = [p for p, f in zip(self.positional, fields[:n_user]) if not _holds_map(f.dataType)]
        self.keep = [p for p, _ in self.user] + ([RID_COLUMN] if traced.emit_rid else [])
        self._named = [*[F.col(p).alias(n) for p, n in self.user], *([F.col(RID_COLUMN)] if traced.emit_rid else [])]
        self._rid_inputs = [F.col(c) for c in dict.fromkeys([*self.keep, RID_COLUMN, *[s.column for s in threaded.sources]])]
        self._keep_columns = [F.col(c) for c in self.keep]
        self.fusable = self._fusable(fields[:n_user])  # whether lineage can ride in the sink's write job
        self.tables = {location_key(location): location for node in threaded.ir.walk()
                       if node.detail.get("source") == "static" for location in node.detail.get("locations", [])}

    def table_versions(self) -> dict[str, str]:
        """The version of each file-backed static table the batch reads (``table_files.table_version``),
        by its root paths; a table whose files cannot be listed from here has none."""
        versions = {}
        for key, location in self.tables.items():
            try:
                versions[key] = table_version(location)["digest"]
            except TableUnreadable as exc:
                log.debug("no version of static table %s: %s", key, exc)
        return versions

    def streaming_frame(self, df: DataFrame) -> DataFrame:
        """The traced rows as the hook gets them: the user's columns by position, plus ``_hw_row``.

        ``_hw_row`` hashes all of an output row's rid but its batch: its query, sink,
        input rids and content. Computed in the streaming plan, it leaves the hook one
        small expression per batch.
        """
        return df.toDF(*self.positional).withColumn(ROW_HASH, self.row_hash())

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

    def row_hash(self):
        """An output row's rid before its batch: its query, sink, input rids and content.

        The content tells apart the rows one input yields (explode); rows alike in
        content and inputs share a rid, which is their true lineage either way.
        """
        parts = [F.col(f"{s.column}.rid") for s in self.traced.threaded.sources]
        return F.xxhash64(F.lit(rids.OUTPUT), F.lit(self.traced.name), F.lit(self.spec.describe()),
                          *parts, *[F.col(c) for c in self.hashable])

    @staticmethod
    def output_rid(batch_id: int):
        """rid of each output row: its ``_hw_row`` hash and the batch."""
        return F.xxhash64(F.col(ROW_HASH), F.lit(batch_id).cast("long"))

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        versions = self.table_versions()  # as the batch reads them: a table may change before the next
        plan = Plan(LOG_ONLY, 0.0) if self.log_only else self.budget.plan()
        frame = batch_df
        boxes = self.traced.threaded.black_boxes
        capture = plan.level != LOG_ONLY
        latest = self.sink.latest_batch()
        if latest > batch_id:
            self._refuse(batch_id, versions, started)
            return
        # An earlier attempt wrote the batch and Spark's commit did not follow: the sink keeps
        # what it holds, and the lineage is published again (rids and edges are idempotent).
        written = latest == batch_id
        fused = capture and self.fusable and self.sink.reads_every_row and not written
        context = batch_df.sparkSession.sparkContext
        run = run_of(batch_df.sparkSession)
        if capture:  # what the tasks feeding stateful aggregates need to publish their state edges
            context.setLocalProperty(PROPERTY, self._setting(batch_df, batch_id, run, plan).to_json())
        if boxes and capture:
            frame = frame.persist()
        out = frame.where(F.col(BLACK_BOX_MARKER).isNull()) if boxes else frame
        out = out.withColumn(RID_COLUMN, self.output_rid(batch_id))
        if capture and not fused:
            out = out.persist()
        stats: dict = {}
        publishing = 0.0
        before = list(self.counts.value)
        try:
            if fused:
                self._write_through(out, batch_id, plan, run)
            elif not written:
                self.sink.write(out.select(*self._named), batch_id)
            if capture and not fused:
                publish_started = time.monotonic()
                context.setLocalProperty(CAPTURE_PROPERTY, "publish")
                try:
                    stats = self._capture(frame, out, batch_id, plan, run)
                finally:
                    context.setLocalProperty(CAPTURE_PROPERTY, None)
                publishing = time.monotonic() - publish_started
        finally:
            context.setLocalProperty(PROPERTY, None)
            if capture and not fused:
                out.unpersist()
            if capture and boxes:
                frame.unpersist()
        if capture:
            publishing += self._executors(stats, before, fused)
        status = self._status(plan, stats)
        rest = time.monotonic() - started - publishing
        if not self.log_only:
            self.budget.observe(plan, publishing, rest)
        metrics.record_batch(self.traced.name, status, stats, publishing)
        metrics.OVERHEAD_RATIO.labels(self.traced.name).set(metrics.overhead_ratio(publishing, rest))
        extra = {"sampled_fraction": plan.fraction} if plan.level == SAMPLED else {}
        files = self._files(batch_id)
        if files is not None:
            extra["sink_files"] = files
        if written:
            extra["sink_written_before"] = True
        self.traced.tracer.publish_log(
            LOG_BATCH, query=self.traced.name, batch=batch_id, status=status,
            seconds=round(time.monotonic() - started, 3), capture_seconds=round(publishing, 3), **extra, **stats,
            tables=versions,
        )

    def _files(self, batch_id: int) -> list[str] | None:
        """The files the batch added to the sink, or None; the sink has committed the batch by
        now, so a failure to read its log costs the batch's log entry that list, not the batch."""
        try:
            return self.sink.files(batch_id)
        except Exception:
            log.warning("the files batch %s of %s wrote to its sink are not known", batch_id, self.traced.name,
                        exc_info=True)
            return None

    def _refuse(self, batch_id: int, versions: dict, started: float) -> None:
        """A sink whose own log holds batches after this one belongs to another run (a new
        checkpoint over an old sink path): Spark's sink skips the batch, untraced too, so
        nothing is written and no lineage published; the batch is logged ``failed``, saying so."""
        error = (f"the sink's commit log already holds batches after {batch_id}: it was written by another run "
                 f"(a new checkpoint over the same sink?), and skips this batch, as Spark's sink does untraced")
        log.error("%s, batch %s: %s", self.traced.name, batch_id, error)
        metrics.record_batch(self.traced.name, "failed", {}, 0.0)
        self.traced.tracer.publish_log(
            LOG_BATCH, query=self.traced.name, batch=batch_id, status="failed",
            seconds=round(time.monotonic() - started, 3), capture_seconds=0.0, error=error, tables=versions)

    def _fusable(self, fields) -> bool:
        """Whether lineage can ride in the job that writes the sink.

        Not with black boxes (their lineage needs rows the sink does not get), nor for
        columns Arrow cannot carry; and only into sinks that read every row of a batch
        (``Sink.reads_every_row``: not the user's own code, nor console), checked per batch.
        """
        from pyspark.sql.pandas.types import to_arrow_schema
        from pyspark.sql.types import StructType

        if self.traced.threaded.black_boxes:
            return False
        try:
            to_arrow_schema(StructType(list(fields)),
                            timezone=self.traced.tracer.spark.conf.get("spark.sql.session.timeZone"))
            return True
        except Exception:
            log.info("lineage of %s gets a job of its own: its columns do not all fit Arrow",
                     self.traced.name, exc_info=True)
            return False

    def _write_through(self, out: DataFrame, batch_id: int, plan: Plan, run: int | None) -> None:
        """Write the sink with lineage published by the same tasks (their counts go to ``counts``)."""
        threaded = self.traced.threaded
        ctx = self._context(batch_id, threaded.ir.id, self._edges_from(threaded.sources, batch_id), run=run)
        fn = functools.partial(publish_through, ctx=ctx, target=self.target, keep=self.keep,
                               fraction=plan.fraction if plan.level == SAMPLED else None, counts=self.counts)
        if self._kept_schema is None:
            self._kept_schema = out.select(*self._keep_columns).schema
        inputs = out.select(*self._rid_inputs)
        self.sink.write(inputs.mapInArrow(fn, self._kept_schema).select(*self._named), batch_id)

    def _executors(self, stats: dict, before: list, fused: bool) -> float:
        """Add what the executors counted since ``before`` (lineage written through the sink, state edges
        published by the tasks feeding aggregates) to ``stats``; returns their capture seconds, their
        time on lineage spread over the cores that ran them."""
        delta = [after - was for after, was in zip(self.counts.value, before)]
        counted = dict(zip(STATS, delta))
        rows = counted.pop("rows")
        if fused:
            stats["rows_out"] = rows
        self._add(stats, counted)
        task_ms, failed = delta[len(STATS)], delta[len(STATS) + 1]
        if failed:
            stats["error"] = f"lineage failed in {failed} task(s); see the executors' logs"
        metrics.TASK_SECONDS.labels(self.traced.name).inc(task_ms / 1000)
        return task_ms / 1000 / self.parallelism

    def _setting(self, batch_df: DataFrame, batch_id: int, run: int | None, plan: Plan) -> Setting:
        """The batch's setting for the tasks that publish state edges (``state_nodes.Setting``)."""
        ops = self.traced.threaded.state_ops
        late = {}
        if ops and run is not None:
            try:  # Spark's plan of this micro-batch, with its watermarks (the hook's DataFrame only scans its rows)
                late = late_watermarks(self._execution(batch_df), ops)
            except Exception:  # the tasks then publish no state edges of aggregates that drop late rows
                log.exception("the watermarks of %s's aggregates are not known for batch %s", self.traced.name,
                              batch_id)
        return Setting(batch_id, run, plan.fraction if plan.level == SAMPLED else None, late)

    def _execution(self, batch_df: DataFrame):
        """The ``IncrementalExecution`` of the micro-batch the hook is called with, from the query running it."""
        query_id = batch_df.sparkSession.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
        query = self.traced.tracer.spark.streams.get(query_id) if query_id else None
        if query is None:
            raise LookupError(f"streaming query {query_id} is not active in the traced session")
        return query._jsq.streamingQuery().lastExecution()

    @staticmethod
    def _status(plan: Plan, stats: dict) -> str:
        """The batch's capture status: what the gap map says of it."""
        if plan.level == LOG_ONLY:
            return LOG_ONLY
        if stats.get("dropped_edges") or stats.get("error") is not None:
            return "failed"
        return FULL if plan.level == FULL else SAMPLED

    def _capture(self, frame: DataFrame, out: DataFrame, batch_id: int, plan: Plan, run: int | None) -> dict:
        """Publish the batch's lineage (all of it, or the sampled rows' edges); returns the counts."""
        threaded = self.traced.threaded
        if plan.level == SAMPLED:
            out = out.where(_sampled(F.col(RID_COLUMN), plan.fraction))
        stats = self._publish(out, self._context(batch_id, threaded.ir.id,
                                                 self._edges_from(threaded.sources, batch_id), run=run))
        # Counted by the publishing job itself: no job of its own.
        stats["rows_out"] = stats.pop("rows", None)
        if plan.level == SAMPLED:
            stats.pop("rows_out")  # the sample's rows, not the sink's
        if self.spec.foreach_batch is not None:
            self._add(stats, self._publish_foreach_batch(out, batch_id))
        inputs = {s.column: s for s in threaded.inputs}
        for box in threaded.black_boxes:
            # What enters a black box reaches the sink's columns it feeds.
            sources = self._edges_from([inputs[c] for c in box.inputs], batch_id, self.masks.get(box.node_id, -1))
            ctx = self._context(batch_id, box.node_id, sources, dst_kind="state", dst_dataset=box.dataset,
                                exact=False, run=run)
            entering = frame.where(F.col(BLACK_BOX_MARKER) == box.node_id)
            if plan.level == SAMPLED:  # by the entering row's own rid: the state node is one per batch
                entering = entering.where(_sampled(F.col(f"{box.inputs[0]}.rid"), plan.fraction))
            entering = entering.withColumn(RID_COLUMN, F.lit(self.state_rid(box, batch_id)))
            self._add(stats, self._publish(entering, ctx))
        return stats

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
            # One row of counts per task, summed here: no shuffle stage for so few rows.
            counts = rows.select(*columns).mapInArrow(fn, STATS_SCHEMA).collect()
            return {c: sum(r[c] for r in counts) for c in STATS}
        except Exception as exc:  # lineage must never stop the user's stream
            log.exception("publishing lineage of batch %s failed", ctx.batch)
            return {**{c: 0 for c in STATS if c != "rows"}, "error": str(exc)[:500]}


def _sampled(rid, fraction: float):
    """Whether a row is in a batch's sample: by its rid, so a retried batch samples the same rows."""
    return F.pmod(rid, F.lit(SAMPLE_MODULUS)) < F.lit(int(fraction * SAMPLE_MODULUS))

