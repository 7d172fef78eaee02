"""``adapters.kafka.records_between``: the one reader of a range of Kafka records (the log-only fallback's batch
records, a Kafka sink's placements), against the stack's Apache Kafka."""

from __future__ import annotations

import uuid

import pytest

from headwater.adapters.kafka import RecordGone, ensure_topics, producer, records_between


@pytest.fixture(scope="module")
def topic(stack_config):
    """A topic of two partitions: offsets 0–4 in partition 0, 0–2 in partition 1."""
    name = f"records-{uuid.uuid4().hex[:8]}"
    ensure_topics(stack_config, [name], 2)
    client = producer(stack_config)
    try:
        for partition, count in ((0, 5), (1, 3)):
            for i in range(count):
                client.send(name, value=f"{partition}-{i}".encode(), partition=partition)
        client.flush(timeout=30)
    finally:
        client.close()
    return name


def read(config, ranges, **kwargs) -> list[tuple[int, int, bytes]]:
    return [(r.partition, r.offset, r.value) for r in records_between(config, ranges, **kwargs)]


def test_each_range_gives_its_records_in_offset_order_within_a_partition(stack_config, topic):
    got = read(stack_config, {(topic, 0): (1, 4), (topic, 1): (0, 3)})
    assert sorted(got) == [(0, 1, b"0-1"), (0, 2, b"0-2"), (0, 3, b"0-3"), (1, 0, b"1-0"), (1, 1, b"1-1"),
                           (1, 2, b"1-2")]
    for partition in (0, 1):
        offsets = [offset for p, offset, _ in got if p == partition]
        assert offsets == sorted(offsets)
    assert read(stack_config, {(topic, 0): (2, 2)}) == []


def test_what_the_broker_does_not_hold_is_left_out_or_refused_when_the_whole_range_is_wanted(stack_config, topic):
    assert read(stack_config, {(topic, 1): (1, 9), (topic, 7): (0, 2), ("no-such-topic", 0): (0, 1)}) == [
        (1, 1, b"1-1"), (1, 2, b"1-2")]
    with pytest.raises(RecordGone, match=rf"{topic}:1 holds \[0, 3\), \[1, 9\) was asked for"):
        read(stack_config, {(topic, 1): (1, 9)}, whole=True)
    with pytest.raises(RecordGone, match=rf"topic '{topic}' has no partition 7"):
        read(stack_config, {(topic, 0): (0, 1), (topic, 7): (0, 2)}, whole=True)
    assert read(stack_config, {(topic, 0): (4, 5)}, whole=True) == [(0, 4, b"0-4")]
