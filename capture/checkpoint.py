"""What capture keeps in a query's checkpoint: the fingerprint of the plan it last ran, and since when.

A query restarted from its checkpoint with changed code runs a different plan from
the next batch on; the log's plan record then says so (``previous_fingerprint``,
``from_batch``), which tells the query tier and the log-only fallback which plan made
which batches. The batch each plan first ran (``Recorded.since``, and the previous plan's) names the
OpenLineage run of the plan (``openlineage.py``): a restart with the same plan continues it.
Local checkpoints (paths, ``file:`` URIs) only; elsewhere changes across
restarts are not detected, and the plan record says nothing of a previous plan.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlparse

PLAN_FILE = "headwater-plan.json"


def local_folder(location: str | None) -> Path | None:
    """The local folder of a checkpoint location, or None where it is not local."""
    if not location:
        return None
    parsed = urlparse(location)
    if parsed.scheme in ("", "file"):
        return Path(parsed.path if parsed.scheme else location)
    return None


def next_batch(folder: Path) -> int:
    """The batch the query will run next: one past the last committed batch."""
    try:
        done = [int(p.name) for p in (folder / "commits").iterdir() if p.name.isdigit()]
    except FileNotFoundError:
        return 0
    return max(done, default=-1) + 1


class Recorded(NamedTuple):
    previous: str | None  # the fingerprint of the plan the last run ran; None: no run before
    from_batch: int  # the batch this run runs first
    since: int  # the batch this run's plan first ran: ``from_batch``, or earlier if the last run had the same plan
    previous_since: int | None = None  # where the plan changed: the batch the previous plan first ran, if known


def record_plan(folder: Path, fingerprint: str) -> Recorded:
    """Note the plan this run uses, and since when it runs."""
    path = folder / PLAN_FILE
    try:
        kept = json.loads(path.read_text())
    except (OSError, ValueError):
        kept = {}
    previous = kept.get("fingerprint")
    start = next_batch(folder)
    if previous == fingerprint:
        return Recorded(previous, start, int(kept.get("from_batch", start)))
    folder.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"fingerprint": fingerprint, "from_batch": start}))
    os.replace(tmp, path)
    before = kept.get("from_batch")
    return Recorded(previous, start, start, int(before) if previous is not None and before is not None else None)
