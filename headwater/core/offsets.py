"""A Kafka source's offsets, as Spark's progress and headwater's batch log hold them: one reader.

Spark's Kafka connector writes a source's offsets as ``{"topic": {"0": 42, "1": 7}}`` (each partition's
next offset to read); logs written while headwater read Kafka through a Python source of its own hold
``{"topic:0": 42}``. ``partition_offsets`` reads both into ``{(topic, partition): offset}``, so the batch
log of an older stream still answers. Pure: no Spark, no Kafka client.
"""

from __future__ import annotations

import json

Offsets = dict[tuple[str, int], int]


def partition_offsets(value) -> Offsets:
    """``{(topic, partition): offset}`` of a source's offsets (Spark's JSON text or its dict, offsets already
    read, or None: nothing)."""
    if value in (None, "None", "null", ""):
        return {}
    if isinstance(value, str):
        value = json.loads(value)
    found: Offsets = {}
    for name, offsets in value.items():
        if isinstance(name, tuple):  # already read
            found[name] = int(offsets)
        elif isinstance(offsets, dict):  # Spark's connector: a topic's partitions
            found.update({(name, int(partition)): int(offset) for partition, offset in offsets.items()})
        else:  # headwater's former source: "topic:partition"
            topic, partition = name.rsplit(":", 1)
            found[topic, int(partition)] = int(offsets)
    return found


Ranges = dict[tuple[str, int], tuple[int, int]]


def read_ranges(start, end) -> Ranges:
    """The records a batch read from one source, ``[start, end)`` by (topic, partition), from the source's
    start and end offsets.

    A first batch has no start: it read from its partitions' first offset, taken as 0 (a broker that no
    longer holds them says so to whoever reads them back)."""
    begun = partition_offsets(start)
    return {where: (begun.get(where, 0), last) for where, last in partition_offsets(end).items()
            if last > begun.get(where, 0)}


def offset_ranges(sources: list[dict]) -> Ranges:
    """The records a batch read, ``[start, end)`` by (topic, partition), from its log entry's ``sources``
    (each with ``start`` and ``end``, as ``capture/listener.py`` logs Spark's progress)."""
    ranges: Ranges = {}
    for source in sources:
        ranges.update(read_ranges(source.get("start"), source.get("end")))
    return ranges


def spark_offsets(offsets: Offsets) -> str:
    """``offsets`` as Spark's connector takes them in ``startingOffsets``/``endingOffsets``."""
    nested: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        nested.setdefault(topic, {})[str(partition)] = offset
    return json.dumps(nested)


def reached(end, until: Offsets) -> bool:
    """Whether a source's ``end`` offsets have read every record up to ``until``."""
    read = partition_offsets(end)
    return all(read.get(where, 0) >= offset for where, offset in until.items())
