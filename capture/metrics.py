"""Prometheus metrics of capture, ``headwater_capture_*``, labelled by traced query.

They live in prometheus-client's default registry, one set per process, so several
tracers in one job share them; ``serve(port)`` exposes them on the ``metrics_host`` setting's
address, 127.0.0.1 by default (the caller stops the server it got).
"""

from __future__ import annotations

from wsgiref.simple_server import WSGIServer

from prometheus_client import Counter, Gauge, Histogram, start_http_server

EDGES = Counter("headwater_capture_edges",
                "Lineage edges captured: journaled by the tasks, then sent to the edges topic", ["query"])
BYTES = Counter("headwater_capture_bytes", "Bytes of lineage payloads sent to the edges topic", ["query"])
MESSAGES = Counter("headwater_capture_messages", "Lineage payloads sent to the edges topic", ["query"])
DROPPED_EDGES = Counter("headwater_capture_dropped_edges",
                        "Edges captured but not journaled: the journal was full (their batch is logged as a gap)",
                        ["query"])
SPILLED_EDGES = Counter("headwater_capture_spilled_edges",
                        "Edges journaled while the broker was away (sent when it returns)", ["query"])
SPILL_BYTES = Gauge("headwater_capture_spill_bytes", "Bytes waiting in the journal and spill folder for the broker")
BUFFER_DEPTH = Gauge("headwater_capture_buffer_depth",
                     "Files waiting in the journal and spill folder, and log records queued, for the broker")
BATCHES = Counter("headwater_capture_batches", "Micro-batches by capture status", ["query", "status"])
PUBLISH_SECONDS = Histogram("headwater_capture_publish_seconds",
                            "Capture's time in a micro-batch: its own jobs, and its time in the user's tasks "
                            "spread over the cores", ["query"])
DELIVERY_SECONDS = Histogram("headwater_capture_delivery_seconds",
                             "From a task journaling lineage to its payloads being sent or spilled", ["query"],
                             buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, float("inf")))
OVERHEAD_RATIO = Gauge("headwater_capture_overhead_ratio",
                       "Last batch: capture time over the rest of the batch's time", ["query"])
JOB_SECONDS = Counter("headwater_capture_job_seconds",
                      "Spark job time of traced queries' micro-batches, by part: the user's work or capture's",
                      ["query", "part"])
TASK_SECONDS = Counter("headwater_capture_task_seconds",
                       "Time capture spent inside the user's tasks (journaling lineage)", ["query"])
LISTENER_LAG_SECONDS = Gauge("headwater_capture_listener_lag_seconds",
                             "Last batch: from its end to its progress reaching the listener", ["query"])
OPENLINEAGE_EVENTS = Counter("headwater_capture_openlineage_events",
                             "OpenLineage events of traced queries, by type (START, RUNNING, COMPLETE, FAIL) and "
                             "outcome (sent, failed)", ["query", "event", "outcome"])
# The budget beside the ratio, so that an alert can compare the two per query (deploy/prometheus/rules.yaml).
OVERHEAD_BUDGET = Gauge("headwater_capture_overhead_budget",
                        "The query's overhead budget: capture time over the batch's own time it allows; 0: no limit",
                        ["query"])


def record_batch(query: str, status: str, stats: dict, publish_seconds: float) -> None:
    """Count one micro-batch's capture, from the per-batch hook's figures."""
    EDGES.labels(query).inc(stats.get("edges", 0))
    SPILLED_EDGES.labels(query).inc(stats.get("spilled_edges", 0))
    DROPPED_EDGES.labels(query).inc(stats.get("dropped_edges", 0))
    BATCHES.labels(query, status).inc()
    PUBLISH_SECONDS.labels(query).observe(publish_seconds)


def record_sent(query: str, messages: int, size: int, seconds: float) -> None:
    """Count one journal file's payloads sent (or spilled) by a drain, ``seconds`` after it was journaled."""
    MESSAGES.labels(query).inc(messages)
    BYTES.labels(query).inc(size)
    DELIVERY_SECONDS.labels(query).observe(seconds)


def overhead_ratio(publish_seconds: float, batch_seconds: float) -> float:
    """Publishing time over the time the batch would have taken without it."""
    return publish_seconds / max(batch_seconds - publish_seconds, 1e-3)


def serve(port: int, host: str | None = None) -> WSGIServer:
    """Start the ``/metrics`` endpoint on ``host`` (default: the effective config's ``metrics_host``);
    returns the server, whose ``shutdown()`` stops it."""
    if host is None:
        from headwater.core import config as configuration

        host = configuration.load().metrics_host
    try:
        server, _ = start_http_server(port, addr=host)
    except OSError as exc:
        raise OSError(f"cannot serve metrics on {host}:{port} ({exc}); choose a free port, or 0 for none") from exc
    return server
