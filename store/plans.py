"""Queries' plans in the Parquet store, for the log-only fallback and for naming what answers cross.

Capture logs a query's plans in its LOG_PLAN record, once per start and per plan change,
with ``from_batch``: the first batch the plan made. The indexer keeps of each, durable
before the record's offset is committed, one JSON file per plan: the optimized plan
(``optimized``, ``capture/spark_plan.optimized_records``: what inference replays), the
plan IR (``ir``, ``headwater.core.plan``: the node ids lineage's ``ops`` name), the sink's
columns (``output_columns``: what ``cols`` masks are over), ``sources``, ``state`` (the
stateful aggregates), ``sink`` and ``at``. Plans kept before the IR was (no ``ir``,
``output_columns``, ``state``) load as they are; the query tier then names operators by id
(``query/explain.py``).

    <store_dir>/<log topic>/plans/<query, hex>/<from_batch, 12 digits>-<fingerprint>.json

Files are written whole (temporary name, fsync, rename), so a reader sees a plan or no
plan, and a record indexed twice writes the same file again. The plan a batch ran is the
one with the greatest ``from_batch`` not after it.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from pathlib import Path

from .batch_log import fsync_dir

_FILE = re.compile(r"^(\d{12})-([0-9a-f]+)\.json$")


class PlanStore:
    """The plans of one log topic's queries."""

    def __init__(self, store_dir: str | Path, log_topic: str):
        self.store_dir = Path(store_dir)
        self.log_topic = log_topic

    def write(self, query: str, from_batch: int, fingerprint: str, plan: dict) -> Path:
        """Keep ``plan`` (the optimized records and what the query tier needs beside them)."""
        if not re.fullmatch(r"[0-9a-f]+", fingerprint or ""):
            raise ValueError(f"a plan fingerprint is hex digits, not {fingerprint!r}")
        folder = self._folder(query)
        folder.mkdir(parents=True, exist_ok=True)
        final = folder / f"{int(from_batch):012d}-{fingerprint}.json"
        temporary = folder / f".{final.name}.{uuid.uuid4().hex}.tmp"
        with open(temporary, "w") as out:
            json.dump({"query": query, "from_batch": int(from_batch), "fingerprint": fingerprint, **plan}, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, final)
        fsync_dir(folder)
        return final

    def plan_for(self, query: str, batch: int) -> dict | None:
        """The plan batch ``batch`` of ``query`` ran, or None if none is kept."""
        folder = self._folder(query)
        if not folder.is_dir():
            return None
        found = sorted((int(m.group(1)), name) for name in os.listdir(folder) if (m := _FILE.match(name))
                       and int(m.group(1)) <= batch)
        if not found:
            return None
        with open(folder / found[-1][1]) as f:
            return json.load(f)

    def starts(self, query: str) -> list[int]:
        """The ``from_batch`` of each plan of ``query`` kept, in order."""
        folder = self._folder(query)
        if not folder.is_dir():
            return []
        return sorted(int(m.group(1)) for name in os.listdir(folder) if (m := _FILE.match(name)))

    @property
    def root(self) -> Path:
        return self.store_dir / self.log_topic / "plans"

    def _folder(self, query: str) -> Path:
        return self.root / query.encode().hex()

    def folders(self) -> list[str]:
        """The folder of each query with a plan kept (its name in hex), for ``stamp``."""
        try:
            return sorted(name for name in os.listdir(self.root) if re.fullmatch(r"[0-9a-f]+", name))
        except FileNotFoundError:
            return []

    def queries(self) -> list[str]:
        """Every query with a plan kept."""
        return [bytes.fromhex(name).decode() for name in self.folders()]

    def stamp(self, folders: list[str]) -> tuple:
        """What changes whenever a plan is kept: the modification times of the plans folder (a new query's) and of
        each of the query ``folders`` (a new plan), as ``folders()`` listed them; a reader that holds the plans
        reads them again only then, and between plans asks a stat per folder, no listing."""
        try:
            return (self.root.stat().st_mtime_ns,
                    tuple((name, (self.root / name).stat().st_mtime_ns) for name in folders))
        except FileNotFoundError:
            return ()

    def kept(self, folders: list[str] | None = None) -> list[tuple[str, int, Path]]:
        """Every plan kept (in ``folders``, as ``folders()`` listed them, when given): ``(query, from_batch, file)``,
        by query, then in ``from_batch`` order (``read`` a file)."""
        found = []
        for name in self.folders() if folders is None else folders:
            try:
                listed = sorted(n for n in os.listdir(self.root / name) if _FILE.match(n))
            except FileNotFoundError:
                continue  # a query's folder gone meanwhile
            query = bytes.fromhex(name).decode()
            found += [(query, int(match.group(1)), self.root / name / n) for n in listed if (match := _FILE.match(n))]
        return found

    @staticmethod
    def read(path: Path) -> dict | None:
        """One kept plan's file, or None if it is gone or unreadable."""
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def latest(self, query: str) -> dict | None:
        return self.plan_for(query, 10**18)

