"""The query tier's HTTP API: read-only JSON over ``LineageClient``.

    GET /v1/lineage/backward?rid=R&to=source&depth=16&payload=false&backend=csprov
    GET /v1/lineage/forward?source=kafka:orders:0:17
    GET /openapi.json   the OpenAPI 3.0 document of the above
    GET /healthz        {"status": "ok"}: the server is up (liveness)
    GET /readyz         {"status": "ready"}, or 503 naming the store that does not answer (readiness)
    GET /metrics        Prometheus text: headwater_query_* (``metrics.py``)

The last three are never behind the token: probes and scrapers come without one, and
they say nothing of the lineage (counts by route and status; store addresses).

To add a query: one ``Route`` in ``ROUTES`` (its path, the ``LineageClient`` method that
answers it, its options); the request handler and the OpenAPI document are both built
from that table, and the document's defaults are read off the method's signature.

``serve`` starts a server in a thread and returns it (``.port``, ``.close()``);
``headwater serve`` runs one until SIGINT or SIGTERM.
"""

from __future__ import annotations

import hmac
import inspect
import ipaddress
import json
import re
import socket
import sys
import threading
import time
import traceback
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, fields
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable
from urllib.parse import parse_qsl, urlsplit

from kafka.errors import KafkaError
from neo4j.exceptions import ServiceUnavailable, SessionExpired
from prometheus_client.exposition import choose_encoder

import headwater
from headwater.adapters.graph import GraphUnavailable
from headwater.adapters.health_http import readiness
from headwater.adapters.kafka import BrokerUnavailable, KafkaSourceError
from headwater.adapters.readiness import GraphProbe, folder_problem
from headwater.core import config as configuration
from headwater.core.config import Config
from headwater.indexer.generation import compacted_root, current_number
from headwater.indexer.store import EdgeStore

from . import api
from . import metrics as query_metrics
from .address import SOURCE_FORMS, checked_source
from .backend import MAX_DEPTH, OPTIONAL_FIELDS, Lineage, LineageError, UnknownRow, check_depth

TOKEN_ENV = "HEADWATER_HTTP_TOKEN"
MIN_TOKEN_LENGTH = 16
MAX_REQUEST_LINE = 8192  # bytes; longer: 414
MAX_PARAMETERS = 16
SOCKET_TIMEOUT_S = 10.0  # a client this slow to send its request (or to read the answer) is dropped
RETRY_AFTER_S = 1
CLOSE_WAIT_S = 30.0  # how long close() waits for running queries before closing the backends

# The store or a service behind an answer is not there (503), as opposed to a bug (500).
UNAVAILABLE = (GraphUnavailable, ServiceUnavailable, SessionExpired, BrokerUnavailable, KafkaSourceError,
               KafkaError, OSError)


class ServeError(ValueError):
    """The server cannot start as asked; the message says what to change (e.g. give a token, or bind to loopback)."""


def _cut(text: str, limit: int = 80) -> str:
    """Client input cut short, for an error message."""
    return text if len(text) <= limit else text[:limit] + "…"


def _shown(text: str) -> str:
    return repr(_cut(text))


_INTEGER = re.compile(r"-?[0-9]{1,19}")


def _rid(text: str) -> int:
    if _INTEGER.fullmatch(text) and -(1 << 63) <= int(text) < 1 << 63:
        return int(text)
    raise LineageError(f"a rid is a signed 64-bit integer, not {_shown(text)}")


def _depth(text: str) -> int:
    return check_depth(int(text) if _INTEGER.fullmatch(text) else _cut(text))


def _payload(text: str) -> bool:
    if text not in ("true", "false"):
        raise LineageError(f"payload is true or false, not {_shown(text)}")
    return text == "true"


def _cols(text: str) -> int:
    try:
        mask = int(text, 0) if len(text) <= 70 else 0
    except ValueError:
        mask = 0
    if not mask or not -(1 << 63) <= mask < 1 << 63:
        raise LineageError(f"cols is a non-zero 64-bit mask of columns (e.g. 5 or 0b101), not {_shown(text)}")
    return mask


def _paths(text: str) -> int:
    if not re.fullmatch(r"[0-9]{1,3}", text) or int(text) > api.MAX_PATHS:
        raise LineageError(f"paths is how many paths to keep per row, 0 to {api.MAX_PATHS}, not {_shown(text)}")
    return int(text)


def _backend(text: str) -> str:
    if text not in api.choices():
        raise LineageError(f"backend is one of {', '.join(api.choices())}, not {_shown(text)}")
    return text


@dataclass(frozen=True)
class Param:
    """A query parameter: its OpenAPI schema, and how its text becomes the value the client method takes."""

    name: str
    schema: dict
    description: str
    parse: Callable[[str], object]


@dataclass(frozen=True)
class Route:
    """``GET path``: answered by ``LineageClient.<method>(rid, **options)``, a ``backend.Answer``."""

    path: str
    method: str
    summary: str
    options: tuple[Param, ...]


_INT64 = {"type": "integer", "format": "int64"}

# Every route asks about one row: exactly one of these names it.
ROW = (
    Param("rid", _INT64, "The row's rid (e.g. a sink row's _hw_rid). Exactly one of rid and source.", _rid),
    Param("source", {"type": "string"}, f"The row's address: {SOURCE_FORMS}. Exactly one of rid and source.",
          checked_source),
)
BACKEND = Param("backend", {"type": "string"}, "cypher: the graph store; csprov: the Parquet store by connected "
                "sets; rq: the Parquet store scanned whole; auto: the graph when it answers and holds the row, else "
                "the Parquet store. Default: the server's.", _backend)
TO = Param("to", {"type": "string"}, "The rows answered: source, state or output rows, or the rows of the "
           "dataset it names (an unknown name: no rows).", str)
DEPTH = Param("depth", {"type": "integer", "minimum": 1, "maximum": MAX_DEPTH}, "Longest path followed, in edges "
              "(each way, for the co- questions).", _depth)
PAYLOAD = Param("payload", {"type": "boolean"}, "Add each row's original source record (Kafka by offset, Parquet "
                "file rows by position, file-backed static tables by key).", _payload)
def _moment(text: str) -> str:
    api.moment(text, "since/until")  # refused here, as a 400, not in the middle of a walk
    return text


SINCE = Param("since", {"type": "string", "format": "date-time"}, "Time bound: only through batches that ran at "
              "or after this ISO 8601 time (the batch log's time of each).", _moment)
UNTIL = Param("until", {"type": "string", "format": "date-time"}, "Time bound: only through batches that ran at "
              "or before this time.", _moment)
LINEAGE_OPTIONS = (
    TO, DEPTH, PAYLOAD, SINCE, UNTIL,
    Param("cols", {"type": "string"}, "Attribute level: a bit mask (decimal, 0x… or 0b…) of the columns of the row "
          "asked about (backward) or of the rows answered (forward).", _cols),
    Param("paths", {"type": "integer", "minimum": 0, "maximum": api.MAX_PATHS}, "How-provenance: keep up to this "
          "many paths per row, each a list of [query, batch, op] steps in data-flow order.", _paths),
)
CO_OPTIONS = (
    TO, Param("via", {"type": "string"}, "The rows in between: source, state or output rows, or a dataset.", str),
    DEPTH, PAYLOAD, SINCE, UNTIL,
)
ROUTES = (
    Route("/v1/lineage/backward", "backward", "The inputs a row was derived from.", LINEAGE_OPTIONS),
    Route("/v1/lineage/forward", "forward", "The rows derived from an input.", LINEAGE_OPTIONS),
    Route("/v1/lineage/co-contributors", "co_contributors",
          "The rows used together with a row to make others (TensProv Q10).", CO_OPTIONS),
    Route("/v1/lineage/co-dependents", "co_dependents",
          "The rows derived from the inputs of a row (TensProv Q11).", CO_OPTIONS),
)


def parse_query(route: Route, query: str) -> tuple[str | None, int, dict]:
    """``(backend or None, rid, options)`` of a query string; ``LineageError`` says what is wrong with it."""
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query), errors="strict",
                          max_num_fields=MAX_PARAMETERS)
    except ValueError as exc:  # a field without '=', too many fields, bad percent-encoding
        raise LineageError(f"malformed query string: {exc}") from None
    known = {p.name: p for p in ROW + route.options + (BACKEND,)}
    given: dict[str, str] = {}
    for name, text in pairs:
        if name not in known:
            raise LineageError(f"unknown parameter {_shown(name)}; known: {', '.join(known)}")
        if name in given:
            raise LineageError(f"parameter {name} given more than once")
        if not text:
            raise LineageError(f"parameter {name} is empty")
        given[name] = text
    named = [p for p in ROW if p.name in given]
    if len(named) != 1:
        raise LineageError(f"give exactly one of {' or '.join(p.name for p in ROW)}")
    rid = named[0].parse(given[named[0].name])
    options = {p.name: p.parse(given[p.name]) for p in route.options if p.name in given}
    backend = BACKEND.parse(given["backend"]) if "backend" in given else None
    return backend, rid, options


_FIELD_SCHEMAS = {
    "int": _INT64, "int | None": {**_INT64, "nullable": True}, "str": {"type": "string"},
    "str | None": {"type": "string", "nullable": True}, "bool": {"type": "boolean"},
    "list[int]": {"type": "array", "items": _INT64},
    "list[list] | None": {"type": "array", "nullable": True, "items": {"type": "array", "items": {
        "type": "array", "description": "[query, batch, op]", "items": {}}},
        "description": "How-provenance: only with paths > 0."},
    "bool | None": {"type": "boolean", "nullable": True, "description": "Only with paths > 0."},
    "object": {"description": "The original source record; only with payload=true."},
}


# Fields whose meaning their type does not tell.
_NAMED_FIELD_SCHEMAS = {
    "table": {"type": "string", "nullable": True, "description": "A static table's row: where the table lives "
              "(file paths or catalog name); dataset is its short name."},
    "changed_since": {"type": "boolean", "nullable": True, "description": "Only with payload=true, for a static "
                      "table's row: the table changed since the batches that read the row, so the payload is the "
                      "row as it is now."},
}


def _schema_of_lineage() -> dict:
    """``Lineage``'s fields as an OpenAPI schema; a field of a type not mapped here fails loudly, not silently."""
    properties = {f.name: _NAMED_FIELD_SCHEMAS.get(f.name) or _FIELD_SCHEMAS[f.type] for f in fields(Lineage)}
    return {"type": "object", "properties": properties,
            "required": [n for n in properties if n not in OPTIONAL_FIELDS]}


def openapi(default_backend: str, secured: bool) -> dict:
    """The OpenAPI 3.0 document of ``ROUTES`` as a server with this default backend and auth serves them."""
    def response(description: str, schema: str) -> dict:
        return {"description": description,
                "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}}}

    errors = {"400": response("A missing, unknown, repeated or malformed parameter, or a question that "
                              "cannot be answered as asked.", "Error"),
              "404": response("The row is not in the lineage store or graph (not captured, or not indexed yet).",
                              "Error"),
              "503": response("Too many queries running (see Retry-After), or the store is unavailable.", "Error"),
              "500": response("An unexpected error; the server's log has its details.", "Error")}
    if secured:
        errors["401"] = response("No or a wrong bearer token.", "Error")
    backend = {**BACKEND.schema, "enum": api.choices(), "default": default_backend}
    paths = {}
    for route in ROUTES:
        defaults = inspect.signature(getattr(api.LineageClient, route.method)).parameters
        parameters = [{"name": p.name, "in": "query", "required": False, "description": p.description,
                       "schema": p.schema} for p in ROW]
        parameters += [{"name": p.name, "in": "query", "required": False, "description": p.description,
                        "schema": {**p.schema, "default": defaults[p.name].default}} for p in route.options]
        parameters.append({"name": BACKEND.name, "in": "query", "required": False,
                           "description": BACKEND.description, "schema": backend})
        paths[route.path] = {"get": {"operationId": route.method, "summary": route.summary,
                                     "parameters": parameters,
                                     "responses": {"200": response("The answer.", "Answer"), **errors}}}
    paths["/openapi.json"] = {"get": {"operationId": "openapi", "summary": "This document.",
                                      "responses": {"200": {"description": "This document.",
                                                            "content": {"application/json": {}}}}}}
    status = {"type": "object", "required": ["status"], "properties": {"status": {"type": "string"}}}
    paths["/healthz"] = {"get": {"operationId": "healthz", "summary": "The server is up: liveness (no token needed).",
                                 "security": [],
                                 "responses": {"200": {"description": "Up.", "content": {"application/json": {
                                     "schema": status}}}}}}
    paths["/readyz"] = {"get": {
        "operationId": "readyz", "security": [],
        "summary": "The store the server's default backend reads answers: readiness (no token needed). cypher: "
                   "the graph; csprov and rq: the Parquet store's folder; auto: either.",
        "responses": {
            "200": {"description": "Ready: {\"status\": \"ready\"}.",
                    "content": {"application/json": {"schema": status}}},
            "503": {"description": "Not ready: what does not answer, and why.", "content": {"application/json": {
                "schema": {**status, "properties": {**status["properties"], "unreachable": {
                    "type": "object", "additionalProperties": {"type": "string"},
                    "description": "By store (graph, store): why it does not answer."}}}}}}}}}
    paths["/metrics"] = {"get": {
        "operationId": "metrics", "security": [],
        "summary": "Prometheus metrics, text format (no token needed): headwater_query_request_seconds{route,status}, "
                   "headwater_query_errors_total{route}, headwater_query_in_flight, process_*.",
        "responses": {"200": {"description": "The metrics.", "content": {"text/plain": {
            "schema": {"type": "string"}}}}}}}
    document = {
        "openapi": "3.0.3",
        "info": {"title": "headwater lineage", "version": headwater.__version__,
                 "description": "Row-level lineage questions, read-only."},
        "paths": paths,
        "components": {"schemas": {
            "Lineage": _schema_of_lineage(),
            "Answer": {"type": "object", "required": ["of", "answer", "truncated", "complete", "gaps",
                                                      "unexplained", "read_by"], "properties": {
                "of": {**_INT64, "description": "The rid asked about."},
                "answer": {"type": "array", "items": {"$ref": "#/components/schemas/Lineage"}},
                "truncated": {"type": "boolean", "description": "The answer was cut to the server's max_results."},
                "complete": {"type": "boolean", "description": "Every batch on the way was fully captured, "
                             "and no row on the way lacks its recorded inputs."},
                "gaps": {"type": "array", "description": "Batches on the way the batch log does not record as "
                         "fully captured (status null: not in the log yet).", "items": {
                             "type": "object", "properties": {"query": {"type": "string"}, "batch": _INT64,
                                                              "status": {"type": "string", "nullable": True}}}},
                "unexplained": {"type": "array", "description": "Rows on the way (backward) that are not sources "
                                "yet have no recorded inputs: lineage stops there.", "items": {
                                    "type": "object", "properties": {"rid": _INT64,
                                                                     "kind": {"type": "string", "nullable": True},
                                                                     "dataset": {"type": "string", "nullable": True}}}},
                "read_by": {"type": "array", "description": "Forward from a source row: the fully captured batches "
                            "that read it and derived nothing from it (filtered, unmatched, late, duplicate): the "
                            "empty answer is complete.", "items": {
                                "type": "object", "properties": {"query": {"type": "string"}, "batch": _INT64,
                                                                 "status": {"type": "string", "nullable": True}}}}}},
            "Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}}}},
    }
    if secured:
        document["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        document["security"] = [{"bearer": []}]
    return document


def _store_stamp(config: Config) -> tuple:
    """Changes whenever what a Parquet backend reads would: a new generation, a shard's range committed or dropped."""
    store, topic = config.store_path(), config.edges_topic
    shards = tuple((folder.name, tuple(EdgeStore(folder).committed()))
                   for folder in sorted((store / topic).glob("partition=*")))
    return current_number(compacted_root(store, topic)), shards


# Backends that read the Parquet store as it was when they were made (``parquet.StoreView``).
_SNAPSHOTS = ("csprov", "rq", "auto")


class _Clients:
    """One ``LineageClient`` per backend, made at its first question and shared by every request thread.

    The Cypher client takes questions from any number of threads at once: its neo4j
    ``Driver`` is concurrency-safe and it opens a session (which is not) per query. A
    Parquet client takes one at a time (its lock): each question builds its own walk
    state and the ``StoreView``'s tables are immutable, but the generation keeps
    readers between questions (lazily built caches; open ``pq.ParquetFile``s, whose
    shared use Arrow does not promise to be safe). A Parquet client sees the store as
    it was when made, so it is made again once the store has changed; the one replaced
    is left to the questions still walking it (it holds no connections). Making a
    client is locked per backend. The neo4j ``Driver.close`` is not concurrency-safe:
    ``LineageServer.close`` closes the clients after the last question.
    """

    def __init__(self, config: Config):
        self.config = config
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._held: dict[str, tuple[api.LineageClient, tuple | None, AbstractContextManager]] = {}

    def get(self, backend: str) -> tuple[api.LineageClient, AbstractContextManager]:
        """The backend's client, and what a question to it holds while it runs."""
        stamp = _store_stamp(self.config) if backend in _SNAPSHOTS else None
        with self._guard:
            lock = self._locks.setdefault(backend, threading.Lock())
        with lock:
            held = self._held.get(backend)
            if held is None or held[1] != stamp:
                serial = threading.Lock() if backend in _SNAPSHOTS else nullcontext()
                held = self._held[backend] = (api.LineageClient(self.config, backend=backend), stamp, serial)
        return held[0], held[2]

    def close(self) -> None:
        for client, _, _ in self._held.values():
            client.close()
        self._held.clear()


def _printable(text: str, limit: int = 200) -> str:
    """Client input fit for one log line: printable ASCII (the rest percent-encoded), cut short."""
    return "".join(c if " " <= c <= "~" else "".join(f"%{b:02X}" for b in c.encode()) for c in text[:limit])


class _Handler(BaseHTTPRequestHandler):
    server: "LineageServer"
    server_version = "headwater"
    # HTTP/1.0: one request per connection, so a body sent anyway (never read) cannot be taken for the next request.
    protocol_version = "HTTP/1.0"
    # A broken (or HTTP/0.9) request line is answered with a status line and headers too, not a bare body.
    default_request_version = "HTTP/1.0"

    def version_string(self) -> str:
        return self.server_version  # not Python's version

    def setup(self) -> None:
        self.timeout = self.server.socket_timeout_s
        super().setup()

    def handle_one_request(self) -> None:
        self._status = None
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
                    {"error": f"{_shown(self.command)} is not allowed: the API is read-only (GET)"}, {"Allow": "GET"})

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
            backend, rid, options = parse_query(route, query)
        except LineageError as exc:
            return self._reply(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
        if not server.slots.acquire(blocking=False):
            return self._reply(HTTPStatus.SERVICE_UNAVAILABLE,
                               {"error": f"{server.max_concurrent} queries are running already; retry later"},
                               {"Retry-After": str(RETRY_AFTER_S)})
        try:
            status, body = HTTPStatus.OK, server.ask(route, backend or server.backend, rid, options)
        except LineageError as exc:
            status = HTTPStatus.NOT_FOUND if isinstance(exc, UnknownRow) else HTTPStatus.BAD_REQUEST
            body = {"error": str(exc)}
        except UNAVAILABLE as exc:
            status, body = HTTPStatus.SERVICE_UNAVAILABLE, {"error": f"unavailable: {type(exc).__name__}: {exc}"}
        except Exception as exc:
            server.say("".join(traceback.format_exception(exc)).rstrip())
            status, body = HTTPStatus.INTERNAL_SERVER_ERROR, {
                "error": f"internal error ({type(exc).__name__}); the server's log has its details"}
        finally:
            server.slots.release()
        self._reply(status, body)


class LineageServer(ThreadingHTTPServer):
    """The HTTP API over one config's stores; ``serve`` starts one."""

    daemon_threads = True

    def __init__(self, config: Config | None = None, host: str = "127.0.0.1", port: int = 8080,
                 backend: str = "auto", token: str | None = None, max_results: int = 10_000,
                 max_concurrent: int = 4, say: Callable[[str], None] | None = None,
                 socket_timeout_s: float = SOCKET_TIMEOUT_S):
        if backend not in api.choices():
            raise ServeError(f"unknown backend {backend!r}; choose one of {', '.join(api.choices())}")
        if max_results < 1 or max_concurrent < 1:
            raise ServeError("max_results and max_concurrent must be at least 1")
        if token is not None and not re.fullmatch(rf"[!-~]{{{MIN_TOKEN_LENGTH},}}", token):
            raise ServeError(f"the token must be at least {MIN_TOKEN_LENGTH} printable ASCII characters, no spaces")
        try:
            found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except socket.gaierror as exc:
            raise ServeError(f"cannot bind to {host!r}: {exc}") from None
        if token is None and not all(ipaddress.ip_address(a[4][0].split("%")[0]).is_loopback for a in found):
            raise ServeError(f"refusing to serve on {host!r} without a token: anyone who reaches it could read "
                             f"the lineage; give --token-file PATH or ${TOKEN_ENV}, or bind to 127.0.0.1")
        self.address_family = found[0][0]
        self.config = config or configuration.load()
        self.backend = backend
        self.token = token
        self.max_results = max_results
        self.max_concurrent = max_concurrent
        self.socket_timeout_s = socket_timeout_s
        self.slots = threading.BoundedSemaphore(max_concurrent)
        self.routes = {route.path: route for route in ROUTES}
        self.openapi = openapi(backend, secured=token is not None)
        self.clients = _Clients(self.config)
        self._graph_probe = GraphProbe(self.config)
        self._say = say
        self._thread: threading.Thread | None = None
        super().__init__(found[0][4], _Handler)

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

    def route_of(self, handler: _Handler) -> str:
        """The request's route as metrics label it: a path of the document, else ``other``."""
        path = urlsplit(handler.path or "").path if handler.command else None
        return path if path in self.openapi["paths"] else query_metrics.OTHER

    def unready(self) -> dict[str, str]:
        """What keeps the server's default backend from answering, by store (``/readyz``); empty when ready.

        auto asks the graph, else the Parquet store: it answers while either does.
        """
        found = {}
        for name in api.AUTO if self.backend == "auto" else (self.backend,):
            store = "graph" if name == "cypher" else "store"
            problem = self._graph_probe.problem() if store == "graph" else folder_problem(self.config.store_path())
            if problem is None:
                return {}
            found[store] = problem
        return found

    def log_request_line(self, handler: _Handler, started: float) -> None:
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
        client, serial = self.clients.get(backend)
        payload = options.pop("payload", False)
        with serial:
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
        return self

    def close(self) -> None:
        """Stop accepting, close the port, let running queries finish (up to ``CLOSE_WAIT_S``), close the backends."""
        if self._thread is not None:
            self.shutdown()
            self._thread.join()
        self.server_close()
        deadline = time.monotonic() + CLOSE_WAIT_S
        taken = sum(self.slots.acquire(timeout=max(0.0, deadline - time.monotonic()))
                    for _ in range(self.max_concurrent))
        self.clients.close()
        self._graph_probe.close()
        for _ in range(taken):
            self.slots.release()


def serve(config: Config | None = None, host: str = "127.0.0.1", port: int = 8080, backend: str = "auto",
          token: str | None = None, max_results: int = 10_000, max_concurrent: int = 4,
          say: Callable[[str], None] | None = None, socket_timeout_s: float = SOCKET_TIMEOUT_S) -> LineageServer:
    """A server answering on ``host``:``port`` (0: any free port) in a thread of its own; ``.close()`` stops it.

    ``token``: every /v1 and /openapi.json request needs ``Authorization: Bearer <token>``;
    without one, only a loopback ``host`` is allowed (``ServeError``). ``say``: where the
    request log goes (default stderr).
    """
    return LineageServer(config, host, port, backend, token, max_results, max_concurrent, say,
                         socket_timeout_s).start()
