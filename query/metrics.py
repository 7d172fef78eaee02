"""Prometheus metrics of the query service, ``headwater_query_*``, served at its ``/metrics``.

A registry of the service's own (with the process's CPU, memory and file descriptors),
so that the metrics of modules it merely imports (the indexer's) are not served as if it
reported them. ``route`` is a path the server knows (``/v1/lineage/backward``,
``/healthz``, …) or ``other``, never the URL asked for, so a scanner cannot make series
without end.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

REGISTRY = CollectorRegistry()
ProcessCollector(registry=REGISTRY)

OTHER = "other"  # the route of a path the server does not know, and of a request it could not read

REQUEST_SECONDS = Histogram("headwater_query_request_seconds",
                            "Requests by route and status: from reading the request to the answer sent",
                            ["route", "status"], registry=REGISTRY,
                            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
ERRORS = Counter("headwater_query_errors", "Answers with a 5xx status (internal errors, store unavailable, "
                 "too many queries), by route", ["route"], registry=REGISTRY)
IN_FLIGHT = Gauge("headwater_query_in_flight", "Requests being read or answered now", registry=REGISTRY)


def record(route: str, status: int, seconds: float) -> None:
    """Count one answered request (a connection closed before any request, as a TCP probe's, is none)."""
    REQUEST_SECONDS.labels(route, str(status)).observe(seconds)
    if status >= 500:
        ERRORS.labels(route).inc()
