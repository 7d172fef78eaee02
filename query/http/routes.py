"""The HTTP API's routes, as one table (``ROUTES``): each path, the method that answers it, its parameters (``Param``:
the OpenAPI schema and how the text is read), and ``parse_query``, which reads a request's query string by it.

A lineage question's options are read as ``question.READS`` reads them, and the question as a whole is checked by
``question.Question``, as the CLI and ``LineageClient`` check it; the explorer's parameters (a query's name, a batch,
a limit, a sink and a predicate) are read here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import parse_qsl

from .. import api
from ..address import SOURCE_FORMS, checked_source
from ..errors import LineageError
from ..question import (
    MAX_DEPTH,
    MAX_PATHS,
    READS,
    Question,
    quoted,
    read_cols,
    read_depth,
    read_paths,
    read_payload,
    read_rid,
)
from ..where import MAX_SELECTED

MAX_PARAMETERS = 16
MAX_LIMIT = 10_000  # the most batches, rows or rids an explorer route answers with


def _backend(text: str) -> str:
    if text not in api.choices():
        raise LineageError(f"backend is one of {', '.join(api.choices())}, not {quoted(text)}")
    return text


def _name(text: str) -> str:
    if len(text) > 256 or not text.isprintable():
        raise LineageError(f"a query's name is at most 256 printable characters, not {quoted(text)}")
    return text


def _batch(text: str) -> int:
    if not re.fullmatch(r"[0-9]{1,19}", text) or int(text) >= 1 << 63:
        raise LineageError(f"batch is a batch id, a non-negative 64-bit integer, not {quoted(text)}")
    return int(text)


def _limit(text: str) -> int:
    if not re.fullmatch(r"[0-9]{1,5}", text) or not 1 <= int(text) <= MAX_LIMIT:
        raise LineageError(f"limit is from 1 to {MAX_LIMIT}, not {quoted(text)}")
    return int(text)


def _selected(text: str) -> int:
    if not re.fullmatch(r"[0-9]{1,5}", text) or not 1 <= int(text) <= MAX_SELECTED:
        raise LineageError(f"limit is from 1 to {MAX_SELECTED}, not {quoted(text)}")
    return int(text)


def _dataset(text: str) -> str:
    if len(text) > 4096 or not text.isprintable():
        raise LineageError(f"dataset is a sink as lineage names it (parquet:PATH, …), not {quoted(text)}")
    return text


@dataclass(frozen=True)
class Param:
    """A query parameter: its OpenAPI schema, and how its text becomes the value the answering method takes."""

    name: str
    schema: dict
    description: str
    parse: Callable[[str], Any]  # as question.READS: each parameter's value is of a type of its own


@dataclass(frozen=True)
class Route:
    """``GET path``, answered by ``method``.

    A lineage route (``row``) asks about one row, which exactly one of ``ROW`` names, and is
    answered by ``LineageClient.<method>(rid, **options)``, a ``backend.Answer``; the document
    takes its options' defaults from that method's signature. The explorer's routes are
    answered by ``explore.Explorer.<method>(**options)``, an object of the schema ``answer``;
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
    Param("rid", _INT64, "The row's rid (e.g. a sink row's _hw_rid). Exactly one of rid and source.", read_rid),
    Param("source", {"type": "string"}, f"The row's address: {SOURCE_FORMS}. Exactly one of rid and source.",
          checked_source),
)
BACKEND = Param("backend", {"type": "string"}, "cypher: the graph store; csprov: the Parquet store by connected "
                "sets; rq: the Parquet store scanned whole; auto: the graph when it answers and holds the row, else "
                "the Parquet store. Default: the server's.", _backend)
TO = Param("to", {"type": "string"}, "The rows answered: source, state or output rows, or the rows of the "
           "dataset it names (an unknown name: no rows).", READS["to"])
DEPTH = Param("depth", {"type": "integer", "minimum": 1, "maximum": MAX_DEPTH}, "Longest path followed, in edges "
              "(each way, for the co- questions).", read_depth)
PAYLOAD = Param("payload", {"type": "boolean"}, "Add each row's original source record (Kafka by offset, Parquet "
                "file rows by position, file-backed static tables by key).", read_payload)


SINCE = Param("since", {"type": "string", "format": "date-time"}, "Time bound: only through batches that ran at "
              "or after this ISO 8601 time (the batch log's time of each).", READS["since"])
UNTIL = Param("until", {"type": "string", "format": "date-time"}, "Time bound: only through batches that ran at "
              "or before this time.", READS["until"])
LINEAGE_OPTIONS = (
    TO, DEPTH, PAYLOAD, SINCE, UNTIL,
    Param("cols", {"type": "string"}, "Attribute level: a bit mask (decimal, 0x… or 0b…) of the columns of the row "
          "asked about (backward) or of the rows answered (forward).", read_cols),
    Param("paths", {"type": "integer", "minimum": 0, "maximum": MAX_PATHS}, "How-provenance: keep up to this "
          "many paths per row, each a list of [query, batch, op] steps in data-flow order.", read_paths),
)
CO_OPTIONS = (
    TO, Param("via", {"type": "string"}, "The rows in between: source, state or output rows, or a dataset.",
              READS["via"]),
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
            raise LineageError(f"unknown parameter {quoted(name)}; known: {', '.join(known) or 'none'}")
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
    if row is not None:  # a lineage route's
        options = Question(route.method, row, options).options  # the question as a whole (since before until)
    backend = BACKEND.parse(given["backend"]) if "backend" in given else None
    return backend, row, options

