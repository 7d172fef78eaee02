"""Starting and stopping a traced query as untraced (issue 45).

A start that Spark refuses: each case starts the same query untraced and traced; the traced start
raises the untraced start's exception, its class and its message (Spark's own, which prints the
user's plan), and afterwards no streaming query runs, no thread of the attempt (Python's or the JVM's)
is left, the session has the listeners it had, the tracer watches no name of the attempt, and its
log topic holds nothing of it.

A stop in the middle of a batch: traced queries stopped while a batch runs, ten times, in a Spark
application of their own whose whole output the test reads: each stops as untraced (no exception),
and nothing in the output is a ``StackOverflowError`` or a query terminated with an error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F

from headwater.capture import attach
from tests.conftest import own_topics, read_log


@pytest.fixture(scope="module")
def tracer(spark, stack_config, tmp_path_factory):
    config, _ = own_topics(stack_config, "refused")
    tracer = attach(spark, config.with_overrides(spill_dir=str(tmp_path_factory.mktemp("refused-spill"))))
    yield tracer
    tracer.close()


def rate(spark):
    return spark.readStream.format("rate").option("rowsPerSecond", 5).load()


def what_runs(spark, tracer) -> dict:
    """What a start may leave behind: queries, threads, listeners, the tracer's watched names."""
    jvm_threads = {t.getName() for t in spark._jvm.java.lang.Thread.getAllStackTraces().keySet()}
    return {"active": [q.name for q in spark.streams.active],
            # headwater's own (py4j's callback threads come and go with any running query's batches)
            "python_threads": sorted(t.name for t in threading.enumerate() if t.name.startswith("headwater")),
            "stream_threads": sorted(n for n in jvm_threads if "stream execution thread" in n),
            "listeners": len(spark._jsparkSession.streams().listListeners()),
            "watched": dict(tracer._queries), "logged": dict(tracer._logged)}


def refusal(start):
    with pytest.raises(Exception) as raised:
        start()
    return type(raised.value), str(raised.value)


CASES = {
    "aggregate in append mode without a watermark":
        (lambda s: rate(s).groupBy((F.col("value") % 3).alias("k")).count(), lambda w: w.outputMode("append")),
    "an outer stream-stream join without a watermark":
        (lambda s: rate(s).alias("a").join(rate(s).alias("b"), F.expr("a.value = b.value"), "left"),
         lambda w: w.outputMode("append")),
    "a missing checkpoint": (rate, lambda w: w.format("parquet")),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_start_spark_refuses_fails_with_spark_s_own_error_and_leaves_nothing(spark, tracer, tmp_path, case):
    make, configure = CASES[case]
    sink = str(tmp_path / "sink")
    checkpoint = {} if case == "a missing checkpoint" else {"checkpointLocation": str(tmp_path / "cp")}
    df = make(spark)
    untraced = refusal(lambda: configure(df.writeStream.format("noop").options(**checkpoint)).start(sink))
    name = f"refused{uuid.uuid4().hex[:6]}"
    before = what_runs(spark, tracer)
    traced = refusal(lambda: configure(tracer.trace(df, name=name).writeStream.format("noop")
                                       .options(**checkpoint)).start(sink))
    assert traced == untraced
    assert what_runs(spark, tracer) == before
    assert not [r for r in read_log(tracer.config) if r.get("query") == name]


def test_a_start_that_fails_after_the_checks_forgets_its_attempt_but_not_the_running_query(spark, tracer, tmp_path):
    """A second query of a running query's name: Spark refuses it when it starts; the running one is still
    watched, and the attempt leaves nothing of its own."""
    name = f"twice{uuid.uuid4().hex[:6]}"
    first = tracer.trace(rate(spark), name=name).writeStream.format("noop").start()
    try:
        before = what_runs(spark, tracer)
        untraced = refusal(lambda: rate(spark).writeStream.format("noop").queryName(name).start())
        traced = refusal(lambda: tracer.trace(rate(spark), name=f"{name}b").writeStream.format("noop")
                         .queryName(name).start())
        assert traced[0] == untraced[0] and "already active" in traced[1] and name in traced[1]
        after = what_runs(spark, tracer)
        assert after == before and after["watched"][name] == name
    finally:
        first.stop()


def test_a_traced_query_stopped_mid_batch_stops_as_untraced_ten_times_out_of_ten(stack_config, tmp_path):
    config, _ = own_topics(stack_config, "stop")
    source = tmp_path / "in"
    source.mkdir()
    for number in range(4):
        rows = [{"id": number * 200_000 + i, "v": i} for i in range(200_000)]
        pq.write_table(pa.Table.from_pylist(rows), source / f"part-{number}.parquet")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "HEADWATER_HOME": str(tmp_path / "home"),
           "PYSPARK_PYTHON": sys.executable,
           **{f"HEADWATER_{k.upper()}": str(v) for k, v in config.to_dict().items()}}
    done = subprocess.run([sys.executable, "-m", "tests.stop_mid_batch", str(source), str(tmp_path), "10"],
                          env=env, cwd=root, capture_output=True, text=True, timeout=500)
    output = done.stdout + done.stderr
    assert done.returncode == 0, done.stderr[-3000:]
    assert "StackOverflowError" not in output
    assert "terminated with error" not in output
    tries = json.loads(done.stdout.strip().splitlines()[-1])
    assert [t["exception"] for t in tries] == [None] * 10
    assert sum(t["running"] for t in tries) >= 8, tries  # stopped mid-batch, not between batches


def test_a_closed_tracer_refuses_a_start_before_it_touches_the_checkpoint(spark, stack_config, tmp_path):
    """Tracing on a tracer after ``close()`` fails at ``start()`` saying so, with no plan file written into
    the checkpoint (a later start from it would take the plan for its own) and nothing of it logged."""
    config, _ = own_topics(stack_config, "closed")
    closed = attach(spark, config.with_overrides(spill_dir=str(tmp_path / "spill")))
    traced = closed.trace(rate(spark), name=f"closed{uuid.uuid4().hex[:6]}")
    closed.close()
    with pytest.raises(RuntimeError, match="this Tracer is closed"):
        traced.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "cp")).start()
    assert not (tmp_path / "cp").exists() or not any((tmp_path / "cp").iterdir())
    assert not [r for r in read_log(config) if r.get("query") == traced.name]


def test_an_attach_that_fails_leaves_no_thread_of_its_own(spark, stack_config, tmp_path):
    """A metrics port that is taken fails ``attach`` with the port named; the tracer's thread it had started
    is stopped, not left sending from the spill folder with nobody to close it."""
    import socket

    config, _ = own_topics(stack_config, "taken")
    threads_before = {t.ident for t in threading.enumerate() if t.name == "headwater-log"}
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            attach(spark, config.with_overrides(spill_dir=str(tmp_path / "spill"), metrics_port=port,
                                                metrics_host="127.0.0.1"))
    left = [t for t in threading.enumerate() if t.name == "headwater-log" and t.ident not in threads_before]
    assert not [t for t in left if t.is_alive()]
