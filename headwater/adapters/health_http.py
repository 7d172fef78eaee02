"""A service's port for Prometheus and Kubernetes: ``/metrics``, ``/healthz`` and ``/readyz``.

prometheus-client's own ``start_http_server`` serves ``/metrics`` only; this is its WSGI
app (``make_wsgi_app``) beside the two probes, on one threaded server, so that a slow
readiness check never holds up a scrape.

- ``/healthz``: 200 ``{"status": "ok"}`` while the process serves: liveness.
- ``/readyz``: 200 ``{"status": "ready"}`` when ``unready()`` names nothing, else 503
  ``{"status": "unready", "unreachable": {part: why}}``.

None of them needs a token: they carry counts and store addresses, no lineage and no secret.
"""

from __future__ import annotations

import json
import socket
import threading
from socketserver import ThreadingMixIn
from typing import Callable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import REGISTRY, CollectorRegistry, make_wsgi_app

Unready = Callable[[], dict]  # what is not ready, by part: {"graph": "why"}; empty when ready


def readiness(unready: Unready) -> tuple[int, dict]:
    """``(status, body)`` of a ``/readyz`` answer; a check that fails is itself the reason."""
    try:
        problems = unready()
    except Exception as exc:
        problems = {"readiness": f"the check failed: {type(exc).__name__}"}
    if problems:
        return 503, {"status": "unready", "unreachable": problems}
    return 200, {"status": "ready"}


def app(unready: Unready, registry: CollectorRegistry = REGISTRY):
    """The WSGI app of the three paths."""
    metrics = make_wsgi_app(registry)

    def reply(start_response, status: int, body: dict) -> list[bytes]:
        data = json.dumps(body).encode()
        phrase = {200: "200 OK", 404: "404 Not Found", 503: "503 Service Unavailable"}[status]
        start_response(phrase, [("Content-Type", "application/json"), ("Content-Length", str(len(data))),
                                ("Cache-Control", "no-store")])
        return [data]

    def serve(environ, start_response):
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            return metrics(environ, start_response)
        if path == "/healthz":
            return reply(start_response, 200, {"status": "ok"})
        if path == "/readyz":
            return reply(start_response, *readiness(unready))
        return reply(start_response, 404, {"error": "no such path: /metrics, /healthz or /readyz"})

    return serve


class _Quiet(WSGIRequestHandler):
    def log_message(self, format, *args) -> None:
        pass  # a scrape and two probes every few seconds are not news


class HealthServer:
    """The server running in a daemon thread; ``shutdown()`` stops it and closes its port."""

    def __init__(self, host: str, port: int, unready: Unready, registry: CollectorRegistry = REGISTRY):
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        server_class = type("_Server", (ThreadingMixIn, WSGIServer),
                            {"daemon_threads": True, "address_family": family})
        self._server: WSGIServer = make_server(host, port, app(unready, registry), server_class, handler_class=_Quiet)
        self._thread = threading.Thread(target=self._server.serve_forever, name="headwater-health", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def shutdown(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def serve(host: str, port: int, unready: Unready, registry: CollectorRegistry = REGISTRY) -> HealthServer:
    """Serve the three paths on ``host``:``port`` (0: any free port); ``OSError`` says why it cannot."""
    try:
        return HealthServer(host, port, unready, registry)
    except OSError as exc:
        raise OSError(f"cannot serve metrics on {host}:{port} ({exc}); choose another port or host") from exc
