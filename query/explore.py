"""What the explorer shows beside lineage, read from the batch log and the kept plans: the traced queries and
their batches' capture at a glance (``Explorer.queries``), one query's plan and batches (``query``), one batch's
record, sink rows and Kafka offsets (``batch``), and the rows of a sink a predicate selects (``where``). The HTTP
API's explorer routes are answered by these methods; each answer is an object of the schema the OpenAPI document
names for its route (``http/openapi.py``).
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

from headwater.core import openlineage
from headwater.core.config import Config
from headwater.core.offsets import offset_ranges
from headwater.store.batch_log import BatchLog

from .errors import LineageError
from .explain import Explainer
from .question import quoted


class NotFound(LineageError):
    """The batch log has no such query or batch (404)."""


class Explorer:
    """The explorer's answers over one config's batch log and plans. The routes run in the HTTP server's threads;
    the batch log and the plans keep caches a refresh mutates, so one answer reads them at a time."""

    def __init__(self, config: Config):
        self.config = config
        self._logs = threading.Lock()
        self._batch_log: BatchLog | None = None
        self._explainer = Explainer(self.config.store_uri(), self.config.log_topic)

    def _log(self) -> BatchLog:
        """The batch log, refreshed; hold ``_logs``."""
        if self._batch_log is None:
            self._batch_log = BatchLog(self.config.store_uri(), self.config.log_topic)
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
                raise NotFound(f"no query {quoted(name)} in the batch log or the plans")
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
            raise NotFound(f"batch {batch} of {quoted(query)} is not in the batch log")
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

        as_named = openlineage.parse(dataset)  # a sink by its OpenLineage name, as a catalog's page links to it
        if as_named is not None:
            dataset = self._explainer.openlineage_names().get(as_named, dataset)
        chosen = selection.check(dataset, where)  # the name and the predicate refused before any file is read
        with self._logs:
            sinks = sorted({q["sink"] for q in self._explainer.queries() if q["sink"]})
        if str(chosen.sink) not in sinks:
            raise LineageError(f"{quoted(dataset)} is not the sink of a traced query; the sinks are: "
                               f"{', '.join(sinks) or 'none yet'}")
        found = chosen.select(limit=limit, fallback=False)
        return {"dataset": str(chosen.sink), "where": where, "rids": found.rids}


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

    from headwater.spark.table_files import uri_path

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

