"""Thin kafka-python helpers shared by capture, the indexer and the query tier."""

from __future__ import annotations

import time

from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError


class BrokerUnavailable(RuntimeError):
    """The Kafka-protocol broker did not answer; is the stack up (``headwater stack status``)?"""


def admin(bootstrap: str, timeout_s: float = 10.0) -> KafkaAdminClient:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10000)
        except (KafkaError, OSError) as exc:
            if time.monotonic() > deadline:
                raise BrokerUnavailable(f"no Kafka broker answers at {bootstrap}: {exc}") from exc
            time.sleep(0.2)


def list_topics(bootstrap: str, timeout_s: float = 10.0) -> list[str]:
    client = admin(bootstrap, timeout_s)
    try:
        return sorted(client.list_topics())
    finally:
        client.close()


def ensure_topics(bootstrap: str, names: list[str], partitions: int) -> None:
    """Create the topics that do not exist yet; existing ones are left as they are."""
    client = admin(bootstrap)
    try:
        missing = [n for n in names if n not in set(client.list_topics())]
        if not missing:
            return
        try:
            client.create_topics([NewTopic(n, partitions, 1) for n in missing])
        except TopicAlreadyExistsError:
            pass
    finally:
        client.close()


def producer(bootstrap: str, **overrides) -> KafkaProducer:
    settings = dict(
        bootstrap_servers=bootstrap,
        acks=1,
        linger_ms=20,
        batch_size=256 * 1024,
        max_request_size=8 * 1024 * 1024,
        retries=5,
    )
    settings.update(overrides)
    return KafkaProducer(**settings)
