"""Publishing lineage from Spark's executors to the edges topic.

``publish_partition`` runs inside ``mapInArrow`` on each task: it turns the task's
sink rows into lineage payloads and hands them to the worker's ``Delivery`` (kept for
the life of the Python worker), which sends them, or spills them when the broker is
away. It yields one row of counts, so the driver learns what was sent, spilled and
dropped without ever holding an edge.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa

from headwater.core.schema import encode_lineage

from .delivery import DROPPED, SPILLED, Delivery, DeliverySettings
from .lineage import BatchContext, lineage_tables

STATS = ("rows", "edges", "nodes", "bytes", "messages", "spilled_edges", "dropped_edges")
STATS_SCHEMA = ", ".join(f"{name} long" for name in STATS)

_DELIVERIES: dict = {}


@dataclass(frozen=True)
class PublishTarget:
    delivery: DeliverySettings
    topic: str
    max_rows_per_message: int = 20000


def delivery(settings: DeliverySettings) -> Delivery:
    """This process's delivery for ``settings``, made once."""
    if settings not in _DELIVERIES:
        _DELIVERIES[settings] = Delivery(settings)
    return _DELIVERIES[settings]


def publish_partition(
    batches: Iterator[pa.RecordBatch], ctx: BatchContext, target: PublishTarget
) -> Iterator[pa.RecordBatch]:
    counts = dict.fromkeys(STATS, 0)
    edge_counts = []
    key = f"{ctx.query}/{ctx.batch}".encode()

    def messages():
        for batch in batches:
            counts["rows"] += batch.num_rows
            for offset in range(0, batch.num_rows, target.max_rows_per_message):
                node_table, edge_table = lineage_tables(batch.slice(offset, target.max_rows_per_message), ctx)
                payload = encode_lineage(node_table, edge_table)
                counts["edges"] += edge_table.num_rows
                counts["nodes"] += node_table.num_rows
                counts["bytes"] += len(payload)
                counts["messages"] += 1
                edge_counts.append(edge_table.num_rows)
                yield target.topic, key, payload

    sender = delivery(target.delivery)
    outcomes = sender.deliver(messages())
    for outcome, n in zip(outcomes, edge_counts):
        if outcome == SPILLED:
            counts["spilled_edges"] += n
        elif outcome == DROPPED:
            counts["dropped_edges"] += n
    if outcomes and all(o not in (SPILLED, DROPPED) for o in outcomes):
        sender.drain(budget_s=1.0)  # an executor's own spill, once its broker is back
    yield pa.RecordBatch.from_pydict({name: [value] for name, value in counts.items()})
