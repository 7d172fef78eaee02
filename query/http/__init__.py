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

To add a query: one ``Route`` in ``routes.ROUTES`` (its path, the method that answers it, its
options); the request handler and the OpenAPI document are both built from that table.
A lineage route is answered by a ``LineageClient`` method, whose signature gives the
document's defaults; the explorer's by a method of ``explore.Explorer``.

The package's modules: ``routes`` (the table, and reading a query string by it), ``openapi``
(the document), ``handler`` (one request), ``gate`` (slots and shared clients), ``server``
(``LineageServer`` and ``serve``).

Queries run ``max_concurrent`` at a time; up to ``max_queued`` more wait for a slot, each
at most ``queue_wait_s``, and beyond that get 503 with Retry-After.

``serve`` starts a server in a thread and returns it (``.port``, ``.close()``);
``headwater serve`` runs one until SIGINT or SIGTERM.
"""


from .gate import Slots
from .openapi import lineage_fields, openapi
from .routes import BACKEND, ROUTES, ROW, parse_query
from .server import (
    EXPLORER_DIR,
    EXPLORER_FILES,
    MAX_CONCURRENT,
    MAX_QUEUED,
    QUEUE_WAIT_S,
    TOKEN_ENV,
    LineageServer,
    ServeError,
    serve,
)

__all__ = ["BACKEND", "EXPLORER_DIR", "EXPLORER_FILES", "MAX_CONCURRENT", "MAX_QUEUED", "QUEUE_WAIT_S", "ROUTES",
           "ROW", "TOKEN_ENV", "LineageServer", "ServeError", "Slots", "openapi", "parse_query", "lineage_fields",
           "serve"]
