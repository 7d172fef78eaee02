"""Capture when the broker dies: the stream goes on, spilled lineage arrives, overflow is counted.

A broker of this test's own (the session's broker serves every other test) is killed
with SIGKILL while a traced file stream runs, and started again on the same port.
The in-memory test broker loses what it held when killed, so everything on it is
indexed into the graph before the kill; a real Kafka keeps it. Files arrive one per
micro-batch: one before the kill, three while the broker is away (the third larger
than the spill may hold), one after it is back. The broker comes back only once capture
has noticed it gone (the breaker open): an empty broker back within one send timeout
would take sends to topics it makes on its own, which a real Kafka, keeping its topics,
never needs.
"""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import functions as F

from headwater.adapters.graph import driver
from headwater.capture import attach
from headwater.capture.delivery import Breaker, Spill
from headwater.core.schema import LOG_BATCH, LOG_PROGRESS
from headwater.store.batch_log import BatchLog
from headwater.store.graph import batch_statuses
from tests.conftest import index, own_topics, read_log, stop_when_idle, wait_batches

SIZES = [40, 40, 40, 3000, 40]  # rows per file; file 3 overflows the spill
DOWN = (1, 2, 3)  # files that arrive while the broker is away
OVERFLOW = 3
SPILL_MAX_BYTES = 64 * 1024
SEND_TIMEOUT_S = 6.0


def rows(number: int) -> list[dict]:
    return [{"id": number * 10_000 + i, "v": i} for i in range(SIZES[number])]


def graph_edges(config, query: str) -> list[tuple]:
    """Every DERIVED relationship into the query's output rows, one tuple per relationship."""
    with driver(config) as d, d.session(database=config.graph_database) as s:
        return [tuple(r.values()) for r in s.run(
            "MATCH (a:Row)-[e:DERIVED]->(b:Row) WHERE b.query = $name RETURN a.path, a.position, b.rid",
            name=query)]


def test_broker_killed_mid_stream(spark, stack_config, broker, tmp_path):
    config, tag = own_topics(stack_config, "fault")
    config = config.with_overrides(bootstrap=f"127.0.0.1:{broker.port}", spill_dir=str(tmp_path / "spill"),
                                   spill_max_bytes=SPILL_MAX_BYTES, send_timeout_s=SEND_TIMEOUT_S,
                                   breaker_cooldown_s=5.0)
    name = f"fault-{tag}"
    folder = tmp_path / "in"
    folder.mkdir()
    tracer = attach(spark, config)
    spill = Path(tracer.delivery_settings.spill_dir)  # the destination's folder under the spill root
    log_records = []
    try:
        source = spark.readStream.schema("id long, v long").option("maxFilesPerTrigger", 1).parquet(str(folder))
        df = source.where(F.col("v") % 3 != 0).withColumn("w", F.col("v") * 2)
        query = (tracer.trace(df, name=name).writeStream.format("parquet")
                 .option("checkpointLocation", str(tmp_path / "checkpoint")).start(str(tmp_path / "sink")))
        seconds = {}
        try:
            for number in range(len(SIZES)):
                if number == DOWN[0]:
                    index(config)
                    log_records += read_log(config)
                    broker.kill()
                if number == DOWN[-1] + 1:
                    assert Breaker(spill, 5.0).is_open()
                    broker.start()
                    deadline = time.monotonic() + 60
                    # Sent, and the breaker closed: a send that failed while the broker was still starting
                    # (an idempotent producer asks it for a producer id first) may open it once more, and what
                    # a batch journals while it is open is counted spilled, rightly, which this batch's
                    # expectation (none spilled) is not about.
                    while Spill(spill, SPILL_MAX_BYTES).files() or Breaker(spill, 5.0).is_open():
                        assert time.monotonic() < deadline, "spilled lineage was not sent after the broker returned"
                        time.sleep(0.5)
                pq.write_table(pa.Table.from_pylist(rows(number)), folder / f"part-{number}.parquet")
                started = time.monotonic()
                wait_batches(query, number + 1)
                seconds[number] = time.monotonic() - started
                if number == DOWN[0]:  # the batch's log record finds the broker gone, within a send timeout
                    deadline = time.monotonic() + 3 * SEND_TIMEOUT_S
                    while not Breaker(spill, 5.0).is_open():
                        assert time.monotonic() < deadline, "capture did not notice the broker was gone"
                        time.sleep(0.2)
        finally:
            stop_when_idle(query)
    finally:
        tracer.close()
    index(config)
    log_records += read_log(config)

    # The stream kept its pace while the broker was away: no task or batch waits for the
    # broker (tasks journal; the tracer's own thread sends).
    print("seconds per batch", seconds)
    assert all(seconds[n] < SEND_TIMEOUT_S for n in DOWN), seconds

    sink = spark.read.parquet(str(tmp_path / "sink")).collect()
    expected = {(f"part-{r['id'] // 10_000}.parquet", r["v"], r["id"]) for n in range(len(SIZES)) for r in rows(n)
                if r["v"] % 3 != 0}
    assert {(f"part-{r.id // 10_000}.parquet", r.v, r.id) for r in sink} == expected
    rid_of = {r._hw_rid: r.id for r in sink}
    edges = [(path.rsplit("/", 1)[-1], position, rid_of[dst]) for path, position, dst in graph_edges(config, name)]
    assert len(edges) == len(set(edges)), "an edge is in the graph twice"
    assert set(edges) == {e for e in expected if int(e[0][5]) != OVERFLOW}

    batches = {r["batch"]: r for r in log_records if r["schema"] == LOG_BATCH and r["query"] == name}
    progress = {r["batch"] for r in log_records if r["schema"] == LOG_PROGRESS and r["query"] == name}
    assert sorted(batches) == list(range(len(SIZES))) and progress >= set(batches)
    out_rows = {n: sum(1 for r in rows(n) if r["v"] % 3 != 0) for n in range(len(SIZES))}
    for n, record in batches.items():
        if n == OVERFLOW:
            assert record["status"] == "failed" and record["dropped_edges"] == out_rows[n]
        else:
            assert record["status"] == "full" and record["dropped_edges"] == 0
            # Spilled: journaled while the breaker was open, after the first batch without a broker.
            assert record["spilled_edges"] == (out_rows[n] if n in DOWN[1:] else 0)

    # The store's batch log kept what it held before the broker lost its data and took
    # what came after in a new epoch: the same gap map as the graph's.
    pairs = [(name, n) for n in range(len(SIZES))]
    with driver(config) as d:
        graph = batch_statuses(d, pairs, database=config.graph_database)
    assert graph == {(name, n): record["status"] for n, record in batches.items()}
    assert BatchLog(config.store_uri(), config.log_topic).statuses(pairs) == graph
