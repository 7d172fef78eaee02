"""The OpenAPI 3.0 document of the HTTP API (``GET /openapi.json``), built from the route table (``routes.ROUTES``)
and from the fields of ``backend.Lineage``: a route or a field added there is in the document, and a field of a type
not mapped here fails loudly."""

from __future__ import annotations

import inspect
from dataclasses import fields
from typing import Any

import headwater

from .. import api
from ..backend import OPTIONAL_FIELDS, Lineage
from .routes import _INT64, BACKEND, ROUTES, ROW

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


def lineage_fields() -> list[str]:
    """The fields of a ``Lineage`` record as an answer gives them (the rest are the walk's own)."""
    given = set(Lineage(of=0, rid=0, kind="", dataset=None).to_dict()) | set(OPTIONAL_FIELDS)
    return [f.name for f in fields(Lineage) if f.name in given]


def _schema_of_lineage() -> dict:
    """``Lineage``'s fields as an OpenAPI schema; a field of a type not mapped here fails loudly, not silently."""
    types = {f.name: str(f.type) for f in fields(Lineage)}  # as written: backend.py's annotations are postponed
    properties = {name: _NAMED_FIELD_SCHEMAS.get(name) or _FIELD_SCHEMAS[types[name]] for name in lineage_fields()}
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
_EXPLORER_SCHEMAS: dict[str, dict] = {
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
    paths: dict[str, dict] = {}
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
    status: dict[str, Any] = {"type": "object", "required": ["status"],
                              "properties": {"status": {"type": "string"}}}
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
    document: dict[str, Any] = {
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

