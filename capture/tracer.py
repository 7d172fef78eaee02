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
import uuid
from dataclasses import dataclass, replace
from typing import Callable
from wsgiref.simple_server import WSGIServer

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from headwater.adapters import spark_lines
from headwater.adapters.kafka import ensure_topics
from headwater.core import config as configuration
from headwater.core.config import Config
from headwater.core.plan import places, plan_fingerprint

from . import metrics
from .budget import LOG_ONLY
from .delivery import DeliverySettings
from .jar import Counts, Journals, drain_command
from .journal import drain_env
from .jvm_listener import JobTimes
from .listener import ProgressListener
from .openlineage import OpenLineageEvents
from .rewrite import Threaded, thread_rids
from .shipping import Shipper
from .spark_plan import analyzed, optimized_records
from .state_nodes import entering_column
from .writer import TracedWriter

log = logging.getLogger("headwater.capture")


def attach(spark: SparkSession, config: Config | None = None, **settings) -> "Tracer":
    """Prepare ``spark`` for tracing: the edges and log topics exist.

    Streams read Kafka through Spark's own connector (``format("kafka")``, on the session's classpath as
    the user's job has it: ``--packages org.apache.spark:spark-sql-kafka-0-10_<Scala>:<Spark's version>``).

    ``settings`` override fields of ``Config`` (e.g. ``bootstrap="127.0.0.1:9092"``). A Spark headwater does
    not support is refused (``UnsupportedSpark``, naming the supported lines) before anything is done.
    """
    spark_lines.running(spark)
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
        self._queries: dict[str, str] = {}  # Spark query name → traced query name
        self._query_ids: dict[str, str | None] = {}  # Spark query id → traced query name (None: untraced)
        self._logged: dict = {}  # traced query name → its ``log_only.LoggedBatches``, where Spark writes the sink
        self._job_times: JobTimes | None = JobTimes(spark, self.journals.job_times())
        self._listener: ProgressListener | None = None
        self._metrics_server: WSGIServer | None = None
        self.events: OpenLineageEvents | None = None  # the traced queries' OpenLineage events, where wanted
        # The tracer's thread (``shipping.Shipper``): the log records and the journal to the broker.
        self.shipper = Shipper(self.delivery_settings, config.log_topic, config.edges_topic, config.spill_max_bytes,
                               config.send_timeout_s, each_round=self._count_job_time)
        try:  # a listener or a metrics port that fails leaves no thread of this tracer's running, nor its drain
            self.events = OpenLineageEvents.start(spark, config)
            if self.events is not None:
                self.shipper.observers.append(self.events.observe)
            self._listener = ProgressListener(spark, self.journals.progress(), self._queries.get,
                                              self.shipper.publish_log, self._observe_progress,
                                              self.events.lifecycle if self.events is not None else lambda e: None)
            if config.metrics_port:
                self._metrics_server = metrics.serve(config.metrics_port, config.metrics_host)
        except BaseException:
            self.close()
            raise

    def check_open(self) -> None:
        """Refuse to trace on a closed tracer, before a query's start has any effect."""
        if self._listener is None:
            raise RuntimeError("this Tracer is closed: attach() again to trace another query")

    def _name_query(self, spark_name: str, traced_name: str) -> str | None:
        """Spark's name of a traced query's streaming query, for the progress listener; the traced query
        the name stood for before, if any (``_forget_query`` gives it back)."""
        self.check_open()
        assert self._listener is not None  # check_open's
        previous = self._queries.get(spark_name)
        self._queries[spark_name] = traced_name
        self._listener.watch(spark_name)
        return previous

    def start_query(self, writer, spark_name: str, traced_name: str, logged=None) -> StreamingQuery:
        """Start a traced query's ``DataStreamWriter`` (its ``queryName`` is ``spark_name``), its progress
        watched and its Spark id noted; ``logged``: its ``log_only.LoggedBatches`` where Spark writes its sink
        with no hook. A start that fails leaves none of this behind."""
        named_before = self._name_query(spark_name, traced_name)
        self._logged[traced_name] = logged
        try:
            query = writer.start()
        except BaseException:
            self._forget_query(spark_name, traced_name, named_before)
            raise
        self._query_ids[str(query.id)] = traced_name
        return query

    def _forget_query(self, spark_name: str, traced_name: str, previous: str | None) -> None:
        """Undo ``_name_query`` (``previous``: what it returned) and the logged batches for a start that failed."""
        if previous is None:
            self._queries.pop(spark_name, None)
            if self._listener is not None:
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

    def _count_job_time(self) -> None:
        """The job time of traced queries' batches since the last call, into ``headwater_capture_job_seconds``."""
        if self._job_times is None:
            return
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
        self.shipper.close()  # its last round counts the last jobs' time
        if self.events is not None:  # after the listener and the shipper: the queries' last records and ends
            self.events.close(self.config.send_timeout_s)
            self.events = None
        if self._job_times is not None:
            self._job_times.close()
            self._job_times = None


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

    @property
    def spark(self) -> SparkSession:
        return self.tracer.spark

    @property
    def config(self) -> Config:
        return self.tracer.config

    @property
    def journals(self) -> Journals:
        return self.tracer.journals

    @property
    def shipper(self) -> Shipper:
        """Where the traced query's log records go (``publish_log``) and its batches say they started."""
        return self.tracer.shipper

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
