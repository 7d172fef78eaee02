"""State nodes over a long stream: aggregates in update mode across more than 30 micro-batches,
with late data, a restart from the checkpoint and a retried batch, against a brute-force oracle.

The oracle replays Spark's micro-batch semantics in plain Python from which batch read each
Kafka record (Spark's progress): batch x drops as late the rows of windows ending at or before
the previous batch's watermark (the latest event time of the batches before x - 1, less the
delay); every group a batch puts a row into is emitted in update mode, holding every row it
got so far. Output rows (each with the ids Spark aggregated, and the batch that wrote it,
from capture's batch log) must be exactly the oracle's, so the oracle is Spark's; then the
backward lineage of every output row must be exactly its group's rows up to that batch, the
forward lineage of every input the outputs of its groups from its batch on (on the graph,
and for a sample on both Parquet backends; co-contributors for a sample too), and each batch
must publish exactly one edge per row entering a group plus one per row
emitted: work proportional to the batch's new rows, however old the stream.

The stream runs three times on one checkpoint: the first half, then the second half with a
fault after the sink write of one batch (so Spark runs it again), then again from the
checkpoint. The state nodes of the second run must be the first's (the lineage of an output
of the second half reaches rows of the first), and the retried batch, published twice, must
publish the same edges both times.
"""

from __future__ import annotations

import json
import uuid
from collections import defaultdict

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

from headwater.adapters.kafka import ensure_topics
from headwater.adapters.spark_lines import recent_progress
from headwater.capture import attach
from headwater.capture.budget import LOG_ONLY
from headwater.capture.sinks.spark_sinks import FileSink
from headwater.core.offsets import partition_offsets
from headwater.core.rid import kafka_rid
from headwater.core.schema import LOG_BATCH
from headwater.demo import orders as demo_data
from headwater.query.api import LineageClient
from headwater.query.errors import LineageError
from tests.capture.test_sinks import fail_after_write
from tests.conftest import (
    edges_published,
    index,
    local_file,
    own_topics,
    read_log,
    records_read,
    sink_file_batches,
    stop_when_idle,
)
from tests.oracle import as_input

pytestmark = pytest.mark.every_line  # runs on every supported Spark line (./dev test)

BASE = 1_790_000_000  # event time 0, in epoch seconds: windows of 10 and 20 s start at it
BATCHES = 32  # micro-batches of new rows
PER_BATCH = 5  # rows a batch (maxOffsetsPerTrigger)
DELAY_S = 10  # the watermark's delay
FAULT_BATCH = 23  # in the second half: its sink write completes, then it fails, and Spark runs it again

SHAPES = {
    # name: (groups of an event time t in seconds and key k, as (key, window start, window end) tuples; build)
    "keyed_update": (lambda t, k: [(k, None, None)],
                     lambda df: df.groupBy("k")),
    "keyed_window_update": (lambda t, k: [(k, t - t % 20, t - t % 20 + 20)],
                            lambda df: df.groupBy("k", F.window("ts", "20 seconds").alias("w"))),
    "sliding_update": (lambda t, k: [(None, s, s + 20) for s in (t - t % 10 - 10, t - t % 10)],
                       lambda df: df.groupBy(F.window("ts", "20 seconds", "10 seconds").alias("w"))),
}


def events() -> list[dict]:
    """Rows of every batch; one row in four batches 60 s behind (late wherever windows close), one in
    four 6 s behind (within the watermark: taken)."""
    out = []
    for j in range(BATCHES * PER_BATCH):
        batch, i = divmod(j, PER_BATCH)
        t = 2 * j - (60 if batch % 4 == 3 and i == 2 else 6 if batch % 4 == 1 and i == 4 else 0)
        out.append({"id": j, "k": j % 3, "v": j * 7 % 11, "t": max(t, 0)})
    return out


def oracle(shape: str, rows: list[dict], batch_of: dict[int, int], groups_of=None):
    """Spark's update mode replayed: ``{(group, batch): ids}`` emitted, and per batch the rows entering groups.

    Batch x evicts by the watermark ``wm(x)``, the latest event time of batches before x less the
    delay, and drops as late the rows of windows ending at or before the previous batch's, ``wm(x - 1)``
    (Spark's watermark for late events), so a window can take a row in the batch that closes it.
    ``groups_of`` overrides the shape's groups (``SHAPES``).
    """
    groups_of = groups_of or SHAPES[shape][0]
    windowed = shape != "keyed_update"
    by_batch = defaultdict(list)
    for row in rows:
        by_batch[batch_of[row["id"]]].append(row)

    def watermark(batch: int) -> int:
        times = [row["t"] for b, held in by_batch.items() if b < batch for row in held]
        return max(max(times) - DELAY_S, 0) if times else 0

    members: dict[tuple, list[int]] = defaultdict(list)
    emitted: dict[tuple, list[int]] = {}
    entering: dict[int, int] = {}
    for batch in sorted(by_batch):
        late_by = watermark(batch - 1)
        touched = set()
        entering[batch] = 0
        for row in by_batch[batch]:
            for group in groups_of(row["t"], row["k"]):
                if windowed and group[2] <= late_by:
                    continue  # late: its window closed
                members[group].append(row["id"])
                touched.add(group)
                entering[batch] += 1
        for group in touched:
            emitted[(group, batch)] = sorted(members[group])
    return emitted, entering


def read_all(query, last_offset: int, topic: str) -> None:
    """Wait until ``query`` has read up to ``last_offset`` of the topic, then stop it between triggers."""
    import time

    deadline = time.monotonic() + 300
    while not any(partition_offsets(s.endOffset).get((topic, 0), 0) > last_offset
                  for p in recent_progress(query) for s in p.sources):
        assert query.exception() is None, query.exception()
        assert time.monotonic() < deadline, "the stream did not read its rows"
        time.sleep(0.2)
    stop_when_idle(query)
    assert query.exception() is None, query.exception()


class Stream:
    """One traced stream (a topic, sink and checkpoint of its own; the log and edges topics of ``config``),
    started as often as a test needs on one checkpoint; ``read`` the batch that read each record,
    ``coordinates`` each event's."""

    def __init__(self, spark, config, tmp_path, prefix: str):
        self.spark, self.config = spark, config
        self.topic = self.name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        ensure_topics(self.config.bootstrap, [self.topic], 1)
        self.sink, self.checkpoint = str(tmp_path / "sink"), str(tmp_path / "cp")
        self.read: dict = {}
        self.coordinates: dict[int, tuple] = {}

    def produce(self, part: list[dict]) -> None:
        placed = demo_data.produce(self.config.bootstrap, self.topic,
                                   [(None, json.dumps({**e, "t": BASE + e["t"]}).encode()) for e in part])
        self.coordinates.update({e["id"]: ("kafka", self.topic, p, o) for e, (p, o) in zip(part, placed)})

    def start(self, tracer, build, mode: str = "update"):
        """Start the stream traced by ``tracer``: ``build`` makes the sink's DataFrame of the events."""
        raw = (self.spark.readStream.format("kafka").option("kafka.bootstrap.servers", self.config.bootstrap)
               .option("startingOffsets", "earliest")
               .option("subscribe", self.topic).option("maxOffsetsPerTrigger", PER_BATCH).load())
        parsed = raw.select(F.from_json(F.col("value").cast("string"), "id long, k int, v int, t long").alias("e"))
        df = parsed.select("e.*").withColumn("ts", F.col("t").cast("timestamp")).drop("t") \
            .withWatermark("ts", f"{DELAY_S} seconds")
        return (tracer.trace(build(df), name=self.name).writeStream.format("parquet").outputMode(mode)
                .option("checkpointLocation", self.checkpoint).trigger(processingTime="0 seconds").start(self.sink))

    def run(self, tracer, build, mode: str = "update") -> set[int]:
        """Start the stream, let it read every record produced so far, stop it between triggers; returns
        the batches it ran (with those that read nothing: Spark runs one when the watermark moves)."""
        return self.finish(self.start(tracer, build, mode))

    def finish(self, query) -> set[int]:
        """``run``'s end: the started ``query`` reads every record produced so far and is stopped."""
        read_all(query, max(o for _, _, _, o in self.coordinates.values()), self.topic)
        self.read.update(records_read(query))
        return {p.batchId for p in recent_progress(query)}

    def batch_of(self, rows: list[dict]) -> dict[int, int]:
        """The batch that read each event."""
        return {e["id"]: self.read[self.coordinates[e["id"]][1:]] for e in rows}

    def sink_rows(self) -> list[tuple[dict, int]]:
        """Every row of the sink, with the batch that wrote it (from capture's batch log)."""
        index(self.config)
        file_batch = sink_file_batches(self.config, self.name)
        table = self.spark.read.parquet(self.sink).withColumn("_file", F.input_file_name()).collect()
        return [(row.asDict(recursive=True), file_batch[local_file(row["_file"])]) for row in table]

    def logged(self) -> dict[int, dict]:
        """Capture's batch log of the stream, by batch."""
        return {r["batch"]: r for r in read_log(self.config) if r["schema"] == LOG_BATCH and r["query"] == self.name}


def build_of(shape: str):
    """The aggregation of a shape, with the ids of the rows each group holds, as Spark aggregates them."""
    return lambda df: SHAPES[shape][1](df).agg(F.sort_array(F.collect_list("id")).alias("ids"),
                                               F.count("*").alias("n"), F.sum("v").alias("total"))


def group_of(row: dict) -> tuple:
    """A sink row's group, as the oracle names it: (key, window start, window end), event times in seconds."""
    window = row.get("w")
    return (row.get("k"), None if window is None else int(window["start"].timestamp()) - BASE,
            None if window is None else int(window["end"].timestamp()) - BASE)


@pytest.fixture(scope="module")
def long_streams(spark, stack_config, tmp_path_factory):
    """Every shape's stream at once (three queries whose batches interleave, which saves the suite minutes;
    one tracer, a topic each), run three times on its checkpoint as the module says: the first half; the
    second half with a fault after the sink write of ``FAULT_BATCH`` (each query fails there once); again
    from the checkpoint. ``{shape: Stream}``."""
    config = own_topics(stack_config, "sn")[0]
    streams = {shape: Stream(spark, config, tmp_path_factory.mktemp(f"sn-{shape}"), "sn") for shape in SHAPES}
    rows = events()
    half = len(rows) // 2
    tracer = attach(spark, config)
    started = []

    def start_all() -> dict:
        queries = {shape: stream.start(tracer, build_of(shape)) for shape, stream in streams.items()}
        started.extend(queries.values())
        return queries

    try:
        for stream in streams.values():
            stream.produce(rows[:half])
        for shape, query in start_all().items():
            streams[shape].finish(query)
        for stream in streams.values():
            stream.produce(rows[half:])
        with fail_after_write(FileSink, FAULT_BATCH) as fired:
            for shape, query in start_all().items():
                with pytest.raises(StreamingQueryException, match="InjectedFault|after the write"):
                    query.awaitTermination(300)
                streams[shape].read.update(records_read(query))
        assert fired == [FAULT_BATCH] * len(SHAPES)
        for shape, query in start_all().items():
            streams[shape].finish(query)
    finally:
        for query in started:
            if query.isActive:
                query.stop()
        tracer.close()
    return streams


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_state_nodes_over_a_long_stream_equal_the_oracle(long_streams, shape):
    stream = long_streams[shape]
    config, name, coordinates = stream.config, stream.name, stream.coordinates
    rows = events()
    batch_of = stream.batch_of(rows)
    assert len(set(batch_of.values())) >= 30
    emitted, entering = oracle(shape, rows, batch_of)

    # The sink's rows are Spark's emissions, each once (the retried batch's too), and the oracle's.
    found: dict[tuple, list[int]] = {}
    rid_of: dict[tuple, int] = {}
    for row, batch in stream.sink_rows():
        key = (group_of(row), batch)
        assert key not in found, f"{key} emitted twice"
        found[key], rid_of[key] = list(row["ids"]), row["_hw_rid"]
        assert row["n"] == len(row["ids"])
    assert found == emitted

    # Work per batch: one edge per row entering a group, one per row emitted; never the group's history.
    logged = stream.logged()
    emitted_in = defaultdict(int)
    for _, batch in emitted:
        emitted_in[batch] += 1
    for batch, count in entering.items():
        assert logged[batch]["status"] == "full"
        assert logged[batch]["edges"] == count + emitted_in[batch], batch

    # The retried batch published twice (its first attempt's write completed), the same edges both times.
    published = [e for key, e in edges_published(config) if key == f"{name}/{FAULT_BATCH}".encode()]
    distinct = {tuple(row.values()) for row in published}
    assert len(distinct) == entering[FAULT_BATCH] + emitted_in[FAULT_BATCH] < len(published)

    outputs_of: dict[int, set[int]] = defaultdict(set)
    with LineageClient(config) as client:
        for key, ids in emitted.items():
            answer = client.backward(rid_of[key])
            assert {as_input(x) for x in answer} == {coordinates[i] for i in ids}, key
            assert all(x.exact for x in answer) and answer.complete
            for i in ids:
                outputs_of[i].add(rid_of[key])
        for row in rows:
            answer = client.forward(kafka_rid(*coordinates[row["id"]][1:]))
            assert {x.rid for x in answer} == outputs_of.get(row["id"], set()), row
            assert answer.complete
        # Co-contributors: the rows of every emission the row went into, up to that emission.
        ids_of = {rid_of[key]: ids for key, ids in emitted.items()}
        for row in [r for r in rows if r["id"] in outputs_of][::7]:
            together = {i for out in outputs_of.get(row["id"], ()) for i in ids_of[out]} - {row["id"]}
            answer = client.co_contributors(kafka_rid(*coordinates[row["id"]][1:]))
            assert {as_input(x) for x in answer} == {coordinates[i] for i in together}, row
    # The Parquet store's backends walk the same state nodes alike.
    for backend in ("csprov", "rq"):
        with LineageClient(config, backend=backend) as client:
            for key in sorted(emitted, key=str)[::9]:
                assert {as_input(x) for x in client.backward(rid_of[key])} == {coordinates[i] for i in emitted[key]}
            for row in rows[::11]:
                answer = client.forward(kafka_rid(*coordinates[row["id"]][1:]))
                assert {x.rid for x in answer} == outputs_of.get(row["id"], set()), (backend, row)


def chained(df):
    """An aggregate of an aggregate (Spark's chained time windows, append mode): the rows of each key's
    10-s windows, then those windows gathered into 20-s windows by their event time (``window_time``)."""
    first = df.groupBy(F.window("ts", "10 seconds").alias("w1"), "k").agg(F.collect_list("id").alias("ids1"))
    return first.groupBy(F.window(F.window_time("w1"), "20 seconds").alias("w")).agg(
        F.sort_array(F.flatten(F.collect_list("ids1"))).alias("ids"), F.count("*").alias("windows"))


def test_an_aggregate_of_an_aggregate_links_node_to_node_once_and_equals_the_oracle(spark, stack_config, tmp_path):
    """The second aggregate's input rows are the first's emitted groups: each links its first-level state
    node to its second-level one once, in the batch the first emits it; the walk's time rule then gives
    every output exactly the rows its 10-s windows took (late rows dropped by the first), over a restart."""
    stream = Stream(spark, own_topics(stack_config, "chain")[0], tmp_path, "chain")
    rows = events()
    tracer = attach(spark, stream.config)
    try:
        stream.produce(rows[:len(rows) // 2])
        stream.run(tracer, chained, "append")
        stream.produce(rows[len(rows) // 2:])
        stream.run(tracer, chained, "append")
    finally:
        tracer.close()
    batch_of = stream.batch_of(rows)
    assert len(set(batch_of.values())) >= 30
    first_emitted, entering = oracle("keyed_window_update", rows, batch_of,
                                     groups_of=lambda t, k: [(k, t - t % 10, t - t % 10 + 10)])
    taken: dict[tuple, set[int]] = defaultdict(set)  # the rows each 10-s window took
    for (group, _), ids in first_emitted.items():
        taken[group] |= set(ids)
    assert sum(map(len, taken.values())) < len(rows), "no row was late: the test would not check lateness"

    # Spark's emissions, each once, each exactly the rows its 10-s windows took.
    rid_of, ids_of, batch_out = {}, {}, {}
    for row, batch in stream.sink_rows():
        _, start, end = group_of(row)
        assert start not in ids_of, f"window {start} emitted twice"
        expected = sorted(i for (_, s, _), ids in taken.items() if start <= s < end for i in ids)
        assert list(row["ids"]) == expected, start
        rid_of[start], ids_of[start], batch_out[start] = row["_hw_rid"], expected, batch
    assert len(ids_of) >= 8

    # Work per batch: each row entering the first aggregate once (late rows never), each 10-s window into
    # the second once, each output from its node once; no edge is ever published again.
    published = edges_published(stream.config)
    edges = [(e["src"], e["dst"], e["op"]) for _, e in published]
    assert len(edges) == len(set(edges)), "an edge was published twice"
    sources = {kafka_rid(*c[1:]) for c in stream.coordinates.values()}
    ops = {e["op"] for _, e in published if e["src"] in sources}
    assert len(ops) == 1
    into_first = defaultdict(int)
    for _, e in published:
        if e["op"] in ops:
            into_first[e["batch"]] += 1
    assert into_first == {b: n for b, n in entering.items() if n}
    outputs = set(rid_of.values())
    second = [e for _, e in published if e["op"] not in ops and e["dst"] not in outputs]
    assert len({e["src"] for e in second}) == len(second) <= len(taken)
    assert len([e for _, e in published if e["dst"] in outputs]) == len(outputs)
    for batch, record in stream.logged().items():
        assert record["status"] == "full", batch

    outputs_of: dict[int, set[int]] = defaultdict(set)
    for start, ids in ids_of.items():
        for i in ids:
            outputs_of[i].add(rid_of[start])
    for backend in ("cypher", "csprov", "rq"):
        with LineageClient(stream.config, backend=backend) as client:
            for start, ids in ids_of.items():
                answer = client.backward(rid_of[start])
                assert {as_input(x) for x in answer} == {stream.coordinates[i] for i in ids}, (backend, start)
                assert all(x.exact for x in answer) and answer.complete
            for row in rows if backend == "cypher" else rows[::7]:
                answer = client.forward(kafka_rid(*stream.coordinates[row["id"]][1:]))
                assert {x.rid for x in answer} == outputs_of.get(row["id"], set()), (backend, row)
                assert answer.complete


def test_a_group_fed_by_a_batch_not_captured_names_it_as_a_gap(spark, stack_config, tmp_path):
    """One keyed update-mode stream run three times on one checkpoint: captured, log-only, captured. An
    answer through a group names every batch not captured that may have fed it (backward: up to the
    emission; forward: from the input's batch on) and is then not complete; what the captured batches
    published is still exactly the oracle's; answers that no such batch touches stay complete and exact.
    A record an uncaptured batch read is a clear error forward (query/README: which groups it entered
    is not inferred yet)."""
    stream = Stream(spark, own_topics(stack_config, "gap")[0], tmp_path, "gap")
    rows = events()
    thirds = [rows[:len(rows) // 3], rows[len(rows) // 3:2 * len(rows) // 3], rows[2 * len(rows) // 3:]]
    build = build_of("keyed_update")
    ran = []
    for part, overrides in zip(thirds, ({}, {"capture": LOG_ONLY}, {})):
        stream.produce(part)
        tracer = attach(spark, stream.config.with_overrides(**overrides))
        try:
            ran.append(stream.run(tracer, build))
        finally:
            tracer.close()
    batch_of = stream.batch_of(rows)
    emitted, _ = oracle("keyed_update", rows, batch_of)
    logged = stream.logged()
    skipped = ran[1]  # every batch of the log-only run, one that read nothing included
    assert {batch_of[e["id"]] for e in thirds[1]} <= skipped
    assert {b for b, r in logged.items() if r["status"] != "full"} == skipped
    first, last = min(skipped), max(skipped)

    rid_of = {}
    for row, batch in stream.sink_rows():
        rid_of[(group_of(row), batch)] = row["_hw_rid"]
    assert set(rid_of) == set(emitted)
    coordinates = stream.coordinates
    outputs_of: dict[int, set[tuple]] = defaultdict(set)
    for key, ids in emitted.items():
        for i in ids:
            outputs_of[i].add(key)
    with LineageClient(stream.config) as client:
        for key, ids in emitted.items():
            batch = key[1]
            answer = client.backward(rid_of[key])
            gaps = {g.batch for g in answer.gaps if g.query == stream.name}
            if batch < first:  # no uncaptured batch before it
                assert {as_input(x) for x in answer} == {coordinates[i] for i in ids}, key
                assert answer.complete and not gaps, key
            elif batch > last:  # from edges: its captured rows, exactly; every uncaptured batch named
                captured = {coordinates[i] for i in ids if batch_of[i] not in skipped}
                assert {as_input(x) for x in answer if x.exact} == captured, key
                assert gaps == skipped and not answer.complete, key
            else:  # emitted by a batch not captured: inferred, never claimed complete
                assert batch in gaps and not answer.complete, key
        for row in rows:
            at = batch_of[row["id"]]
            if first <= at <= last:  # read by a batch not captured: which groups it entered is not known
                with pytest.raises(LineageError, match="keeps state across batches"):
                    client.forward(kafka_rid(*coordinates[row["id"]][1:]))
                continue
            answer = client.forward(kafka_rid(*coordinates[row["id"]][1:]))
            gaps = {g.batch for g in answer.gaps if g.query == stream.name}
            reached = {rid_of[k] for k in outputs_of[row["id"]]}
            if at > last:  # after every uncaptured batch: exact and complete
                assert {x.rid for x in answer} == reached and answer.complete and not gaps, row
            else:  # its emissions in captured batches, exactly; the uncaptured ones named
                captured = {rid_of[k] for k in outputs_of[row["id"]] if k[1] not in skipped}
                assert {x.rid for x in answer if x.exact} == captured, row
                assert gaps == skipped and not answer.complete, row


def test_the_rows_entering_a_window_are_journaled_without_copying_the_window_into_the_plan(spark, stack_config):
    """The journal's call below an aggregate is a column of its own projection: in a filter's condition Spark's
    optimizer pushed it through the projection computing the window, copying the window's expression into it
    for the state key and again for the late column, a larger plan planned every batch (capture/README, "The hot
    path"). Traced, the optimized plan computes the window as often as untraced."""
    events = spark.readStream.format("kafka").option("kafka.bootstrap.servers", stack_config.bootstrap) \
        .option("subscribe", f"plan-{uuid.uuid4().hex[:8]}").load()
    counts = events.select(F.col("timestamp").alias("t"), F.col("partition").alias("k")) \
        .withWatermark("t", "10 seconds").groupBy(F.window("t", "10 seconds"), "k").count()
    tracer = attach(spark, stack_config)
    try:
        traced = tracer.trace(counts, name=f"plan-{uuid.uuid4().hex[:8]}").threaded.df

        def optimized(frame) -> str:  # as a micro-batch's plan is optimized (Spark 3.5 refuses a streaming frame's own)
            return spark._jsparkSession.sessionState().optimizer().execute(frame._jdf.queryExecution().analyzed()) \
                .toString()

        def windows(frame) -> int:  # Spark's window start and end, each a few precise timestamp conversions
            return optimized(frame).count("precisetimestampconversion")

        assert windows(counts) > 0
        assert windows(traced) == windows(counts)
        assert "journal.test" in optimized(traced)
    finally:
        tracer.close()
