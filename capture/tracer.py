"""The capture entry points: ``attach(spark) -> Tracer`` and ``Tracer.trace(df)``.

``trace`` wraps only the user's final DataFrame. Its ``.writeStream`` mirrors
``DataStreamWriter``; ``start()`` runs the rid-threaded plan as a ``foreachBatch``
query whose per-batch hook writes the user's rows (plus ``_hw_rid``) to the user's
sink and publishes the batch's lineage from the executors; with ``capture="log-only"``
and a file sink in append mode, as Spark's own file sink query, with no hook (``log_only.py``).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
import queue
import threading
import time
import uuid
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable

from py4j.protocol import Py4JJavaError
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql.classic.dataframe import DataFrame as ClassicDataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import ArrayType, MapType, StructType

from headwater.adapters.kafka import ensure_topics
from headwater.adapters.table_files import TableUnreadable, table_version
from headwater.core import config as configuration
from headwater.core import rid as rids
from headwater.core.config import Config
from headwater.core.plan import column_masks, location_key, places, plan_fingerprint
from headwater.core.schema import LOG_BATCH, LOG_PROGRESS, encode_log

from . import metrics
from .batch_errors import for_the_stream
from .budget import FULL, LOG_ONLY, SAMPLED, OverheadBudget, Plan
from .delivery import DROPPED, Delivery, DeliverySettings, Spill
from .jar import Counts, Journals, drain_command
from .journal import NOT_CAPTURED, PROPERTY, Drain, Setting, drain_env
from .jvm_listener import CAPTURE_PROPERTY, QUERY_ID_PROPERTY, JobTimes
from .listener import ProgressListener
from .publishers import black_box_publisher, foreach_batch_publisher, outputs_publisher
from .rewrite import BLACK_BOX_MARKER, RID_COLUMN, Threaded, thread_rids
from .state_nodes import entering_column, late_watermarks
from .sinks import Sink, SinkSpec
from .spark_plan import analyzed, optimized_records

if TYPE_CHECKING:
    from .writer import TracedWriter

log = logging.getLogger("headwater.capture")

ROW_HASH = "_hw_row"  # an output row's rid but for its batch (BatchHook.row_hash)
DRAIN_DEFER_S = 5.0  # the longest the tracer's thread leaves the journal alone while a traced batch runs


def attach(spark: SparkSession, config: Config | None = None, **settings) -> "Tracer":
    """Prepare ``spark`` for tracing: the edges and log topics exist.

    Streams read Kafka through Spark's own connector (``format("kafka")``, on the session's classpath as
    the user's job has it: ``--packages org.apache.spark:spark-sql-kafka-0-10_2.13:<Spark's version>``).

    ``settings`` override fields of ``Config`` (e.g. ``bootstrap="127.0.0.1:9092"``).
    """
    config = (config or configuration.load()).with_overrides(**settings)
    ensure_topics(config, [config.edges_topic, config.log_topic])
    _check_executor_password(spark, config)
    return Tracer(spark, config)


def _check_executor_password(spark: SparkSession, config: Config) -> None:
    """Executors' drains get the driver's Kafka settings but never its password (``journal.drain_env``):
    say so where a cluster's executors would then fail to send their lineage."""
    if not config.kafka_security_protocol.startswith("SASL_") or config.kafka_sasl_password_file:
        return
    conf = spark.sparkContext.getConf()
    if conf.get("spark.master", "").startswith("local") or conf.contains("spark.executorEnv.HEADWATER_KAFKA_SASL_PASSWORD"):
        return
    log.warning("the Kafka SASL password is given to the driver only: executors on other hosts cannot send their "
                "lineage. Give it as kafka_sasl_password_file (a file on every host), or also as "
                "spark.executorEnv.HEADWATER_KAFKA_SASL_PASSWORD")


class Tracer:
    """Traces streaming queries of one SparkSession; ``close()`` when done with it."""

    def __init__(self, spark: SparkSession, config: Config):
        self.spark = spark
        self.config = config
        self.delivery_settings = DeliverySettings.of(config)
        # The hot path journals lineage from the JVM into its destination's folder under the spill root, each
        # file naming the destination and this tracer, so that no other job's drain sends it elsewhere
        # (``delivery.Destination``); this tracer's own thread turns it into payloads (``journal.Drain``).
        self.tracer_id = f"{spark.sparkContext.applicationId}/{uuid.uuid4().hex[:12]}"
        self.journals = Journals(spark, self.delivery_settings.spill_dir, config.spill_max_bytes,
                                 drain_command(spark, drain_env(config)),
                                 destination=self.delivery_settings.destination, writer=self.tracer_id)
        self._drain = Drain(self.delivery_settings, config.edges_topic, on_sent=metrics.record_sent)
        self._log_queue: queue.Queue = queue.Queue(maxsize=10_000)
        self._queries: dict[str, str] = {}  # Spark query name → traced query name
        self._query_ids: dict[str, str | None] = {}  # Spark query id → traced query name (None: untraced)
        self._logged: dict = {}  # traced query name → its ``log_only.LoggedBatches``, where Spark writes the sink
        self._in_flight = InFlight()  # traced batches running: the tracer's thread leaves the journal alone
        self._listener = ProgressListener(spark, self.journals.progress(), self._queries.get, self.publish_log,
                                          self._observe_progress)
        self._job_times = JobTimes(spark, self.journals.job_times())
        self._metrics_server = metrics.serve(config.metrics_port, config.metrics_host) if config.metrics_port else None
        self._stop = threading.Event()
        self._shipper = threading.Thread(target=self._ship, name="headwater-log", daemon=True)
        self._shipper.start()

    def name_query(self, spark_name: str, traced_name: str) -> str | None:
        """Spark's name of a traced query's streaming query, for the progress listener; the traced query
        the name stood for before, if any (``forget_query`` gives it back)."""
        previous = self._queries.get(spark_name)
        self._queries[spark_name] = traced_name
        self._listener.watch(spark_name)
        return previous

    def start_query(self, writer, traced_name: str) -> StreamingQuery:
        """Start a traced query's ``DataStreamWriter``, noting its Spark id."""
        query = writer.start()
        self._query_ids[str(query.id)] = traced_name
        return query

    def forget_query(self, spark_name: str, traced_name: str, previous: str | None) -> None:
        """Undo ``name_query`` (``previous``: what it returned) and ``log_batches`` for a start that failed."""
        if previous is None:
            self._queries.pop(spark_name, None)
            self._listener.forget(spark_name)
        else:  # the name is another traced query's, which may be running
            self._queries[spark_name] = previous
        if traced_name not in self._queries.values():
            self._logged.pop(traced_name, None)

    def _traced_by_id(self, spark_id: str) -> str | None:
        """The traced query of a Spark query id (None for any other), looked up once per id."""
        if spark_id not in self._query_ids:  # a first batch can run before start() returns
            active = self.spark.streams.get(spark_id)
            self._query_ids[spark_id] = self._queries.get(active.name) if active is not None else None
        return self._query_ids[spark_id]

    def log_batches(self, traced_name: str, batches) -> None:
        """Have ``batches`` (a ``log_only.LoggedBatches``) publish the capture records of a traced query
        whose sink Spark writes with no hook, from its progress."""
        self._logged[traced_name] = batches

    def _observe_progress(self, record: dict) -> None:
        """Sees each progress record of a traced query before it is published: its listener lag, and
        the capture record of a query whose sink Spark writes, queued ahead of the progress record."""
        batches = self._logged.get(record["query"])
        if batches is not None:
            try:  # a capture record that cannot be made costs that record, not the progress record
                batches.ran(record)
            except Exception:
                log.exception("the capture record of %s's batch %s is lost", record["query"], record.get("batch"))
        batch_ms = record["durations_ms"].get("triggerExecution")
        if batch_ms is not None and record.get("at"):
            started = dt.datetime.fromisoformat(record["at"].replace("Z", "+00:00"))
            ended = started + dt.timedelta(milliseconds=batch_ms)
            lag = (dt.datetime.now(dt.timezone.utc) - ended).total_seconds()
            metrics.LISTENER_LAG_SECONDS.labels(record["query"]).set(lag)

    def _ship(self, every_s: float = 1.0) -> None:
        """The tracer's own thread: sends queued log records, what was journaled, and what was spilled.

        Neither the stream nor the listener ever waits for the broker on account of the
        log or of lineage; spilled messages go out once the broker is back (topics made
        again if it lost them). A batch's log record wakes it, so what the batch journaled
        is sent right after the batch: once Spark has finished it (its progress record follows), so
        that sending takes no time from the batch itself (``collect``).
        """
        delivery = Delivery(self.delivery_settings)
        while True:
            records = collect(self._log_queue, every_s)
            try:
                self._in_flight.heard(records)
                delivery.drain(budget_s=5.0)  # first: it is the one to probe a broker coming back
                # A record's fields computed off the stream's path (``publish_log(later=…)``).
                messages = [(topic, key, encode_log(schema, **fields, **(later() if later else {})))
                            for topic, key, schema, fields, later in records]
                for outcome, (_, key, _) in zip(delivery.deliver(messages), messages):
                    if outcome == DROPPED:
                        log.error("spill full: a log record of query %s is lost", key.decode())
                if self._stop.is_set() or not self._in_flight.running(DRAIN_DEFER_S):
                    self._drain.run_once(budget_s=5.0)
                metrics.SPILL_BYTES.set(delivery.spill.size())
                metrics.BUFFER_DEPTH.set(self._drain.pending() + self._log_queue.qsize())
            except Exception:  # this thread must outlive any broker trouble
                log.exception("sending the log or the journal failed; retrying")
            try:
                self._count_job_time()
            except Exception:
                log.exception("reading the job times of traced queries failed")
            if self._stop.is_set() and self._log_queue.empty():
                break
        delivery.close(timeout_s=self.config.send_timeout_s)
        try:  # what the last batches journaled, before the process may end
            if not self._drain.flush(timeout_s=self.config.send_timeout_s):
                log.warning("lineage is left in %s for the next tracer or drain of its destination on this host",
                            self.delivery_settings.spill_dir)
        except Exception:
            log.exception("sending the journal at close failed; it stays in %s", self.delivery_settings.spill_dir)
        self._drain.close()

    def batch_started(self, traced_name: str, batch: int) -> None:
        """A batch of a traced query reached its hook: the journal waits until it is over (``InFlight``)."""
        self._in_flight.started(traced_name, batch)

    def _count_job_time(self) -> None:
        """The job time of traced queries' batches since the last call, into ``headwater_capture_job_seconds``."""
        for (spark_id, part), seconds in self._job_times.seconds().items():
            traced = self._traced_by_id(spark_id)
            if traced is not None:
                metrics.JOB_SECONDS.labels(traced, part).inc(seconds)

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
        counts = Counts.make(self.spark, name)
        # With capture turned off (log-only), the aggregates get no entering filter: nothing would be journaled.
        entering = None if self.config.capture == LOG_ONLY else \
            functools.partial(entering_column, query=name, journals=self.journals, counts=counts)
        retrace = functools.partial(thread_rids, df, keys, frozenset(black_boxes), name, entering)
        threaded = retrace()
        fingerprint = plan_fingerprint(analyzed(df).toJSON(), places(threaded.ir))
        return Traced(self, threaded, name, emit_rid, fingerprint, counts, _optimized_plan(df, name), analyzed(df),
                      retrace)

    def close(self) -> None:
        """Stop listening and flush the log and the journal; call it after the traced queries have stopped.

        What the broker has not taken within ``send_timeout_s`` stays in the spill folder; the
        next tracer on this host sends it.
        """
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
            self._metrics_server = None
        self._stop.set()
        self._shipper.join(timeout=60)  # its last round counts the last jobs' time
        if self._job_times is not None:
            self._job_times.close()
            self._job_times = None

    def publish_log(self, schema: str, later=None, **fields) -> None:
        """Queue one record for the log topic; never waits for the broker.

        ``later()`` gives more fields, computed by the tracer's thread before it sends the
        record rather than on the caller's (the stream's) time. The hook and the listener
        call it from different threads.
        """
        key = str(fields.get("query", "")).encode()
        try:
            self._log_queue.put_nowait((self.config.log_topic, key, schema, fields, later))
        except queue.Full:  # the log thread is far behind: keep the record on disk instead
            value = encode_log(schema, **fields, **(later() if later else {}))
            spill = Spill(self.delivery_settings.spill_dir, self.config.spill_max_bytes,
                          self.delivery_settings.destination)
            if spill.put(self.config.log_topic, key, value) is None:
                log.error("spill full: log record %s of %s lost", schema, fields.get("query"))


class InFlight:
    """The traced batches running, each from its hook until its progress record is heard.

    The tracer's thread wakes every second even when no record comes; a wake that falls inside a
    batch would convert and send the journal files that batch's first tasks already wrote (an
    aggregate's entering rows), on the cores and the GIL the batch is using. It leaves them while a
    batch runs (``running``), so a stream with time between its triggers sends its lineage in that
    time. A batch running longer than the wait it is given holds the journal no longer, nor does a query
    whose progress records stop coming, so the journal, which the spill bound counts, keeps draining.
    """

    def __init__(self):
        # traced query → (its latest batch to reach its hook, held since, when that batch reached it)
        self._batches: dict[str, tuple[int, float, float]] = {}
        self._lock = threading.Lock()  # the stream's thread starts batches, the tracer's thread hears them end

    def started(self, query: str, batch: int, now: float | None = None) -> None:
        """A batch of ``query`` reached its hook. The journal is held since its query's earliest batch whose
        progress is not heard yet, so a query whose progress records stop coming holds it once, not every batch."""
        now = time.monotonic() if now is None else now
        with self._lock:
            self._batches[query] = (batch, self._batches.get(query, (batch, now))[1], now)

    def heard(self, records: list[tuple]) -> None:
        """A progress record among ``records`` (``collect``'s) ends its batch and any earlier one of its query;
        a later batch of the query already running holds the journal from its own hook on."""
        for _, _, schema, fields, _ in records:
            if schema != LOG_PROGRESS:
                continue
            with self._lock:
                running = self._batches.get(fields.get("query"))
                if running is None:
                    continue
                batch, _, latest = running
                if batch <= fields.get("batch", -1):
                    del self._batches[fields["query"]]
                else:
                    self._batches[fields["query"]] = (batch, latest, latest)

    def running(self, most_s: float, now: float | None = None) -> bool:
        """Whether a batch runs that has held the journal for less than ``most_s``."""
        now = time.monotonic() if now is None else now
        with self._lock:
            return any(now - since < most_s for _, since, _ in self._batches.values())


def collect(records: queue.Queue, wait_s: float, most: int = 500) -> list[tuple]:
    """What the tracer's thread sends next: the queued log records, waiting up to ``wait_s`` for the first.

    A batch's record is queued as its hook ends, while Spark still commits the batch; its progress
    record follows once the batch is over. Until that one comes (or ``wait_s`` more has passed), this
    waits for it, so that the journal the batch wrote is sent between batches rather than during one.
    """
    got: list[tuple] = []
    unfinished: set[tuple] = set()  # (query, batch) of batch records whose progress record is still to come
    try:
        got.append(records.get(timeout=wait_s))
        deadline = time.monotonic() + wait_s
        while len(got) < most:
            _, _, schema, fields, _ = got[-1]
            if schema == LOG_BATCH:
                unfinished.add((fields.get("query"), fields.get("batch")))
            elif schema == LOG_PROGRESS:
                unfinished.discard((fields.get("query"), fields.get("batch")))
            left = deadline - time.monotonic()
            got.append(records.get(timeout=left) if unfinished and left > 0 else records.get_nowait())
    except queue.Empty:
        pass
    return got


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
    counts: Counts  # what its journal filters journaled, and their time in the tasks
    optimized: list | None = None  # the user's optimized plan records (``spark_plan.optimized_records``)
    user_plan: object = None  # the user's analyzed JVM plan, which Spark's checks at start are asked of
    retrace: Callable[..., Threaded] | None = None  # ``thread_rids`` of the user's plan, as ``trace`` called it

    def in_complete_mode(self) -> "Traced":
        """As traced for complete mode, where Spark's aggregates drop no late row: the rows entering them carry
        no watermark column to the journal, which then needs no watermark of the batch, so that a job Spark
        runs for the batch before the hook (``Journal.sparkSetting``: a sort's range sample) journals them."""
        if self.retrace is None or all(op.late_key is None for op in self.threaded.state_ops):
            return self
        return replace(self, threaded=self.retrace(drops_late=False))

    @property
    def writeStream(self) -> "TracedWriter":
        from .writer import TracedWriter

        return TracedWriter(self)


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
    """The per-batch hook: user's rows to the user's sink, lineage to the journal."""

    def __init__(self, traced: Traced, spec: SinkSpec):
        self.traced = traced
        self.spec = spec
        self.sink: Sink | None = None  # opened from the spec at start()
        threaded = traced.threaded
        self.masks = column_masks(threaded.ir)
        config = traced.tracer.config
        self.budget = OverheadBudget(config.overhead_budget)
        self.log_only = config.capture == LOG_ONLY  # the operator turned edges off, the log stays
        context = traced.tracer.spark.sparkContext
        self.counts = traced.counts
        self._counted = self.counts.value()  # the accumulators as the last batch left them
        self.parallelism = max(1, context.defaultParallelism)
        # Everything below is the same for every batch: built once, so a batch costs
        # the driver few calls into the JVM.
        fields = threaded.df.schema.fields
        n_user = threaded.user_columns
        # Positional names: the user's output may repeat a column name.
        self.positional = [f"_hw_c{i}" for i in range(n_user)] + [f.name for f in fields[n_user:]]
        self.user = [(p, f.name) for p, f in zip(self.positional, fields[:n_user])]
        self.hashable = [p for p, f in zip(self.positional, fields[:n_user]) if not _holds_map(f.dataType)]
        self._named = [*[F.col(p).alias(n) for p, n in self.user], *([F.col(RID_COLUMN)] if traced.emit_rid else [])]
        self.tables = {location_key(location): location for node in threaded.ir.walk()
                       if node.detail.get("source") == "static" for location in node.detail.get("locations", [])}
        # The journal filters of what this query publishes from the hook (``publishers.py``), built once:
        # a batch only puts them in its plan. Their fields' types are those of the batch's frame.
        journals, name = traced.tracer.journals, traced.name
        self.frame = frame = self.streaming_frame(threaded.df)  # what the writer streams into this hook
        # What the hook asks of Spark every batch, one call into the JVM each (``Hook.java``).
        self.jvm = journals.hook(ROW_HASH, RID_COLUMN, self._named)
        out = self.with_rid(frame, 0)
        self.outputs = journals.column(outputs_publisher(name, threaded.ir.id, threaded.sources, self.masks),
                                       self.counts, out, [F.col(RID_COLUMN), *[F.col(s.column) for s in threaded.sources]])
        inputs = {s.column: s for s in threaded.inputs}
        self.boxes = [(box, journals.column(black_box_publisher(name, box, inputs, self.masks), self.counts, frame,
                                            [F.col(c) for c in box.inputs])) for box in threaded.black_boxes]
        self.foreach_batch = journals.column(foreach_batch_publisher(name), self.counts, out,
                                             [F.struct(F.col(RID_COLUMN).alias("rid"))]) \
            if spec.foreach_batch is not None else None

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

    @property
    def streamed(self) -> bool:
        """Whether the hook gets the sink's rows, journaled in the streaming plan (``hooked_frame``); the
        ``sink`` is opened first."""
        return not self.traced.threaded.black_boxes and self.sink.reads_every_row

    def hooked_frame(self) -> DataFrame:
        """The streaming frame the writer hands this hook each batch (``sink`` opened first).

        Where every row goes to a sink that reads every row and no black box needs rows of its own,
        it is the sink's rows: each with its output rid, computed from the id of the micro-batch
        computing it, through the sink's journal filter, in the streaming plan
        (``Hook.streamingSinkRows``), so that a batch's hook builds no Dataset of its own; the filter
        journals only in batches the hook set a ``Setting`` for. Otherwise the traced rows
        (``streaming_frame``), which the hook splits and journals itself.
        """
        if not self.streamed:
            return self.frame
        journal = None if self.log_only else self.outputs._jc
        return ClassicDataFrame(self.jvm.streamingSinkRows(self.frame._jdf, journal), self.frame.sparkSession)

    def streaming_frame(self, df: DataFrame) -> DataFrame:
        """The traced rows as the hook gets them: the user's columns by position, plus ``_hw_row``.

        ``_hw_row`` hashes all of an output row's rid but its batch: its query, sink,
        input rids and content. Computed in the streaming plan, it leaves the hook one
        small expression per batch.
        """
        return df.toDF(*self.positional).withColumn(ROW_HASH, self.row_hash())

    def row_hash(self):
        """An output row's rid before its batch: its query, sink, input rids and content.

        The content tells apart the rows one input yields (explode); rows alike in
        content and inputs share a rid, which is their true lineage either way.
        """
        parts = [F.col(f"{s.column}.rid") for s in self.traced.threaded.sources]
        return F.xxhash64(F.lit(rids.OUTPUT), F.lit(self.traced.name), F.lit(self.spec.describe()),
                          *parts, *[F.col(c) for c in self.hashable])

    def with_rid(self, rows: DataFrame, batch_id: int) -> DataFrame:
        """``rows`` with each one's rid, ``_hw_rid``: its ``_hw_row`` hash and the batch,
        ``xxhash64(_hw_row, '<batch id>')``.

        The batch is hashed as text: Spark's generated code holds a string literal by reference but
        writes a number into the code, so a numeric batch id made every batch compile its stages
        anew (two Janino compilations, 12-30 ms each, a batch of the demo shape)."""
        return ClassicDataFrame(self.jvm.withRid(rows._jdf, str(batch_id)), rows.sparkSession)

    def sink_rows(self, rows: DataFrame) -> DataFrame:
        """What the sink gets of ``rows`` (``with_rid``'s): the user's columns and ``_hw_rid``."""
        return ClassicDataFrame(self.jvm.sinkRows(rows._jdf, None), rows.sparkSession)

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        try:
            self.run_batch(batch_df, batch_id)
        except Py4JJavaError as error:  # never its Java trace to Spark's stream thread: ``batch_errors``
            try:
                job_group = batch_df.sparkSession.sparkContext.getLocalProperty("spark.jobGroup.id")
            except Exception:  # the JVM does not answer an interrupted thread
                job_group = None
            raise for_the_stream(error, job_group) from None

    def run_batch(self, batch_df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        self.traced.tracer.batch_started(self.traced.name, batch_id)
        versions = self.table_versions()  # as the batch reads them: a table may change before the next
        plan = Plan(LOG_ONLY, 0.0) if self.log_only else self.budget.plan()
        capture = plan.level != LOG_ONLY
        latest = self.sink.latest_batch()
        if latest > batch_id:
            self.refuse(batch_id, versions, round(time.monotonic() - started, 3))
            return
        # An earlier attempt wrote the batch and Spark's commit did not follow: the sink keeps
        # what it holds, and the lineage is journaled again (rids and edges are idempotent).
        written = latest == batch_id
        context = batch_df.sparkSession.sparkContext
        # What the journal filters of this batch's tasks need; a batch not captured says so (``NOT_CAPTURED``),
        # since a filter with no setting at all takes Spark's (``Journal.sparkSetting``).
        setting = self._setting(batch_id, context.getLocalProperty(QUERY_ID_PROPERTY), plan) if capture else None
        context.setLocalProperty(PROPERTY, setting.to_json() if setting else NOT_CAPTURED)
        try:
            write = self._write_streamed if self.streamed else self._write_split
            apart, written_nanos, errors = write(batch_df, batch_id, capture, written)
        finally:
            context.setLocalProperty(PROPERTY, None)
        stats = self._stats(capture, errors)
        nanos = stats.pop("nanos", 0) if written_nanos is None else written_nanos
        metrics.TASK_SECONDS.labels(self.traced.name).inc(nanos / 1e9)
        # Capture's time: its own jobs, and its time inside the user's tasks, spread over the cores.
        publishing = apart + nanos / 1e9 / self.parallelism
        status = self._status(plan, stats)
        rest = time.monotonic() - started - publishing
        if not self.log_only:
            self.budget.observe(plan, publishing, rest)
        metrics.record_batch(self.traced.name, status, stats, publishing)
        metrics.OVERHEAD_RATIO.labels(self.traced.name).set(metrics.overhead_ratio(publishing, rest))
        extra = {"sampled_fraction": plan.fraction} if plan.level == SAMPLED else {}
        if written:
            extra["sink_written_before"] = True
        self.traced.tracer.publish_log(
            LOG_BATCH, later=functools.partial(self.files, batch_id), query=self.traced.name, batch=batch_id,
            status=status, seconds=round(time.monotonic() - started, 3), capture_seconds=round(publishing, 3),
            **extra, **stats, tables=versions,
        )

    def _write_streamed(self, batch_df: DataFrame, batch_id: int, capture: bool, written: bool) \
            -> tuple[float, int | None, list[str]]:
        """Write a batch of the sink's rows (``hooked_frame``), journaled by the tasks writing them; a batch the
        sink holds is not written again, and its lineage is journaled by a job of capture's own. Returns the
        seconds of capture's own jobs, capture's nanoseconds in the user's tasks where its own jobs followed
        them (else None), and what failed."""
        if not written:
            self.sink.write(batch_df, batch_id)
            return 0.0, None, []
        if not capture:
            return 0.0, None, []
        return self._apart([(batch_df, None)])

    def _write_split(self, batch_df: DataFrame, batch_id: int, capture: bool, written: bool) \
            -> tuple[float, int | None, list[str]]:
        """Write a batch of the traced rows (``streaming_frame``): the sink's rows, each with its output rid, to
        the sink; then their lineage, the rows handed to the user's own code and those entering each black box,
        by jobs of capture's own over the rows kept. Returns as ``_write_streamed``."""
        boxes = self.traced.threaded.black_boxes
        frame = batch_df.persist() if boxes and capture else batch_df
        out = frame.where(F.col(BLACK_BOX_MARKER).isNull()) if boxes else frame
        out = self.with_rid(out, batch_id)
        if capture:
            out = out.persist()
        try:
            if not written:
                self.sink.write(self.sink_rows(out), batch_id)
            if not capture:
                return 0.0, None, []
            jobs = [(out, self.outputs)]
            if self.foreach_batch is not None:
                jobs.append((out, self.foreach_batch))
            jobs.extend((frame.where(F.col(BLACK_BOX_MARKER) == box.node_id), journal) for box, journal in self.boxes)
            return self._apart(jobs)
        finally:
            if capture:
                out.unpersist()
            if capture and boxes:
                frame.unpersist()

    def _apart(self, jobs: list[tuple[DataFrame, Column | None]]) -> tuple[float, int, list[str]]:
        """Journal lineage by jobs of capture's own, one for each ``(rows, journal)`` of ``jobs``: the rows
        through that journal filter, or (None) rows whose plan journals them already. Returns their seconds,
        capture's nanoseconds inside the user's tasks before them, and what failed."""
        in_tasks = self.counts.nanos() - self._counted["nanos"]
        context = self.traced.tracer.spark.sparkContext
        started = time.monotonic()
        errors = []
        context.setLocalProperty(CAPTURE_PROPERTY, "publish")
        try:
            for rows, journal in jobs:
                try:  # lineage must never stop the user's stream
                    (rows if journal is None else rows.where(journal)).count()
                except Exception as exc:
                    log.exception("journaling lineage of %s failed", self.traced.name)
                    errors.append(str(exc)[:500])
        finally:
            context.setLocalProperty(CAPTURE_PROPERTY, None)
        return time.monotonic() - started, in_tasks, errors

    def _stats(self, capture: bool, errors: list[str]) -> dict:
        """What this batch's journal filters did (the accumulators since the last batch), as the batch
        log reports it; ``nanos`` is taken out by the caller."""
        if self.log_only:  # no journal filter in its plan: nothing to read
            return {}
        now = self.counts.value()
        previous, self._counted = self._counted, now
        if not capture:
            return {}
        delta = {name: now[name] - previous[name] for name in now}
        stats = {"rows_out": delta.pop("rows"), **delta}
        failed = stats.pop("failed")
        if failed:
            errors = [*errors, f"lineage failed in {failed} task(s); see the executors' logs"]
        if errors:
            stats["error"] = "; ".join(errors)[:500]
        return stats

    def files(self, batch_id: int) -> dict:
        """The files the batch added to the sink (read by the tracer's thread once the sink has
        committed the batch; a failure to read its log costs the batch's log entry that list), or
        where a Kafka sink's records of the batch went."""
        offsets = self.sink.offsets(batch_id)
        if offsets is not None:
            return {"sink_offsets": offsets}
        try:
            files = self.sink.files(batch_id)
        except Exception:
            log.warning("the files batch %s of %s wrote to its sink are not known", batch_id, self.traced.name,
                        exc_info=True)
            return {}
        return {} if files is None else {"sink_files": files}

    def refuse(self, batch_id: int, versions: dict, seconds: float) -> None:
        """A sink whose own log holds batches after this one belongs to another run (a new
        checkpoint over an old sink path): Spark's sink skips the batch, untraced too, so
        nothing is written and no lineage published; the batch is logged ``failed``, saying so."""
        error = (f"the sink's commit log already holds batches after {batch_id}: it was written by another run "
                 f"(a new checkpoint over the same sink?), and skips this batch, as Spark's sink does untraced")
        log.error("%s, batch %s: %s", self.traced.name, batch_id, error)
        metrics.record_batch(self.traced.name, "failed", {}, 0.0)
        self.traced.tracer.publish_log(
            LOG_BATCH, query=self.traced.name, batch=batch_id, status="failed",
            seconds=seconds, capture_seconds=0.0, error=error, tables=versions)

    def _setting(self, batch_id: int, query_id: str | None, plan: Plan) -> Setting:
        """The batch's setting for the journal filters of its tasks (``journal.Setting``). ``query_id``: the
        Spark id of the streaming query running the batch (the run is its ``rid.run_hash``); None outside one."""
        ops = self.traced.threaded.state_ops
        run = rids.run_hash(query_id) if query_id else None
        late = {}
        if ops and run is not None:
            try:  # Spark's plan of this micro-batch, with its watermarks (the hook's DataFrame only scans its rows)
                # The query is the traced session's: the batch's own session is the stream's clone of it.
                late = late_watermarks(json.loads(self.jvm.late(self.traced.tracer.spark._jsparkSession, query_id)),
                                       ops)
            except Exception:  # the tasks then journal no state edges of aggregates that drop late rows
                log.exception("the watermarks of %s's aggregates are not known for batch %s", self.traced.name,
                              batch_id)
        return Setting(batch_id, run, plan.fraction if plan.level == SAMPLED else None, late)

    @staticmethod
    def _status(plan: Plan, stats: dict) -> str:
        """The batch's capture status: what the gap map says of it."""
        if plan.level == LOG_ONLY:
            return LOG_ONLY
        if stats.get("dropped_edges") or stats.get("error") is not None:
            return "failed"
        return FULL if plan.level == FULL else SAMPLED
