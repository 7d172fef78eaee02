"""Plan records across restarts: the log says when a query's plan changed, and from which batch."""

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import functions as F

from headwater.capture import attach
from headwater.capture.checkpoint import local_folder, record_plan
from headwater.core.plan import plan_fingerprint
from headwater.core.schema import LOG_PLAN
from tests.conftest import own_topics, read_log, stop_when_idle, wait_batches

EXPR = '{"exprId":{"product-class":"org.apache.spark.sql.catalyst.expressions.ExprId","id":%d,"jvmId":"%s"}}'


def test_fingerprint_ignores_attribute_numbering_only():
    plan = "[%s,%s,%s]"
    a = plan % (EXPR % (4, "j1"), EXPR % (9, "j1"), EXPR % (4, "j1"))
    b = plan % (EXPR % (17, "j2"), EXPR % (3, "j2"), EXPR % (17, "j2"))
    swapped = plan % (EXPR % (17, "j2"), EXPR % (3, "j2"), EXPR % (3, "j2"))
    assert plan_fingerprint(a) == plan_fingerprint(b) != plan_fingerprint(swapped)
    # Where the tables live counts too: Spark's JSON leaves it out.
    assert plan_fingerprint(a, ["file:/v1/sites.parquet"]) == plan_fingerprint(b, ["file:/v1/sites.parquet"]) \
        != plan_fingerprint(a, ["file:/v2/sites.parquet"])


def test_checkpoint_remembers_the_plan_and_the_batch_it_started_at(tmp_path):
    assert local_folder("s3a://bucket/cp") is None and local_folder(f"file:{tmp_path}") == tmp_path
    assert record_plan(tmp_path, "aaa") == (None, 0, 0, None)
    (tmp_path / "commits").mkdir()
    for batch in ("0", "1", ".1.crc"):
        (tmp_path / "commits" / batch).write_text("v1")
    assert record_plan(tmp_path, "aaa") == ("aaa", 2, 0, None)  # the same plan since batch 0: its run goes on
    assert record_plan(tmp_path, "bbb") == ("aaa", 2, 2, 0)  # a new plan from batch 2, the old one's from 0
    assert record_plan(tmp_path, "bbb") == ("bbb", 2, 2, None)


def test_a_restart_with_changed_code_is_logged_as_a_plan_change(spark, stack_config, tmp_path):
    config, tag = own_topics(stack_config, "plans")
    folder = tmp_path / "in"
    folder.mkdir()
    tracer = attach(spark, config)
    try:
        for run, modulus in enumerate((3, 3, 5)):  # the third run's filter differs
            pq.write_table(pa.Table.from_pylist([{"id": run * 100 + i, "v": i} for i in range(30)]),
                           folder / f"part-{run}.parquet")
            source = spark.readStream.schema("id long, v long").option("maxFilesPerTrigger", 1).parquet(str(folder))
            df = source.where(F.col("v") % modulus != 0)
            query = (tracer.trace(df, name=f"plans-{tag}").writeStream.format("parquet")
                     .option("checkpointLocation", str(tmp_path / "checkpoint")).start(str(tmp_path / "sink")))
            try:
                wait_batches(query, 1)
            finally:
                stop_when_idle(query)
    finally:
        tracer.close()
    plans = [r for r in read_log(config) if r["schema"] == LOG_PLAN]
    assert [(p["from_batch"], p["changed"]) for p in plans] == [(0, False), (1, False), (2, True)]
    first, same, changed = (p["fingerprint"] for p in plans)
    assert first == same != changed
    assert [p["previous_fingerprint"] for p in plans] == [None, first, first]
