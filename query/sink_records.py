"""A traced Kafka sink's records (``format("kafka")``): the rid a record carries, and where an output row went.

Capture (``capture/sinks/kafka_sink.py``) writes each record's rid in a header ``_hw_rid`` (the rid in
decimal) or first in its JSON value, and logs each batch's ``sink_offsets``, the ranges of the topics the
batch wrote to (``{topic: {partition: [first, end)}}``). An output row of batch b is found among the records
of b's ranges by its rid: a record of another writer in a range carries another rid, or none; a batch
Spark ran again wrote its records again, and the ranges the batch's last attempt logged are read. The
records are read with headwater's own Kafka settings: the sink's topics on the cluster headwater uses.
"""

from __future__ import annotations

import json
from collections import OrderedDict

from headwater.adapters.kafka import Kafka, records_between

RID_KEY = "_hw_rid"
CACHED = 256  # batches whose placements a client keeps


def carried_rid(record) -> int | None:
    """The rid a record of a traced Kafka sink carries: its ``_hw_rid`` header, else its JSON value's; None if
    neither."""
    for key, value in record.headers or []:
        if key == RID_KEY and value:
            try:
                return int(value.decode())
            except ValueError:
                return None
    value = record.value
    if value and value.lstrip()[:1] == b"{":
        try:
            found = json.loads(value).get(RID_KEY)
        except (ValueError, AttributeError):
            return None
        return found if isinstance(found, int) and not isinstance(found, bool) else None
    return None


def ranges_of(sink_offsets: dict) -> dict[tuple[str, int], tuple[int, int]]:
    """A batch's logged ``sink_offsets`` as ``{(topic, partition): (first, end)}``."""
    return {(topic, int(partition)): (int(first), int(end))
            for topic, partitions in sink_offsets.items() for partition, (first, end) in partitions.items()}


class Placements:
    """Where each output row of a batch went (``{rid: [(topic, partition, offset), …]}``, in offset order), read from
    the broker once a batch and kept for the ``CACHED`` batches asked of last."""

    def __init__(self, kafka: Kafka):
        self.kafka = kafka
        self._batches: OrderedDict[tuple[str, int], dict[int, list[tuple[str, int, int]]]] = OrderedDict()

    def of(self, query: str, batch: int, sink_offsets: dict | None) -> dict[int, list[tuple[str, int, int]]]:
        key = (query, batch)
        if key in self._batches:
            self._batches.move_to_end(key)
            return self._batches[key]
        found: dict[int, list[tuple[str, int, int]]] = {}
        for record in records_between(self.kafka, ranges_of(sink_offsets or {})):
            rid = carried_rid(record)
            if rid is not None:
                found.setdefault(rid, []).append((record.topic, record.partition, record.offset))
        for places in found.values():
            places.sort()
        self._batches[key] = found
        while len(self._batches) > CACHED:
            self._batches.popitem(last=False)
        return found
