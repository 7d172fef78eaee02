"""Indexer replicas on hosts of their own write one lineage store in S3 at once, through faults.

Every part runs on a host of the test's own (``tests.hosts.Network``: network namespaces on a bridge): Apache
Kafka (one broker) at ``.11``; the store's S3 server (SeaweedFS) and the graph (Neo4j) at ``.20``; indexer
replicas, each a ``headwater index`` process, at ``.21``, ``.22`` and ``.23``. No lock service: the replicas
share the edges topic's six partitions through their consumer group, and the store's Delta commits are
conditional puts. While lineage streams in:

- replicas A and B write, then C joins (a rebalance: three writers), and a compaction runs (this process's
  Spark) while they write;
- C is killed (SIGKILL) in the middle of a write: its files are in the bucket, its Delta commit not made;
- B's host is cut off the network in the middle of a write, for longer than its consumer session: the group
  gives B's partitions to the others, which write B's ranges; B's network comes back and B finishes its
  write late, the range another replica already committed;
- C starts again (another rebalance).

Afterwards the store holds exactly the edges produced (none lost, none twice), and so does the graph; the
shards' rows records hold each row once per range; a last compaction's generation records each row once;
and the CSProv backend answers backward and forward questions as a brute-force walk over the produced edges
does. ``HEADWATER_INDEXER_FAULT_PAUSE_S`` widens the windows the kill and the cut must hit.
"""

from __future__ import annotations

import os
import random
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from bench.workload import lineage_messages
from headwater.adapters.graph import wait_ready
from headwater.adapters.kafka import ensure_topics, producer
from headwater.core.config import Config
from headwater.core.schema import encode_lineage
from headwater.deploy.neo4j_server import Neo4jServer
from headwater.deploy.s3_server import S3Server
from headwater.deploy.stack import server_command
from headwater.indexer.compaction import compact
from headwater.indexer.service import FAULT_PAUSE_ENV
from headwater.query.parquet import CSProvBackend
from headwater.store.generation import Snapshot
from tests.conftest import graph_edge_counts, stop_process, stored_edges
from tests.hosts import Network
from tests.kafka_cluster import Cluster
from tests.query.test_query_backends import oracle, summary

EDGES = 60_000
PER_MESSAGE = 250
PARTITIONS = 6
PAUSE_S = 1.0  # before each store commit and each offset commit
CUT_S = 16.0  # longer than the consumers' session (10 s): the group moves the cut replica's partitions
SPACING_S = 0.15  # between messages produced: a stream over the whole fault phase
BOLT, GRAPH_HTTP = 7687, 7474


class Replica:
    """One ``headwater index`` process on a host of its own."""

    def __init__(self, name: str, host, config: Config, env: dict, folder: Path):
        self.name, self.host = name, host
        self.log = folder / f"indexer-{name}.log"
        settings = {"HEADWATER_BOOTSTRAP": config.bootstrap, "HEADWATER_GRAPH_URI": config.graph_uri,
                    "HEADWATER_GRAPH_PASSWORD": config.graph_password, "HEADWATER_STORE_DIR": config.store_dir,
                    "HEADWATER_EDGES_TOPIC": config.edges_topic, "HEADWATER_LOG_TOPIC": config.log_topic,
                    "HEADWATER_DLQ_TOPIC": config.dlq_topic, FAULT_PAUSE_ENV: str(PAUSE_S)}
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [*host.wrapper, sys.executable, "-m", "headwater.cli", "--home", str(folder / f"home-{name}"),
                 "index"], env={**os.environ, **env, **settings}, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True)

    def said(self, text: str) -> int:
        return self.log.read_text(errors="replace").count(text)

    def wait_for(self, text: str, times: int = 1, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while self.said(text) < times:
            assert self.proc.poll() is None, f"indexer {self.name} died on its own: {self.log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, \
                f"indexer {self.name} did not say {text!r} in {timeout_s}s: {self.log.read_text()[-3000:]}"
            time.sleep(0.05)

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        stop_process(self.proc, signal.SIGINT)


@pytest.fixture
def hosts(tmp_path):
    """The network, Kafka at .11, and SeaweedFS and Neo4j at .20; every process stopped by its PID after."""
    network = Network().up()
    cluster = Cluster(tmp_path / "kafka", nodes=1, network=network)
    services = network.host(20)
    s3 = S3Server(tmp_path / "s3", host=services.address, wrapper=services.wrapper)
    graph = Neo4jServer(tmp_path / "graph", BOLT, GRAPH_HTTP, secrets.token_hex(12), host=services.address)
    graph_proc = None
    try:
        cluster.up()
        s3.start()
        with open(tmp_path / "graph.log", "ab") as log:
            graph_proc = subprocess.Popen([*services.wrapper, *server_command(graph)], stdout=log,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        config = Config(bootstrap=cluster.bootstrap, graph_uri=f"bolt://{services.address}:{BOLT}",
                        graph_password=graph.password, store_dir=s3.uri("store"), topic_partitions=PARTITIONS,
                        edges_topic="mw.edges", log_topic="mw.log", dlq_topic="mw.dlq")
        wait_ready(config, timeout_s=180)
        yield network, config, s3
    finally:
        stop_process(graph_proc, signal.SIGTERM, timeout_s=60)
        s3.stop()
        cluster.down()
        network.down()


@pytest.mark.spark
def test_replicas_on_three_hosts_write_one_s3_store_exactly_once_through_a_kill_and_a_cut(
        hosts, spark, tmp_path, monkeypatch):
    network, config, s3 = hosts
    for name, value in s3.environment().items():  # this process reads the store (and compacts it) too
        monkeypatch.setenv(name, value)
    ensure_topics(config, [config.edges_topic], PARTITIONS)
    ensure_topics(config, [config.log_topic, config.dlq_topic], 2)
    messages = list(lineage_messages(EDGES, seed=23, edges_per_message=PER_MESSAGE, prefix="mw-"))
    produced = Counter()
    for _, edges in messages:
        produced.update(zip(edges["src"].to_pylist(), edges["dst"].to_pylist(), edges["query"].to_pylist()))
    assert sum(produced.values()) == EDGES and max(produced.values()) == 1

    def produce() -> None:
        client = producer(config)
        try:
            for i, (nodes, edges) in enumerate(messages):
                client.send(config.edges_topic, key=f"m{i}".encode(), value=encode_lineage(nodes, edges))
                time.sleep(SPACING_S)
            client.flush()
        finally:
            client.close()

    streaming = threading.Thread(target=produce)
    compactions: list[dict] = []
    failures: list[BaseException] = []

    def compacting() -> None:
        try:
            compactions.append(compact(spark, config.store_dir, config.edges_topic, threshold=200, buckets=8))
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    compaction = threading.Thread(target=compacting)
    rng = random.Random(7)
    replicas: dict[str, Replica] = {}
    env = s3.environment()

    def start(name: str, number: int) -> Replica:
        replicas[name] = Replica(name, network.host(number), config, env, tmp_path)
        return replicas[name]

    try:
        streaming.start()
        a, b = start("a", 21), start("b", 22)
        a.wait_for("resuming at offset")
        b.wait_for("resuming at offset")
        a.wait_for("before committing offsets")  # the store holds A's first write
        b.wait_for("before committing offsets")
        compaction.start()  # while the writers write
        c = start("c", 23)
        c.wait_for("resuming at offset")  # three writers: the group gave C partitions
        pauses = c.said("before the store's commit")
        c.wait_for("before the store's commit", pauses + 1)
        time.sleep(rng.uniform(0.1, PAUSE_S * 0.8))
        c.kill()  # its files written, its commit not made
        pauses = b.said("before the store's commit")
        b.wait_for("before the store's commit", pauses + 1)
        network.cut(22)  # B mid-write, past its session: its partitions go to A
        time.sleep(CUT_S)
        network.mend(22)
        start("c2", 23).wait_for("resuming at offset")
        streaming.join(timeout=600)
        assert not streaming.is_alive()
        compaction.join(timeout=600)
        assert not failures, failures
        deadline = time.monotonic() + 300
        while sum(stored_edges(config).values()) < EDGES:
            for replica in replicas.values():
                assert replica.name == "c" or replica.proc.poll() is None, \
                    f"indexer {replica.name} died: {replica.log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"the store holds {sum(stored_edges(config).values())} of {EDGES}"
            time.sleep(1.0)
        time.sleep(2 * PAUSE_S)  # a write late to commit would land by now
    finally:
        try:
            for thread in (streaming, compaction):
                if thread.ident is not None:  # started
                    thread.join(timeout=600)
        finally:
            for replica in replicas.values():
                replica.stop()

    assert compactions and compactions[0]["generation"] == 1, compactions
    in_store = stored_edges(config)
    assert in_store == produced, (f"store: {sum((produced - in_store).values())} missing, "
                                  f"{sum((in_store - produced).values())} extra")
    assert graph_edge_counts(config, sorted({q for _, _, q in produced})) == produced
    snapshot = Snapshot.of(config.store_dir, config.edges_topic)  # the rows records readers take
    rows = snapshot.tables.rows.read(snapshot.shard_rows_files(), ["rid", "store", "first", "last"])
    shard_rows = Counter(zip(*(rows[c].to_pylist() for c in ("rid", "store", "first", "last"))))
    assert shard_rows and max(shard_rows.values()) == 1, "a range recorded a row twice (a late writer's records)"

    # A last compaction, once every edge is in: its generation records each row once, and the CSProv backend
    # answers as a brute-force walk does.
    compact(spark, config.store_dir, config.edges_topic, threshold=200, buckets=8)
    snapshot = Snapshot.of(config.store_dir, config.edges_topic)
    assert snapshot.generation == 2 and not snapshot.shard_files
    generation = snapshot.current()
    assert generation is not None
    every = sorted({r for s, d, _ in produced for r in (s, d)})
    recorded = generation.rows(every)["rid"].to_pylist()
    assert sorted(recorded) == every, "the generation records a row twice, or misses one"
    edges = [e for _, batch in messages for e in batch.to_pylist()]
    kinds = {n["rid"]: (n["kind"], n["dataset"]) for nodes, _ in messages for n in nodes.to_pylist()}
    outputs = sorted(r for r, (kind, _) in kinds.items() if kind == "output")
    sources = sorted(r for r, (kind, dataset) in kinds.items() if kind == "source" and dataset == "kafka:orders")
    backend = CSProvBackend(config)
    try:
        for rid in random.Random(3).sample(outputs, 40):
            assert summary(backend.backward(rid, to="source", depth=16)) == \
                oracle(edges, kinds, rid, "source", 16, True), rid
        for rid in random.Random(4).sample(sources, 40):
            assert summary(backend.forward(rid, to="output", depth=16)) == \
                oracle(edges, kinds, rid, "output", 16, False), rid
    finally:
        backend.close()
