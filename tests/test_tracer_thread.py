"""The tracer's thread sends a batch's journal between batches: ``tracer.collect`` waits for the batch's
progress record (Spark has finished the batch) before handing its records on, but never longer than it
was told."""

from __future__ import annotations

import queue
import threading
import time

from headwater.capture.tracer import collect
from headwater.core.schema import LOG_BATCH, LOG_PLAN, LOG_PROGRESS


def record(schema: str, query: str = "q", batch: int = 0) -> tuple:
    return ("hw.log", query.encode(), schema, {"query": query, "batch": batch}, None)


def put_later(records: queue.Queue, delay_s: float, *items) -> threading.Thread:
    def put():
        time.sleep(delay_s)
        for item in items:
            records.put(item)
    thread = threading.Thread(target=put)
    thread.start()
    return thread


def test_a_batch_record_waits_for_its_batchs_progress_record():
    records = queue.Queue()
    records.put(record(LOG_BATCH, batch=3))
    started = time.monotonic()  # before the progress records' thread starts its 0.3 s
    thread = put_later(records, 0.3, record(LOG_PROGRESS, "other", 3), record(LOG_PROGRESS, batch=3))
    got = collect(records, wait_s=5.0)
    took = time.monotonic() - started
    thread.join()
    assert [(r[2], r[3]["query"]) for r in got] == [(LOG_BATCH, "q"), (LOG_PROGRESS, "other"), (LOG_PROGRESS, "q")]
    assert 0.3 <= took < 2.0


def test_a_progress_record_that_never_comes_is_waited_for_no_longer_than_told():
    records = queue.Queue()
    records.put(record(LOG_BATCH, batch=1))
    started = time.monotonic()
    got = collect(records, wait_s=0.4)
    assert got == [record(LOG_BATCH, batch=1)]
    assert 0.4 <= time.monotonic() - started < 1.5


def test_other_records_are_taken_as_they_are_queued_without_waiting():
    records = queue.Queue()
    for item in (record(LOG_PLAN), record(LOG_PROGRESS, batch=0), record(LOG_BATCH, batch=0),
                 record(LOG_PROGRESS, batch=0)):
        records.put(item)
    started = time.monotonic()
    got = collect(records, wait_s=5.0)
    assert len(got) == 4 and time.monotonic() - started < 0.5
    assert collect(records, wait_s=0.2) == []  # nothing queued: back after the wait


def test_at_most_so_many_records_at_a_time():
    records = queue.Queue()
    for batch in range(10):
        records.put(record(LOG_PROGRESS, batch=batch))
    assert len(collect(records, wait_s=1.0, most=4)) == 4
    assert len(collect(records, wait_s=1.0, most=100)) == 6
