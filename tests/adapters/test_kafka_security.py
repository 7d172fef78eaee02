"""headwater against an Apache Kafka broker with SASL_SSL (SCRAM-SHA-512), TLS certificates made in the
test and ACLs that allow headwater's principal its topics and its consumer groups only (``secure_kafka``).

Capture (the tracer and its drain), the indexer and the query tier (payloads read from the broker) work
as the ``headwater`` principal, with its password in a file, and the lineage is exactly the oracle's; a
wrong password, a certificate of an untrusted CA and a topic the ACLs do not allow each stop the CLI with
one JSON line naming the setting; no password shows in any log, record or output.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import urllib.request
import uuid

import pytest
from pyspark.sql import functions as F

from headwater.adapters.kafka import ensure_topics
from headwater.capture import attach
from headwater.core.rid import kafka_rid
from headwater.core.schema import LOG_PROGRESS
from headwater.demo import orders as demo_data
from headwater.demo.run import end_offsets, run_until
from headwater.query import fallback
from headwater.query.api import LineageClient
from tests.conftest import index, read_log, stop_process, topic_records
from tests.oracle import as_input
from tests.secure_kafka import SecureKafka

PREFIX = "sec."  # the topics headwater's principal may use
GROUPS = "headwater-indexer"  # the consumer groups it may use (the indexer's, by default)
EVENTS = 60


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    broker = SecureKafka(tmp_path_factory.mktemp("secure-kafka"))
    broker.start()
    try:
        broker.allow(PREFIX, GROUPS)
        yield broker
    finally:
        broker.stop()


def own_config(secure, stack_config, tmp_path, prefix: str = PREFIX, **overrides):
    tag = uuid.uuid4().hex[:8]
    base = stack_config.with_overrides(edges_topic=f"{prefix}{tag}.edges", log_topic=f"{prefix}{tag}.log",
                                       dlq_topic=f"{prefix}{tag}.dlq", spill_dir=str(tmp_path / "spill"),
                                       store_dir=str(tmp_path / "store"))
    return secure.config(base, **overrides), tag


def environment(config) -> dict[str, str]:
    """The config as a deployment gives it to a process: ``HEADWATER_*`` variables (the password as a file)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEADWATER_")}
    for name, value in config.to_dict().items():
        if value not in (None, "") and name != "kafka_sasl_password":
            env[f"HEADWATER_{name.upper()}"] = str(value)
    env["HEADWATER_GRAPH_PASSWORD"] = config.graph_password  # the graph's, not Kafka's: to_dict leaves it out
    return env


def decoded(value):
    """A payload's value: the JSON the record held, decoded by the query tier or here."""
    return json.loads(value) if isinstance(value, (str, bytes)) else value


def cli(env: dict, *arguments: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "headwater.cli", *arguments], env=env, capture_output=True,
                          text=True, timeout=timeout)


def served_payload(env: dict, tmp_path, rid: int) -> dict:
    """The backward answer with payload of ``rid`` from ``headwater serve`` (a process of its own, ``env``'s
    settings), and what it logged (``log``)."""
    token = tmp_path / "http.token"
    token.write_text(uuid.uuid4().hex)
    log = tmp_path / "serve.log"
    with open(log, "w") as err:
        process = subprocess.Popen([sys.executable, "-m", "headwater.cli", "serve", "--port", "0", "--token-file",
                                    str(token)], env=env, stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        url = json.loads(process.stdout.readline())["serving"]
        request = urllib.request.Request(f"{url}/v1/lineage/backward?rid={rid}&payload=true",
                                         headers={"Authorization": f"Bearer {token.read_text()}"})
        with urllib.request.urlopen(request, timeout=60) as response:
            answer = json.loads(response.read())
    finally:
        stop_process(process)
    return {**answer, "log": log.read_text()}


@pytest.mark.spark
@pytest.mark.stack
def test_capture_indexer_and_queries_over_sasl_ssl_are_exact(spark, stack_config, secure, tmp_path, caplog):
    config, tag = own_config(secure, stack_config, tmp_path)
    topic = f"{PREFIX}{tag}.events"
    ensure_topics(config, [topic], 2)
    events = [(str(i).encode(), json.dumps({"id": i, "v": i * 7 % 10}).encode()) for i in range(EVENTS)]
    placed = demo_data.produce(config, topic, events)
    where = {i: (topic, p, o) for i, (p, o) in enumerate(placed)}

    with caplog.at_level(logging.DEBUG):
        tracer = attach(spark, config)
        try:
            source = (spark.readStream.format("kafka").options(**secure.spark_options())
                      .option("subscribe", topic).option("startingOffsets", "earliest")
                      .option("maxOffsetsPerTrigger", 25).load())
            parsed = source.select(F.from_json(F.col("value").cast("string"), "id long, v int").alias("e"))
            df = parsed.select("e.*").where("v % 3 != 0").withColumn("w", F.col("v") * 2)
            sink = str(tmp_path / "sink")
            query = (tracer.trace(df, name=f"sec-{tag}").writeStream.format("parquet")
                     .option("checkpointLocation", str(tmp_path / "cp")).trigger(processingTime="500 milliseconds")
                     .start(sink))
            run_until(query, end_offsets(topic, [(p, o) for p, o in placed]), say=print)
        finally:
            tracer.close()
        index(config)

    rows = spark.read.parquet(sink).collect()
    kept = {i for i in range(EVENTS) if i * 7 % 10 % 3 != 0}
    assert sorted(r.id for r in rows) == sorted(kept)
    with LineageClient(config) as client:
        for row in rows:
            found = client.backward(row._hw_rid)
            assert {as_input(x) for x in found} == {("kafka", *where[row.id])}, row.id
            assert all(x.exact for x in found)
        first = min(rows, key=lambda r: r.id)
        [record] = client.backward(first._hw_rid, payload=True)
        assert decoded(record.payload["value"]) == {"id": first.id, "v": first.id * 7 % 10}  # read over SASL_SSL
        dropped = next(i for i in range(EVENTS) if i not in kept)
        assert list(client.forward(kafka_rid(*where[dropped]))) == []

    # The log-only fallback reads a batch's records back from the broker as the principal, too.
    progress = [r for r in read_log(config) if r["schema"] == LOG_PROGRESS and r["rows_in"]]
    assert sum(len(fallback._kafka(config, r["sources"])) for r in progress) == EVENTS

    # The CLI, a process of its own given the settings as a deployment gives them, reads the payload too.
    asked = cli(environment(config), "lineage", "backward", "--rid", str(first._hw_rid), "--payload", "--in-process")
    assert asked.returncode == 0, asked.stderr
    [line] = asked.stdout.splitlines()
    assert decoded(json.loads(line)["payload"]["value"])["id"] == first.id

    # The stack's query part (``headwater serve``), given the settings the same way, reads it over HTTP too.
    served = served_payload(environment(config), tmp_path, first._hw_rid)
    assert [decoded(x["payload"]["value"])["id"] for x in served["answer"]] == [first.id]

    password = secure.passwords["headwater"]
    published = [json.dumps(r, default=str) for r in read_log(config)] + \
        [repr(m.value) for m in topic_records(config, config.edges_topic)]
    assert published and not any(password in text for text in published)  # the plan logged holds no jaas config
    # Every log record but py4j's, which at DEBUG shows each call the job makes into the JVM, the user's own
    # option values among them (the jaas config the job gives the connector): none is headwater's to hide.
    logged = "\n".join(r.getMessage() for r in caplog.records if not r.name.startswith("py4j"))
    assert "headwater" in logged
    problems = [r.getMessage() for r in caplog.records
                if r.name.startswith("headwater") and r.levelno >= logging.WARNING]
    assert not problems, problems
    for text in (logged, asked.stdout, asked.stderr, served["log"]):
        assert password not in text and secure.passwords["admin"] not in text


@pytest.mark.stack
@pytest.mark.parametrize("fault", ["wrong password", "untrusted certificate", "no ACL for the topics"])
def test_each_refusal_is_one_json_line_naming_the_setting(secure, stack_config, tmp_path, fault):
    wrong = tmp_path / "wrong-password"
    wrong.write_text("not-the-password\n")
    overrides = {"wrong password": {"password_file": wrong}, "untrusted certificate": {"cafile": secure.other_ca},
                 "no ACL for the topics": {}}[fault]
    config, _ = own_config(secure, stack_config, tmp_path, prefix="other." if fault.startswith("no ACL") else PREFIX,
                           **overrides)
    done = cli(environment(config), "index", "--drain", "--max-seconds", "30")
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
    [line] = done.stderr.splitlines()
    error = json.loads(line)["error"]
    said = {"wrong password": ["refused the SASL login", "kafka_sasl_username 'headwater'",
                               "kafka_sasl_password_file"],
            "untrusted certificate": ["kafka_ssl_cafile", str(secure.other_ca), "certificate"],
            "no ACL for the topics": ["does not allow kafka_sasl_username 'headwater'", config.edges_topic,
                                      "ACLs"]}[fault]
    assert all(words in error for words in said), error
    for password in secure.passwords.values():
        assert password not in done.stderr


@pytest.mark.spark
@pytest.mark.stack
def test_lineage_spilled_under_a_wrong_password_is_sent_whole_once_it_is_right(spark, stack_config, secure, tmp_path):
    """The password in capture's password file goes wrong under a running tracer (before it first sends): the
    stream runs on, its lineage waits in the spill folder; ``headwater drain`` with the wrong password says
    so in one JSON line naming the setting and sends nothing; with the right one, it sends everything, and the
    lineage is exactly the oracle's."""
    from headwater.capture.delivery import DeliverySettings, Spill

    password_file = tmp_path / "password"
    password_file.write_text(secure.passwords["headwater"] + "\n")
    password_file.chmod(0o600)
    config, tag = own_config(secure, stack_config, tmp_path, password_file=password_file)
    config = config.with_overrides(send_timeout_s=3.0, breaker_cooldown_s=2.0)
    topic = f"{PREFIX}{tag}.events"
    ensure_topics(config, [topic], 2)
    events = [(str(i).encode(), json.dumps({"id": i, "v": i * 7 % 10}).encode()) for i in range(EVENTS)]
    placed = demo_data.produce(config, topic, events, partitions=2)
    where = {i: (topic, p, o) for i, (p, o) in enumerate(placed)}

    tracer = attach(spark, config)  # its topics made with the right password
    password_file.write_text("not-the-password\n")
    try:
        source = (spark.readStream.format("kafka").options(**secure.spark_options())
                  .option("subscribe", topic).option("startingOffsets", "earliest")
                  .option("maxOffsetsPerTrigger", 25).load())
        df = source.select(F.from_json(F.col("value").cast("string"), "id long, v int").alias("e")).select("e.*")
        sink = str(tmp_path / "sink")
        query = (tracer.trace(df, name=f"pw-{tag}").writeStream.format("parquet")
                 .option("checkpointLocation", str(tmp_path / "cp")).trigger(processingTime="500 milliseconds")
                 .start(sink))
        run_until(query, end_offsets(topic, placed), say=print)
    finally:
        tracer.close()
    spill = Spill(DeliverySettings.of(config).spill_dir, config.spill_max_bytes)
    waiting = spill.waiting()
    assert waiting, "nothing waited in the spill folder: the wrong password was not in force"

    refused = cli(environment(config), "drain", "--idle", "2", timeout=120)
    assert refused.returncode == 2 and refused.stdout == "", (refused.stdout, refused.stderr)
    [line] = refused.stderr.splitlines()
    error = json.loads(line)["error"]
    assert "refused the SASL login" in error and "kafka_sasl_password_file" in error, error
    assert str(spill.folder) in error and spill.waiting() == waiting  # nothing sent, nothing lost
    assert secure.passwords["headwater"] not in refused.stderr

    password_file.write_text(secure.passwords["headwater"] + "\n")
    sent = cli(environment(config), "drain", "--idle", "2", timeout=180)
    assert sent.returncode == 0, sent.stderr
    assert spill.waiting() == 0
    index(config)
    rows = spark.read.parquet(sink).collect()
    assert sorted(r.id for r in rows) == list(range(EVENTS))
    with LineageClient(config) as client:
        for row in rows:
            assert {as_input(x) for x in client.backward(row._hw_rid)} == {("kafka", *where[row.id])}, row.id
