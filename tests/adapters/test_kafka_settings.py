"""Kafka security settings (``core.kafka_client``) reach every client headwater makes, and the
password never shows; then the producer on the local stack: acks=all, idempotent, topics only
as ``ensure_topics`` makes them.

Each client made with them against a real SASL_SSL broker with ACLs: ``tests/adapters/test_kafka_security.py``.
"""

from __future__ import annotations

import logging
import uuid

import pytest

from headwater.adapters import kafka as kafka_adapter
from headwater.capture.delivery import DeliverySettings
from headwater.core import config as configuration
from headwater.core.config import Config
from headwater.core.kafka_client import KafkaSettingsError, connection

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


# -- on the local stack


def test_the_producer_waits_for_all_replicas_and_is_idempotent(config):
    replicated = config.with_overrides(topic_replication=1, topic_partitions=3)  # the local stack: one broker
    topic = f"acks-{uuid.uuid4().hex[:8]}"
    kafka_adapter.ensure_topics(replicated, [topic])
    client = kafka_adapter.admin(config)
    try:
        described = {t["name"]: t for t in client.describe_topics([topic])}[topic]
    finally:
        client.close()
    assert len(described["partitions"]) == 3
    assert all(len(p["replica_nodes"]) == 1 for p in described["partitions"])

    producer = kafka_adapter.producer(config)
    try:
        assert producer.config["acks"] == -1 and producer.config["enable_idempotence"] is True
        assert producer.config["allow_auto_create_topics"] is False  # topics are made by ensure_topics only
        sent = [(str(i % 7).encode(), f"v{i}".encode()) for i in range(300)]
        futures = [producer.send(topic, key=k, value=v) for k, v in sent]
        producer.flush(timeout=30)
        landed = [f.get(timeout=10) for f in futures]
    finally:
        producer.close()

    read = {}
    for p in range(3):
        count = sum(1 for m in landed if m.partition == p)
        read[p] = [(r.key, r.value) for r in records(config, topic, p, count)]
    by_partition = {p: [(k, v) for (k, v), m in zip(sent, landed) if m.partition == p] for p in range(3)}
    assert read == by_partition  # each record once, in the order sent, per partition
    assert all(by_partition.values())


def records(config, topic: str, partition: int, count: int) -> list:
    """The first ``count`` records of a partition, in order."""
    from kafka import TopicPartition

    client = kafka_adapter.consumer(config)
    try:
        where = TopicPartition(topic, partition)
        client.assign([where])
        client.seek(where, 0)
        found = []
        while len(found) < count:
            polled = client.poll(timeout_ms=5000).get(where, [])
            assert polled, f"{topic}:{partition} gave {len(found)} of {count} records"
            found += polled
        return found[:count]
    finally:
        client.close()


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
