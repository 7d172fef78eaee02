"""The progress half of the batch log: what Spark says each micro-batch of a traced query read.

A ``StreamingQueryListener`` (Spark calls it on the driver, through the py4j callback
server) publishes one progress record per micro-batch of a traced query: its source
offsets (start, end), rows in, and durations. The per-batch hook publishes the other
half, the batch's capture status; both carry ``(query, batch)`` and the indexer merges
them into one batch entry of the gap map. Kept apart because a batch whose hook failed
still has progress, which is how a gap shows.
"""

from __future__ import annotations

import json
import logging
from typing import Callable

from pyspark.sql.streaming import StreamingQueryListener

from headwater.core.schema import LOG_PROGRESS

log = logging.getLogger("headwater.capture")


def _offsets(text: str | None) -> dict | None:
    """A source's offsets as Spark reports them (JSON text), parsed where they are JSON."""
    if text in (None, "None", "null"):  # a first batch has no start
        return None
    try:
        return json.loads(text)
    except ValueError:
        return {"raw": text}


def progress_record(progress, query: str) -> dict:
    """The log record of one ``StreamingQueryProgress`` of traced query ``query``."""
    return {
        "query": query,
        "batch": progress.batchId,
        "run_id": str(progress.runId),
        "rows_in": progress.numInputRows,
        "durations_ms": dict(progress.durationMs or {}),
        "sources": [
            {"description": s.description, "start": _offsets(s.startOffset), "end": _offsets(s.endOffset),
             "rows_in": s.numInputRows}
            for s in progress.sources
        ],
        "at": progress.timestamp,
    }


class ProgressListener(StreamingQueryListener):
    """Publishes progress of traced queries: ``traced(spark query name)`` names the traced
    query, or is None for a query that is not traced, which is ignored."""

    def __init__(self, traced: Callable[[str], str | None], publish: Callable[..., None],
                 observe: Callable[[dict], None] = lambda record: None):
        self._traced = traced
        self._publish = publish
        self._observe = observe  # sees each record too, for metrics

    def onQueryStarted(self, event) -> None:
        pass

    def onQueryProgress(self, event) -> None:
        progress = event.progress
        query = self._traced(progress.name)
        if query is None:
            return
        try:
            record = progress_record(progress, query)
            self._observe(record)
            self._publish(LOG_PROGRESS, **record)
        except Exception:  # a listener must never fail the stream
            log.exception("publishing the progress of %s batch %s failed", progress.name, progress.batchId)

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        pass
