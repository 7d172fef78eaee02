"""The tracer's thread: it ships the log records the hook and the listener queue, and the lineage the tasks journaled.

Neither the stream nor the listener ever waits for the broker on account of the log or of lineage: they queue log
records (``Shipper.publish_log``), which this thread sends; the journal the JVM wrote for each batch is converted and
sent by it too (``journal.Drain``), between batches, not during one (``InFlight``, ``collect``); spilled messages go
out once the broker is back (``delivery.Delivery``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Callable

from headwater.core.schema import LOG_BATCH, LOG_PROGRESS, encode_log

from . import metrics
from .delivery import DROPPED, Delivery, DeliverySettings, Spill
from .journal import Drain

log = logging.getLogger("headwater.capture")

DRAIN_DEFER_S = 5.0  # the longest the tracer's thread leaves the journal alone while a traced batch runs
LOG_QUEUE_SIZE = 10_000  # log records queued at most; beyond, a record is spilled to disk by the caller's thread


class Shipper:
    """The tracer's thread, started at once; ``close()`` sends what is left (within ``send_timeout_s``) and stops it.

    ``each_round`` is called once a round (about every second), after sending, on this thread: the tracer counts
    its queries' job time there. Each of ``observers`` is told of every log record as it is sent, whole
    (``observer(schema, fields)``, on this thread): the tracer's OpenLineage events read them.
    """

    def __init__(self, settings: DeliverySettings, log_topic: str, edges_topic: str, spill_max_bytes: int,
                 send_timeout_s: float, each_round: Callable[[], None] = lambda: None):
        self.settings = settings
        self.log_topic = log_topic
        self.spill_max_bytes = spill_max_bytes
        self.send_timeout_s = send_timeout_s
        self.each_round = each_round
        self.drain = Drain(settings, edges_topic, on_sent=metrics.record_sent)
        self.in_flight = InFlight()  # traced batches running: the thread leaves the journal alone meanwhile
        self.observers: list[Callable[[str, dict], None]] = []
        self._queue: queue.Queue = queue.Queue(maxsize=LOG_QUEUE_SIZE)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="headwater-log", daemon=True)
        self._thread.start()

    def publish_log(self, schema: str, later: Callable[[], dict] | None = None, **fields) -> None:
        """Queue one record for the log topic; never waits for the broker.

        ``later()`` gives more fields, computed by this thread before it sends the record rather than on the
        caller's (the stream's) time. The hook and the listener call it from different threads.
        """
        key = str(fields.get("query", "")).encode()
        try:
            self._queue.put_nowait((self.log_topic, key, schema, fields, later))
        except queue.Full:  # the thread is far behind: keep the record on disk instead
            value = encode_log(schema, **fields, **(later() if later else {}))
            spill = Spill(self.settings.spill_dir, self.spill_max_bytes, self.settings.destination)
            if spill.put(self.log_topic, key, value) is None:
                log.error("spill full: log record %s of %s lost", schema, fields.get("query"))

    def batch_started(self, query: str, batch: int) -> None:
        """A batch of a traced query reached its hook: the journal waits until it is over (``InFlight``)."""
        self.in_flight.started(query, batch)

    def close(self, timeout_s: float = 60.0) -> None:
        """Send what is queued, then stop; the thread's last round counts the last jobs' time."""
        self._stop.set()
        self._thread.join(timeout=timeout_s)

    def _run(self, every_s: float = 1.0) -> None:
        """Each round: the queued log records, what was journaled, and what was spilled.

        A batch's log record wakes the thread, so what the batch journaled is sent right after the batch: once
        Spark has finished it (its progress record follows), so that sending takes no time from the batch itself
        (``collect``).
        """
        delivery = Delivery(self.settings)
        while True:
            records = collect(self._queue, every_s)
            try:
                self.in_flight.progress_seen(records)
                delivery.drain(budget_s=5.0)  # first: it is the one to probe a broker coming back
                messages = []
                for topic, key, schema, fields, later in records:
                    whole = {**fields, **later()} if later else fields  # fields computed off the stream's path
                    messages.append((topic, key, encode_log(schema, **whole)))
                    self._tell(schema, whole)
                for outcome, (_, key, _) in zip(delivery.deliver(messages), messages):
                    if outcome == DROPPED:
                        log.error("spill full: a log record of query %s is lost", key.decode())
                if self._stop.is_set() or not self.in_flight.running(DRAIN_DEFER_S):
                    self.drain.run_once(budget_s=5.0)
                metrics.SPILL_BYTES.set(delivery.spill.size())
                metrics.BUFFER_DEPTH.set(self.drain.pending() + self._queue.qsize())
            except Exception:  # this thread must outlive any broker trouble
                log.exception("sending the log or the journal failed; retrying")
            try:
                self.each_round()
            except Exception:
                log.exception("the tracer's round of bookkeeping failed")
            if self._stop.is_set() and self._queue.empty():
                break
        delivery.close(timeout_s=self.send_timeout_s)
        try:  # what the last batches journaled, before the process may end
            if not self.drain.flush(timeout_s=self.send_timeout_s):
                log.warning("lineage is left in %s for the next tracer or drain of its destination on this host",
                            self.settings.spill_dir)
        except Exception:
            log.exception("sending the journal at close failed; it stays in %s", self.settings.spill_dir)
        self.drain.close()

    def _tell(self, schema: str, fields: dict) -> None:
        for observer in self.observers:
            try:
                observer(schema, fields)
            except Exception:  # an observer's failure costs its own view, never the record
                log.exception("an observer of the log records failed")


class InFlight:
    """The traced batches running, each from its hook until its progress record is seen.

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
        self._lock = threading.Lock()  # the stream's thread starts batches, the tracer's thread sees them end

    def started(self, query: str, batch: int, now: float | None = None) -> None:
        """A batch of ``query`` reached its hook. The journal is held since its query's earliest batch whose
        progress is not seen yet, so a query whose progress records stop coming holds it once, not every batch."""
        now = time.monotonic() if now is None else now
        with self._lock:
            self._batches[query] = (batch, self._batches.get(query, (batch, now, now))[1], now)

    def progress_seen(self, records: list[tuple]) -> None:
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
