"""Three Apache Kafka brokers, each on a host of its own: network namespaces a test makes (``ip netns``),
joined by a bridge in the test's own namespace, on addresses of a subnet of the test's own.

``Cluster(folder)`` picks a /24 of 10.213.0.0/16 that no route of the machine uses; ``up()`` makes the
bridge (the test's side at ``.1``), a namespace per node with a veth into the bridge (the node at
``.11``, ``.12``, ``.13``), and starts the nodes (KRaft, each a broker and one of three controller voters;
``min.insync.replicas=2``, topics replicated 3 times by default). Faults, by node: ``kill`` (SIGKILL),
``start`` (again, with its data), ``cut``/``mend`` (its link set down and up: it neither sends nor hears
anything, as a host whose network failed). ``down()`` stops every node by its PID and removes the
namespaces and the bridge. Nothing listens outside the namespaces' own addresses.
"""

from __future__ import annotations

import random
import signal
import subprocess
import time
import uuid
from pathlib import Path

from headwater.deploy.kafka_server import KafkaServer, new_cluster_id
from headwater.deploy.tools import kafka
from tests.conftest import stop_process

NODES = 3
PORT, CONTROLLER_PORT = 9092, 9093  # each node has its own address, so all use the same ports


def ip(*arguments: str) -> None:
    done = subprocess.run(["ip", *arguments], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(arguments)}: {done.stderr.strip()} (the test needs network namespaces: "
                           "root, or CAP_NET_ADMIN, and iproute2)")


def free_subnet() -> str:
    """``10.213.N`` for an N no route of this machine is in."""
    routes = subprocess.run(["ip", "-4", "route", "show", "table", "all"], capture_output=True, text=True,
                            timeout=30).stdout
    for n in random.sample(range(1, 255), 254):
        if f"10.213.{n}." not in routes:
            return f"10.213.{n}"
    raise RuntimeError("no free subnet of 10.213.0.0/16 for the test's hosts")


class Cluster:
    def __init__(self, folder: Path, properties: dict[str, str] | None = None):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        tag = uuid.uuid4().hex[:6]
        self.subnet = free_subnet()
        self.bridge = f"hwbr{tag}"
        self.namespaces = {i: f"hw{tag}-{i}" for i in range(1, NODES + 1)}
        self.links = {i: f"hw{tag}v{i}" for i in self.namespaces}  # the test's end of each node's veth
        hosts = {i: f"{self.subnet}.{10 + i}" for i in self.namespaces}
        voters = ",".join(f"{i}@{hosts[i]}:{CONTROLLER_PORT}" for i in self.namespaces)
        cluster_id = new_cluster_id()
        self.nodes = {i: KafkaServer(self.folder / f"node{i}", PORT, CONTROLLER_PORT, host=hosts[i], node_id=i,
                                     voters=voters, cluster_id=cluster_id,
                                     properties={"default.replication.factor": "3", "min.insync.replicas": "2",
                                                 "unclean.leader.election.enable": "false",
                                                 # A node cut off leaves the in-sync replicas within 10 s (Kafka's
                                                 # default is 30 s), and one killed sooner (its session ends).
                                                 "replica.lag.time.max.ms": "10000",
                                                 **(properties or {})})
                      for i in self.namespaces}
        self.procs: dict[int, subprocess.Popen] = {}
        self.jars = kafka()
        self._made: list[tuple[str, ...]] = []  # what down() removes, last first

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes.values())

    def log(self, i: int) -> Path:
        return self.folder / f"node{i}.log"

    def up(self, timeout_s: float = 120.0) -> None:
        ip("link", "add", self.bridge, "type", "bridge")
        self._made.append(("link", "del", self.bridge))
        ip("addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        for i, namespace in self.namespaces.items():
            ip("netns", "add", namespace)
            self._made.append(("netns", "del", namespace))
            ip("link", "add", self.links[i], "type", "veth", "peer", "name", "eth0", "netns", namespace)
            ip("link", "set", self.links[i], "master", self.bridge, "up")
            ip("-n", namespace, "addr", "add", f"{self.nodes[i].host}/24", "dev", "eth0")
            ip("-n", namespace, "link", "set", "eth0", "up")
            ip("-n", namespace, "link", "set", "lo", "up")
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
        ip("link", "set", self.links[i], "down")

    def mend(self, i: int) -> None:
        ip("link", "set", self.links[i], "up")

    def down(self) -> None:
        for proc in self.procs.values():  # all at once, not each after the last has gone
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            stop_process(proc, signal.SIGTERM, timeout_s=20)
        for command in reversed(self._made):
            try:
                ip(*command)
            except RuntimeError:
                pass
        self._made.clear()

    def alive(self, i: int) -> bool:
        return self.procs.get(i) is not None and self.procs[i].poll() is None

    def wait_replicated(self, topics: list[str], config, timeout_s: float = 120.0) -> None:
        """Until every partition of ``topics`` has all three replicas in sync (after a node came back)."""
        from headwater.adapters.kafka import admin

        deadline = time.monotonic() + timeout_s
        client = admin(config)
        try:
            while True:
                described = client.describe_topics(topics)
                short = [(t["name"], p["partition_index"]) for t in described for p in t["partitions"]
                         if len(p["isr_nodes"]) < NODES]
                if not short:
                    return
                assert time.monotonic() < deadline, f"partitions not back to 3 in-sync replicas: {short}"
                time.sleep(1.0)
        finally:
            client.close()

    def _wrapper(self, i: int) -> tuple[str, ...]:
        return ("ip", "netns", "exec", self.namespaces[i])
