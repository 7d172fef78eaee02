"""Apache Kafka brokers, each on a host of its own (``hosts.Network``: network namespaces a test makes).

``Cluster(folder)`` makes a network of its own, or takes the test's (``network=``), and puts node ``i`` on host
``.1i`` (``.11``, ``.12``, ``.13``); ``up()`` starts the nodes (KRaft, each a broker and a controller voter).
Three nodes by default, with ``min.insync.replicas=2`` and topics replicated 3 times; ``nodes=1`` is a single
broker. Faults, by node: ``kill`` (SIGKILL), ``start`` (again, with its data), ``cut``/``mend`` (its link set
down and up). ``down()`` stops every node by its PID, then removes the network if it made it.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

from headwater.deploy.kafka_server import KafkaServer, new_cluster_id
from headwater.deploy.tools import kafka
from tests.conftest import stop_process
from tests.hosts import Network

NODES = 3
PORT, CONTROLLER_PORT = 9092, 9093  # each node has its own address, so all use the same ports


class Cluster:
    def __init__(self, folder: Path, properties: dict[str, str] | None = None, nodes: int = NODES,
                 network: Network | None = None):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.network = network or Network()
        self._own_network = network is None
        self.size = nodes
        ids = range(1, nodes + 1)
        hosts = {i: self.network.address(10 + i) for i in ids}
        voters = ",".join(f"{i}@{hosts[i]}:{CONTROLLER_PORT}" for i in ids)
        cluster_id = new_cluster_id()
        replication = {"default.replication.factor": "3", "min.insync.replicas": "2"} if nodes >= 3 else \
            {"default.replication.factor": str(nodes), "min.insync.replicas": "1",
             "offsets.topic.replication.factor": str(nodes), "transaction.state.log.replication.factor": str(nodes),
             "transaction.state.log.min.isr": "1"}
        self.nodes = {i: KafkaServer(self.folder / f"node{i}", PORT, CONTROLLER_PORT, host=hosts[i], node_id=i,
                                     voters=voters, cluster_id=cluster_id,
                                     properties={**replication, "unclean.leader.election.enable": "false",
                                                 # A node cut off leaves the in-sync replicas within 10 s (Kafka's
                                                 # default is 30 s), and one killed sooner (its session ends).
                                                 "replica.lag.time.max.ms": "10000",
                                                 **(properties or {})})
                      for i in ids}
        self.procs: dict[int, subprocess.Popen] = {}
        self.jars = kafka()

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes.values())

    def log(self, i: int) -> Path:
        return self.folder / f"node{i}.log"

    def up(self, timeout_s: float = 120.0) -> None:
        if self._own_network:
            self.network.up()
        for i in self.nodes:
            self.network.host(10 + i)
        for i in self.nodes:  # all at once: a node listens only once a quorum of the controllers runs
            self.procs[i] = self.nodes[i].launch(self.jars, self.log(i), self._wrapper(i))
        for i, node in self.nodes.items():
            node.wait_started(self.procs[i], self.log(i), timeout_s)

    def kill(self, i: int) -> None:
        """SIGKILL node ``i``: no shutdown, its leadership and its place in the in-sync replicas are taken away."""
        proc = self.procs[i]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)

    def start(self, i: int, timeout_s: float = 120.0) -> None:
        """Start node ``i`` again, with the data it had."""
        self.procs[i] = self.nodes[i].start(self.jars, self.log(i), self._wrapper(i), timeout_s)

    def cut(self, i: int) -> None:
        """Take node ``i`` off the network: nothing it sends arrives, nothing sent to it does."""
        self.network.cut(10 + i)

    def mend(self, i: int) -> None:
        self.network.mend(10 + i)

    def down(self) -> None:
        for proc in self.procs.values():  # all at once, not each after the last has gone
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            stop_process(proc, signal.SIGTERM, timeout_s=20)
        if self._own_network:
            self.network.down()

    def alive(self, i: int) -> bool:
        return self.procs.get(i) is not None and self.procs[i].poll() is None

    def wait_replicated(self, topics: list[str], config, timeout_s: float = 120.0) -> None:
        """Until every partition of ``topics`` has all its replicas in sync (after a node came back)."""
        from headwater.adapters.kafka import admin

        deadline = time.monotonic() + timeout_s
        client = admin(config)
        try:
            while True:
                described = client.describe_topics(topics)
                short = [(t["name"], p["partition_index"]) for t in described for p in t["partitions"]
                         if len(p["isr_nodes"]) < self.size]
                if not short:
                    return
                assert time.monotonic() < deadline, f"partitions not back to {self.size} in-sync replicas: {short}"
                time.sleep(1.0)
        finally:
            client.close()

    def _wrapper(self, i: int) -> tuple[str, ...]:
        return self.network.host(10 + i).wrapper
