"""Hosts of a test's own: network namespaces (``ip netns``) joined by a bridge, on a subnet no route uses.

``Network()`` picks a /24 of 10.213.0.0/16 that no route of the machine uses; ``up()`` makes the bridge
(the test's side at ``.1``); ``host(number)`` makes a namespace with a veth into the bridge, its address
``.number`` and its loopback up. A process runs on a host under ``host.wrapper`` (``ip netns exec NAME``,
which execs it: the process is the program's own). ``cut``/``mend`` set a host's link down and up (it
neither sends nor hears anything, as a host whose network failed). ``down()`` removes the namespaces and
the bridge (the processes on them are the caller's to stop first). Nothing listens outside the namespaces'
own addresses.
"""

from __future__ import annotations

import random
import subprocess
import uuid
from dataclasses import dataclass


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


@dataclass(frozen=True)
class Host:
    namespace: str
    address: str
    link: str  # the test's end of the host's veth

    @property
    def wrapper(self) -> tuple[str, ...]:
        return ("ip", "netns", "exec", self.namespace)


class Network:
    def __init__(self):
        self.tag = uuid.uuid4().hex[:6]
        self.subnet = free_subnet()
        self.bridge = f"hwbr{self.tag}"
        self.hosts: dict[int, Host] = {}
        self._made: list[tuple[str, ...]] = []  # what down() removes, last first

    def address(self, number: int) -> str:
        return f"{self.subnet}.{number}"

    def up(self) -> "Network":
        ip("link", "add", self.bridge, "type", "bridge")
        self._made.append(("link", "del", self.bridge))
        ip("addr", "add", f"{self.address(1)}/24", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        return self

    def host(self, number: int) -> Host:
        """Host ``.number`` (2…254), made on first use."""
        if number not in self.hosts:
            host = Host(f"hw{self.tag}-{number}", self.address(number), f"hw{self.tag}v{number}")
            ip("netns", "add", host.namespace)
            self._made.append(("netns", "del", host.namespace))
            ip("link", "add", host.link, "type", "veth", "peer", "name", "eth0", "netns", host.namespace)
            ip("link", "set", host.link, "master", self.bridge, "up")
            ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", "eth0")
            ip("-n", host.namespace, "link", "set", "eth0", "up")
            ip("-n", host.namespace, "link", "set", "lo", "up")
            self.hosts[number] = host
        return self.hosts[number]

    def cut(self, number: int) -> None:
        """Take host ``.number`` off the network: nothing it sends arrives, nothing sent to it does."""
        ip("link", "set", self.hosts[number].link, "down")

    def mend(self, number: int) -> None:
        ip("link", "set", self.hosts[number].link, "up")

    def down(self) -> None:
        for command in reversed(self._made):
            try:
                ip(*command)
            except RuntimeError:
                pass
        self._made.clear()
        self.hosts.clear()
