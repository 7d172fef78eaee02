"""Prometheus metrics of narrowing ahead (``follow.py``), ``headwater_narrowing_*``.

Narrowing that falls behind: ``headwater_narrowing_lag_seconds`` (since the oldest black-box batch
waiting for its narrowing ran) growing, or ``headwater_narrowing_batches_waiting`` above zero while
``rate(headwater_narrowing_batches_total[10m]) == 0`` (deploy/prometheus/rules.yaml).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

WAITING = Gauge("headwater_narrowing_batches_waiting", "Black-box batches in the batch log not narrowed yet")
LAG = Gauge("headwater_narrowing_lag_seconds",
            "Seconds since the oldest black-box batch waiting for its narrowing ran (0: none waits)")
NARROWED = Counter("headwater_narrowing_batches", "Black-box batches narrowed ahead, by the class re-running found "
                   "(dispatcher, grouped, per key, superset)", ["kind"])
KINDS = ("dispatcher", "grouped", "per key", "superset")
for _kind in KINDS:  # each class's series from the start, at 0
    NARROWED.labels(_kind)
SECONDS = Histogram("headwater_narrowing_seconds", "Time to narrow one black-box batch (read back, re-run, checks)",
                    buckets=(0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200))
