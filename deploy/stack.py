"""The embedded local stack: Apache Kafka, Neo4j and the query service on 127.0.0.1.

``Stack(home).up()`` starts Apache Kafka, one KRaft node (``headwater.deploy.kafka_server``, its data in
``home/broker``), and Neo4j 5 Community (``headwater.deploy.neo4j_server``, Bolt and HTTP, its data in
``home/graph``), both from jars fetched from Maven Central into the tools cache on first use, waits until
each answers a real request, then starts ``headwater serve`` on the stack's config (the
``query`` part, behind the token in ``home/http-token``) and waits for its ``/healthz``.
It records PIDs, ports and the generated graph password in ``home/stack.json``; the CLI
asks the query part a lineage question when it runs, instead of importing the query tier
(``headwater.cli``). ``down()`` stops exactly the processes recorded there. A second
``up()`` starts only what is not running.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from headwater.core.config import STACK_FILE, Config, at_home, load

if TYPE_CHECKING:
    from .kafka_server import KafkaServer
    from .neo4j_server import Neo4jServer

# The store clients (neo4j, kafka), and what only starting, checking or naming the parts needs (kafka_server,
# tools, secrets, urllib), are imported where they are used, not here: the CLI reads the stack's state
# (``query_service``) before every lineage question, against a 0.3 s bar (``bench/cli_latency.py``).

HOST = "127.0.0.1"
DEFAULT_PORTS = {"broker": 9092, "controller": 9093, "bolt": 7687, "graph_http": 7474, "query": 8080}
TOKEN_FILE = "http-token"  # in the home: the query part's bearer token, generated once
# In the home: the key capture signs black boxes' functions with and the query tier checks (``core/signing.py``)
NARROWING_KEY_FILE = "narrowing-key"


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
    server: str = ""  # what runs the part: "Apache Kafka 4.1.1 (KRaft)", "Neo4j 5.26.30 Community", …

    def to_dict(self) -> dict:
        return self.__dict__.copy()


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
    deadline = time.monotonic() + 2.0
    while True:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return False
        # A process still in its exec (just started, on a busy machine) shows no command line yet.
        if cmdline or state == "Z" or time.monotonic() > deadline:
            return marker in cmdline
        time.sleep(0.05)


def broker_server(home: Path, ports: dict) -> KafkaServer:
    from .kafka_server import KafkaServer

    return KafkaServer(Path(home) / "broker", ports["broker"], ports["controller"], host=HOST)


def graph_server(home: Path, ports: dict, password: str = "") -> Neo4jServer:
    from .neo4j_server import Neo4jServer

    return Neo4jServer(Path(home) / "graph", ports["bolt"], ports["graph_http"], password, host=HOST)


def server_command(server: KafkaServer | Neo4jServer) -> list[str]:
    """The command of Apache Kafka's or Neo4j's ``server``, prepared first (its config written, and Kafka's
    storage formatted or Neo4j's initial password set), with its jars fetched into the tools cache."""
    from . import tools
    from .kafka_server import KafkaServer

    name, jars = ("Apache Kafka", tools.kafka) if isinstance(server, KafkaServer) else ("Neo4j", tools.neo4j)
    try:
        folder = jars()
        server.prepare(folder)
    except (tools.ToolUnavailable, RuntimeError, OSError, subprocess.SubprocessError) as exc:
        raise StackError(f"cannot start {name}: {exc}") from exc
    return server.command(folder)


def query_command(home: Path, port: int) -> list[str]:
    return [sys.executable, "-m", "headwater.cli", "--home", str(home), "serve", "--host", HOST,
            "--port", str(port), "--token-file", str(home / TOKEN_FILE)]


def narrow_command(home: Path) -> list[str]:
    """The narrowing part: black boxes' batches narrowed ahead of the questions (query/README.md)."""
    return [sys.executable, "-m", "headwater.cli", "--home", str(home), "narrow", "--follow"]


def token(home: Path, name: str = TOKEN_FILE) -> str:
    """The query part's token (or another secret of the home: ``name``), generated on first use and kept
    (owner-only) across ups."""
    path = Path(home) / name
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as out:
            import secrets

            out.write(secrets.token_urlsafe(32))
    return path.read_text().strip()


def healthz(port: int, timeout_s: float = 3.0) -> str | None:
    """None when the query part at ``port`` says it is up, else what went wrong."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}/healthz", timeout=timeout_s) as reply:
            return None if reply.status == 200 else f"/healthz answered {reply.status}"
    except (OSError, ValueError) as exc:
        return f"/healthz: {exc}"


def query_service(home: Path, config: dict) -> tuple[str, str] | None:
    """``(url, token)`` of the query part the stack of ``home`` runs, or None: not started, stopped, its token
    gone, or serving another config than ``config`` (``Config.to_dict``: e.g. a setting from the environment
    that the query part was not started with). Cheap (no store client is imported): the CLI asks it before
    every lineage question."""
    home = Path(home)
    try:
        state = json.loads((home / STACK_FILE).read_text())
        part = state["parts"]["query"]
        if not _alive(part["pid"], _marker("query", home)) or \
                part.get("config") != json.loads(json.dumps(config, default=str)):
            return None
        return f"http://{HOST}:{int(state['ports']['query'])}", (home / TOKEN_FILE).read_text().strip()
    except (OSError, ValueError, KeyError, TypeError):
        return None


def server_name(part: str) -> str:
    """The server a part runs, as ``stack status`` names it."""
    from .tools import KAFKA_VERSION, NEO4J_VERSION

    return {"broker": f"Apache Kafka {KAFKA_VERSION} (KRaft)", "graph": f"Neo4j {NEO4J_VERSION} Community",
            "query": "headwater serve", "narrow": "headwater narrow --follow"}[part]

# The parts in the order they start; each is stopped in the reverse order.
PARTS = ("broker", "graph", "query", "narrow")


def _marker(name: str, home: Path) -> str:
    """What identifies a part's process in /proc/PID/cmdline (the query part: the serve of this home)."""
    if name == "broker":
        return broker_server(home, DEFAULT_PORTS).marker
    if name == "graph":
        return graph_server(home, DEFAULT_PORTS).marker
    if name == "narrow":
        return f"headwater.cli --home {home} narrow --follow"
    return f"headwater.cli --home {home} serve"


class Stack:
    """The local stack recorded under ``home``."""

    def __init__(self, home: Path, ports: dict | None = None, say: Callable[[str], None] = lambda _: None):
        self.home = Path(home)
        self.state_path = self.home / STACK_FILE
        self.say = say
        # A caller choosing its own ports (tests, benchmarks) but not the query part's gets a free one for it.
        self.requested_ports = {**DEFAULT_PORTS, **({"query": 0, "controller": 0} if ports else {}), **(ports or {})}
        self._started: dict[str, subprocess.Popen] = {}

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
        return at_home(Config.from_dict(self._state().get("config", {})), self.home)

    # lifecycle -----------------------------------------------------------

    def up(self, timeout_s: float = 90.0) -> list[PartStatus]:
        state = self._state()
        parts = state.get("parts", {})
        ports = {**self.requested_ports, **state.get("ports", {})}
        for name in ("controller", "query"):
            if not ports.get(name):
                ports[name] = free_port()
        import secrets

        password = state.get("graph_password") or secrets.token_urlsafe(18)
        token(self.home)
        token(self.home, NARROWING_KEY_FILE)

        config = Config(
            bootstrap=f"{HOST}:{ports['broker']}",
            graph_uri=f"bolt://{HOST}:{ports['bolt']}",
            graph_password=password,
            narrowing_key_file=str(self.home / NARROWING_KEY_FILE),
        )
        state = {"parts": parts, "ports": ports, "graph_password": password, "config": config.to_dict()}
        # Saved after each part starts: a part that fails to start leaves those before it known to ``down``.
        self._start(parts, "broker", lambda: server_command(broker_server(self.home, ports)),
                    [ports["broker"], ports["controller"]])
        self._save(state)
        self._start(parts, "graph",
                    lambda: server_command(graph_server(self.home, ports, password)),
                    [ports["bolt"], ports["graph_http"]])
        self._save(state)
        deadline = time.monotonic() + timeout_s
        self._wait_healthy(config, ports["broker"], timeout_s)
        # The query service reads the config from the state just saved, and answers only once the stores do.
        try:
            started = self._start(parts, "query", lambda: query_command(self.home, ports["query"]), [ports["query"]])
        except StackError as exc:  # its port taken: the stores still serve, questions are answered in-process
            self.say(f"query: not started ({exc}); lineage questions are answered in-process")
            return self.status()
        if started:
            # What it serves: it loads the config as this process does (the state, then the environment).
            served = load(self.home).to_dict()
            parts["query"]["config"] = json.loads(json.dumps(served, default=str))
        self._save(state)
        self._wait_query(ports["query"], deadline)
        self._start(parts, "narrow", lambda: narrow_command(self.home), [])
        self._save(state)
        return self.status()

    def _start(self, parts: dict, name: str, command: Callable[[], list[str]], part_ports: list[int]) -> bool:
        """Start the part unless it runs; whether it was started."""
        if _alive(parts.get(name, {}).get("pid"), _marker(name, self.home)):
            self.say(f"{name}: already running (pid {parts[name]['pid']})")
            return False
        taken = [p for p in part_ports if not port_free(p)]
        if taken:
            raise StackError(
                f"cannot start the {name}: port {taken[0]} on {HOST} is taken by another process; "
                f"free it or choose other ports (headwater stack up --help)"
            )
        logs = self.home / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        cmd = command()
        log = open(logs / f"{name}.log", "ab")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd=self.home)
        log.close()
        parts[name] = {"pid": proc.pid, "log": str(logs / f"{name}.log")}
        self._started[name] = proc
        self.say(f"{name}: started (pid {proc.pid}), waiting until it answers")
        return True

    def _wait_query(self, port: int, deadline: float) -> None:
        started = self._started.get("query")
        while True:
            problem = healthz(port, timeout_s=2)
            if problem is None:
                self.say("query: answers")
                return
            if started is not None and started.poll() is not None:
                raise StackError(f"query exited during start-up; see {self.home / 'logs' / 'query.log'}")
            if time.monotonic() > deadline:
                raise StackError(f"query did not answer in time ({problem}); see {self.home / 'logs' / 'query.log'}")
            time.sleep(0.1)

    def _wait_healthy(self, config: Config, broker_port: int, timeout_s: float) -> None:
        from headwater.adapters.graph import GraphUnavailable, wait_ready
        from headwater.adapters.kafka import BrokerUnavailable, list_topics

        from .kafka_server import wait_listening

        deadline = time.monotonic() + timeout_s
        try:
            # Kafka takes seconds to listen; a client asked meanwhile backs off for as long again.
            wait_listening(HOST, broker_port, deadline, self._started.get("broker"))
            list_topics(config.bootstrap, timeout_s=max(1.0, deadline - time.monotonic()))
            self.say("broker: answers")
            wait_ready(config, timeout_s=max(1.0, deadline - time.monotonic()))
            self.say("graph: answers")
        except (BrokerUnavailable, GraphUnavailable) as exc:
            for status in self.status():
                if status.name != "query" and not status.running:
                    raise StackError(f"{status.name} exited during start-up; see {status.detail}") from exc
            raise StackError(str(exc)) from exc

    def down(self, timeout_s: float = 20.0) -> list[str]:
        state = self._state()
        stopped = []
        parts = state.get("parts", {})
        for name in sorted(parts, key=lambda n: -PARTS.index(n)):  # the query service first: it uses the others
            pid, marker = parts[name].get("pid"), _marker(name, self.home)
            if not _alive(pid, marker):
                continue
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            while _alive(pid, marker) and time.monotonic() < deadline:
                _reap(pid)
                time.sleep(0.1)
            if _alive(pid, marker):
                os.kill(pid, signal.SIGKILL)
            _reap(pid)
            stopped.append(name)
            self.say(f"{name}: stopped (pid {pid})")
        if state:
            state["parts"] = {}
            self._save(state)
        return stopped

    def status(self) -> list[PartStatus]:
        from headwater.adapters.graph import GraphUnavailable, wait_ready
        from headwater.adapters.kafka import BrokerUnavailable, list_topics

        state = self._state()
        parts = state.get("parts", {})
        ports = state.get("ports", self.requested_ports)
        config = self.config() if state else Config()
        found = []
        for name, part_ports in (("broker", {"kafka": ports["broker"], "controller": ports.get("controller")}),
                                 ("graph", {"bolt": ports["bolt"], "http": ports["graph_http"]}),
                                 ("query", {"http": ports.get("query")}), ("narrow", {})):
            pid = parts.get(name, {}).get("pid")
            running = _alive(pid, _marker(name, self.home))
            healthy, detail = False, parts.get(name, {}).get("log", "not started")
            if running:
                try:
                    if name == "broker":
                        list_topics(config.bootstrap, timeout_s=3)
                    elif name == "graph":
                        wait_ready(config, timeout_s=3)
                    elif name == "narrow":
                        pass  # it runs: it follows the batch log (its log says what it narrows)
                    else:
                        problem = healthz(ports["query"])
                        if problem is not None:
                            raise StackError(problem)
                    healthy, detail = True, "answers" if name != "narrow" else "follows the batch log"
                except (BrokerUnavailable, GraphUnavailable, StackError) as exc:
                    detail = str(exc)
            found.append(PartStatus(name, pid if running else None, running, healthy, part_ports, detail,
                                    server_name(name)))
        return found


def _reap(pid: int) -> None:
    """Collect the exit status of a child we started, so it does not linger as a zombie."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
