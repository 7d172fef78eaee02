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
import logging
import queue
import threading
import time
import uuid
from dataclasses import dataclass, replace
from typing import Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from headwater.adapters.kafka import ensure_topics
from headwater.core import config as configuration
from headwater.core.config import Config
from headwater.core.plan import places, plan_fingerprint
from headwater.core.schema import LOG_BATCH, LOG_PROGRESS, encode_log

from . import metrics
from .budget import LOG_ONLY
from .delivery import DROPPED, Delivery, DeliverySettings, Spill
from .jar import Counts, Journals, drain_command
from .journal import Drain, drain_env
from .jvm_listener import JobTimes
from .listener import ProgressListener
from .rewrite import Threaded, thread_rids
from .spark_plan import analyzed, optimized_records
from .state_nodes import entering_column
from .writer import TracedWriter

log = logging.getLogger("headwater.capture")

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
    if conf.get("spark.master", "").startswith("local") \
            or conf.contains("spark.executorEnv.HEADWATER_KAFKA_SASL_PASSWORD"):
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
    def writeStream(self) -> TracedWriter:
        return TracedWriter(self)
