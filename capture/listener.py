"""The progress half of the batch log: what Spark says each micro-batch of a traced query read.

A ``StreamingQueryListener`` in the JVM (``java/headwater/capture/Progress.java``) keeps the
progress of traced queries (Spark's JSON of each micro-batch's ``StreamingQueryProgress``), and
a thread of the tracer's takes it and publishes one progress record per micro-batch: its source
offsets (start, end), rows in, and durations. The per-batch hook publishes the other half, the
batch's capture status; both carry ``(query, batch)`` and the indexer merges them into one batch
entry of the gap map. Kept apart because a batch whose hook failed still has progress, which is
how a gap shows.

The same listener hears a traced query start and end (``lifecycle``), which the tracer's OpenLineage
events are told of (``openlineage.py``): Spark's own end event is the only word of a query that failed.

In the JVM because PySpark's listener in Python cost every query of the session, traced or
not, 70-90 ms of the driver's CPU a batch (``Progress.java`` says why).
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Callable

from headwater.core.schema import LOG_PROGRESS

log = logging.getLogger("headwater.capture")

TAKE_WAIT_MS = 500  # how long a take waits in the JVM for progress before the thread looks whether to stop


def _offsets(value) -> dict | None:
    """A source's offsets as Spark's progress JSON gives them: JSON where Spark could parse them, else text."""
    if value in (None, "None", "null"):  # a first batch has no start
        return None
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return {"raw": value}


def progress_record(progress: dict, query: str) -> dict:
    """The log record of one micro-batch's progress (Spark's ``StreamingQueryProgress.json``) of traced query
    ``query``."""
    return {
        "query": query,
        "batch": progress["batchId"],
        "run_id": progress["runId"],
        "rows_in": progress["numInputRows"],
        "durations_ms": dict(progress.get("durationMs") or {}),
        "sources": [
            {"description": s.get("description"), "start": _offsets(s.get("startOffset")),
             "end": _offsets(s.get("endOffset")), "rows_in": s.get("numInputRows")}
            for s in progress.get("sources") or []
        ],
        "at": progress.get("timestamp"),
    }


class ProgressListener:
    """Publishes the progress of traced queries. ``listener`` is a ``Progress`` of capture's jar;
    ``traced(spark query name)`` names the traced query (None: not traced, ignored); ``watch`` it
    before the query starts. ``lifecycle`` is told of each start and end of a traced query (``Progress.java``'s
    records, with ``query`` set to the traced query's name)."""

    def __init__(self, spark, listener, traced: Callable[[str], str | None], publish: Callable[..., None],
                 observe: Callable[[dict], None] = lambda record: None,
                 lifecycle: Callable[[dict], None] = lambda event: None):
        self._spark = spark
        self._listener = listener
        self._traced = traced
        self._publish = publish
        self._observe = observe  # sees each record too, for metrics
        self._lifecycle = lifecycle
        self._lost = 0
        self._stop = threading.Event()
        spark._jsparkSession.streams().addListener(listener)
        self._thread = threading.Thread(target=self._run, name="headwater-progress", daemon=True)
        self._thread.start()

    def watch(self, spark_name: str) -> None:
        """Keep the progress of the streaming query Spark knows as ``spark_name``."""
        self._listener.watch(spark_name)

    def forget(self, spark_name: str) -> None:
        """Keep no more progress of the streaming query ``spark_name`` (its start failed)."""
        self._listener.forget(spark_name)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.handle(self._listener.take(TAKE_WAIT_MS))
            except Exception:  # this thread must outlive a failing call
                if self._stop.is_set() or self._spark.sparkContext._jsc is None:  # closed, or Spark stopped
                    break
                log.exception("taking the progress of traced queries failed")
                self._stop.wait(1.0)

    def handle(self, lines: str) -> None:
        """Publish a progress record for each progress (Spark's JSON, one a line) of a traced query."""
        if not lines:  # progress is lost only while the queue is full, so an empty take has nothing to count
            return
        for line in lines.splitlines():
            try:
                progress = json.loads(line)
                query = self._traced(progress.get("name"))
                if query is None:
                    continue
                if "headwater" in progress:  # a start or an end, not a batch's progress
                    self._lifecycle({**progress, "query": query})
                    continue
                record = progress_record(progress, query)
                self._observe(record)
                self._publish(LOG_PROGRESS, **record)
            except Exception:  # a progress that cannot be read or published costs its record, not the others
                log.exception("publishing the progress of a traced query failed: %.200s", line)
        lost = int(self._listener.lost())
        if lost > self._lost:
            log.error("%d progress records of traced queries were not kept: the tracer's thread fell behind",
                      lost - self._lost)
            self._lost = lost

    def close(self) -> None:
        """Hear the progress already posted, publish it, and stop listening."""
        try:  # let progress events already posted reach the listener first
            self._spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(10_000)
        except Exception:
            log.warning("progress events still queued at close may not be logged", exc_info=True)
        self._spark._jsparkSession.streams().removeListener(self._listener)
        self._stop.set()
        self._thread.join(timeout=10)
        self.handle(self._listener.take(0))
