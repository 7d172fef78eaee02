"""Kafka security settings (``core.kafka_client``) reach every client headwater makes, and the
password never shows; then the producer on the local stack: acks=all, idempotent, topics only
as ``ensure_topics`` makes them.

A broker with SASL or TLS cannot run here: the tansu of the local stack takes ``--authentication``
but has no way to create a SCRAM user on an authenticating broker with in-memory storage (its
``user create`` must itself authenticate), and its ``--cert`` leaves the listener plaintext. So the
client side is checked up to each kafka-python constructor's arguments, with the constructors
replaced by recorders, named as such.
"""

from __future__ import annotations

import logging
import uuid

import pytest

from headwater.adapters import kafka as kafka_adapter
from headwater.capture import kafka_source
from headwater.capture.delivery import Delivery, DeliverySettings
from headwater.core import config as configuration
from headwater.core.config import Config
from headwater.core.kafka_client import KafkaSettingsError, connection
from headwater.indexer.service import Indexer
from headwater.query import fallback

PASSWORD = "pw-" + uuid.uuid4().hex
SASL_SSL = dict(bootstrap="broker-1:9093,broker-2:9093", kafka_security_protocol="SASL_SSL",
                kafka_sasl_mechanism="SCRAM-SHA-512", kafka_sasl_username="headwater",
                kafka_ssl_cafile="/etc/kafka/ca.pem", kafka_ssl_certfile="/etc/kafka/client.pem",
                kafka_ssl_keyfile="/etc/kafka/client.key")
EXPECTED = {"bootstrap_servers": "broker-1:9093,broker-2:9093", "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "headwater", "sasl_plain_password": PASSWORD,
            "ssl_cafile": "/etc/kafka/ca.pem", "ssl_certfile": "/etc/kafka/client.pem",
            "ssl_keyfile": "/etc/kafka/client.key"}


def test_connection_arguments_of_each_protocol(tmp_path):
    assert connection(Config(**SASL_SSL, kafka_sasl_password=PASSWORD)) == EXPECTED
    assert connection(Config()) == {"bootstrap_servers": "127.0.0.1:9092", "security_protocol": "PLAINTEXT"}
    # SSL files only where TLS is spoken; SASL credentials only where SASL is.
    ssl = Config(kafka_security_protocol="SSL", kafka_ssl_cafile="/ca.pem")
    assert connection(ssl) == {"bootstrap_servers": "127.0.0.1:9092", "security_protocol": "SSL",
                               "ssl_cafile": "/ca.pem"}
    plain = Config(kafka_security_protocol="SASL_PLAINTEXT", kafka_sasl_mechanism="PLAIN", kafka_sasl_username="u",
                   kafka_sasl_password=PASSWORD, kafka_ssl_cafile="/ca.pem")
    assert connection(plain) == {"bootstrap_servers": "127.0.0.1:9092", "security_protocol": "SASL_PLAINTEXT",
                                 "sasl_mechanism": "PLAIN", "sasl_plain_username": "u", "sasl_plain_password": PASSWORD}


def test_the_password_file_is_read_whenever_a_client_is_made(tmp_path):
    secret = tmp_path / "password"
    secret.write_text(PASSWORD + "\n")  # as `echo` writes it, or a mounted Secret with a newline
    config = Config(**SASL_SSL, kafka_sasl_password_file=str(secret))
    assert connection(config)["sasl_plain_password"] == PASSWORD
    secret.write_text("rotated")
    assert connection(config)["sasl_plain_password"] == "rotated"
    secret.unlink()
    with pytest.raises(KafkaSettingsError, match=f"cannot read kafka_sasl_password_file {secret}"):
        connection(config)


def test_settings_kafka_would_refuse_are_refused_first_without_the_password():
    for wrong, says in [
        (dict(kafka_security_protocol="SASL_TLS"), "expected one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"),
        (dict(kafka_sasl_mechanism="GSSAPI"), "needs kafka_sasl_mechanism, one of PLAIN, SCRAM-SHA-256"),
        (dict(kafka_sasl_username=""), "needs kafka_sasl_username"),
        (dict(kafka_sasl_password_file="/run/secrets/kafka"), "exactly one of kafka_sasl_password and"),
        (dict(kafka_sasl_password=""), "exactly one of kafka_sasl_password and"),
        (dict(topic_replication=0), "topic_replication must be at least 1"),
    ]:
        with pytest.raises(ValueError, match=says) as raised:
            Config(**{**SASL_SSL, "kafka_sasl_password": PASSWORD, **wrong})
        assert PASSWORD not in str(raised.value)


def test_the_password_is_never_shown_nor_written(tmp_path, monkeypatch):
    config = Config(**SASL_SSL, kafka_sasl_password=PASSWORD, graph_password="graph-" + PASSWORD)
    assert PASSWORD not in repr(config) and PASSWORD not in str(config)
    assert "kafka_sasl_password" not in config.to_dict() and config.to_dict()["kafka_sasl_username"] == "headwater"
    settings = DeliverySettings.of(config)
    assert PASSWORD not in repr(settings) and settings.kafka is config
    # From the environment, as a Kubernetes Secret given as a variable; every HEADWATER_<FIELD> is read.
    monkeypatch.setenv("HEADWATER_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("HEADWATER_KAFKA_SASL_MECHANISM", "SCRAM-SHA-256")
    monkeypatch.setenv("HEADWATER_KAFKA_SASL_USERNAME", "env-user")
    monkeypatch.setenv("HEADWATER_KAFKA_SASL_PASSWORD", PASSWORD)
    monkeypatch.setenv("HEADWATER_TOPIC_REPLICATION", "3")
    monkeypatch.setenv("HEADWATER_METRICS_HOST", "0.0.0.0")
    loaded = configuration.load(tmp_path)
    assert (loaded.kafka_sasl_mechanism, loaded.kafka_sasl_username, loaded.kafka_sasl_password) == \
        ("SCRAM-SHA-256", "env-user", PASSWORD)
    assert loaded.topic_replication == 3 and loaded.metrics_host == "0.0.0.0"
    assert PASSWORD not in repr(loaded)


class Built(Exception):
    """Raised by the recording constructors: the client was asked for, with these arguments."""

    def __init__(self, kind: str, arguments: dict):
        super().__init__(kind)
        self.kind, self.arguments = kind, arguments


@pytest.fixture
def recorded(monkeypatch):
    """kafka-python's three client classes, as the adapter sees them, replaced by recorders (fakes,
    named as such: no SASL broker runs here). Each call's arguments are kept, then ``Built`` raised."""
    calls = []

    def recorder(kind):
        def construct(**arguments):
            calls.append((kind, arguments))
            raise Built(kind, arguments)
        return construct

    for kind in ("KafkaProducer", "KafkaConsumer", "KafkaAdminClient"):
        monkeypatch.setattr(kafka_adapter, kind, recorder(kind))
    return calls


def test_every_client_gets_the_security_settings(recorded, tmp_path, caplog):
    config = Config(**SASL_SSL, kafka_sasl_password=PASSWORD, store_dir=str(tmp_path / "store"),
                    graph_uri="bolt://127.0.0.1:1")
    indexer = Indexer(config)
    makers = {
        "adapter producer": lambda: kafka_adapter.producer(config),
        "adapter consumer": lambda: kafka_adapter.consumer(config),
        "adapter admin": lambda: kafka_adapter.admin(config, timeout_s=0.1),
        "ensure_topics": lambda: kafka_adapter.ensure_topics(config, ["t"]),
        "payload by offset": lambda: kafka_adapter.record_at(config, "t", 0, 0),
        "indexer consumer": lambda: indexer._consumer(),
        "indexer dlq producer": lambda: indexer.to_dlq(None, "why"),
        "query fallback consumer": lambda: fallback._kafka(config, [{"start": {"t:0": 0}, "end": {"t:0": 2}}]),
    }
    try:
        for name, make in makers.items():
            with pytest.raises(Built) as built:
                make()
            assert EXPECTED.items() <= built.value.arguments.items(), name
    finally:
        indexer.close()
    # capture's delivery: its producer is made on first use, and a failure to make it means spilling
    with caplog.at_level(logging.DEBUG):
        assert Delivery(DeliverySettings.of(config)).producer() is None
    assert recorded[-1][0] == "KafkaProducer" and EXPECTED.items() <= recorded[-1][1].items()
    assert PASSWORD not in caplog.text
    assert {kind for kind, _ in recorded} == {"KafkaProducer", "KafkaConsumer", "KafkaAdminClient"}


def test_an_address_alone_takes_the_environments_security_settings(recorded, monkeypatch, tmp_path):
    """Callers that hold only a bootstrap address (the tracer's ``attach``, capture's Kafka source on
    the executors) get the deployment's settings, which it gives as ``HEADWATER_*`` variables."""
    monkeypatch.setenv("HEADWATER_HOME", str(tmp_path))
    for name, value in SASL_SSL.items():
        if name != "bootstrap":
            monkeypatch.setenv(f"HEADWATER_{name.upper()}", value)
    monkeypatch.setenv("HEADWATER_KAFKA_SASL_PASSWORD", PASSWORD)
    monkeypatch.setenv("HEADWATER_TOPIC_REPLICATION", "3")
    with pytest.raises(Built) as built:
        kafka_adapter.ensure_topics("broker-1:9093,broker-2:9093", ["t"], 4)
    assert EXPECTED.items() <= built.value.arguments.items()
    with pytest.raises(Built) as built:
        list(kafka_source.read_range("broker-1:9093,broker-2:9093", kafka_source.OffsetRange("t", 0, 0, 1)))
    assert EXPECTED.items() <= built.value.arguments.items()
    assert kafka_adapter.config_of("b:1").topic_replication == 3


def test_producer_defaults():
    config = Config()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kafka_adapter, "KafkaProducer", lambda **arguments: arguments)
        made = kafka_adapter.producer(config, linger_ms=0)
    # Kafka honours allow_auto_create_topics (the local tansu makes a topic on a send anyway, so topics are
    # made by ensure_topics before anything is sent to them).
    assert made["acks"] == "all" and made["allow_auto_create_topics"] is False and made["linger_ms"] == 0
    # idempotence is left to kafka-python's default (on), which it turns off itself for a broker too old
    assert "enable_idempotence" not in made


# -- on the local stack


def test_the_producer_waits_for_all_replicas_and_is_idempotent(config):
    replicated = config.with_overrides(topic_replication=3, topic_partitions=3)
    topic = f"acks-{uuid.uuid4().hex[:8]}"
    kafka_adapter.ensure_topics(replicated, [topic])
    client = kafka_adapter.admin(config)
    try:
        described = {t["name"]: t for t in client.describe_topics([topic])}[topic]
    finally:
        client.close()
    assert len(described["partitions"]) == 3
    assert all(len(p["replica_nodes"]) == 3 for p in described["partitions"])

    producer = kafka_adapter.producer(config)
    try:
        assert producer.config["acks"] == -1 and producer.config["enable_idempotence"] is True
        sent = [(str(i % 7).encode(), f"v{i}".encode()) for i in range(300)]
        futures = [producer.send(topic, key=k, value=v) for k, v in sent]
        producer.flush(timeout=30)
        landed = [f.get(timeout=10) for f in futures]
    finally:
        producer.close()

    read = {}
    for p in range(3):
        count = sum(1 for m in landed if m.partition == p)
        read[p] = [(r.key, r.value) for r in kafka_adapter.read_records(config, topic, p, 0, count)]
    by_partition = {p: [(k, v) for (k, v), m in zip(sent, landed) if m.partition == p] for p in range(3)}
    assert read == by_partition  # each record once, in the order sent, per partition
    assert all(by_partition.values())


def test_drain_processes_get_the_security_settings_but_never_the_password(tmp_path, monkeypatch):
    """An executor's drain process is started with ``drain_env``: a command line anyone on the host can read."""
    from headwater.capture.journal import drain_env

    secret = tmp_path / "password"
    secret.write_text(PASSWORD + "\n")
    env = drain_env(Config(**SASL_SSL, kafka_sasl_password_file=str(secret)))
    assert env["HEADWATER_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
    assert env["HEADWATER_KAFKA_SSL_CAFILE"] == "/etc/kafka/ca.pem"
    for name, value in env.items():  # as the drain process gets them
        monkeypatch.setenv(name, value)
    assert connection(configuration.load(home=tmp_path)) == EXPECTED
    given = drain_env(Config(**SASL_SSL, kafka_sasl_password=PASSWORD))
    assert PASSWORD not in repr(given) and "HEADWATER_KAFKA_SASL_PASSWORD" not in given
    assert "HEADWATER_KAFKA_SASL_USERNAME" not in drain_env(Config())  # unset: left to the executor's environment


def test_the_password_kafka_python_gets_shows_as_stars_but_authenticates_as_itself():
    """kafka-python logs a client's whole config at DEBUG (``KafkaAdminClient``): by ``repr`` of each value."""
    from kafka.net.sasl.plain import SaslMechanismPlain
    from kafka.net.sasl.scram import ScramClient

    given = connection(Config(**SASL_SSL, kafka_sasl_password=PASSWORD))["sasl_plain_password"]
    assert PASSWORD not in repr({"sasl_plain_password": given}) and PASSWORD not in f"{given} {given!s}"
    assert given == PASSWORD  # the characters themselves, as kafka-python joins and encodes them
    plain = SaslMechanismPlain(sasl_plain_username="headwater", sasl_plain_password=given)
    assert plain.auth_bytes() == f"headwater\0headwater\0{PASSWORD}".encode()
    assert ScramClient("headwater", given, "SCRAM-SHA-512").password == PASSWORD.encode()


@pytest.mark.parametrize("master, executor_env, warned", [
    ("spark://cluster:7077", {}, True),
    ("spark://cluster:7077", {"spark.executorEnv.HEADWATER_KAFKA_SASL_PASSWORD": "x"}, False),
    ("local[2]", {}, False),  # the drains run on the driver's host, with its environment
])
def test_attach_warns_when_executors_cannot_get_the_password(caplog, master, executor_env, warned):
    """A cluster cannot run here: a SparkSession stand-in (named so) holding a real SparkConf."""
    from types import SimpleNamespace

    from pyspark import SparkConf

    from headwater.capture.tracer import _check_executor_password

    conf = SparkConf(loadDefaults=False).setMaster(master).setAll(list(executor_env.items()))
    session_stand_in = SimpleNamespace(sparkContext=SimpleNamespace(getConf=lambda: conf))
    with caplog.at_level(logging.WARNING, logger="headwater.capture"):
        _check_executor_password(session_stand_in, Config(**SASL_SSL, kafka_sasl_password=PASSWORD))
    assert ("executors on other hosts" in caplog.text) is warned and PASSWORD not in caplog.text
