"""The JVM half of capture's listening: a ``SparkListener`` implemented in Python.

Spark's listener bus calls it through py4j's callback server, on the bus's own
thread, so it never sits on a job's path. It attributes the time of every job of a
traced query's micro-batch to the user's work or to capture: Spark tags a
micro-batch's jobs with the query id and batch id (local properties the stream
thread sets), and the per-batch hook tags its publishing jobs with
``CAPTURE_PROPERTY``. The sums feed ``headwater_capture_job_seconds`` and, per batch,
the hook's overhead figures. Every other event returns at once.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

log = logging.getLogger("headwater.capture")

CAPTURE_PROPERTY = "headwater.capture"
QUERY_ID_PROPERTY = "sql.streaming.queryId"  # set by Spark's stream execution
BATCH_ID_PROPERTY = "streaming.sql.batchId"


def _ignore(*args) -> None:
    return None


class JobListener:
    """Job time of traced queries' micro-batches, split into the user's and capture's.

    ``traced(spark query id)`` names the traced query, or is None for any other job.
    """

    class Java:
        implements = ["org.apache.spark.scheduler.SparkListenerInterface"]

    def __init__(self, traced: Callable[[str], str | None], observe: Callable[[str, int, str, float], None]):
        self._traced = traced
        self._observe = observe  # (query, batch, "capture" | "user", seconds)
        self._jobs: dict[int, tuple[str, int, str, int]] = {}
        self._lock = threading.Lock()

    def __getattr__(self, name: str):
        if name.startswith("on"):  # the interface's ~35 other events
            return _ignore
        raise AttributeError(name)

    def onJobStart(self, event) -> None:
        try:
            props = event.properties()
            query_id = props.getProperty(QUERY_ID_PROPERTY) if props is not None else None
            query = self._traced(query_id) if query_id else None
            if query is None:
                return
            batch = int(props.getProperty(BATCH_ID_PROPERTY) or -1)
            part = "capture" if props.getProperty(CAPTURE_PROPERTY) else "user"
            with self._lock:
                self._jobs[event.jobId()] = (query, batch, part, event.time())
        except Exception:  # a listener must never disturb the job
            log.exception("reading a job start failed")

    def onJobEnd(self, event) -> None:
        try:
            with self._lock:
                job = self._jobs.pop(event.jobId(), None) if self._jobs else None
            if job is not None:
                query, batch, part, started_ms = job
                self._observe(query, batch, part, max(event.time() - started_ms, 0) / 1000)
        except Exception:
            log.exception("reading a job end failed")


def register(spark, listener: JobListener):
    """Add ``listener`` to Spark's listener bus; returns its JVM proxy, for ``unregister``."""
    from pyspark.java_gateway import ensure_callback_server_started

    gateway = spark.sparkContext._gateway
    ensure_callback_server_started(gateway)
    # py4j makes a new JVM proxy each time a Python object is passed; hold on to one.
    holder = gateway.jvm.java.util.ArrayList()
    holder.add(listener)
    proxy = holder.get(0)
    spark.sparkContext._jsc.sc().addSparkListener(proxy)
    return proxy


def unregister(spark, proxy) -> None:
    spark.sparkContext._jsc.sc().removeSparkListener(proxy)
