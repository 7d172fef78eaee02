"""One HTTP request of the API, start to end: the request line's limits, the token, the route, the query slots,
and the error that each failure is answered with (400, 404, 503 with Retry-After, 500 with the details in the log
only), always as JSON; the explorer's files with headers that keep the page to itself."""

from __future__ import annotations

import hmac
import json
import time
import traceback
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from kafka.errors import KafkaError
from neo4j.exceptions import ServiceUnavailable, SessionExpired
from prometheus_client.exposition import choose_encoder

from headwater.adapters.graph import GraphUnavailable
from headwater.adapters.health_http import readiness
from headwater.adapters.kafka import BrokerUnavailable, KafkaSourceError

from .. import metrics as query_metrics
from ..errors import LineageError, UnknownRow
from ..explore import NotFound
from ..question import quoted
from .routes import Route, parse_query

if TYPE_CHECKING:
    from .server import LineageServer

MAX_REQUEST_LINE = 8192  # bytes; longer: 414
RETRY_AFTER_S = 1
# The store or a service behind an answer is not there (503), as opposed to a bug (500).
UNAVAILABLE = (GraphUnavailable, ServiceUnavailable, SessionExpired, BrokerUnavailable, KafkaSourceError,
               KafkaError, OSError)
# The page runs only its own script and style, talks only to this server, and cannot be framed: data it shows
# (a payload, a dataset's name) can never run as code or be sent elsewhere.
EXPLORER_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                               "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}


def _printable(text: str, limit: int = 200) -> str:
    """Client input fit for one log line: printable ASCII (the rest percent-encoded), cut short."""
    return "".join(c if " " <= c <= "~" else "".join(f"%{b:02X}" for b in c.encode()) for c in text[:limit])


class Handler(BaseHTTPRequestHandler):
    server: "LineageServer"
    server_version = "headwater"
    # HTTP/1.0: one request per connection, so a body sent anyway (never read) cannot be taken for the next request.
    protocol_version = "HTTP/1.0"
    # A broken (or HTTP/0.9) request line is answered with a status line and headers too, not a bare body.
    default_request_version = "HTTP/1.0"

    def version_string(self) -> str:
        return self.server_version  # not Python's version

    def setup(self) -> None:
        # The server's own timeout: StreamRequestHandler's ``timeout`` is one for the class.
        self.request.settimeout(self.server.socket_timeout_s)
        super().setup()

    def handle_one_request(self) -> None:
        self._status: int | None = None  # the status replied, once one is
        started = time.monotonic()
        query_metrics.IN_FLIGHT.inc()
        try:
            super().handle_one_request()
        finally:
            query_metrics.IN_FLIGHT.dec()
            if self._status is not None:
                self.server.log_request_line(self, started)
                query_metrics.record(self.server.route_of(self), self._status, time.monotonic() - started)

    def parse_request(self) -> bool:
        if len(self.raw_requestline) > MAX_REQUEST_LINE:
            self.requestline, self.request_version, self.command = "", "", ""
            self.send_error(HTTPStatus.REQUEST_URI_TOO_LONG)
            return False
        return super().parse_request()

    def send_response(self, code: int, message: str | None = None) -> None:
        self._status = int(code)
        super().send_response(code)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own errors (bad request line, too long, too many headers…) as JSON too."""
        self.close_connection = True
        status = HTTPStatus(code)
        text = f"the request line is longer than {MAX_REQUEST_LINE} bytes" if status == 414 else message
        self._reply(status, {"error": text or status.phrase})

    def log_request(self, code="-", size="-") -> None:
        pass  # handle_one_request logs each request once, with its duration

    def log_message(self, format: str, *args) -> None:
        self.server.say(_printable(f"{self.client_address[0]} {format % args}", 500))

    def __getattr__(self, name: str):
        if name.startswith("do_"):  # any method but GET; http.server would answer 501
            return self._not_allowed
        raise AttributeError(name)

    def _reply(self, status: int, body: dict, headers: dict | None = None) -> None:
        self._send(status, json.dumps(body, default=str).encode(), "application/json", headers)

    def _send(self, status: int, data: bytes, content_type: str, headers: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _not_allowed(self) -> None:
        self._reply(HTTPStatus.METHOD_NOT_ALLOWED,
                    {"error": f"{quoted(self.command)} is not allowed: the API is read-only (GET)"}, {"Allow": "GET"})

    def _authorized(self) -> bool:
        token = self.server.token
        if token is None:
            return True
        given = self.headers.get_all("Authorization") or []
        if len(given) != 1:
            return False
        scheme, _, credentials = given[0].strip().partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            credentials.strip().encode("latin-1", "replace"), token.encode())

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path == "/healthz":
            return self._reply(HTTPStatus.OK, {"status": "ok"})
        if url.path == "/readyz":
            return self._reply(*readiness(self.server.unready))
        if url.path == "/metrics":  # in the format the scraper asks for, as prometheus-client's own server does
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            return self._send(HTTPStatus.OK, encoder(query_metrics.REGISTRY), content_type)
        if url.path in self.server.explorer_files:
            data, content_type = self.server.explorer_files[url.path]
            return self._send(HTTPStatus.OK, data, content_type, EXPLORER_HEADERS)
        if not self._authorized():
            return self._reply(HTTPStatus.UNAUTHORIZED,
                               {"error": "give the server's token: Authorization: Bearer <token>"},
                               {"WWW-Authenticate": "Bearer"})
        if url.path == "/openapi.json":
            return self._reply(HTTPStatus.OK, self.server.openapi)
        route = self.server.routes.get(url.path)
        if route is None:
            return self._reply(HTTPStatus.NOT_FOUND, {"error": "no such path; the paths are in /openapi.json"})
        self._answer(route, url.query)

    def _answer(self, route: Route, query: str) -> None:
        server = self.server
        try:
            backend, row, options = parse_query(route, query)
        except LineageError as exc:
            return self._reply(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
        if not server.slots.enter():
            return self._reply(HTTPStatus.SERVICE_UNAVAILABLE,
                               {"error": f"{server.max_concurrent} queries are running and {server.max_queued} "
                                         f"waiting already; retry later"},
                               {"Retry-After": str(RETRY_AFTER_S)})
        try:
            status = HTTPStatus.OK
            body = server.ask(route, backend or server.backend, row, options) if row is not None else \
                getattr(server.explorer, route.method)(**options)
        except LineageError as exc:
            status = HTTPStatus.NOT_FOUND if isinstance(exc, (UnknownRow, NotFound)) else HTTPStatus.BAD_REQUEST
            body = {"error": str(exc)}
        except UNAVAILABLE as exc:
            status, body = HTTPStatus.SERVICE_UNAVAILABLE, {"error": f"unavailable: {type(exc).__name__}: {exc}"}
        except Exception as exc:
            server.say("".join(traceback.format_exception(exc)).rstrip())
            status, body = HTTPStatus.INTERNAL_SERVER_ERROR, {
                "error": f"internal error ({type(exc).__name__}); the server's log has its details"}
        finally:
            server.slots.leave()
        self._reply(status, body)

