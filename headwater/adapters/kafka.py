"""Thin kafka-python helpers shared by capture, the indexer and the query tier.

Every client is made here, from a ``Config`` (``Kafka``): its bootstrap address and its
security settings (``core.kafka_client.connection``) reach each producer, consumer and
admin client. A bare address is also taken, for callers that hold no config: the client
then gets the security settings of the effective config (``core.config.load``: the
environment, the stack's state file), which is where a deployment sets them.
"""

from __future__ import annotations

import time

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import AuthorizationError, KafkaError, TopicAlreadyExistsError

from headwater.core import config as configuration
from headwater.core.config import Config
from headwater.core.kafka_client import connection

Kafka = Config | str  # a config, or a bootstrap address (security settings from the effective config)


class BrokerUnavailable(RuntimeError):
    """The Kafka broker did not answer, or refused headwater's login or certificate; the message says which
    and names the setting to change (``diagnose``), never a secret. ``reason`` is that part alone."""

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        self.reason = reason or message


class NotAuthorized(BrokerUnavailable):
    """The broker took headwater's login but its ACLs do not allow what was asked (a topic, a group)."""


def diagnose(config: Config, timeout_s: float = 5.0) -> str:
    """Why no client of ``config`` could bootstrap, as far as the connection itself tells, naming the setting.

    kafka-python gives up with "Unable to bootstrap" whatever the cause, so each step is tried here on the
    first bootstrap server that accepts a connection: TCP, then TLS with the config's CA (an untrusted
    certificate fails here), then, TLS being fine, the SASL login, the only step left.
    """
    import socket
    import ssl

    protocol = config.kafka_security_protocol
    servers = [s.strip() for s in config.bootstrap.split(",") if s.strip()]
    for server in servers:
        host, _, port = server.rpartition(":")
        try:
            plain = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s)
        except (OSError, ValueError):
            continue
        with plain:
            if protocol in ("SSL", "SASL_SSL"):
                context = ssl.create_default_context(cafile=config.kafka_ssl_cafile or None)
                try:
                    if config.kafka_ssl_certfile:
                        context.load_cert_chain(config.kafka_ssl_certfile, config.kafka_ssl_keyfile or None)
                    context.wrap_socket(plain, server_hostname=host.strip("[]")).close()
                except ssl.SSLCertVerificationError as exc:
                    trusted = f"kafka_ssl_cafile ({config.kafka_ssl_cafile})" if config.kafka_ssl_cafile \
                        else "the system's CAs (kafka_ssl_cafile is not set)"
                    return (f"the broker at {server} has a certificate {trusted} does not trust: "
                            f"{exc.verify_message}; set kafka_ssl_cafile to the CA that signed it")
                except (ssl.SSLError, OSError) as exc:
                    return (f"no TLS with the broker at {server} ({type(exc).__name__}: {exc}): check "
                            f"kafka_security_protocol ({protocol}) and kafka_ssl_certfile/kafka_ssl_keyfile")
        if protocol.startswith("SASL_"):
            return (f"the broker at {server} refused the SASL login of kafka_sasl_username "
                    f"{config.kafka_sasl_username!r} ({config.kafka_sasl_mechanism}), or did not answer it in "
                    f"time: check the password (kafka_sasl_password or kafka_sasl_password_file) and "
                    f"kafka_sasl_mechanism")
        return f"the broker at {server} accepts connections but does not answer Kafka's protocol in time"
    return f"no Kafka broker listens at {config.bootstrap} (bootstrap); is it up (headwater stack status)?"


def unavailable(config: Config) -> BrokerUnavailable:
    """The error for a client of ``config`` that could not be made: ``diagnose``'s reason."""
    reason = diagnose(config)
    return BrokerUnavailable(f"no Kafka client of {config.bootstrap}: {reason}", reason)


def not_authorized(config: Config, what: str, exc: Exception) -> NotAuthorized:
    user = f"kafka_sasl_username {config.kafka_sasl_username!r}" if config.kafka_security_protocol.startswith(
        "SASL_") else "headwater's principal"
    return NotAuthorized(f"the broker at {config.bootstrap} does not allow {user} to {what} "
                         f"({type(exc).__name__}): its ACLs must allow it")


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
        except (KafkaError, OSError):
            if time.monotonic() > deadline:
                raise unavailable(config) from None
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
        except AuthorizationError as exc:  # an ACL short of Describe hides a topic that exists, too
            raise not_authorized(config, f"describe or create the topics {', '.join(missing)}", exc) from None
    finally:
        client.close()


def producer(kafka: Kafka, **overrides) -> KafkaProducer:
    """A producer that waits for every in-sync replica (``acks="all"``) and is idempotent.

    Idempotence (a retried send is written once) is kafka-python's default and left to it:
    on a broker too old for it (before 0.11) kafka-python turns it off with a warning,
    where asking for it explicitly would fail every send. The broker is asked never to make a
    topic for a send: callers make their topics with ``ensure_topics`` before sending.
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
    config = config_of(kafka)
    try:
        return KafkaProducer(**connection(config), **settings)
    except KafkaError:  # its bootstrap failed
        raise unavailable(config) from None



class KafkaSourceError(RuntimeError):
    """Records could not be read from the broker."""


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
    config = config_of(kafka)
    try:
        return KafkaConsumer(**connection(config), **settings)
    except KafkaError:  # its bootstrap failed
        raise unavailable(config) from None


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


def records_between(kafka: Kafka, ranges: dict[tuple[str, int], tuple[int, int]], timeout_s: float = 10.0,
                    whole: bool = False):
    """Every record the broker still holds in each ``(topic, partition) → [first, end)`` of ``ranges``, in offset
    order within a partition (partitions interleaved). A range the broker no longer holds (all or part: retention,
    a deleted or recreated topic) gives what is left of it, and the records not back within ``timeout_s`` are not
    given; with ``whole``, either is ``RecordGone`` instead, naming the partition: a seek there would silently skip
    to what is left, rows lost rather than a superset."""
    config = config_of(kafka)
    client = consumer(config)
    try:
        wanted = _held(client, ranges, whole)
        left = {}
        if wanted:
            client.assign(list(wanted))
            firsts, ends = client.beginning_offsets(list(wanted)), client.end_offsets(list(wanted))
            gone = {tp: (firsts[tp], ends[tp]) for tp, (first, end) in wanted.items()
                    if whole and (firsts[tp] > first or ends[tp] < end)}
            if gone:
                raise RecordGone("Kafka records asked for are no longer retained: " + ", ".join(
                    f"{tp.topic}:{tp.partition} holds [{held[0]}, {held[1]}), [{wanted[tp][0]}, {wanted[tp][1]}) "
                    f"was asked for" for tp, held in sorted(gone.items())))
            for tp, (first, end) in wanted.items():
                first, end = max(first, firsts[tp]), min(end, ends[tp])
                if first < end:
                    client.seek(tp, first)
                    left[tp] = end
        deadline = time.monotonic() + timeout_s
        while left:
            if time.monotonic() > deadline:
                if whole:
                    raise RecordGone(f"Kafka records were not all read back within {timeout_s:g}s: "
                                     + ", ".join(sorted(f"{tp.topic}:{tp.partition}" for tp in left)))
                return
            for tp, records in client.poll(timeout_ms=300).items():
                for record in records:
                    if tp in left and record.offset < left[tp]:
                        yield record
                if tp in left and client.position(tp) >= left[tp]:
                    del left[tp]
                    client.pause(tp)
    finally:
        client.close()


def _held(client: KafkaConsumer, ranges: dict[tuple[str, int], tuple[int, int]], whole: bool) \
        -> dict[TopicPartition, tuple[int, int]]:
    """The non-empty ranges of ``ranges`` whose partition the broker has, by ``TopicPartition``; with ``whole``,
    ``RecordGone`` for one it has not."""
    partitions: dict[str, set[int]] = {}
    held = {}
    for (topic, partition), (first, end) in sorted(ranges.items()):
        if topic not in partitions:
            partitions[topic] = client.partitions_for_topic(topic) or set()
        if partition in partitions[topic]:
            if first < end:
                held[TopicPartition(topic, partition)] = (first, end)
        elif whole:
            raise RecordGone(f"topic {topic!r} has no partition {partition} on the broker now (deleted or "
                             f"recreated since?)")
    return held
