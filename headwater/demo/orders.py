"""The demo's data: an ``orders`` event stream and a static ``customers`` table."""

from __future__ import annotations

import datetime as dt
import json
import random

CUSTOMER_COUNT = 40
REGIONS = ("EU", "US", "APAC")
# Customer ids from 0 to CUSTOMER_COUNT + 4: the last five have no customers row, so
# the join drops their orders, as real dirty data would.
MAX_CUSTOMER_ID = CUSTOMER_COUNT + 4


def customers() -> list[dict]:
    return [
        {"customer_id": i, "name": f"customer-{i:03d}", "region": REGIONS[i % len(REGIONS)], "tier": i % 3}
        for i in range(CUSTOMER_COUNT)
    ]


MALFORMED = (b'{"order_id": ', b"not json at all", b'{"order_id": "x", "amount": []}', b"\xff\xfe\x00")


def order_events(count: int, seed: int = 7, malformed_every: int = 0) -> list[tuple[bytes, bytes]]:
    """``count`` keyed order events; with ``malformed_every=k``, every k-th one is garbage."""
    rng = random.Random(seed)
    start = dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc)
    events = []
    for i in range(count):
        customer = rng.randint(0, MAX_CUSTOMER_ID)
        if malformed_every and i % malformed_every == malformed_every - 1:
            events.append((str(customer).encode(), MALFORMED[i % len(MALFORMED)]))
            continue
        order = {
            "order_id": i,
            "customer_id": customer,
            "amount": round(rng.uniform(1, 200), 2),
            "event_time": (start + dt.timedelta(seconds=i)).isoformat(),
        }
        events.append((str(customer).encode(), json.dumps(order).encode()))
    return events


def produce(bootstrap: str, topic: str, events: list[tuple[bytes, bytes]],
            partitions: int | None = None) -> list[tuple[int, int]]:
    """Send ``events`` in order; returns where each landed, as (partition, offset). With
    ``partitions``, event i goes to partition i mod partitions (a split that does not vary
    from run to run); else the producer's partitioner places it."""
    from headwater.adapters.kafka import producer

    client = producer(bootstrap)
    try:
        futures = [client.send(topic, key=key, value=value, partition=None if partitions is None else i % partitions)
                   for i, (key, value) in enumerate(events)]
        client.flush(timeout=60)
        return [(meta.partition, meta.offset) for meta in (f.get(timeout=10) for f in futures)]
    finally:
        client.close()
