"""Publishing lineage from Spark's executors to the edges topic.

Two ways, both inside ``mapInArrow`` on each task, handing payloads to the Python
worker's ``Delivery`` (kept for the life of the worker), which sends them, or spills
them when the broker is away:

- ``publish_through`` rides in the job that writes the user's sink: it passes the
  sink's rows on unchanged (minus the lineage columns) and publishes their lineage
  on the way, so a batch costs no second job. Its counts go to an accumulator.
- ``publish_partition`` is a job of its own over rows the hook kept (black boxes,
  the user's own foreachBatch code, sinks that do not read every row); it yields one
  row of counts per task.

Either way the driver learns what was sent, spilled and dropped without ever holding
an edge.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa
from pyspark.accumulators import AccumulatorParam

from headwater.core.schema import encode_lineage

from .delivery import DROPPED, SPILLED, Delivery, DeliverySettings
from .lineage import BatchContext, lineage_tables

STATS = ("rows", "edges", "nodes", "bytes", "messages", "spilled_edges", "dropped_edges")
STATS_SCHEMA = ", ".join(f"{name} long" for name in STATS)
SAMPLE_MODULUS = 1_000_003  # a row is sampled when pmod(rid, SAMPLE_MODULUS) < fraction * SAMPLE_MODULUS

_DELIVERIES: dict = {}
log = logging.getLogger("headwater.capture")


@dataclass(frozen=True)
class PublishTarget:
    delivery: DeliverySettings
    topic: str
    max_rows_per_message: int = 20000


def delivery(settings: DeliverySettings) -> Delivery:
    """This worker's delivery for ``settings``, made once, with a thread that drains its host's spill.

    The drain thread sends what was spilled once the broker answers again, beside the
    tasks rather than in them, so no task ever waits for it.
    """
    if settings not in _DELIVERIES:
        _DELIVERIES[settings] = Delivery(settings)
        threading.Thread(target=_drain_forever, args=(Delivery(settings),), name="headwater-drain",
                         daemon=True).start()
    return _DELIVERIES[settings]


def _drain_forever(drainer: Delivery, every_s: float = 2.0) -> None:
    while True:
        time.sleep(every_s)
        try:
            drainer.drain(budget_s=5.0)
        except Exception:  # keep draining whatever the broker does
            log.exception("draining the spill failed; retrying")


class Counts(AccumulatorParam):
    """An accumulator of ``STATS``, then capture's task time in milliseconds, then failed tasks."""

    def zero(self, value):
        return [0] * (len(STATS) + 2)

    def addInPlace(self, a, b):
        return [x + y for x, y in zip(a, b)]


class _Task:
    """One task's payloads and counts."""

    def __init__(self, ctx: BatchContext, target: PublishTarget):
        self.ctx, self.target = ctx, target
        self.counts = dict.fromkeys(STATS, 0)
        self.edge_counts: list[int] = []
        self.key = f"{ctx.query}/{ctx.batch}".encode()

    def messages(self, batch: pa.RecordBatch, ctx: BatchContext | None = None) -> Iterator[tuple]:
        """Payloads of the lineage of ``batch``'s rows, as ``ctx`` (the task's own by default) reads them."""
        for offset in range(0, batch.num_rows, self.target.max_rows_per_message):
            node_table, edge_table = lineage_tables(batch.slice(offset, self.target.max_rows_per_message),
                                                    ctx or self.ctx)
            payload = encode_lineage(node_table, edge_table)
            self.counts["edges"] += edge_table.num_rows
            self.counts["nodes"] += node_table.num_rows
            self.counts["bytes"] += len(payload)
            self.counts["messages"] += 1
            self.edge_counts.append(edge_table.num_rows)
            yield self.target.topic, self.key, payload

    def deliver(self, messages) -> None:
        sender = delivery(self.target.delivery)
        outcomes = sender.deliver(messages)
        for outcome, n in zip(outcomes, self.edge_counts):
            if outcome == SPILLED:
                self.counts["spilled_edges"] += n
            elif outcome == DROPPED:
                self.counts["dropped_edges"] += n


def publish_partition(
    batches: Iterator[pa.RecordBatch], ctx: BatchContext, target: PublishTarget
) -> Iterator[pa.RecordBatch]:
    task = _Task(ctx, target)

    def messages():
        for batch in batches:
            task.counts["rows"] += batch.num_rows
            yield from task.messages(batch)

    task.deliver(messages())
    yield pa.RecordBatch.from_pydict({name: [value] for name, value in task.counts.items()})


def sampled(rids: np.ndarray, fraction: float) -> np.ndarray:
    """Which rows are in a batch's sample: by rid, as ``tracer._sampled`` decides in Spark."""
    return np.mod(rids, SAMPLE_MODULUS) < int(fraction * SAMPLE_MODULUS)


def publish_through(
    batches: Iterator[pa.RecordBatch], ctx: BatchContext, target: PublishTarget, keep: list[str],
    fraction: float | None, counts,
) -> Iterator[pa.RecordBatch]:
    """Yield each batch's ``keep`` columns, publishing the lineage of its rows (of a sample)."""
    task = _Task(ctx, target)
    payloads = []
    spent = 0.0
    failed = 0
    for batch in batches:
        started = time.perf_counter()
        task.counts["rows"] += batch.num_rows
        if not failed:
            try:
                lineage = batch
                if fraction is not None:
                    lineage = batch.filter(pa.array(sampled(batch.column("_hw_rid").to_numpy(), fraction)))
                payloads.extend(task.messages(lineage))
            except Exception:  # lineage must never fail the user's write: the batch is logged failed
                log.exception("lineage of batch %s failed in this task", ctx.batch)
                failed = 1
        spent += time.perf_counter() - started
        yield batch.select(keep)
    started = time.perf_counter()
    try:
        task.deliver(payloads)
    except Exception:
        log.exception("publishing the lineage of batch %s failed in this task", ctx.batch)
        failed = 1
    spent += time.perf_counter() - started
    counts.add([task.counts[name] for name in STATS] + [round(spent * 1000), failed])
