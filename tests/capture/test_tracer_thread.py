"""The tracer's thread sends a batch's journal between batches: ``shipping.collect`` waits for the batch's
progress record (Spark has finished the batch) before handing its records on, but never longer than it
was told; and a wake of the thread while a traced batch runs leaves the journal alone (``InFlight``)
until the batch's progress record is heard, or the batch has run longer than the thread waits."""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path

from pyspark.sql import functions as F

from headwater.capture import attach, jar, shipping
from headwater.capture.journal import PROPERTY, Setting
from headwater.capture.listener import progress_record
from headwater.capture.shipping import InFlight, collect
from headwater.core.schema import LOG_BATCH, LOG_PLAN, LOG_PROGRESS
from tests.capture.test_journal import N, outputs, source_frame
from tests.conftest import edges_published, own_topics


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


def test_a_batch_holds_the_journal_from_its_hook_until_its_progress_record():
    batches = InFlight()
    assert not batches.running(5.0)
    batches.started("q", 4, now=100.0)
    assert batches.running(5.0, now=101.0)
    batches.progress_seen([record(LOG_BATCH, batch=4), record(LOG_PROGRESS, "other", 4), record(LOG_PROGRESS, batch=3)])
    assert batches.running(5.0, now=101.0)  # another query's progress, and this query's earlier batch's
    batches.progress_seen([record(LOG_PROGRESS, batch=4)])
    assert not batches.running(5.0, now=101.0)


def test_a_batch_holds_the_journal_no_longer_than_told():
    batches = InFlight()
    batches.started("q", 0, now=100.0)
    batches.started("r", 0, now=103.0)
    assert batches.running(5.0, now=104.9)  # both
    assert batches.running(5.0, now=107.9)  # r
    assert not batches.running(5.0, now=108.0)  # both past the wait: their progress never came


def test_a_query_whose_progress_never_comes_holds_the_journal_once_not_every_batch():
    batches = InFlight()
    for batch, now in enumerate((100.0, 101.0, 102.0, 103.0, 104.0, 105.0)):
        batches.started("q", batch, now=now)
    assert not batches.running(5.0, now=105.5)  # held since batch 0's hook, 5.5 s ago
    batches.progress_seen([record(LOG_PROGRESS, batch=5)])
    batches.started("q", 6, now=106.0)
    assert batches.running(5.0, now=106.5)


def test_a_progress_record_heard_late_does_not_end_the_next_batch():
    batches = InFlight()
    batches.started("q", 6, now=96.0)
    batches.started("q", 7, now=100.0)  # before batch 6's progress is heard: back to back
    assert not batches.running(5.0, now=101.5)  # held since batch 6's hook
    batches.progress_seen([record(LOG_PROGRESS, batch=6)])
    assert batches.running(5.0, now=101.5)  # batch 7 holds it from its own hook
    batches.progress_seen([record(LOG_PROGRESS, batch=9)])  # a later batch's: every earlier one is over too
    assert not batches.running(5.0, now=100.5)


def test_the_tracers_thread_sends_a_running_batchs_journal_once_its_progress_is_heard(spark, stack_config, tmp_path,
                                                                                     monkeypatch):
    """A real tracer: what a batch's tasks journal while it runs stays on disk through the thread's wakes,
    and reaches the edges topic, every edge of it, once the batch's progress record is heard. (The batch
    may hold the journal 60 s here, not 5: a busy machine's first Spark job may take longer than 5 s.)"""
    monkeypatch.setattr(shipping, "DRAIN_DEFER_S", 60.0)
    config, tag = own_topics(stack_config, "inflight")
    config = config.with_overrides(spill_dir=str(tmp_path))
    tracer = attach(spark, config)
    folder = Path(tracer.delivery_settings.spill_dir)  # its destination's, under the spill root
    query = f"q{tag}"
    try:
        tracer.shipper.batch_started(query, 2)
        frame = source_frame(spark)
        column = tracer.journals.column(outputs(query), jar.Counts.make(spark, query), frame,
                                        [F.col("_hw_rid"), F.col("src")])
        spark.sparkContext.setLocalProperty(PROPERTY, Setting(2, None, None, {}).to_json())
        try:
            assert frame.where(column).count() == N
        finally:
            spark.sparkContext.setLocalProperty(PROPERTY, None)
        journaled = sorted(folder.glob("*.rows"))
        assert len(journaled) == 3
        time.sleep(2.5)  # two wakes of the tracer's thread
        assert sorted(folder.glob("*.rows")) == journaled
        progress = {"batchId": 2, "runId": "r", "numInputRows": N, "durationMs": {}, "sources": [], "timestamp": None}
        tracer.shipper.publish_log(LOG_PROGRESS, **progress_record(progress, query))
        deadline = time.monotonic() + 10
        while list(folder.glob("*.rows")) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not list(folder.glob("*.rows"))
    finally:
        tracer.close()
    assert {(edge["src"], edge["dst"]) for _, edge in edges_published(config)} == {(1000 + i * 7919, i * 7777)
                                                                                   for i in range(N)}
