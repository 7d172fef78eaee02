"""The overhead budget: its controller batch by batch (pure logic), and on a live stream."""

import os
import time

import pytest

from headwater.adapters.spark_lines import last_progress, recent_progress
from headwater.capture.budget import FULL, LOG_ONLY, MIN_FRACTION, SAMPLED, OverheadBudget, Plan

pytestmark = pytest.mark.every_line  # runs on every supported Spark line (./dev test)


def run(budget: OverheadBudget, cost_of, batches: int) -> list[Plan]:
    """Feed ``batches`` batches whose capture costs ``cost_of(plan)`` (over a rest of 1 s)."""
    plans = []
    plan = budget.plan()
    for _ in range(batches):
        plans.append(plan)
        plan = budget.observe(plan, cost_of(plan), 1.0)
    return plans


def cost(full_ratio: float, fixed: float = 0.0):
    return lambda plan: 0.0 if plan.level == LOG_ONLY else fixed + full_ratio * plan.fraction


def test_no_budget_always_captures_everything():
    assert {p.level for p in run(OverheadBudget(0), cost(5.0), 20)} == {FULL}


def test_within_budget_stays_full():
    assert {p.level for p in run(OverheadBudget(0.15), cost(0.10), 30)} == {FULL}


def test_over_budget_samples_a_fraction_that_fits_and_stays_there():
    plans = run(OverheadBudget(0.15), cost(0.60), 40)
    assert plans[0].level == FULL and plans[1].level == SAMPLED
    assert abs(plans[1].fraction - 0.8 * 0.15 / 0.60) < 1e-9
    # Probes back to full now and then, each failed probe waiting twice as long.
    full_again = [i for i, p in enumerate(plans) if p.level == FULL and i > 0]
    assert len(full_again) >= 2 and all(b - a > 3 for a, b in zip(full_again, full_again[1:]))
    assert sum(p.level == SAMPLED for p in plans) > 30
    assert all(cost(0.60)(p) <= 0.15 or p.level == FULL for p in plans)


def test_fixed_cost_over_budget_ends_log_only():
    plans = run(OverheadBudget(0.15), cost(0.60, fixed=0.30), 40)
    assert plans[-1].level == LOG_ONLY
    assert LOG_ONLY in {p.level for p in plans[:10]}
    sampled = [p.fraction for p in plans if p.level == SAMPLED]
    assert sampled and min(sampled) >= MIN_FRACTION


def test_an_empty_sample_keeps_the_fraction_that_fits():
    """A sampled batch that cost nothing (no rows in its sample) says nothing of full
    capture's cost: the next sample stays small, not back at the default half."""
    budget = OverheadBudget(0.15)
    sampled = budget.observe(budget.plan(), 0.6, 1.0)
    assert sampled.level == SAMPLED and abs(sampled.fraction - 0.2) < 1e-9
    assert budget.observe(sampled, 0.0, 1.0).fraction == sampled.fraction


def test_recovers_to_full_when_load_drops():
    budget = OverheadBudget(0.15)
    heavy = run(budget, cost(2.0, fixed=0.5), 20)
    assert heavy[-1].level in (SAMPLED, LOG_ONLY)
    light = run(budget, cost(0.05), 120)
    assert light[-1].level == FULL and all(p.level == FULL for p in light[-10:])


ROWS = 3000


def trace_files(spark, config, name: str, tmp_path, tables: list[list[dict]], transform=lambda df: df) -> None:
    """Trace a Parquet file stream over ``tmp_path/in``, one file and batch per table, into ``tmp_path/sink``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from headwater.capture import attach
    from tests.conftest import stop_when_idle, wait_batches

    folder = tmp_path / "in"
    folder.mkdir()
    tracer = attach(spark, config)
    try:
        source = spark.readStream.schema("id long, v long").option("maxFilesPerTrigger", 1).parquet(str(folder))
        query = (tracer.trace(transform(source), name=name).writeStream.format("parquet")
                 .option("checkpointLocation", str(tmp_path / "checkpoint")).start(str(tmp_path / "sink")))
        try:
            for number, rows in enumerate(tables):
                pq.write_table(pa.Table.from_pylist(rows), folder / f"part-{number}.parquet")
                wait_batches(query, number + 1)
        finally:
            stop_when_idle(query)
    finally:
        tracer.close()


def test_a_stream_over_budget_is_sampled_then_log_only_and_says_so(spark, stack_config, tmp_path):
    """A budget no capture fits: the log shows the controller's levels, the graph holds exactly
    the edges of full batches and of the sampled rows (by rid), none of log-only batches."""
    from pyspark.sql import functions as F

    from headwater.core.schema import LOG_BATCH
    from tests.capture.test_faults import graph_edges
    from tests.conftest import index, own_topics, read_log

    config, tag = own_topics(stack_config, "budget")
    config = config.with_overrides(overhead_budget=1e-6)
    name = f"budget-{tag}"
    levels = [FULL, SAMPLED, LOG_ONLY, LOG_ONLY, LOG_ONLY, LOG_ONLY, SAMPLED]
    trace_files(spark, config, name, tmp_path,
                [[{"id": number * 10_000 + i, "v": i} for i in range(ROWS)] for number in range(len(levels))],
                lambda source: source.where(F.col("v") % 3 != 0).withColumn("w", F.col("v") * 2))
    index(config)

    batches = {r["batch"]: r for r in read_log(config) if r["schema"] == LOG_BATCH}
    assert [batches[n]["status"] for n in range(len(levels))] == levels
    sink = spark.read.parquet(str(tmp_path / "sink")).collect()

    def captured(row) -> bool:
        record = batches[row.id // 10_000]
        if record["status"] == SAMPLED:
            fraction = record["sampled_fraction"]
            return row._hw_rid % 1_000_003 < int(fraction * 1_000_003)
        return record["status"] == FULL

    expected = {(f"part-{r.id // 10_000}.parquet", r.v, r.id) for r in sink if captured(r)}
    rid_of = {r._hw_rid: r.id for r in sink}
    edges = {(path.rsplit("/", 1)[-1], position, rid_of[dst]) for path, position, dst in graph_edges(config, name)}
    assert edges == expected
    assert any(r.id // 10_000 == 1 for r in sink if captured(r))  # the sample is not empty
    # Answers say which batch on their way was not fully captured, from the batch log.
    from headwater.query.api import LineageClient

    with LineageClient(config) as client, LineageClient(config, backend="csprov") as parquet:
        for row in sink:
            if captured(row):
                batch = row.id // 10_000
                for answer in (client.backward(row._hw_rid), parquet.backward(row._hw_rid)):
                    assert [x.position for x in answer] == [row.v]
                    gaps = [(g.query, g.batch, g.status) for g in answer.gaps]
                    assert gaps == ([] if batches[batch]["status"] == FULL else [(name, batch, SAMPLED)])
                    assert answer.complete == (batches[batch]["status"] == FULL)
    assert all(batches[n].get("edges", 0) == 0 for n in range(2, 6))


def test_capture_setting_is_checked():
    from headwater.core.config import Config

    with pytest.raises(ValueError, match="capture='none'"):
        Config(capture="none")


def test_capture_log_only_logs_every_batch_and_publishes_no_edges(spark, stack_config, tmp_path):
    """The operator's switch: the sink gets its rows (with rids), the log every batch, the graph nothing."""
    from headwater.core.schema import LOG_BATCH
    from tests.capture.test_faults import graph_edges
    from tests.conftest import index, own_topics, read_log

    config, tag = own_topics(stack_config, "logonly")
    config = config.with_overrides(capture="log-only")
    name = f"logonly-{tag}"
    trace_files(spark, config, name, tmp_path, [[{"id": n * 100 + i, "v": i} for i in range(50)] for n in range(2)])
    index(config)

    batches = {r["batch"]: r for r in read_log(config) if r["schema"] == LOG_BATCH and r["query"] == name}
    assert {n: r["status"] for n, r in batches.items()} == {0: LOG_ONLY, 1: LOG_ONLY}
    sink = spark.read.parquet(str(tmp_path / "sink")).collect()
    assert sorted(r.id for r in sink) == [n * 100 + i for n in range(2) for i in range(50)]
    assert all(r._hw_rid is not None for r in sink)
    assert graph_edges(config, name) == []


def test_capture_log_only_to_a_file_sink_is_spark_s_own_write_with_the_hook_s_rids(spark, stack_config, tmp_path):
    """Log-only into a file sink in append mode: Spark's file sink writes the query (no foreachBatch, no
    per-batch hook), each row's ``_hw_rid`` is the rid full capture's hook gives the same row of the same
    batch, and each batch's capture record comes from its progress: ``log-only``, with the files it wrote;
    a batch run again after its write (the commit lost) says ``sink_written_before``; a new checkpoint over
    the sink logs the batches Spark's sink skips ``failed``, as the hook says them. Full capture's hook over
    another run's sink alike: it skips the batches the sink's log holds, and writes the next ones."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    from headwater.capture import attach
    from headwater.core.schema import LOG_BATCH
    from tests.conftest import own_topics, read_log, stop_when_idle

    config, tag = own_topics(stack_config, "logsink")
    name, sink = f"logsink-{tag}", tmp_path / "sink"
    folder = tmp_path / "in"
    folder.mkdir()

    def add_input(number: int) -> None:
        """Input file ``number``, its 40 rows' ids from ``number * 100``; older files are read first."""
        path = folder / f"part-{number}.parquet"
        pq.write_table(pa.Table.from_pylist([{"id": number * 100 + i, "v": i % 7} for i in range(40)]), path)
        os.utime(path, (1_000_000 + number, 1_000_000 + number))

    for number in range(3):
        add_input(number)

    def run(capture: str, checkpoint: str, batches: int):
        """Run the query until it has run batch ``batches - 1``."""
        tracer = attach(spark, config, capture=capture)
        try:
            source = spark.readStream.schema("id long, v long").option("maxFilesPerTrigger", 1).parquet(str(folder))
            query = (tracer.trace(source.where("v < 6"), name=name).writeStream.format("parquet")
                     .option("checkpointLocation", str(tmp_path / checkpoint)).start(str(sink)))
            try:  # a batch whose rows Spark's sink skips reads none: wait for the batch ids
                deadline = time.monotonic() + 120
                while not any(p.batchId == batches - 1 and "addBatch" in p.durationMs for p in recent_progress(query)):
                    assert query.exception() is None and time.monotonic() < deadline, query.exception()
                    time.sleep(0.2)
            finally:
                stop_when_idle(query)
        finally:
            tracer.close()
        return query

    def rids() -> dict[int, int]:
        return {r.id: r._hw_rid for r in spark.read.parquet(str(sink)).collect()}

    query = run("full", "cp-full", 3)
    assert last_progress(query).sink.description.startswith("ForeachBatchSink")
    by_hook = rids()
    shutil.rmtree(sink)
    query = run("log-only", "cp-log", 3)
    assert last_progress(query).sink.description.startswith("FileSink")
    assert rids() == by_hook and len(set(by_hook.values())) == len(by_hook) == 3 * 35  # v = 6 filtered out

    # Batch 2 again, as after a driver died between the sink's write and Spark's commit.
    for commit in ("2", ".2.crc"):
        (tmp_path / "cp-log" / "commits" / commit).unlink()
    run("log-only", "cp-log", 3)
    assert rids() == by_hook  # Spark's sink skipped the batch its log holds
    # Another run's checkpoint over the sink: Spark's sink skips batches 0 and 1 (its log holds them) and 2.
    run("log-only", "cp-other", 3)
    assert rids() == by_hook

    records = [r for r in read_log(config) if r["schema"] == LOG_BATCH and r["query"] == name]
    logged = records[3:]  # after full capture's three
    assert [(r["batch"], r["status"]) for r in logged[:4]] == [(0, LOG_ONLY), (1, LOG_ONLY), (2, LOG_ONLY),
                                                               (2, LOG_ONLY)]
    assert [r.get("sink_written_before") for r in logged[:4]] == [None, None, None, True]
    assert all(r["sink_files"] and r["capture_seconds"] == 0.0 for r in logged[:3])
    assert [(r["batch"], r["status"]) for r in logged[4:]] == [(0, "failed"), (1, "failed"), (2, LOG_ONLY)]
    assert "written by another run" in logged[4]["error"] and logged[6]["sink_written_before"] is True

    # Full capture over another run's sink: the hook reads the sink's latest batch once a run (2 here), skips
    # batches 0 and 1, takes batch 2 as written (as log-only does), and writes batches 3 and 4.
    for number in (3, 4):
        add_input(number)
    run("full", "cp-full-other", 5)
    written = rids()
    assert {i: r for i, r in written.items() if i < 300} == by_hook
    assert sorted(i for i in written if i >= 300) == [n * 100 + i for n in (3, 4) for i in range(40) if i % 7 < 6]
    assert all(written[i] is not None for i in written)
    records = [r for r in read_log(config) if r["schema"] == LOG_BATCH and r["query"] == name]
    assert [(r["batch"], r["status"], r.get("sink_written_before")) for r in records[10:]] == \
        [(0, "failed", None), (1, "failed", None), (2, "full", True), (3, "full", None), (4, "full", None)]
    assert all(r["sink_files"] for r in records[12:])
