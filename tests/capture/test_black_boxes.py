"""Black boxes: superset lineage through user code capture cannot see into, never missing.

A stateless black box (mapInPandas, mapInArrow, applyInPandas, applyInArrow, a cogroup) links
each output row to every row that went into it in the same micro-batch; a stateful one
(applyInPandasWithState, transformWithStateInPandas) to every row that ever went into it.
The oracle knows each micro-batch's offset ranges from the query's
progress, so it recomputes exactly which Kafka records entered the black box, and
demands that lineage be exactly those, flagged ``exact=false``, while edges that bypass
the black box (the dims row of a join above it) stay exact.
"""

from __future__ import annotations

import uuid
from collections import Counter

import pandas as pd
import pyarrow as pa
import pytest
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupStateTimeout

from headwater.adapters.spark_lines import recent_progress
from headwater.capture import UnsupportedPlanError
from headwater.core.offsets import partition_offsets
from headwater.core.rid import kafka_rid
from headwater.demo.run import end_offsets, run_until
from headwater.query.api import LineageClient
from headwater.query.errors import LineageError
from tests import pipelines
from tests.conftest import index, local_file, sink_file_batches
from tests.oracle import as_input

pytestmark = pytest.mark.every_line  # runs on every supported Spark line (./dev test)

EVENTS = 300


@pytest.fixture(scope="module")
def env(spark, stack_config, tmp_path_factory):
    # Capture's superset as it is, with no narrowing key (re-execution narrows it: test_black_box_narrowing.py).
    config = stack_config.with_overrides(narrowing_key="", narrowing_key_file="")
    yield from pipelines.event_env(spark, config, tmp_path_factory.mktemp("bb"), "bb", EVENTS, seed=5)


def parsed(spark, env):
    source = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", env.config.bootstrap)
              .option("startingOffsets", "earliest")
              .option("subscribe", env.topic).option("maxOffsetsPerTrigger", 120).load())
    return source.select(F.from_json(F.col("value").cast("string"), pipelines.EVENT_SCHEMA).alias("e")).select("e.*")


def keep_and_triple(frames):
    for frame in frames:
        kept = frame[frame["v"] % 3 != 0]
        yield pd.DataFrame({"id": kept["id"], "k": kept["k"], "v3": kept["v"] * 3})


ARROW_OUT = pa.schema([("id", pa.int64()), ("k", pa.int32()), ("v3", pa.int64())])


def keep_and_triple_arrow(batches):
    for frame in keep_and_triple(batch.to_pandas() for batch in batches):
        yield pa.RecordBatch.from_pandas(frame, schema=ARROW_OUT, preserve_index=False)


def keep_and_triple_arrow_group(table):
    return pa.Table.from_batches(list(keep_and_triple_arrow(table.to_batches())), schema=ARROW_OUT)


def running_count(key, frames, state):
    seen = state.get[0] if state.exists else 0
    for frame in frames:
        seen += len(frame)
    state.update((seen,))
    yield pd.DataFrame({"k": [key[0]], "n": [seen]})


def run_traced(spark, env, df, name, mode="append", **trace):
    sink = str(env.workdir / f"sink-{name}")
    query = (env.tracer.trace(df, name=name, keys={"dims": "k"}, **trace).writeStream.format("parquet")
             .outputMode(mode).option("checkpointLocation", str(env.workdir / f"cp-{name}"))
             .trigger(processingTime="200 milliseconds").start(sink))
    run_until(query, end_offsets(env.topic, env.coordinates), say=print)
    index(env.config)
    rows = spark.read.parquet(sink).withColumn("_file", F.input_file_name()).collect()
    batches = {}
    for progress in recent_progress(query):
        if progress.numInputRows:
            source = progress.sources[0]
            batches[progress.batchId] = (partition_offsets(source.startOffset), partition_offsets(source.endOffset))
    batch_of = sink_file_batches(env.config, name)
    return [(r.asDict(), batch_of[local_file(r["_file"])]) for r in rows], batches


def records_read(env, start: dict, end: dict) -> list[tuple]:
    """(coordinates, parsed event) of every record a batch read, from its offset ranges."""
    found = []
    for value, (p, o) in zip(env.values, env.coordinates):
        key = (env.topic, p)
        if start.get(key, 0) <= o < end[key]:
            found.append((("kafka", env.topic, p, o), pipelines.parse(value)))
    return found


def keep_and_triple_group(frame):
    return next(keep_and_triple([frame]))


def keep_and_triple_left(left, right):
    return keep_and_triple_group(left)


@pytest.mark.parametrize("black_box", ["mapInPandas", "applyInPandas", "mapInArrow",
                                       pytest.param("applyInArrow", marks=pytest.mark.since("4.0")), "cogroup"])
def test_stateless_black_box_is_a_superset_per_batch_and_joins_above_it_stay_exact(spark, env, black_box):
    valid = parsed(spark, env).where("v IS NOT NULL")
    schema = "id long, k int, v3 long"
    boxed = {"mapInPandas": lambda: valid.mapInPandas(keep_and_triple, schema),
             "applyInPandas": lambda: valid.groupBy("k").applyInPandas(keep_and_triple_group, schema),
             "mapInArrow": lambda: valid.mapInArrow(keep_and_triple_arrow, schema),
             "applyInArrow": lambda: valid.groupBy("k").applyInArrow(keep_and_triple_arrow_group, schema),
             # the stream cogrouped with itself: each key's rows on both sides, the left's kept
             "cogroup": lambda: valid.groupBy("k").cogroup(valid.groupBy("k")).applyInPandas(keep_and_triple_left,
                                                                                            schema)}[black_box]()
    df = boxed.join(env.dims_df, "k").select("id", "v3", "name")
    name = f"bb-{black_box}-{uuid.uuid4().hex[:6]}"
    rows, batches = run_traced(spark, env, df, name)
    assert len(batches) >= 2

    events = [pipelines.parse(v) for v in env.values]
    expected = Counter((e["id"], e["v"] * 3, f"dim-{e['k']}") for e in events
                       if e["v"] is not None and e["v"] % 3 != 0 and e["k"] in pipelines.DIM_KEYS)
    assert Counter((r["id"], r["v3"], r["name"]) for r, _ in rows) == expected

    entered = {b: {c for c, e in records_read(env, *batches[b]) if e["v"] is not None} for b in batches}
    k_of = {e["id"]: e["k"] for e in events if e["id"] is not None}
    outputs_of_batch: dict = {}
    with LineageClient(env.config) as client:
        for row, batch in rows:
            found = client.backward(row["_hw_rid"])
            kafka = {as_input(x) for x in found if x.topic}
            dims = [x for x in found if x.topic is None]
            assert kafka == entered[batch]
            assert not any(x.exact for x in found if x.topic), "superset edges must be flagged"
            assert [(x.dataset, x.key, x.exact) for x in dims] == [("dims", str(k_of[row["id"]]), True)]
            outputs_of_batch.setdefault(batch, set()).add(row["_hw_rid"])
        for batch, records in entered.items():
            for _, _, p, o in sorted(records)[:20]:
                # Other tests' queries read the same records: only this query's outputs count.
                reached = {x.rid for x in client.forward(kafka_rid(env.topic, p, o), to=name)}
                assert reached == outputs_of_batch.get(batch, set())


@pytest.fixture
def rocksdb_state(spark):
    """Spark's RocksDB state store for the queries the test starts (``transformWithState`` needs it)."""
    key = "spark.sql.streaming.stateStore.providerClass"
    before = spark.conf.get(key, None)
    spark.conf.set(key, "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
    yield
    if before is None:
        spark.conf.unset(key)
    else:
        spark.conf.set(key, before)


@pytest.mark.parametrize("black_box", ["applyInPandasWithState",
                                       pytest.param("transformWithStateInPandas", marks=pytest.mark.since("4.0"))])
def test_stateful_black_box_links_every_output_to_every_input_it_read_up_to_its_batch(spark, env, black_box,
                                                                                     rocksdb_state):
    grouped = parsed(spark, env).where("v IS NOT NULL").groupBy("k")
    if black_box == "applyInPandasWithState":
        df = grouped.applyInPandasWithState(running_count, "k int, n long", "n long", "update",
                                            GroupStateTimeout.NoTimeout)
    else:
        from tests.stateful_processors import RunningCount

        df = grouped.transformWithStateInPandas(RunningCount(), "k int, n long", "Update", "None")
    rows, batches = run_traced(spark, env, df, f"bb-state-{uuid.uuid4().hex[:6]}", mode="update")

    events = [pipelines.parse(v) for v in env.values]
    totals = Counter(e["k"] for e in events if e["v"] is not None)
    last = {}
    for row, batch in sorted(rows, key=lambda rb: rb[1]):
        last[row["k"]] = row["n"]
    assert last == totals, "capture changed what the user's state function computed"

    # An output of batch b may derive from any row the black box read up to b, and from none it read later.
    with LineageClient(env.config) as client:
        for row, batch in rows[:10] + rows[-10:]:
            so_far = {c for b in batches if b <= batch for c, e in records_read(env, *batches[b]) if e["v"] is not None}
            found = client.backward(row["_hw_rid"])
            assert {as_input(x) for x in found} == so_far
            assert not any(x.exact for x in found)


@pytest.mark.since("4.0")  # DataFrame.lateralJoin
def test_a_node_capture_cannot_trace_is_refused_until_named_a_black_box(spark, env):
    """A lateral join whose subquery reads a table's rows is refused, saying why, then traced as named."""
    dims = env.dims_df
    df = parsed(spark, env).where("v IS NOT NULL").lateralJoin(
        dims.where(F.col("w") < F.col("v").outer()).select("name")).select("id", "v", "name")
    refused = r"LateralJoin .*reads rows of a table.*black_boxes=\{'LateralJoin'\}"
    with pytest.raises(UnsupportedPlanError, match=refused):
        env.tracer.trace(df, name="refused")
    rows, batches = run_traced(spark, env, df, f"bb-lateral-{uuid.uuid4().hex[:6]}", black_boxes={"LateralJoin"})
    assert rows and all(r["v"] is not None for r, _ in rows)
    entered = {b: {c for c, e in records_read(env, *batches[b]) if e["v"] is not None} for b in batches}
    with LineageClient(env.config) as client:
        for row, batch in rows[:10]:
            found = client.backward(row["_hw_rid"])
            assert {as_input(x) for x in found} == entered[batch]
            assert not any(x.exact for x in found)
        with pytest.raises(LineageError):
            client.backward(12345)
