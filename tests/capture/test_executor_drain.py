"""Capture on a cluster: an executor journals on its own host and starts the drain that sends it.

A real Spark cluster of one executor JVM (``local-cluster``) runs a traced file stream in a process
of its own (``tests/cluster_stream.py``). The executor's environment gives it a journal folder that
is not the tracer's, as a host of its own would have; no tracer drains that folder, so the lineage
reaches the stores only if the executor's journal filter started ``headwater drain`` there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from headwater.capture.delivery import Destination
from headwater.capture.journal import LOCK, ROWS
from headwater.core.schema import LOG_BATCH
from tests.capture.test_faults import graph_edges
from tests.conftest import index, own_topics, read_log

FILES = 3
ROWS_PER_FILE = 50
ROOT = Path(__file__).resolve().parents[2]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


def drain_pid(folder: Path) -> int | None:
    """The PID the folder's drain wrote into its lock file, if one ran."""
    try:
        return int((folder / LOCK).read_text().strip() or 0) or None
    except (FileNotFoundError, ValueError):
        return None


def test_an_executor_starts_the_drain_of_its_own_journal(stack_config, tmp_path):
    config, tag = own_topics(stack_config, "cluster")
    config = config.with_overrides(spill_dir=str(tmp_path / "driver-spill"))
    name = f"cluster-{tag}"
    executor_spill = tmp_path / "executor-spill"
    executor_folder = Destination(config.bootstrap, config.edges_topic).folder(executor_spill)  # the job's own
    folder = tmp_path / "in"
    folder.mkdir()
    for number in range(FILES):
        rows = [{"id": number * 10_000 + i, "v": i} for i in range(ROWS_PER_FILE)]
        pq.write_table(pa.Table.from_pylist(rows), folder / f"part-{number}.parquet")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HEADWATER_HOME": str(tmp_path / "home"),
           "PYSPARK_PYTHON": sys.executable,
           **{f"HEADWATER_{k.upper()}": str(v) for k, v in config.to_dict().items()}}
    try:
        done = subprocess.run([sys.executable, "-m", "tests.cluster_stream", name, str(folder), str(tmp_path / "sink"),
                               str(tmp_path / "checkpoint"), str(executor_spill), str(FILES)],
                              env=env, cwd=ROOT, capture_output=True, text=True, timeout=400)
        assert done.returncode == 0, done.stderr[-3000:]
        out = json.loads(done.stdout.strip().splitlines()[-1])
        assert out["executors"] == ["0"]  # an executor JVM, not the driver's
        deadline = time.monotonic() + 90
        while True:
            left = [p.name for p in executor_folder.glob("*") if p.name.endswith((ROWS, ".msg"))]
            if drain_pid(executor_folder) and not left:
                break
            assert time.monotonic() < deadline, f"the executor's journal was not drained: {left}"
            time.sleep(0.5)
        assert alive(drain_pid(executor_folder)), "the executor's drain process is gone before its idle time"
    finally:  # the drain outlives the executor that started it: stop it by its PID
        pid = drain_pid(executor_folder)
        if pid is not None and alive(pid):
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 30
            while alive(pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert not alive(pid), f"drain process {pid} did not stop"
    assert not any(p.name.endswith(ROWS) for p in (tmp_path / "driver-spill").rglob("*"))

    index(config)
    rid_of = {rid: row_id for row_id, rid in out["rows"]}
    expected = {(f"part-{i // 10_000}.parquet", i % 10_000, i) for i in rid_of.values()}
    assert len(expected) == FILES * sum(1 for v in range(ROWS_PER_FILE) if v % 3 != 0)
    edges = [(path.rsplit("/", 1)[-1], position, rid_of[dst]) for path, position, dst in graph_edges(config, name)]
    assert len(edges) == len(set(edges)) and set(edges) == expected
    batches = [r for r in read_log(config) if r["schema"] == LOG_BATCH and r["query"] == name]
    assert sorted(r["batch"] for r in batches) == list(range(FILES))
    assert all(r["status"] == "full" and r["edges"] == len(expected) // FILES for r in batches), batches
