"""The HTTP API's server: ``serve`` starts a ``LineageServer`` in a thread of its own over one config's stores.

It binds (loopback only without a token), holds the route table and the OpenAPI document, the query slots and the
shared clients (``gate.py``), answers a lineage route through ``LineageClient`` and an explorer route through
``explore.Explorer``, says what keeps it from being ready (``/readyz``), logs a line per request (parameter names
only), and reads the graph once at start (``graph.warm_up``) where its backend may be the graph's.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit

from headwater.adapters import graph
from headwater.adapters.readiness import GraphProbe, store_problem
from headwater.core import config as configuration
from headwater.core.config import Config

from .. import api
from .. import metrics as query_metrics
from ..cypher import CypherBackend
from ..explore import Explorer
from .gate import Clients, Slots
from .handler import Handler, _printable
from .openapi import openapi
from .routes import BACKEND, ROUTES, ROW, Route

TOKEN_ENV = "HEADWATER_HTTP_TOKEN"
MIN_TOKEN_LENGTH = 16
SOCKET_TIMEOUT_S = 10.0  # a client this slow to send its request (or to read the answer) is dropped
# Queries answered at once. A question is mostly Python between round trips to the store, and the threads of
# one process take turns at the interpreter lock: four stepping the graph at once do 60% of the steps a second
# one thread does alone, and 8 clients of bench/http_load.py got p99 95 ms with 4 at once, 78 with 2, 81
# with 1 (query/README.md, "Why two queries at once"). Two, so that one slow question (a hub's forward
# lineage) never holds up every other.
MAX_CONCURRENT = 2
# A query beyond max_concurrent waits for a slot, rather than failing at once under a small burst (a page of
# the explorer asks a few at a time); but only so many wait, and not for long: past either, 503.
MAX_QUEUED = 16
QUEUE_WAIT_S = 2.0
WARM_UP_RETRY_S = 5.0  # how often a server started before its graph asks it again, to warm it up
CLOSE_WAIT_S = 30.0  # how long close() waits for running queries before closing the backends

# The explorer's files, by the path each is served at. Read once at start: a path asked for is looked
# up here and nowhere else, so no request names a file of its own choosing.
EXPLORER_DIR = Path(__file__).parent.parent / "explorer"
EXPLORER_FILES = {"/": ("index.html", "text/html; charset=utf-8"),
                  "/explorer/app.js": ("app.js", "text/javascript; charset=utf-8"),
                  "/explorer/graph.js": ("graph.js", "text/javascript; charset=utf-8"),
                  "/explorer/style.css": ("style.css", "text/css; charset=utf-8"),
                  "/explorer/icon.svg": ("icon.svg", "image/svg+xml")}


class ServeError(ValueError):
    """The server cannot start as asked; the message says what to change (e.g. give a token, or bind to loopback)."""


class LineageServer(ThreadingHTTPServer):
    """The HTTP API over one config's stores; ``serve`` starts one."""

    daemon_threads = True
    # Connections the kernel holds before they are accepted: socketserver's 5 would drop a burst of clients
    # (who then wait a second to try again) before the queue of queries ever sees them.
    request_queue_size = 128
    # As bound (getsockname's): text, where typeshed's type is every address a bind takes.
    server_address: tuple[str, int] | tuple[str, int, int, int]

    def __init__(self, config: Config | None = None, host: str = "127.0.0.1", port: int = 8080,
                 backend: str = "auto", token: str | None = None, max_results: int = 10_000,
                 max_concurrent: int = MAX_CONCURRENT, say: Callable[[str], None] | None = None,
                 socket_timeout_s: float = SOCKET_TIMEOUT_S, max_queued: int = MAX_QUEUED,
                 queue_wait_s: float = QUEUE_WAIT_S, warm_graph: bool = True):
        if backend not in api.choices():
            raise ServeError(f"unknown backend {backend!r}; choose one of {', '.join(api.choices())}")
        if max_results < 1 or max_concurrent < 1:
            raise ServeError("max_results and max_concurrent must be at least 1")
        if max_queued < 0 or queue_wait_s < 0:
            raise ServeError("max_queued and queue_wait_s must not be negative")
        if token is not None and not re.fullmatch(rf"[!-~]{{{MIN_TOKEN_LENGTH},}}", token):
            raise ServeError(f"the token must be at least {MIN_TOKEN_LENGTH} printable ASCII characters, no spaces")
        try:
            found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except socket.gaierror as exc:
            raise ServeError(f"cannot bind to {host!r}: {exc}") from None
        # (family, address) of each; a Python built without IPv6 gives an IPv6 address as no text, and cannot bind it
        bindable = [(a[0], a[4]) for a in found if isinstance(a[4][0], str)]
        if not bindable:
            raise ServeError(f"cannot bind to {host!r}: an IPv6 address, and this Python was built without IPv6")
        if token is None and not all(ipaddress.ip_address(address[0].split("%")[0]).is_loopback
                                     for _, address in bindable):
            raise ServeError(f"refusing to serve on {host!r} without a token: anyone who reaches it could read "
                             f"the lineage; give --token-file PATH or ${TOKEN_ENV}, or bind to 127.0.0.1")
        self.address_family = bindable[0][0]
        self.config = config or configuration.load()
        self.backend = backend
        self.token = token
        self.max_results = max_results
        self.max_concurrent = max_concurrent
        self.max_queued = max_queued
        self.socket_timeout_s = socket_timeout_s
        self.slots = Slots(max_concurrent, max_queued, queue_wait_s)
        self.routes = {route.path: route for route in ROUTES}
        self.openapi = openapi(backend, secured=token is not None)
        self.explorer_files = {path: ((EXPLORER_DIR / name).read_bytes(), kind) for path, (name, kind) in
                         EXPLORER_FILES.items()}
        self.clients = Clients(self.config)
        self.explorer = Explorer(self.config)  # answers the explorer's routes
        self._graph_probe = GraphProbe(self.config)
        self._say = say
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()
        self.warm_graph = warm_graph and backend in ("auto", "cypher")
        super().__init__(bindable[0][1], Handler)

    @property
    def port(self) -> int:
        return self.server_address[1]

    @property
    def url(self) -> str:
        host = self.server_address[0]
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    def say(self, line: str) -> None:
        if self._say is not None:
            self._say(line)
        else:
            print(line, file=sys.stderr, flush=True)

    def route_of(self, handler: Handler) -> str:
        """The request's route as metrics label it: a path of the document (the explorer's files: ``/``),
        else ``other``."""
        if not handler.command:
            return query_metrics.OTHER
        path = urlsplit(handler.path or "").path
        if path in self.explorer_files:
            return "/"
        return path if path in self.openapi["paths"] else query_metrics.OTHER

    def unready(self) -> dict[str, str]:
        """What keeps the server's default backend from answering, by store (``/readyz``); empty when ready.

        auto asks the graph, else the Parquet store: it answers while either does.
        """
        found = {}
        for name in api.AUTO if self.backend == "auto" else (self.backend,):
            store = "graph" if name == "cypher" else "store"
            problem = self._graph_probe.problem() if store == "graph" else store_problem(self.config.store_uri())
            if problem is None:
                return {}
            found[store] = problem
        return found

    def log_request_line(self, handler: Handler, started: float) -> None:
        """One line per request; of the query string only the parameter names (their values may be secrets)."""
        url = urlsplit(handler.path or "") if handler.command else None
        known = {p.name for p in ROW + (BACKEND,) + tuple(o for r in ROUTES for o in r.options)}
        names = "&".join(n if n in known else "*" for n in (f.split("=", 1)[0] for f in url.query.split("&"))) \
            if url and url.query else ""
        target = _printable(url.path + (f"?{names}" if names else "")) if url else "-"
        self.say(f"{handler.client_address[0]} {_printable(handler.command or '-', 20)} {target} "
                 f"{handler._status} {1000 * (time.monotonic() - started):.1f}ms")

    def shutdown_request(self, request) -> None:
        """Close, first dropping what the client sent and was not read (a body, headers after a 414).

        Closing a socket with unread input resets the connection, and the client may
        lose the answer with it. Only what has arrived already is dropped, at most 1 MiB.
        """
        try:
            request.shutdown(socket.SHUT_WR)
            request.setblocking(False)
            for _ in range(16):
                if not request.recv(65536):
                    break
        except OSError:  # nothing more to read (BlockingIOError), or the client is gone
            pass
        self.close_request(request)

    def handle_error(self, request, client_address) -> None:
        exc = sys.exc_info()[1]
        self.say(f"{client_address[0]} connection error: {type(exc).__name__}: {exc}")

    def ask(self, route: Route, backend: str, rid: int | str, options: dict) -> dict:
        payload = options.pop("payload", False)
        with self.clients.lease(backend) as client:
            answer = getattr(client, route.method)(rid, **options)
            truncated = len(answer) > self.max_results
            found = answer.records[: self.max_results]
            if payload:  # only the rows kept: a payload may be one Kafka read each
                found = client.with_payload(found)
        summary = answer.summary()
        return {"of": answer.of, "answer": [item.to_dict() for item in found], "truncated": truncated,
                "complete": summary["complete"], "gaps": summary["gaps"], "unexplained": summary["unexplained"],
                "read_by": summary["read_by"]}

    def start(self) -> "LineageServer":
        self._thread = threading.Thread(target=self.serve_forever, name="headwater-http", daemon=True)
        self._thread.start()
        if self.warm_graph:
            threading.Thread(target=self._warm_up_graph, name="headwater-graph-warm-up", daemon=True).start()
        return self

    def _warm_up_graph(self) -> None:
        """Read the whole graph once (``graph.warm_up``) as soon as it answers, while questions are answered: a
        hub's forward question then reads Neo4j's page cache, not the disk at random; then have it plan a
        question's statements (``CypherBackend.plan_questions``). Given up on close while it
        waits for the graph; a read already under way runs to its end in this daemon thread (a neo4j session is not
        for closing from another thread), then the thread ends."""
        while self._graph_probe.problem() is not None:
            if self._closing.wait(WARM_UP_RETRY_S):
                return
        self.say("graph: reading every row and edge once into the graph server's page cache")
        try:
            seconds = graph.warm_up(self.config)
            planner = CypherBackend(self.config)
            try:
                planned = planner.plan_questions()
            finally:
                planner.close()
        except Exception as exc:  # questions are answered regardless, only slower
            self.say(f"graph: warm-up failed ({exc!r:.300}); questions are answered from the disk")
            return
        self.say(f"graph: warmed up in {seconds:.1f}s, the {planned} statements of a question planned")

    def close(self) -> None:
        """Stop accepting, close the port, let running queries finish (up to ``CLOSE_WAIT_S``), close the backends."""
        self._closing.set()
        if self._thread is not None:
            self.shutdown()
            self._thread.join()
        self.server_close()
        self.slots.close(CLOSE_WAIT_S)
        self.clients.close()
        self._graph_probe.close()


def serve(config: Config | None = None, host: str = "127.0.0.1", port: int = 8080, backend: str = "auto",
          token: str | None = None, max_results: int = 10_000, max_concurrent: int = MAX_CONCURRENT,
          say: Callable[[str], None] | None = None, socket_timeout_s: float = SOCKET_TIMEOUT_S,
          max_queued: int = MAX_QUEUED, queue_wait_s: float = QUEUE_WAIT_S, warm_graph: bool = True) -> LineageServer:
    """A server answering on ``host``:``port`` (0: any free port) in a thread of its own; ``.close()`` stops it.

    ``token``: every /v1 and /openapi.json request needs ``Authorization: Bearer <token>``;
    without one, only a loopback ``host`` is allowed (``ServeError``). ``say``: where the
    request log goes (default stderr). ``max_concurrent`` queries run at once; up to
    ``max_queued`` more wait for a slot, at most ``queue_wait_s`` each; beyond, 503. ``warm_graph``: where the
    backend may be the graph's, read the whole graph once as soon as it answers (in a thread of its own).
    """
    return LineageServer(config, host, port, backend, token, max_results, max_concurrent, say,
                         socket_timeout_s, max_queued, queue_wait_s, warm_graph).start()
