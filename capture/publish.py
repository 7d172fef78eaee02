"""Publishing lineage from Spark's executors to the edges topic.

``publish_partition`` runs inside ``mapInArrow`` on each task: it turns the task's
sink rows into lineage payloads and sends them with a kafka-python producer kept for
the life of the Python worker. It yields one row of counts, so the driver learns
what was sent without ever holding an edge.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa

from headwater.core.schema import encode_lineage

from .lineage import BatchContext, lineage_tables

STATS = ("rows", "edges", "nodes", "bytes", "messages", "failed_edges")
STATS_SCHEMA = ", ".join(f"{name} long" for name in STATS)

_PRODUCERS: dict = {}


@dataclass(frozen=True)
class PublishTarget:
    bootstrap: str
    topic: str
    max_rows_per_message: int = 20000
    send_timeout_s: float = 30.0


def _producer(bootstrap: str):
    if bootstrap not in _PRODUCERS:
        from headwater.adapters.kafka import producer

        _PRODUCERS[bootstrap] = producer(bootstrap)
    return _PRODUCERS[bootstrap]


def publish_partition(
    batches: Iterator[pa.RecordBatch], ctx: BatchContext, target: PublishTarget
) -> Iterator[pa.RecordBatch]:
    rows = edges = nodes = size = messages = failed = 0
    futures = []
    try:
        producer = _producer(target.bootstrap)
    except Exception:  # broker unreachable: the batch is reported as a gap, the stream goes on
        producer = None
    for batch in batches:
        rows += batch.num_rows
        for offset in range(0, batch.num_rows, target.max_rows_per_message):
            chunk = batch.slice(offset, target.max_rows_per_message)
            node_table, edge_table = lineage_tables(chunk, ctx)
            if producer is None:
                failed += edge_table.num_rows
                continue
            payload = encode_lineage(node_table, edge_table)
            key = f"{ctx.query}/{ctx.batch}".encode()
            futures.append((edge_table.num_rows, producer.send(target.topic, key=key, value=payload)))
            edges += edge_table.num_rows
            nodes += node_table.num_rows
            size += len(payload)
            messages += 1
    if producer is not None:
        try:
            producer.flush(timeout=target.send_timeout_s)
        except Exception:
            pass
    for count, future in futures:
        if not future.succeeded():
            failed += count
    yield pa.RecordBatch.from_pydict(
        {"rows": [rows], "edges": [edges], "nodes": [nodes], "bytes": [size], "messages": [messages],
         "failed_edges": [failed]}
    )
