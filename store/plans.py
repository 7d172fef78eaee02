"""Queries' plans in the store, for the log-only fallback and for naming what answers cross.

Capture logs a query's plans in its LOG_PLAN record, once per start and per plan change,
with ``from_batch``: the first batch the plan made. The indexer keeps of each, durable
before the record's offset is committed, one row of a Delta table (``tables.py``, locally or in S3):

    <store>/<log topic>/plans/…   ``query``, ``from_batch``, ``fingerprint``, ``plan`` (JSON)

The plan holds the optimized plan (``optimized``, ``capture/spark_plan.optimized_records``: what
inference replays), the plan IR (``ir``, ``headwater.core.plan``: the node ids lineage's ``ops``
name), the sink's columns (``output_columns``: what ``cols`` masks are over), ``sources``,
``state`` (the stateful aggregates), ``sink`` and ``at``. Plans kept before the IR was (no ``ir``,
``output_columns``, ``state``) load as they are; the query tier then names operators by id
(``query/explain.py``).

A row is committed whole, so a reader sees a plan or no plan; a record indexed twice adds a row
that says the same, read as one. The plan a batch ran is the one with the greatest
``from_batch`` not after it. A reader holds the plans and reads the table again only when its
version changed (``stamp``).
"""

from __future__ import annotations

import json
import os
import re

import pyarrow as pa

from .tables import Location, Table

TABLE_SCHEMA = pa.schema([("query", pa.string()), ("from_batch", pa.int64()), ("fingerprint", pa.string()),
                          ("plan", pa.string())])


class PlanStore:
    """The plans of one log topic's queries."""

    def __init__(self, store: "str | os.PathLike | Location", log_topic: str):
        if "/" in log_topic:
            raise ValueError(f"topic name {log_topic!r} cannot name a store folder (no '/')")
        self.table = Table(Location.of(store).child(log_topic, "plans"), TABLE_SCHEMA)
        self._version: int | None = None
        self._read: set[str] = set()  # the files read
        self._plans: dict[str, dict[int, dict]] = {}  # by query, by from_batch

    def write(self, query: str, from_batch: int, fingerprint: str, plan: dict) -> None:
        """Keep ``plan`` (the optimized records and what the query tier needs beside them)."""
        if not re.fullmatch(r"[0-9a-f]+", fingerprint or ""):
            raise ValueError(f"a plan fingerprint is hex digits, not {fingerprint!r}")
        kept = {"query": query, "from_batch": int(from_batch), "fingerprint": fingerprint, **plan}
        row = pa.table({"query": [query], "from_batch": [int(from_batch)], "fingerprint": [fingerprint],
                        "plan": [json.dumps(kept)]}, schema=TABLE_SCHEMA)
        self.table.commit([self.table.write_file(row)])

    def stamp(self) -> int | None:
        """Changes whenever a plan is kept: the table's version."""
        return self.table.version()

    def _refresh(self, version: int | None = None) -> dict[str, dict[int, dict]]:
        """The plans as of ``version`` of the table (a ``stamp`` read already; else its latest)."""
        version = self.stamp() if version is None else version
        if version is not None and version != self._version:
            files = self.table.files(version).to_pylist()
            # Oldest first: a plan kept again for the same batch (a replay says the same) reads as the last one.
            new = [f["path"] for f in sorted(files, key=lambda f: f["modification_time"])
                   if f["path"] not in self._read]
            for rows in self.table.read_each(new, TABLE_SCHEMA.names).values():
                for query, from_batch, plan in zip(rows["query"].to_pylist(), rows["from_batch"].to_pylist(),
                                                   rows["plan"].to_pylist()):
                    self._plans.setdefault(query, {})[from_batch] = json.loads(plan)
            self._read |= set(new)
            self._version = version
        return self._plans

    def plan_for(self, query: str, batch: int) -> dict | None:
        """The plan batch ``batch`` of ``query`` ran, or None if none is kept."""
        found = [start for start in self._refresh().get(query, {}) if start <= batch]
        return self._plans[query][max(found)] if found else None

    def starts(self, query: str) -> list[int]:
        """The ``from_batch`` of each plan of ``query`` kept, in order."""
        return sorted(self._refresh().get(query, {}))

    def queries(self) -> list[str]:
        """Every query with a plan kept."""
        return sorted(self._refresh())

    def kept(self, stamp: int | None = None) -> list[tuple[str, int, dict]]:
        """Every plan kept: ``(query, from_batch, plan)``, by query, then in ``from_batch`` order; as of ``stamp``
        when given (one look at the table's log fewer)."""
        plans = self._refresh(stamp)
        return [(query, start, plans[query][start]) for query in sorted(plans) for start in sorted(plans[query])]

    def latest(self, query: str) -> dict | None:
        return self.plan_for(query, 10**18)
