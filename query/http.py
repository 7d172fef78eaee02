"""The query tier's HTTP API: read-only JSON over ``LineageClient``, and the explorer that reads it.

    GET /v1/lineage/backward?rid=R&to=source&depth=16&payload=false&backend=csprov
    GET /v1/lineage/forward?source=kafka:orders:0:17
    GET /v1/queries     the traced queries, their batches' capture at a glance
    GET /v1/query?name=Q                 one query: its plan as operators, its batches, its gaps
    GET /v1/batch?query=Q&batch=N        one batch: its batch log record, the sink rows it wrote
    GET /v1/where?dataset=D&where=P      the rids of a sink's rows a predicate selects
    GET /               the explorer (``explorer/``: HTML, CSS and JavaScript, no lineage in them)
    GET /openapi.json   the OpenAPI 3.0 document of the above
    GET /healthz        {"status": "ok"}: the server is up (liveness)
    GET /readyz         {"status": "ready"}, or 503 naming the store that does not answer (readiness)
    GET /metrics        Prometheus text: headwater_query_* (``metrics.py``)

The last three, and the explorer's files, are never behind the token: probes and scrapers
come without one, and a browser cannot send one when it opens a page; none of them says
anything of the lineage (counts by route and status; store addresses; the explorer's code).
The explorer asks /v1 with the token the person typed, as ``Authorization: Bearer``.

To add a query: one ``Route`` in ``ROUTES`` (its path, the method that answers it, its
options); the request handler and the OpenAPI document are both built from that table.
A lineage route is answered by a ``LineageClient`` method, whose signature gives the
document's defaults; the explorer's by a method of ``LineageServer``.

Queries run ``max_concurrent`` at a time; up to ``max_queued`` more wait for a slot, each
at most ``queue_wait_s``, and beyond that get 503 with Retry-After.

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
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, fields
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
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
from headwater.core.offsets import offset_ranges
from headwater.store.batch_log import BatchLog
from headwater.store.generation import store_version

from . import api
from . import metrics as query_metrics
from .address import SOURCE_FORMS, checked_source
from .backend import MAX_DEPTH, OPTIONAL_FIELDS, Lineage, LineageError, UnknownRow, check_depth
from .explain import Explainer
from .where import MAX_SELECTED

TOKEN_ENV = "HEADWATER_HTTP_TOKEN"
MIN_TOKEN_LENGTH = 16
MAX_REQUEST_LINE = 8192  # bytes; longer: 414
MAX_PARAMETERS = 16
SOCKET_TIMEOUT_S = 10.0  # a client this slow to send its request (or to read the answer) is dropped
RETRY_AFTER_S = 1
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
MAX_LIMIT = 10_000  # the most batches, rows or rids an explorer route answers with
CLOSE_WAIT_S = 30.0  # how long close() waits for running queries before closing the backends

# The store or a service behind an answer is not there (503), as opposed to a bug (500).
UNAVAILABLE = (GraphUnavailable, ServiceUnavailable, SessionExpired, BrokerUnavailable, KafkaSourceError,
               KafkaError, OSError)


class ServeError(ValueError):
    """The server cannot start as asked; the message says what to change (e.g. give a token, or bind to loopback)."""


class NotFound(LineageError):
    """The batch log has no such query or batch (404)."""


# The explorer's files, by the path each is served at. Read once at start: a path asked for is looked
# up here and nowhere else, so no request names a file of its own choosing.
EXPLORER_DIR = Path(__file__).with_name("explorer")
EXPLORER_FILES = {"/": ("index.html", "text/html; charset=utf-8"),
                  "/explorer/app.js": ("app.js", "text/javascript; charset=utf-8"),
                  "/explorer/graph.js": ("graph.js", "text/javascript; charset=utf-8"),
                  "/explorer/style.css": ("style.css", "text/css; charset=utf-8"),
                  "/explorer/icon.svg": ("icon.svg", "image/svg+xml")}
# The page runs only its own script and style, talks only to this server, and cannot be framed: data it shows
# (a payload, a dataset's name) can never run as code or be sent elsewhere.
EXPLORER_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                               "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}


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


def _name(text: str) -> str:
    if len(text) > 256 or not text.isprintable():
        raise LineageError(f"a query's name is at most 256 printable characters, not {_shown(text)}")
    return text


def _batch(text: str) -> int:
    if not re.fullmatch(r"[0-9]{1,19}", text) or int(text) >= 1 << 63:
        raise LineageError(f"batch is a batch id, a non-negative 64-bit integer, not {_shown(text)}")
    return int(text)


def _limit(text: str) -> int:
    if not re.fullmatch(r"[0-9]{1,5}", text) or not 1 <= int(text) <= MAX_LIMIT:
        raise LineageError(f"limit is from 1 to {MAX_LIMIT}, not {_shown(text)}")
    return int(text)


def _selected(text: str) -> int:
    if not re.fullmatch(r"[0-9]{1,5}", text) or not 1 <= int(text) <= MAX_SELECTED:
        raise LineageError(f"limit is from 1 to {MAX_SELECTED}, not {_shown(text)}")
    return int(text)


def _dataset(text: str) -> str:
    if len(text) > 4096 or not text.isprintable():
        raise LineageError(f"dataset is a sink as lineage names it (parquet:PATH, …), not {_shown(text)}")
    return text


@dataclass(frozen=True)
class Param:
    """A query parameter: its OpenAPI schema, and how its text becomes the value the answering method takes."""

    name: str
    schema: dict
    description: str
    parse: Callable[[str], object]


@dataclass(frozen=True)
class Route:
    """``GET path``, answered by ``method``.

    A lineage route (``row``) asks about one row, which exactly one of ``ROW`` names, and is
    answered by ``LineageClient.<method>(rid, **options)``, a ``backend.Answer``; the document
    takes its options' defaults from that method's signature. The explorer's routes are
    answered by ``LineageServer.<method>(**options)``, an object of the schema ``answer``;
    ``required`` options must be given, the others have the ``default`` of their schema.
    """

    path: str
    method: str
    summary: str
    options: tuple[Param, ...]
    row: bool = True
    required: tuple[str, ...] = ()
    answer: str = "Answer"


_INT64 = {"type": "integer", "format": "int64"}

# Every lineage route asks about one row: exactly one of these names it.
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


def _moment(name: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        api.moment(text, name)  # refused here, as a 400, not in the middle of a walk; in the CLI's words
        return text
    return parse


SINCE = Param("since", {"type": "string", "format": "date-time"}, "Time bound: only through batches that ran at "
              "or after this ISO 8601 time (the batch log's time of each).", _moment("since"))
UNTIL = Param("until", {"type": "string", "format": "date-time"}, "Time bound: only through batches that ran at "
              "or before this time.", _moment("until"))
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


def _limited(default: int, what: str) -> Param:
    return Param("limit", {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": default},
                 f"The most {what} answered; more are cut (truncated: true).", _limit)


_QUERY_NAME = {"type": "string", "maxLength": 256}
ROUTES = (
    Route("/v1/lineage/backward", "backward", "The inputs a row was derived from.", LINEAGE_OPTIONS),
    Route("/v1/lineage/forward", "forward", "The rows derived from an input.", LINEAGE_OPTIONS),
    Route("/v1/lineage/co-contributors", "co_contributors",
          "The rows used together with a row to make others (TensProv Q10).", CO_OPTIONS),
    Route("/v1/lineage/co-dependents", "co_dependents",
          "The rows derived from the inputs of a row (TensProv Q11).", CO_OPTIONS),
    Route("/v1/queries", "queries", "The traced queries with a plan in the store, and their batches' capture "
          "statuses at a glance.", (), row=False, answer="Queries"),
    Route("/v1/query", "query", "One query: its plan as operators, its latest batches (capture status, overhead "
          "against the budget) and its gaps.",
          (Param("name", _QUERY_NAME, "The query's name (Tracer.trace's name=).", _name),
           _limited(500, "batches (the latest)")), row=False, required=("name",), answer="Query"),
    Route("/v1/batch", "batch", "One batch of a query: its batch log record, the sink rows it wrote (the files "
          "its record lists) and the Kafka offsets it read: the rows a gap there affects.",
          (Param("query", _QUERY_NAME, "The query's name.", _name),
           Param("batch", {**_INT64, "minimum": 0}, "The batch id.", _batch),
           _limited(1000, "sink rows")), row=False, required=("query", "batch"), answer="Batch"),
    Route("/v1/where", "where", "The rids of the rows of a traced query's sink a predicate selects, to ask "
          "lineage from (where.py; read without Spark, so a predicate only Spark can evaluate is refused).",
          (Param("dataset", {"type": "string", "maxLength": 4096}, "The sink of a traced query (GET /v1/queries: "
                 "sink), as lineage names it: parquet:PATH, json:PATH, orc:PATH.", _dataset),
           Param("where", {"type": "string", "maxLength": 4096}, "A SQL predicate over the sink's columns (Spark's "
                 "dialect; value functions only).", str),
           Param("limit", {"type": "integer", "minimum": 1, "maximum": MAX_SELECTED, "default": 100},
                 "The most rows it may select; more is refused (narrow the predicate), not cut.", _selected)),
          row=False, required=("dataset", "where"), answer="Where"),
)


def parse_query(route: Route, query: str) -> tuple[str | None, int | str | None, dict]:
    """``(backend or None, row or None, options)`` of a query string; ``LineageError`` says what is wrong with it.

    The row (a rid, or an address) only for a lineage route; the backend only where one may be named.
    """
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query), errors="strict",
                          max_num_fields=MAX_PARAMETERS)
    except ValueError as exc:  # a field without '=', too many fields, bad percent-encoding
        raise LineageError(f"malformed query string: {exc}") from None
    known = {p.name: p for p in (ROW + route.options + (BACKEND,) if route.row else route.options)}
    given: dict[str, str] = {}
    for name, text in pairs:
        if name not in known:
            raise LineageError(f"unknown parameter {_shown(name)}; known: {', '.join(known) or 'none'}")
        if name in given:
            raise LineageError(f"parameter {name} given more than once")
        if not text:
            raise LineageError(f"parameter {name} is empty")
        given[name] = text
    missing = [name for name in route.required if name not in given]
    if missing:
        raise LineageError(f"give {' and '.join(missing)}")
    row = None
    if route.row:
        named = [p for p in ROW if p.name in given]
        if len(named) != 1:
            raise LineageError(f"give exactly one of {' or '.join(p.name for p in ROW)}")
        row = named[0].parse(given[named[0].name])
    options = {p.name: p.parse(given[p.name]) for p in route.options if p.name in given}
    backend = BACKEND.parse(given["backend"]) if "backend" in given else None
    return backend, row, options


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
    "operators": {"type": "array", "nullable": True, "description": "The plan operators its rows flowed through, "
                  "named, in data-flow order (where a plan is kept).", "items": {"type": "object", "properties": {
                      "query": {"type": "string"}, "id": {"type": "integer"}, "kind": {"type": "string"},
                      "name": {"type": "string"}, "spark_class": {"type": "string", "nullable": True},
                      "inputs": {"type": "array", "items": {"type": "integer"}}}}},
    "columns": {"type": "array", "nullable": True, "items": {"type": "string"}, "description": "The names of the "
                "columns cols stands for, where the mask and the columns are known."},
}


def record_fields() -> list[str]:
    """The fields of a ``Lineage`` record as an answer gives them (the rest are the walk's own)."""
    given = set(Lineage(of=0, rid=0, kind="", dataset=None).to_dict()) | set(OPTIONAL_FIELDS)
    return [f.name for f in fields(Lineage) if f.name in given]


def _schema_of_lineage() -> dict:
    """``Lineage``'s fields as an OpenAPI schema; a field of a type not mapped here fails loudly, not silently."""
    types = {f.name: f.type for f in fields(Lineage)}
    properties = {name: _NAMED_FIELD_SCHEMAS.get(name) or _FIELD_SCHEMAS[types[name]] for name in record_fields()}
    return {"type": "object", "properties": properties,
            "required": [n for n in properties if n not in OPTIONAL_FIELDS]}


_NULLABLE_NUMBER = {"type": "number", "nullable": True}
_GAP = {"type": "object", "required": ["query", "batch", "status"], "properties": {
    "query": {"type": "string"}, "batch": _INT64, "status": {"type": "string", "nullable": True}}}
_OPERATORS = {"type": "array", "nullable": True, "description": "The plan's operators in data-flow order "
              "(explain.operators); null: no plan kept.", "items": {"type": "object", "properties": {
                  "id": {"type": "integer"}, "kind": {"type": "string"}, "name": {"type": "string"},
                  "inputs": {"type": "array", "items": {"type": "integer"}}}}}
_QUERY_FIELDS = {
    "name": {"type": "string"}, "sink": {"type": "string", "nullable": True,
                                         "description": "The sink's dataset, as lineage names it."},
    "sources": {"type": "array", "items": {"type": "object"}},
    "output_columns": {"type": "array", "nullable": True, "items": {"type": "string"}},
}
_BATCH_SUMMARY = {"type": "object", "required": ["batch", "status", "gap"], "properties": {
    "batch": _INT64, "status": {"type": "string", "nullable": True, "description": "Its capture status: full, "
                                "sampled, log-only, failed; null: not in the batch log yet."},
    "gap": {"type": "boolean", "description": "Not fully captured: lineage through it may miss rows."},
    "at": {"type": "string", "nullable": True, "description": "When it ran (Spark's trigger time)."},
    "seconds": _NULLABLE_NUMBER, "capture_seconds": _NULLABLE_NUMBER,
    "overhead": {**_NULLABLE_NUMBER, "description": "capture_seconds over the rest of the batch's seconds, as "
                 "the budget counts it."},
    "rows_in": {**_INT64, "nullable": True}, "rows_out": {**_INT64, "nullable": True},
    "edges": {**_INT64, "nullable": True}, "sampled_fraction": _NULLABLE_NUMBER,
    "error": {"type": "string", "nullable": True}}}
_BUDGET = {"type": "number", "description": "The overhead budget in this server's config (capture's may differ); "
           "0: no limit."}
_EXPLORER_SCHEMAS = {
    "Queries": {"type": "object", "required": ["queries", "budget"], "properties": {
        "queries": {"type": "array", "items": {"type": "object", "properties": {
            **_QUERY_FIELDS, "batches": {"type": "integer"}, "first": {**_INT64, "nullable": True},
            "last": {**_INT64, "nullable": True}, "last_at": {"type": "string", "nullable": True},
            "statuses": {"type": "object", "additionalProperties": {"type": "integer"},
                         "description": "Batches by capture status (unlogged: no status yet)."},
            "gaps": {"type": "integer", "description": "Batches not fully captured."}}}},
        "budget": _BUDGET}},
    "Query": {"type": "object", "required": ["name", "operators", "batches", "count", "truncated", "gaps"],
              "properties": {
                  **_QUERY_FIELDS, "operators": _OPERATORS, "budget": _BUDGET,
                  "batches": {"type": "array", "items": _BATCH_SUMMARY, "description": "The latest batches, "
                              "oldest first."},
                  "count": {"type": "integer", "description": "Batches in the batch log."},
                  "truncated": {"type": "boolean", "description": "Only the latest `limit` batches are given."},
                  "gaps": {"type": "array", "items": _GAP, "description": "Every batch not fully captured (at "
                           "most `limit`, the latest)."}}},
    "Batch": {"type": "object", "required": ["query", "batch", "status", "gap", "record", "rows", "truncated",
                                             "read"], "properties": {
        "query": {"type": "string"}, "batch": _INT64, "status": {"type": "string", "nullable": True},
        "gap": {"type": "boolean"}, "overhead": _NULLABLE_NUMBER, "budget": _BUDGET,
        "record": {"type": "object", "description": "Every field the batch log holds of the batch."},
        "rows": {"type": "array", "description": "The sink rows the batch wrote: the rows of the files its record "
                 "lists (sink_files), by file and position, with their _hw_rid.", "items": {
                     "type": "object", "properties": {"rid": _INT64, "file": {"type": "string"},
                                                      "position": _INT64}}},
        "rows_note": {"type": "string", "nullable": True, "description": "Why rows is empty where it is: no file "
                      "listed, a sink that is not a file sink, files gone."},
        "truncated": {"type": "boolean", "description": "rows was cut to `limit`."},
        "read": {"type": "array", "description": "The Kafka offsets the batch read, [first, last] by partition.",
                 "items": {"type": "object", "properties": {
                     "topic": {"type": "string"}, "partition": {"type": "integer"}, "first": _INT64,
                     "last": _INT64}}}}},
    "Where": {"type": "object", "required": ["dataset", "where", "rids"], "properties": {
        "dataset": {"type": "string"}, "where": {"type": "string"},
        "rids": {"type": "array", "items": _INT64, "description": "The distinct _hw_rid of the rows selected, "
                 "sorted. None selected is a 404; more than `limit`, a 400."}}},
}


def openapi(default_backend: str, secured: bool) -> dict:
    """The OpenAPI 3.0 document of ``ROUTES`` as a server with this default backend and auth serves them."""
    def response(description: str, schema: str) -> dict:
        return {"description": description,
                "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}}}

    errors = {"400": response("A missing, unknown, repeated or malformed parameter, or a question that "
                              "cannot be answered as asked.", "Error"),
              "404": response("The row is not in the lineage store or graph (not captured, or not indexed yet); "
                              "or the batch log has no such query or batch.", "Error"),
              "503": response("Too many queries running and waiting (see Retry-After), or the store is "
                              "unavailable.", "Error"),
              "500": response("An unexpected error; the server's log has its details.", "Error")}
    if secured:
        errors["401"] = response("No or a wrong bearer token.", "Error")
    backend = {**BACKEND.schema, "enum": api.choices(), "default": default_backend}
    paths = {}
    for route in ROUTES:
        if route.row:
            defaults = inspect.signature(getattr(api.LineageClient, route.method)).parameters
            parameters = [{"name": p.name, "in": "query", "required": False, "description": p.description,
                           "schema": p.schema} for p in ROW]
            parameters += [{"name": p.name, "in": "query", "required": False, "description": p.description,
                            "schema": {**p.schema, "default": defaults[p.name].default}} for p in route.options]
            parameters.append({"name": BACKEND.name, "in": "query", "required": False,
                               "description": BACKEND.description, "schema": backend})
        else:
            parameters = [{"name": p.name, "in": "query", "required": p.name in route.required,
                           "description": p.description, "schema": p.schema} for p in route.options]
        paths[route.path] = {"get": {"operationId": route.method, "summary": route.summary,
                                     "parameters": parameters,
                                     "responses": {"200": response("The answer.", route.answer), **errors}}}
    paths["/"] = {"get": {"operationId": "explorer", "security": [],
                          "summary": "The explorer, a page for browsers (no token needed: it holds no lineage; "
                                     "it asks /v1 with the token typed into it).",
                          "responses": {"200": {"description": "The explorer's page.",
                                                "content": {"text/html": {}}}}}}
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
            **_EXPLORER_SCHEMAS,
            "Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}}}},
    }
    if secured:
        document["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        document["security"] = [{"bearer": []}]
    return document


# Backends that read the Parquet store as it was when they were made (``parquet.StoreView``).
_SNAPSHOTS = ("csprov", "rq", "auto")


class _Clients:
    """``LineageClient``s by backend, made at a backend's first question and shared by the request threads.

    The Cypher client takes questions from any number of threads at once: its neo4j
    ``Driver`` is concurrency-safe and it opens a session (which is not) per query. A
    Parquet client (csprov, rq, and auto, which asks one when the graph does not hold the
    row) takes one question at a time: each question builds its own walk state and the
    ``StoreView``'s tables are immutable, but the generation keeps readers between
    questions (lazily built caches; open ``pq.ParquetFile``s, whose shared use Arrow does
    not promise to be safe). So each of those backends keeps a pool: a question borrows an
    idle client, or makes one, and gives it back after; the server's slots bound the
    questions running at once, and so each pool's clients. A Parquet client sees the store
    as it was when made: one made before the store changed is closed when given back
    (its question done), never lent again. ``LineageServer.close`` closes them all after
    the last question (the neo4j ``Driver.close`` is not concurrency-safe).
    """

    def __init__(self, config: Config):
        self.config = config
        self._lock = threading.Lock()
        self._shared: dict[str, api.LineageClient] = {}
        self._idle: dict[str, list[tuple[api.LineageClient, tuple]]] = {}
        self._latest: dict[str, tuple] = {}
        self._closed = False

    @contextmanager
    def lease(self, backend: str):
        """The backend's client, this question's alone where it must be."""
        if backend not in _SNAPSHOTS:
            with self._lock:
                if backend not in self._shared:
                    self._shared[backend] = api.LineageClient(self.config, backend=backend)
                client = self._shared[backend]
            yield client
            return
        stamp = store_version(self.config.store_path(), self.config.edges_topic)
        with self._lock:
            self._latest[backend] = stamp
            idle = self._idle.setdefault(backend, [])
            stale = [c for c, made in idle if made != stamp]
            idle[:] = [(c, made) for c, made in idle if made == stamp]
            client = idle.pop()[0] if idle else api.LineageClient(self.config, backend=backend)
        for old in stale:
            old.close()
        try:
            yield client
        finally:
            with self._lock:
                kept = not self._closed and self._latest[backend] == stamp
                if kept:
                    self._idle[backend].append((client, stamp))
            if not kept:
                client.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            clients = [*self._shared.values(), *(c for idle in self._idle.values() for c, _ in idle)]
            self._shared.clear()
            self._idle.clear()
        for client in clients:
            client.close()


def _batch_summary(record: dict) -> dict:
    """A batch log record as the explorer's timeline shows it."""
    status = record.get("status")
    seconds, capture = record.get("seconds"), record.get("capture_seconds")
    overhead = None
    if isinstance(seconds, (int, float)) and isinstance(capture, (int, float)):
        overhead = round(capture / max(seconds - capture, 1e-3), 4)  # as the budget counts it (capture/budget.py)
    return {"batch": record["batch"], "status": status, "gap": status != "full", "at": record.get("at"),
            "seconds": seconds, "capture_seconds": capture, "overhead": overhead,
            "rows_in": record.get("rows_in"), "rows_out": record.get("rows_out"), "edges": record.get("edges"),
            "sampled_fraction": record.get("sampled_fraction"), "error": record.get("error")}


def _shown_operators(operators: list[dict] | None) -> list[dict] | None:
    if operators is None:
        return None
    return [{k: op.get(k) for k in ("id", "kind", "name", "inputs")} for op in operators]


_FILE_FORMATS = (("parquet", "parquet"), ("orc", "orc"), ("json", "json"))


def _sink_rows(files: list[str] | None, limit: int) -> tuple[list[dict], str | None]:
    """The rows of a batch's sink files (``sink_files``), at most ``limit``: ``{"rid", "file", "position"}``
    each; and, where there are none, why.

    The paths come from the batch log, which capture wrote, never from the request.
    """
    import pyarrow as pa
    import pyarrow.dataset as ds

    from headwater.adapters.table_files import uri_path

    if not files:
        return [], "the batch log lists no sink files for this batch (not a file sink, or it wrote none)"
    rows: list[dict] = []
    missing = unreadable = 0
    for file in files:
        path = Path(uri_path(file))
        kind = next((k for marker, k in _FILE_FORMATS if marker in path.name.split(".")), None)
        if kind is None:
            unreadable += 1
            continue
        try:
            table = ds.dataset(str(path), format=kind).to_table(columns=["_hw_rid"])
        except FileNotFoundError:
            missing += 1
            continue
        except (OSError, ValueError, pa.ArrowException):  # no _hw_rid, or not of its format: say so, answer the rest
            unreadable += 1
            continue
        for position, rid in enumerate(table.column("_hw_rid").to_pylist()):
            rows.append({"rid": rid, "file": file, "position": position})
            if len(rows) >= limit:
                return rows, None
    note = None
    if missing or unreadable:
        note = f"{missing} of the batch's {len(files)} sink files are gone, {unreadable} could not be read"
    return rows, note


class _Slots:
    """``running`` queries at once; up to ``queued`` more wait for a slot, each at most ``wait_s``.

    A query that finds a slot free and nobody waiting takes it; the others wait their turn
    (first come, first served). One that finds the queue full, or whose wait runs out, is
    refused (``enter`` is False): the server answers 503 with Retry-After.
    """

    def __init__(self, running: int, queued: int, wait_s: float):
        self.running, self.queued, self.wait_s = running, queued, wait_s
        self._free = running
        self._waiting: list[threading.Event] = []  # in arrival order; the first is handed the next slot
        self._closed = False
        self._lock = threading.Lock()

    def enter(self, wait_s: float | None = None) -> bool:
        with self._lock:
            if self._closed:
                return False
            if self._free and not self._waiting:
                self._free -= 1
                return True
            if len(self._waiting) >= self.queued:
                return False
            turn = threading.Event()
            self._waiting.append(turn)
        if turn.wait(self.wait_s if wait_s is None else wait_s):
            return True
        with self._lock:
            if turn.is_set():  # handed a slot as its wait ran out: it is this query's
                return True
            self._waiting.remove(turn)
            return False

    def leave(self) -> None:
        with self._lock:
            if self._waiting:
                self._waiting.pop(0).set()  # the slot goes to the first waiting, never free in between
            else:
                self._free += 1

    def close(self, wait_s: float) -> None:
        """Refuse every query from now on, and wait (at most ``wait_s``) for those running or waiting."""
        deadline = time.monotonic() + wait_s
        with self._lock:
            self._closed = True
        while time.monotonic() < deadline:
            with self._lock:
                if self._free == self.running and not self._waiting:
                    return
            time.sleep(0.01)


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
        if url.path in self.server.explorer:
            data, content_type = self.server.explorer[url.path]
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
            body = server.ask(route, backend or server.backend, row, options) if route.row else \
                getattr(server, route.method)(**options)
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


class LineageServer(ThreadingHTTPServer):
    """The HTTP API over one config's stores; ``serve`` starts one."""

    daemon_threads = True
    # Connections the kernel holds before they are accepted: socketserver's 5 would drop a burst of clients
    # (who then wait a second to try again) before the queue of queries ever sees them.
    request_queue_size = 128

    def __init__(self, config: Config | None = None, host: str = "127.0.0.1", port: int = 8080,
                 backend: str = "auto", token: str | None = None, max_results: int = 10_000,
                 max_concurrent: int = MAX_CONCURRENT, say: Callable[[str], None] | None = None,
                 socket_timeout_s: float = SOCKET_TIMEOUT_S, max_queued: int = MAX_QUEUED,
                 queue_wait_s: float = QUEUE_WAIT_S):
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
        if token is None and not all(ipaddress.ip_address(a[4][0].split("%")[0]).is_loopback for a in found):
            raise ServeError(f"refusing to serve on {host!r} without a token: anyone who reaches it could read "
                             f"the lineage; give --token-file PATH or ${TOKEN_ENV}, or bind to 127.0.0.1")
        self.address_family = found[0][0]
        self.config = config or configuration.load()
        self.backend = backend
        self.token = token
        self.max_results = max_results
        self.max_concurrent = max_concurrent
        self.max_queued = max_queued
        self.socket_timeout_s = socket_timeout_s
        self.slots = _Slots(max_concurrent, max_queued, queue_wait_s)
        self.routes = {route.path: route for route in ROUTES}
        self.openapi = openapi(backend, secured=token is not None)
        self.explorer = {path: ((EXPLORER_DIR / name).read_bytes(), kind) for path, (name, kind) in
                         EXPLORER_FILES.items()}
        self.clients = _Clients(self.config)
        # The explorer's routes read the batch log and the plans; both keep caches a refresh mutates: one at a time.
        self._logs = threading.Lock()
        self._batch_log: BatchLog | None = None
        self._explainer = Explainer(self.config.store_path(), self.config.log_topic)
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
        """The request's route as metrics label it: a path of the document (the explorer's files: ``/``),
        else ``other``."""
        path = urlsplit(handler.path or "").path if handler.command else None
        if path in self.explorer:
            return "/"
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

    def _log(self) -> BatchLog:
        """The batch log, refreshed; hold ``_logs``."""
        if self._batch_log is None:
            self._batch_log = BatchLog(self.config.store_path(), self.config.log_topic)
        return self._batch_log.refresh()

    def queries(self) -> dict:
        """``/v1/queries``: each query with a plan kept, and how its batches were captured."""
        with self._logs:
            log = self._log()
            found = []
            for query in self._explainer.queries():
                batches = log.batches(query["name"])
                statuses = log.statuses((query["name"], b) for b in batches)
                counts = Counter(status or "unlogged" for status in statuses.values())
                last = log.batch(query["name"], batches[-1]) if batches else None
                found.append({**{k: query[k] for k in ("name", "sink", "sources", "output_columns")},
                              "batches": len(batches), "first": batches[0] if batches else None,
                              "last": batches[-1] if batches else None, "last_at": (last or {}).get("at"),
                              "statuses": dict(sorted(counts.items())),
                              "gaps": sum(n for status, n in counts.items() if status != "full")})
        return {"queries": found, "budget": self.config.overhead_budget}

    def query(self, name: str, limit: int = 500) -> dict:
        """``/v1/query``: one query's plan as operators, its latest ``limit`` batches, and its gaps."""
        with self._logs:
            log = self._log()
            described = next((q for q in self._explainer.queries() if q["name"] == name), None)
            batches = log.batches(name)
            if described is None and not batches:
                raise NotFound(f"no query {_shown(name)} in the batch log or the plans")
            statuses = log.statuses((name, b) for b in batches)
            gaps = [{"query": name, "batch": b, "status": statuses[name, b]} for b in batches
                    if statuses[name, b] != "full"]
            shown = [_batch_summary(log.batch(name, b) or {"batch": b}) for b in batches[-limit:]]
            operators = self._explainer.operators_of(name)
        described = described or {"name": name, "sink": None, "sources": [], "output_columns": None}
        return {**{k: described[k] for k in ("name", "sink", "sources", "output_columns")},
                "operators": _shown_operators(operators), "budget": self.config.overhead_budget,
                "batches": shown, "count": len(batches), "truncated": len(batches) > limit, "gaps": gaps[-limit:]}

    def batch(self, query: str, batch: int, limit: int = 1000) -> dict:
        """``/v1/batch``: one batch's record, the sink rows it wrote and the Kafka offsets it read."""
        with self._logs:
            record = self._log().batch(query, batch)
        if record is None:
            raise NotFound(f"batch {batch} of {_shown(query)} is not in the batch log")
        rows, note = _sink_rows(record.get("sink_files"), limit + 1)
        read = [{"topic": topic, "partition": partition, "first": start, "last": end - 1}
                for (topic, partition), (start, end) in sorted(offset_ranges(record.get("sources") or []).items())]
        summary = _batch_summary(record)
        return {"query": query, "batch": batch, "status": summary["status"], "gap": summary["gap"],
                "overhead": summary["overhead"], "budget": self.config.overhead_budget, "record": record,
                "rows": rows[:limit], "rows_note": note, "truncated": len(rows) > limit, "read": read}

    def where(self, dataset: str, where: str, limit: int = 100) -> dict:
        """``/v1/where``: the rids of the rows of a traced query's sink the predicate holds for.

        Only a sink some query's plan names: a token holder cannot make the server read a file of
        their choosing. Never Spark: it would run with the server's rights, in its process.
        """
        from . import where as selection

        chosen = selection.check(dataset, where)  # the name and the predicate refused before any file is read
        with self._logs:
            sinks = sorted({q["sink"] for q in self._explainer.queries() if q["sink"]})
        if str(chosen.sink) not in sinks:
            raise LineageError(f"{_shown(dataset)} is not the sink of a traced query; the sinks are: "
                               f"{', '.join(sinks) or 'none yet'}")
        found = chosen.select(limit=limit, fallback=False)
        return {"dataset": str(chosen.sink), "where": where, "rids": found.rids}

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
        self.slots.close(CLOSE_WAIT_S)
        self.clients.close()
        self._graph_probe.close()


def serve(config: Config | None = None, host: str = "127.0.0.1", port: int = 8080, backend: str = "auto",
          token: str | None = None, max_results: int = 10_000, max_concurrent: int = MAX_CONCURRENT,
          say: Callable[[str], None] | None = None, socket_timeout_s: float = SOCKET_TIMEOUT_S,
          max_queued: int = MAX_QUEUED, queue_wait_s: float = QUEUE_WAIT_S) -> LineageServer:
    """A server answering on ``host``:``port`` (0: any free port) in a thread of its own; ``.close()`` stops it.

    ``token``: every /v1 and /openapi.json request needs ``Authorization: Bearer <token>``;
    without one, only a loopback ``host`` is allowed (``ServeError``). ``say``: where the
    request log goes (default stderr). ``max_concurrent`` queries run at once; up to
    ``max_queued`` more wait for a slot, at most ``queue_wait_s`` each; beyond, 503.
    """
    return LineageServer(config, host, port, backend, token, max_results, max_concurrent, say,
                         socket_timeout_s, max_queued, queue_wait_s).start()
