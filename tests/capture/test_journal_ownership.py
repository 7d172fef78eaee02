"""Journals and spills belong to their job: lineage journaled for one destination (broker and edges topic)
is sent there and nowhere else, whoever else drains the host's journal folder (``spill_dir``).

Each test lets another drain (a second tracer of the process, a tracer left open, another Spark
application, a ``headwater drain``) wake over the folder while a job's lineage waits on disk (the job's
own tracer holds it as a running batch's, ``shipping.InFlight``), then checks every topic edge by edge:
each job's edges on its own topic, exactly, and none on another's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from headwater.capture import attach, jar, shipping
from headwater.capture.journal import PROPERTY, Setting
from headwater.capture.listener import progress_record
from headwater.core.schema import LOG_PROGRESS
from tests.capture.test_journal import N, outputs, source_frame
from tests.conftest import edges_published, own_topics

WAKES_S = 2.5  # two wakes of every tracer's thread


@pytest.fixture(autouse=True)
def batches_hold_the_journal(monkeypatch):
    """A batch's journal waits for its progress record up to 60 s, not 5: a busy machine's Spark job may
    take longer, and the test must choose when the job's own drain may send."""
    monkeypatch.setattr(shipping, "DRAIN_DEFER_S", 60.0)


def expected(batch: int) -> set[tuple[int, int]]:
    """The edges ``journal`` makes for ``batch``: ``source_frame``'s, shifted per batch."""
    return {(1000 + i * 7919 + batch, i * 7777 + batch) for i in range(N)}


def journal(spark, tracer, query: str, batch: int) -> None:
    """Journal one batch of ``query`` through ``tracer``'s filter, as a running batch's (held)."""
    tracer.shipper.batch_started(query, batch)
    frame = source_frame(spark).select((F.col("_hw_rid") + batch).alias("_hw_rid"),
                                       F.col("src").withField("rid", F.col("src.rid") + batch).alias("src"))
    column = tracer.journals.column(outputs(query), jar.Counts.make(spark, query), frame,
                                    [F.col("_hw_rid"), F.col("src")])
    spark.sparkContext.setLocalProperty(PROPERTY, Setting(batch, None, None, {}).to_json())
    try:
        assert frame.where(column).count() == N
    finally:
        spark.sparkContext.setLocalProperty(PROPERTY, None)


def batch_over(tracer, query: str, batch: int) -> None:
    """The progress record of ``query``'s ``batch``: its tracer's thread may send the batch's journal."""
    progress = {"batchId": batch, "runId": "r", "numInputRows": N, "durationMs": {}, "sources": [], "timestamp": None}
    tracer.shipper.publish_log(LOG_PROGRESS, **progress_record(progress, query))


def journaled(root: Path) -> list[Path]:
    return sorted(root.rglob("*.rows"))


def wait_sent(root: Path, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while journaled(root) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not journaled(root), f"still journaled after {timeout_s:g} s: {journaled(root)}"


def edges_on(config) -> set[tuple[int, int]]:
    return {(edge["src"], edge["dst"]) for _, edge in edges_published(config)}


def test_two_tracers_of_one_process_each_send_only_their_own_journal(spark, stack_config, tmp_path):
    """Two tracers of one session, each with topics of its own, one spill folder: while one tracer's
    batch runs, the other tracer's thread wakes over the folder and takes none of its journal; by turns."""
    first, tag = own_topics(stack_config, "own")
    second, _ = own_topics(stack_config, "own")
    first, second = (c.with_overrides(spill_dir=str(tmp_path)) for c in (first, second))
    tracers = {"a": attach(spark, first), "b": attach(spark, second)}
    try:
        for batch in range(2):
            for name, tracer in tracers.items():
                journal(spark, tracer, f"{name}{tag}", batch)
                time.sleep(WAKES_S)
                assert len(journaled(tmp_path)) == 3, "the other tracer sent a running batch's journal"
                batch_over(tracer, f"{name}{tag}", batch)
                wait_sent(tmp_path)
    finally:
        for tracer in tracers.values():
            tracer.close()
    assert edges_on(first) == expected(0) | expected(1)
    assert edges_on(second) == expected(0) | expected(1)


def test_a_tracer_left_open_takes_nothing_of_a_new_tracers_journal(spark, stack_config, tmp_path):
    """A tracer attached and never closed (as after a ``start()`` that raised) beside a new one of other
    topics: three batches of the new one's wait on disk through the old one's wakes, then reach the new
    one's topic, every edge, and the old one's topic gets none."""
    old, _ = own_topics(stack_config, "left")
    new, tag = own_topics(stack_config, "new")
    old, new = (c.with_overrides(spill_dir=str(tmp_path)) for c in (old, new))
    left_open = attach(spark, old)
    tracer = attach(spark, new)
    query = f"n{tag}"
    try:
        for batch in range(3):
            journal(spark, tracer, query, batch)
            time.sleep(WAKES_S)
            assert len(journaled(tmp_path)) == 3, "the tracer left open sent the new one's running batch"
            batch_over(tracer, query, batch)
            wait_sent(tmp_path)
    finally:
        tracer.close()
        left_open.close()
    assert edges_on(new) == set().union(*map(expected, range(3)))
    assert edges_on(old) == set()


OTHER_APPLICATION = textwrap.dedent("""
    import json, sys
    from pyspark.sql import SparkSession
    from headwater.capture import attach
    from headwater.capture import shipping
    from headwater.core.config import Config
    from tests.capture.test_journal_ownership import batch_over, journal

    shipping.DRAIN_DEFER_S = 60.0
    config = Config(**json.loads(sys.argv[1]))
    spark = (SparkSession.builder.master("local[1]").appName("headwater-other-application")
             .config("spark.ui.enabled", "false").getOrCreate())
    tracer = attach(spark, config)
    try:
        journal(spark, tracer, sys.argv[2], 0)
        print("journaled", flush=True)
        sys.stdin.readline()  # the test's own tracer wakes over the folder meanwhile, then journals
        batch_over(tracer, sys.argv[2], 0)
    finally:
        tracer.close()  # sends everything of its own that is left
        spark.stop()
""")


def test_two_spark_applications_on_one_host_with_the_default_spill_dir_each_send_their_own(
        spark, stack_config, tmp_path, monkeypatch):
    """Another Spark application on the host (a process of its own, its own topics) and this one, both with
    the default spill folder under one HEADWATER_HOME: this one's thread leaves the other's running batch
    alone, and the other, sending its batch and closing, leaves this one's running batch alone."""
    home = tmp_path / "home"
    monkeypatch.setenv("HEADWATER_HOME", str(home))
    mine, tag = own_topics(stack_config, "app")
    theirs, _ = own_topics(stack_config, "app")
    mine, theirs = (c.with_overrides(spill_dir="") for c in (mine, theirs))
    settings = {k: v for k, v in theirs.to_dict().items() if k in ("bootstrap", "edges_topic", "log_topic",
                                                                     "dlq_topic", "spill_dir")}
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "HEADWATER_HOME": str(home), "PYTHONPATH": str(root)}
    tracer = attach(spark, mine)
    other = subprocess.Popen([sys.executable, "-c", OTHER_APPLICATION, json.dumps(settings), f"o{tag}"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=root)
    try:
        assert other.stdout.readline().strip() == "journaled"
        time.sleep(WAKES_S)
        assert len(journaled(home)) == 3, "this application sent the other's running batch"
        journal(spark, tracer, f"m{tag}", 0)
        other.stdin.write("\n")
        other.stdin.flush()
        assert other.wait(timeout=120) == 0
        assert len(journaled(home)) == 3, "the other application sent this one's running batch"
        batch_over(tracer, f"m{tag}", 0)
        wait_sent(home)
    finally:
        tracer.close()
        if other.poll() is None:
            other.kill()
            other.wait()
    assert edges_on(mine) == expected(0)
    assert edges_on(theirs) == expected(0)


def headwater_drain(config, idle_s: float = 1.0) -> dict:
    """``headwater drain`` of ``config``'s destination, as an executor starts it (its settings in
    ``HEADWATER_*``), until idle; its JSON line."""
    env = {**os.environ, **{f"HEADWATER_{k.upper()}": str(v) for k, v in config.to_dict().items()
                           if k in ("bootstrap", "edges_topic", "spill_dir")}}
    done = subprocess.run([sys.executable, "-m", "headwater.cli", "drain", "--idle", str(idle_s)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_a_headwater_drain_sends_each_jobs_journal_to_its_own_destination(spark, stack_config, tmp_path):
    """Two jobs journal on one host while their tracers hold the journal; ``headwater drain`` with one
    job's settings sends that job's lineage to its topic and leaves the other's, which a drain with the
    other's settings then sends to the other's topic."""
    first, tag = own_topics(stack_config, "drain")
    second, _ = own_topics(stack_config, "drain")
    first, second = (c.with_overrides(spill_dir=str(tmp_path)) for c in (first, second))
    a, b = attach(spark, first), attach(spark, second)
    try:
        journal(spark, a, f"a{tag}", 0)
        journal(spark, b, f"b{tag}", 1)
        assert headwater_drain(first)["drained"]
        assert edges_on(first) == expected(0)
        assert len(journaled(tmp_path)) == 3, "the other job's journal was taken"
        assert headwater_drain(second)["drained"]
        assert not journaled(tmp_path)
    finally:
        a.close()
        b.close()
    assert edges_on(first) == expected(0)
    assert edges_on(second) == expected(1)
