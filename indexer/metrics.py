"""Prometheus metrics of the indexer, ``headwater_indexer_*``.

Lag is computed from the high-water marks the consumer's own fetches returned, never
from the broker's end offsets (the local broker's are wrong, DESIGN §6); a partition's
lag is reported by the indexer that holds it only. Consumption stalled:
``headwater_indexer_lag > 0`` while ``rate(headwater_indexer_messages_total[5m]) == 0``. Edges per
second into each store: ``rate(headwater_indexer_edges_total[1m])``, or the last
write's figure in ``headwater_indexer_edges_per_second``.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

STORES = ("graph", "parquet")

LAG = Gauge("headwater_indexer_lag", "Messages behind the partition's high-water mark, from the last fetch",
            ["topic", "partition"])
# With the lag, what a stalled indexer shows: lag above zero while this does not grow.
MESSAGES = Counter("headwater_indexer_messages",
                   "Messages consumed and done with (indexed, skipped as already indexed, or sent to the dlq)",
                   ["topic"])
EDGES = Counter("headwater_indexer_edges", "Lineage edges written, by store", ["store"])
EDGES_PER_SECOND = Gauge("headwater_indexer_edges_per_second", "Edges per second of the last write, by store",
                         ["store"])
WRITE_SECONDS = Histogram("headwater_indexer_write_seconds", "Time to write one poll batch, by store", ["store"],
                          buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
DLQ = Counter("headwater_indexer_dlq", "Messages sent to the dlq topic (undecodable or rejected)")
RETRIES = Counter("headwater_indexer_retries", "Writes retried because a store was unavailable")
COMPACTION_SECONDS = Histogram("headwater_indexer_compaction_seconds", "Duration of a compaction of the Parquet store",
                               buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800))


def record_write(store: str, edges: int, seconds: float) -> None:
    EDGES.labels(store).inc(edges)
    WRITE_SECONDS.labels(store).observe(seconds)
    if edges:
        EDGES_PER_SECOND.labels(store).set(edges / max(seconds, 1e-6))


def forget_lag(partitions) -> None:
    """Drop the lag of partitions this indexer no longer holds: their new owner reports it, and a last
    value left behind here would look like a stalled indexer."""
    for tp in partitions:
        try:
            LAG.remove(tp.topic, str(tp.partition))
        except KeyError:  # never reported here
            pass
