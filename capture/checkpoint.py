"""What capture keeps in a query's checkpoint: the fingerprint of the plan it last ran.

A query restarted from its checkpoint with changed code runs a different plan from
the next batch on; the log's plan record then says so (``previous_fingerprint``,
``from_batch``), which tells the query tier and the log-only fallback which plan made
which batches. Local checkpoints (paths, ``file:`` URIs) only; elsewhere changes across
restarts are not detected, and the plan record says nothing of a previous plan.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
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


def record_plan(folder: Path, fingerprint: str) -> tuple[str | None, int]:
    """Note the plan this run uses; returns (the previous run's fingerprint or None, first batch)."""
    path = folder / PLAN_FILE
    try:
        previous = json.loads(path.read_text()).get("fingerprint")
    except (OSError, ValueError):
        previous = None
    start = next_batch(folder)
    if previous != fingerprint:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"fingerprint": fingerprint, "from_batch": start}))
        os.replace(tmp, path)
    return previous, start
