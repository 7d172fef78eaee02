"""Apache Kafka, the broker of the local stack and of the tests: one KRaft node (broker and controller).

``KafkaServer(folder, port, controller_port)`` writes ``folder/server.properties`` and formats the
node's storage once (``kafka.tools.StorageTool format``, as ``kafka-storage.sh`` does); ``command()`` is
what starts it, with the jars ``headwater.deploy.tools.kafka()`` fetched into the tools cache (no Kafka
install, no shell scripts). The data lives in ``folder/data`` and outlives the process, as a real
broker's does: a node killed and started again has its records and committed offsets.

A node of a cluster (``node_id``, ``voters``) and a listener with security (``listeners``,
``properties``) are the same class with other arguments: the tests' SASL_SSL broker and the
three-broker cluster in network namespaces start it so.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

MAIN_CLASS = "kafka.Kafka"
STORAGE_TOOL = "kafka.tools.StorageTool"
HEAP = "-Xmx512m"  # a local broker holds little; Kafka's own default, 1 GiB, is much for 2 cores and Spark beside


def java() -> str:
    """The Java that runs Kafka: ``JAVA_HOME``'s, else the one on the PATH (Spark needs one anyway)."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not found:
        raise RuntimeError("Apache Kafka needs Java 17 or newer: install it or set JAVA_HOME")
    return found


@dataclass
class KafkaServer:
    folder: Path
    port: int
    controller_port: int
    host: str = "127.0.0.1"
    node_id: int = 1
    voters: str | None = None  # ``1@host:port,2@…``; default this node alone
    cluster_id: str | None = None  # a cluster's nodes share one; default a new one, kept in the folder
    listeners: dict[str, str] = field(default_factory=dict)  # listener name → protocol; default PLAINTEXT
    properties: dict[str, str] = field(default_factory=dict)  # any other broker setting, last
    # SCRAM users made when the storage is formatted (KRaft's bootstrap, as ``kafka-storage format -S``):
    # ``{"SCRAM-SHA-512": {"name": "password"}}``
    scram_users: dict[str, dict[str, str]] = field(default_factory=dict)

    def __post_init__(self):
        self.folder = Path(self.folder)

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def config_path(self) -> Path:
        return self.folder / "server.properties"

    @property
    def marker(self) -> str:
        """What tells this node's process in /proc/PID/cmdline from any other."""
        return f"{MAIN_CLASS} {self.config_path}"

    def settings(self) -> dict[str, str]:
        protocols = self.listeners or {"PLAINTEXT": "PLAINTEXT"}
        [name] = list(protocols)[:1]
        replicated = min(3, len((self.voters or "x").split(",")))
        return {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": self.voters or f"{self.node_id}@{self.host}:{self.controller_port}",
            "listeners": f"{name}://{self.host}:{self.port},CONTROLLER://{self.host}:{self.controller_port}",
            "advertised.listeners": f"{name}://{self.host}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": name,
            "listener.security.protocol.map": ",".join(
                [f"{n}:{p}" for n, p in protocols.items()] + ["CONTROLLER:PLAINTEXT"]),
            "log.dirs": str(self.folder / "data"),
            "num.partitions": "1",
            # Topics are made by whoever needs them (headwater's ensure_topics, the tests), never by a produce,
            # as on the clusters our users run.
            "auto.create.topics.enable": "false",
            "offsets.topic.replication.factor": str(replicated),
            "transaction.state.log.replication.factor": str(replicated),
            "transaction.state.log.min.isr": str(min(2, replicated)),
            "group.initial.rebalance.delay.ms": "0",
            # Records are kept whatever their age: a record's own timestamp (a replay of last month's events, a
            # test's fixed event times) would otherwise put it past the default 7 days at once, and Kafka drops
            # such a segment once the next record rolls it, so lineage's payloads and the log-only fallback,
            # which read records back, found them gone. (A cluster of users' sets its own retention; what it
            # has dropped is a clear RecordGone there.)
            "log.retention.ms": "-1",
            "log.retention.check.interval.ms": "30000",
            **self.properties,
        }

    def prepare(self, kafka_jars: Path) -> None:
        """Write the config and format the storage unless already formatted (the data survives)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text("".join(f"{k}={v}\n" for k, v in self.settings().items()))
        (self.folder / "log4j2.properties").write_text(LOG4J)
        if (self.folder / "data" / "meta.properties").exists():
            return
        # ``--cluster-id=ID`` in one argument: an id may begin with "-", which the tool would take for an option.
        cluster = self.cluster_id or self._cluster_id()
        users = [argument for mechanism, names in self.scram_users.items() for name, secret in names.items()
                 for argument in ("--add-scram", f"{mechanism}=[name={name},password={secret}]")]
        done = subprocess.run(self._java(kafka_jars) + [STORAGE_TOOL, "format", f"--cluster-id={cluster}", "-c",
                                                        str(self.config_path), "--ignore-formatted", *users],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              timeout=120)
        if done.returncode != 0:
            tail = done.stdout.decode(errors="replace").strip().splitlines()[-5:]
            raise RuntimeError(f"formatting Kafka's storage in {self.folder / 'data'} failed: {' | '.join(tail)}")

    def command(self, kafka_jars: Path) -> list[str]:
        return self._java(kafka_jars) + [MAIN_CLASS, str(self.config_path)]

    def start(self, kafka_jars: Path, log_path: Path, wrapper: tuple[str, ...] = (),
              timeout_s: float = 60.0) -> subprocess.Popen:
        """Prepare the node and start it (``launch``); returned once it listens (``wait_started``)."""
        proc = self.launch(kafka_jars, log_path, wrapper)
        self.wait_started(proc, log_path, timeout_s)
        return proc

    def launch(self, kafka_jars: Path, log_path: Path, wrapper: tuple[str, ...] = ()) -> subprocess.Popen:
        """Prepare the node and start its process, under ``wrapper`` (e.g. ``ip netns exec NAME``, which execs
        it, so the process is Kafka's own), without waiting: a cluster's nodes listen only once a quorum of
        them runs."""
        self.prepare(kafka_jars)
        with open(log_path, "ab") as log:
            return subprocess.Popen([*wrapper, *self.command(kafka_jars)], stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)

    def wait_started(self, proc: subprocess.Popen, log_path: Path, timeout_s: float = 60.0) -> None:
        """Until the node listens; ``RuntimeError`` with its log's tail if it exits or does not in ``timeout_s``
        (then it is stopped)."""
        if not wait_listening(self.host, self.port, time.monotonic() + timeout_s, proc):
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
            tail = Path(log_path).read_text(errors="replace").strip().splitlines()[-10:]
            raise RuntimeError(f"Apache Kafka node {self.node_id} at {self.bootstrap} did not start: "
                               + " | ".join(tail))

    def wipe(self) -> None:
        """Forget every record and offset: the node starts next as a new, empty broker."""
        shutil.rmtree(self.folder / "data", ignore_errors=True)

    def _java(self, kafka_jars: Path) -> list[str]:
        return [java(), HEAP, "-XX:+UseG1GC", "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={self.folder / 'log4j2.properties'}",
                "-cp", f"{kafka_jars}/*"]

    def _cluster_id(self) -> str:
        """This node's cluster id, kept so a wiped node rejoins as the same cluster."""
        path = self.folder / "cluster-id"
        if not path.exists():
            path.write_text(new_cluster_id())
        return path.read_text().strip()


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, base64url, as ``kafka-storage random-uuid`` prints."""
    import base64

    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def wait_listening(host: str, port: int, deadline: float, process: subprocess.Popen | None = None) -> bool:
    """Until something listens on ``host:port``, the deadline passes, or ``process`` exits; whether it listens."""
    while time.monotonic() < deadline and (process is None or process.poll() is None):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(1.0)
            if s.connect_ex((host, port)) == 0:
                return True
        time.sleep(0.1)
    return False


# Kafka's log: warnings and the start-up line, not every request (its INFO is a megabyte a minute under tests).
LOG4J = """rootLogger.level=WARN
rootLogger.appenderRef.stdout.ref=STDOUT
appender.stdout.type=Console
appender.stdout.name=STDOUT
appender.stdout.layout.type=PatternLayout
appender.stdout.layout.pattern=[%d] %p %m (%c)%n
logger.started.name=kafka.server.KafkaRaftServer
logger.started.level=INFO
"""
