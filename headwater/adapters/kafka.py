"""Thin kafka-python helpers shared by capture, the indexer and the query tier.

Every client is made here, from a ``Config`` (``Kafka``): its bootstrap address and its
security settings (``core.kafka_client.connection``) reach each producer, consumer and
admin client. A bare address is also taken, for callers that hold no config: the client
then gets the security settings of the effective config (``core.config.load``: the
environment, the stack's state file), which is where a deployment sets them.
"""

from __future__ import annotations

import time
from typing import Iterator

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

from headwater.core import config as configuration
from headwater.core.config import Config
from headwater.core.kafka_client import connection

Kafka = Config | str  # a config, or a bootstrap address (security settings from the effective config)


class BrokerUnavailable(RuntimeError):
    """The Kafka-protocol broker did not answer; is the stack up (``headwater stack status``)?"""


def config_of(kafka: Kafka) -> Config:
    """The config a client of ``kafka`` takes its address and security settings from."""
    return kafka if isinstance(kafka, Config) else configuration.load(bootstrap=kafka)


def admin(kafka: Kafka, timeout_s: float = 10.0) -> KafkaAdminClient:
    config = config_of(kafka)
    settings = connection(config)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return KafkaAdminClient(**settings, request_timeout_ms=10000,
                                    bootstrap_timeout_ms=max(200, int((deadline - time.monotonic()) * 1000)))
        except (KafkaError, OSError) as exc:
            if time.monotonic() > deadline:
                raise BrokerUnavailable(f"no Kafka broker answers at {config.bootstrap}: {exc}") from exc
            time.sleep(0.2)


def list_topics(kafka: Kafka, timeout_s: float = 10.0) -> list[str]:
    client = admin(kafka, timeout_s)
    try:
        return sorted(client.list_topics())
    finally:
        client.close()


def ensure_topics(kafka: Kafka, names: list[str], partitions: int | None = None, timeout_s: float = 10.0) -> None:
    """Create the topics that do not exist yet; existing ones are left as they are.

    The only place headwater creates topics (its clients ask the broker never to make one): with
    ``partitions`` (default the config's ``topic_partitions``) and the config's
    ``topic_replication``.
    """
    config = config_of(kafka)
    client = admin(config, timeout_s)
    try:
        missing = [n for n in names if n not in set(client.list_topics())]
        if not missing:
            return
        try:
            client.create_topics([NewTopic(n, partitions or config.topic_partitions, config.topic_replication)
                                  for n in missing])
        except TopicAlreadyExistsError:
            pass
    finally:
        client.close()


def producer(kafka: Kafka, **overrides) -> KafkaProducer:
    """A producer that waits for every in-sync replica (``acks="all"``) and is idempotent.

    Idempotence (a retried send is written once) is kafka-python's default and left to it:
    on a broker too old for it (before 0.11) kafka-python turns it off with a warning,
    where asking for it explicitly would fail every send. The broker is asked never to make a
    topic for a send (Kafka honours it; the local stack's tansu makes one anyway, so callers
    make their topics with ``ensure_topics`` before sending).
    """
    settings = dict(
        acks="all",
        linger_ms=20,
        batch_size=256 * 1024,
        max_request_size=8 * 1024 * 1024,
        retries=5,
        allow_auto_create_topics=False,
    )
    settings.update(overrides)
    return KafkaProducer(**connection(config_of(kafka)), **settings)


FETCH_TIMEOUT_S = 30.0


class KafkaSourceError(RuntimeError):
    """Records could not be read from the broker in time."""


def consumer(kafka: Kafka, **overrides) -> KafkaConsumer:
    """A consumer; by default group-less, for reading by explicit offsets. It asks the broker never to make a topic."""
    settings = dict(
        enable_auto_commit=False,
        group_id=None,
        consumer_timeout_ms=1000,
        request_timeout_ms=30000,
        allow_auto_create_topics=False,
    )
    settings.update(overrides)
    return KafkaConsumer(**connection(config_of(kafka)), **settings)


HIGH_WATERMARK_WAIT_MS = 10  # how long the broker may hold a fetch at a partition's end (kafka-python's default 500)


def high_watermark_client(kafka: Kafka) -> KafkaConsumer:
    """A consumer for ``high_watermarks``: the broker answers a fetch at a partition's end at once."""
    return consumer(kafka, fetch_max_wait_ms=HIGH_WATERMARK_WAIT_MS)


def high_watermarks(client: KafkaConsumer, partitions: dict) -> dict:
    """Fetched high-water marks for ``{TopicPartition: position_to_fetch_from}``.

    One fetch per partition at a known position makes the broker report its
    high-water mark; ``client.highwater`` then holds it. Unassigning first drops the
    marks of earlier calls, so every mark returned is fresh. At the end of a partition the
    broker holds the fetch for the client's ``fetch_max_wait_ms`` (``HIGH_WATERMARK_WAIT_MS``
    in ``high_watermark_client``) before it answers with no records, and the polls here are
    short, so a stream with nothing new learns it in tens of milliseconds, not 400–600.
    """
    client.unsubscribe()
    client.assign(list(partitions))
    for tp, position in partitions.items():
        client.seek(tp, position)
    deadline = time.monotonic() + FETCH_TIMEOUT_S
    while True:
        marks = {tp: client.highwater(tp) for tp in partitions}
        if all(mark is not None for mark in marks.values()):
            return marks
        if time.monotonic() > deadline:
            missing = [f"{tp.topic}:{tp.partition}" for tp, m in marks.items() if m is None]
            raise KafkaSourceError(f"no high-water mark from the broker for {missing}")
        # Records fetched here are discarded: only the marks that come with them count.
        client.poll(timeout_ms=10, max_records=1, update_offsets=False)
        for tp, position in partitions.items():
            client.seek(tp, position)


def read_records(kafka: Kafka, topic: str, partition: int, start: int, end: int) -> Iterator:
    """The records at offsets ``start`` (inclusive) to ``end`` (exclusive), in order."""
    tp = TopicPartition(topic, partition)
    client = consumer(kafka)
    try:
        client.assign([tp])
        client.seek(tp, start)
        position = start
        deadline = time.monotonic() + FETCH_TIMEOUT_S
        while position < end:
            batch = client.poll(timeout_ms=500, max_records=5000).get(tp, [])
            if not batch and time.monotonic() > deadline:
                raise KafkaSourceError(
                    f"{topic}:{partition} stopped at offset {position}, expected records up to {end - 1}"
                )
            for record in batch:
                if record.offset >= end:
                    return
                position = record.offset + 1
                deadline = time.monotonic() + FETCH_TIMEOUT_S
                yield record
    finally:
        client.close()


class RecordGone(KafkaSourceError):
    """The broker no longer holds a record (retention, a deleted or recreated topic, lost data)."""


def record_at(kafka: Kafka, topic: str, partition: int, offset: int, timeout_s: float = 5.0):
    """The record at ``topic``/``partition``/``offset``; ``RecordGone`` within ``timeout_s`` if the broker has
    no such record, saying why as far as it can tell."""
    tp = TopicPartition(topic, partition)
    config = config_of(kafka)
    bootstrap = config.bootstrap
    client = consumer(config)
    try:
        partitions = client.partitions_for_topic(topic)
        if not partitions:
            raise RecordGone(f"topic {topic!r} is not on the broker at {bootstrap} (deleted since?)")
        if partition not in partitions:
            raise RecordGone(f"topic {topic!r} has no partition {partition} now (recreated since?)")
        first = client.beginning_offsets([tp])[tp]
        if offset < first:
            raise RecordGone(f"{topic}:{partition} starts at offset {first} now: the record at {offset} was "
                             f"removed (retention)")
        client.assign([tp])
        client.seek(tp, offset)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for record in client.poll(timeout_ms=300, max_records=1, update_offsets=False).get(tp, []):
                if record.offset == offset:
                    return record
                raise RecordGone(f"{topic}:{partition} has no record at offset {offset} now (compacted away?)")
            end = client.highwater(tp)  # fetched, not asked for: the broker's own end
            if end is not None and end <= offset:
                raise RecordGone(f"{topic}:{partition} ends before offset {offset} now ({end} records): the "
                                 f"record is gone (the topic was recreated, or the broker lost its data)")
            client.seek(tp, offset)
        raise RecordGone(f"no record came back from {topic}:{partition} at offset {offset} within {timeout_s:g}s")
    finally:
        client.close()
