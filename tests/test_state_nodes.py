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
from collections import defaultdict

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

from headwater.adapters.kafka import ensure_topics
from headwater.capture import attach
from headwater.capture.sinks.spark_sinks import FileSink
from headwater.core.rid import kafka_rid
from headwater.core.schema import LOG_BATCH, decode_lineage
from headwater.demo import orders as demo_data
from headwater.query.api import LineageClient

from .conftest import index, local_file, own_topics, read_log, records_read, sink_file_batches, stop_when_idle
from .oracle import as_input
from .test_sinks import fail_after_write

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


def oracle(shape: str, rows: list[dict], batch_of: dict[int, int]):
    """Spark's update mode replayed: ``{(group, batch): ids}`` emitted, and per batch the rows entering groups.

    Batch x evicts by the watermark ``wm(x)``, the latest event time of batches before x less the
    delay, and drops as late the rows of windows ending at or before the previous batch's, ``wm(x - 1)``
    (Spark's watermark for late events), so a window can take a row in the batch that closes it.
    """
    groups_of, _ = SHAPES[shape]
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
    while not any(json.loads(s.endOffset or "{}").get(f"{topic}:0", 0) > last_offset
                  for p in query.recentProgress for s in p.sources):
        assert query.exception() is None, query.exception()
        assert time.monotonic() < deadline, "the stream did not read its rows"
        time.sleep(0.2)
    stop_when_idle(query)
    assert query.exception() is None, query.exception()


def edges_published(config) -> list[tuple[bytes, dict]]:
    """Every edge on the config's edges topic, with the key of the message that held it."""
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(config.edges_topic, bootstrap_servers=config.bootstrap,
                             auto_offset_reset="earliest", consumer_timeout_ms=3000)
    try:
        return [(m.key, edge) for m in consumer for edge in decode_lineage(m.value)[1].to_pylist()]
    finally:
        consumer.close()


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_state_nodes_over_a_long_stream_equal_the_oracle(spark, stack_config, tmp_path, shape):
    config, tag = own_topics(stack_config, "sn")
    topic = f"sn-{tag}"
    ensure_topics(config.bootstrap, [topic], 1)
    name = f"sn-{tag}"
    rows = events()
    sink, checkpoint = str(tmp_path / "sink"), str(tmp_path / "cp")
    tracer = attach(spark, config)
    read: dict = {}
    coordinates: dict[int, tuple] = {}

    def start():
        raw = (spark.readStream.format("headwater_kafka").option("kafka.bootstrap.servers", config.bootstrap)
               .option("subscribe", topic).option("maxOffsetsPerTrigger", PER_BATCH).load())
        parsed = raw.select(F.from_json(F.col("value").cast("string"), "id long, k int, v int, t long").alias("e"))
        df = parsed.select("e.*").withColumn("ts", F.col("t").cast("timestamp")).drop("t") \
            .withWatermark("ts", f"{DELAY_S} seconds")
        grouped = SHAPES[shape][1](df).agg(F.sort_array(F.collect_list("id")).alias("ids"), F.count("*").alias("n"),
                                           F.sum("v").alias("total"))
        return (tracer.trace(grouped, name=name).writeStream.format("parquet").outputMode("update")
                .option("checkpointLocation", checkpoint).trigger(processingTime="0 seconds").start(sink))

    def produce(part: list[dict]) -> None:
        placed = demo_data.produce(config.bootstrap, topic,
                                   [(None, json.dumps({**e, "t": BASE + e["t"]}).encode())
                                    for e in part])
        coordinates.update({e["id"]: ("kafka", topic, p, o) for e, (p, o) in zip(part, placed)})

    half = len(rows) // 2
    try:
        produce(rows[:half])
        query = start()
        read_all(query, max(o for _, _, _, o in coordinates.values()), topic)
        read.update(records_read(query))
        produce(rows[half:])
        with fail_after_write(FileSink, FAULT_BATCH) as fired:
            query = start()
            with pytest.raises(StreamingQueryException, match="InjectedFault|after the write"):
                query.awaitTermination(300)
        read.update(records_read(query))
        assert fired == [FAULT_BATCH]
        query = start()
        read_all(query, max(o for _, _, _, o in coordinates.values()), topic)
        read.update(records_read(query))
    finally:
        tracer.close()

    batch_of = {e["id"]: read[coordinates[e["id"]][1:]] for e in rows}
    assert len(set(batch_of.values())) >= 30
    emitted, entering = oracle(shape, rows, batch_of)

    # The sink's rows are Spark's emissions, each once (the retried batch's too), and the oracle's.
    index(config)
    file_batch = sink_file_batches(config, name)
    table = spark.read.parquet(sink).withColumn("_file", F.input_file_name()).collect()
    found: dict[tuple, list[int]] = {}
    rid_of: dict[tuple, int] = {}
    for row in (r.asDict(recursive=True) for r in table):
        window = row.get("w")
        group = (row.get("k"), None if window is None else int(window["start"].timestamp()) - BASE,
                 None if window is None else int(window["end"].timestamp()) - BASE)
        key = (group, file_batch[local_file(row["_file"])])
        assert key not in found, f"{key} emitted twice"
        found[key], rid_of[key] = list(row["ids"]), row["_hw_rid"]
        assert row["n"] == len(row["ids"])
    assert found == emitted

    # Work per batch: one edge per row entering a group, one per row emitted; never the group's history.
    logged = {r["batch"]: r for r in read_log(config) if r["schema"] == LOG_BATCH and r["query"] == name}
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
