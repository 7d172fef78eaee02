"""The traced sink is the sink the user asked for, exactly once where Spark is (issue 19).

One Kafka stream (several micro-batches) runs untraced into each kind of sink, and traced
into the same kind with a fault: the write of batch 1 completes, then the batch fails
before Spark commits it, and the query is started again from its checkpoint, so Spark
runs batch 1 a second time. The traced sink must hold exactly the untraced sink's rows
(plus ``_hw_rid``), none twice, none lost; a batch reader and a streaming reader of
each file sink must see those rows; the retried batch's lineage must be exact.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

from headwater.adapters.spark_lines import recent_progress
from headwater.capture.sinks import SinkError
from headwater.capture.sinks.spark_sinks import FileSink
from headwater.capture.sinks.streaming_write import StreamingWriteSink
from headwater.core.offsets import reached
from headwater.core.schema import LOG_BATCH
from headwater.query.api import LineageClient
from headwater.spark.table_files import sink_batch_files
from tests import pipelines
from tests.conftest import index, local_file, read_log, stop_when_idle
from tests.oracle import as_input

pytestmark = pytest.mark.every_line  # runs on every supported Spark line (./dev test)


def asked(server, direction: str, source: str) -> dict:
    """The HTTP answer about the row at address ``source``."""
    import urllib.parse
    import urllib.request

    query = urllib.parse.urlencode({"source": source})
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/v1/lineage/{direction}?{query}", timeout=60) as got:
        return json.loads(got.read())


COUNT = 90
PER_BATCH = 30  # records per micro-batch: batches 0, 1 and 2
FAULT_BATCH = 1
COLUMNS = ["id", "k", "v", "s", "name", "day"]
SCHEMA = "id long, k int, v int, s string, name string, day int"
COMPACT_INTERVAL = "spark.sql.streaming.fileSink.log.compactInterval"


class InjectedFault(RuntimeError):
    """A fault injected by the test: the batch fails after its sink write, before Spark's commit."""


@pytest.fixture(scope="module")
def env(spark, stack_config, tmp_path_factory):
    yield from pipelines.event_env(spark, stack_config, tmp_path_factory.mktemp("sinks"), "snk", COUNT, seed=19)


@pytest.fixture(scope="module")
def expected(env) -> dict[int, dict]:
    """The oracle: every parsed event's output row, by id."""
    dims = {d["k"]: d["name"] for d in pipelines.dims()}
    rows = {}
    for value in env.values:
        event = pipelines.parse(value)
        if event["id"] is not None:
            rows[event["id"]] = {"id": event["id"], "k": event["k"], "v": event["v"], "s": event["s"],
                                 "name": dims.get(event["k"]), "day": event["k"] % 3}
    return rows


def stream(spark, env):
    source = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", env.config.bootstrap)
              .option("startingOffsets", "earliest")
              .option("subscribe", env.topic).option("maxOffsetsPerTrigger", PER_BATCH).load())
    events = source.select(F.from_json(F.col("value").cast("string"), pipelines.EVENT_SCHEMA).alias("e")) \
        .select("e.*").where("id IS NOT NULL")
    return events.join(env.dims_df, "k", "left").select(*COLUMNS[:-1], (F.col("k") % 3).alias("day"))


@contextlib.contextmanager
def fail_after_write(sink_class, batch: int = FAULT_BATCH):
    """Fault injection: the first write of batch ``batch`` to each sink of ``sink_class`` (each query's
    own) completes, then raises, as a driver dying between the write and Spark's commit would; yields
    the batches it fired at, one per sink."""
    original = sink_class.write
    fired, sinks = [], set()

    def write(self, df, batch_id):
        original(self, df, batch_id)
        if batch_id == batch and id(self) not in sinks:
            sinks.add(id(self))
            fired.append(batch_id)
            raise InjectedFault(f"after the write of batch {batch_id}")

    with mock.patch.object(sink_class, "write", write):
        yield fired


def ends(env) -> dict[tuple[str, int], int]:
    """Where the topic ends: ``{(topic, partition): next offset}``."""
    last: dict[tuple[str, int], int] = {}
    for partition, offset in env.coordinates:
        last[env.topic, partition] = max(last.get((env.topic, partition), 0), offset + 1)
    return last


def run(start, checkpoint: Path, env):
    """Start the query and stop it once it has read the whole topic (maxOffsetsPerTrigger
    splits it into batches only under a processing-time trigger)."""
    query = start(str(checkpoint))
    deadline = time.monotonic() + 240
    while not any(reached(s.endOffset, ends(env)) for p in recent_progress(query) for s in p.sources):
        assert query.exception() is None, query.exception()
        assert time.monotonic() < deadline, "the stream did not read the whole topic"
        time.sleep(0.2)
    stop_when_idle(query)
    assert query.exception() is None, query.exception()
    return query


def run_with_retry(start, checkpoint: Path, fault, env):
    """Start the query, see it fail at the fault, start it again from its checkpoint."""
    with fault as fired:
        query = start(str(checkpoint))
        with pytest.raises(StreamingQueryException, match="InjectedFault|after the write"):
            query.awaitTermination(240)
    assert fired == [FAULT_BATCH]
    return run(start, checkpoint, env)


FILE_SINKS = {
    "parquet": lambda w: w.format("parquet"),
    "parquet_partitioned": lambda w: w.format("parquet").partitionBy("day"),
    "json": lambda w: w.format("json"),
    "csv": lambda w: w.format("csv").options(header=True),
}


def file_format(kind: str) -> str:
    return kind.split("_")[0]


def read_batch(spark, kind: str, path: str, traced: bool) -> list[dict]:
    reader = spark.read.format(file_format(kind)).option("header", "true")
    return [r.asDict() for r in reader.schema(_schema(traced)).load(path).collect()]


def read_streaming(spark, kind: str, path: str, traced: bool, checkpoint: Path) -> list[dict]:
    """The path's rows as a streaming reader of it gets them (Spark's file source, untraced)."""
    rows = []
    query = (spark.readStream.format(file_format(kind)).option("header", "true").schema(_schema(traced)).load(path)
             .writeStream.foreachBatch(lambda df, _: rows.extend(r.asDict() for r in df.collect()))
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    return rows


def _schema(traced: bool) -> str:
    return SCHEMA + (", _hw_rid long" if traced else "")


def same_rows(traced: list[dict], untraced: list[dict], expected: dict) -> None:
    """Equal rows but for ``_hw_rid``, each once, all of them; every traced row has its own rid."""
    rids = [r.pop("_hw_rid") for r in traced]
    key = lambda r: tuple(sorted(r.items()))  # noqa: E731
    assert Counter(map(key, traced)) == Counter(map(key, untraced))
    assert sorted(r["id"] for r in untraced) == sorted(expected)
    assert None not in rids and len(set(rids)) == len(rids)


def test_file_sink_lists_each_batch_s_files_across_compactions(spark, tmp_path):
    """``FileSink.files``, what each batch's capture record lists: batch ``b`` of a stream reading one input file
    a batch wrote exactly the files holding input ``b``'s rows, at compactions too (every second batch here),
    whether read batch after batch, as the tracer does, or a compaction alone."""
    inputs, sink = tmp_path / "in", str(tmp_path / "sink")
    inputs.mkdir()
    batches = 7  # compactions at 1, 3 and 5: each after another
    for b in range(batches):
        path = inputs / f"{b:02d}.json"
        path.write_text("".join(json.dumps({"id": 10 * b + i}) + "\n" for i in range(10)))
        os.utime(path, (1_700_000_000 + b, 1_700_000_000 + b))  # Spark's file source takes the oldest first
    spark.conf.set(COMPACT_INTERVAL, "2")
    try:
        query = (spark.readStream.schema("id long").option("maxFilesPerTrigger", 1).json(str(inputs))
                 .writeStream.format("parquet").option("checkpointLocation", str(tmp_path / "cp"))
                 .trigger(availableNow=True).start(sink))
        query.awaitTermination(120)
        query.stop()  # stopped already, unless it overran its time
        assert query.exception() is None, query.exception()
        assert sorted(p.name for p in Path(sink, "_spark_metadata").glob("*.compact")) == \
            ["1.compact", "3.compact", "5.compact"]
        in_order = FileSink(spark, None, sink)
        listed = {b: in_order.files(b) for b in range(batches)}
        assert FileSink(spark, None, sink).files(5) == listed[5]  # no entry read before
    finally:
        spark.conf.unset(COMPACT_INTERVAL)
    for b, files in listed.items():
        ids = sorted(pq.read_table([local_file(f) for f in files]).column("id").to_pylist())
        assert ids == list(range(10 * b, 10 * b + 10)), b
    on_disk = {str(p.resolve()) for p in Path(sink).glob("part-*.parquet")}
    assert sorted(local_file(f) for fs in listed.values() for f in fs) == sorted(on_disk)


@pytest.mark.parametrize("kind", list(FILE_SINKS))
def test_file_sinks_after_a_retried_batch_equal_untraced(spark, env, expected, tmp_path, kind):
    configure = FILE_SINKS[kind]
    untraced, traced = str(tmp_path / "untraced"), str(tmp_path / "traced")
    name = f"{kind}-{uuid.uuid4().hex[:6]}"
    if kind == "json":  # Spark compacts the log every second batch: the retried batch 1 is a compaction
        spark.conf.set(COMPACT_INTERVAL, "2")
    try:
        run(lambda cp: configure(stream(spark, env).writeStream).option("checkpointLocation", cp).start(untraced),
            tmp_path / "cp-untraced", env)
        run_with_retry(lambda cp: configure(env.tracer.trace(stream(spark, env), name=name, keys={"dims": "k"})
                                            .writeStream).option("checkpointLocation", cp).start(traced),
                       tmp_path / "cp-traced", fail_after_write(FileSink), env)
    finally:
        spark.conf.unset(COMPACT_INTERVAL)

    # Spark's own commit log, batch by batch, as the untraced sink has it.
    assert sorted(p.name for p in Path(traced, "_spark_metadata").iterdir() if not p.name.startswith(".")) == \
        sorted(p.name for p in Path(untraced, "_spark_metadata").iterdir() if not p.name.startswith("."))
    assert Path(traced, "_spark_metadata", "1.compact").exists() == (kind == "json")
    if kind == "parquet":  # a file an attempt left behind, in no batch of the log, is read by no reader
        stray = Path(traced, "part-99999-left-by-a-dead-attempt.snappy.parquet")
        pq.write_table(pa.Table.from_pylist([{**expected[min(expected)], "_hw_rid": 1}]), stray)
    untraced_rows = read_batch(spark, kind, untraced, False)
    same_rows(read_batch(spark, kind, traced, True), untraced_rows, expected)
    same_rows(read_streaming(spark, kind, traced, True, tmp_path / "cp-read"), untraced_rows, expected)

    # Lineage of every row is exact, the retried batch's too; each batch logged the files it wrote.
    records = [r for r in read_log(env.config) if r["schema"] == LOG_BATCH and r["query"] == name]
    by_batch = {r["batch"]: r for r in records}
    assert sorted(by_batch) == [0, 1, 2] and all(r["status"] == "full" for r in records)
    assert by_batch[FAULT_BATCH].get("sink_written_before") is True
    files = {b: [local_file(f) for f in r["sink_files"]] for b, r in by_batch.items()}
    on_disk = {str(p.resolve()) for p in Path(traced).rglob(f"part-*.{file_format(kind)}*") if "left-by" not in p.name}
    assert sorted(f for fs in files.values() for f in fs) == sorted(on_disk)  # each file in one batch only
    for batch, listed in files.items():  # and the fallback reads the sink's log alike, compactions too
        assert sorted(local_file(f) for f in sink_batch_files(traced, batch)) == sorted(listed), batch
    index(env.config)
    read = {pipelines.parse(v)["id"]: c for v, c in zip(env.values, env.coordinates)}
    with LineageClient(env.config) as client:
        for row in read_batch(spark, kind, traced, True):
            row = SimpleNamespace(**row)
            want = {("kafka", env.topic, *read[row.id])}
            if row.k in pipelines.DIM_KEYS:
                want.add(("table", "dims", str(row.k)))
            found = client.backward(row._hw_rid)
            assert {as_input(x) for x in found} == want, row.id
            assert all(x.exact for x in found)


def test_catalog_table_after_a_retried_batch_equals_untraced(spark, env, expected, tmp_path):
    """Made by toTable, partitioned, as untraced; written with the file sink at its location."""
    untraced, traced = f"hw_untraced_{uuid.uuid4().hex[:6]}", f"hw_traced_{uuid.uuid4().hex[:6]}"
    run(lambda cp: stream(spark, env).writeStream.option("checkpointLocation", cp)
        .toTable(untraced, partitionBy="day"), tmp_path / "cp-untraced", env)
    run_with_retry(lambda cp: env.tracer.trace(stream(spark, env), name=traced, keys={"dims": "k"}).writeStream
                   .option("checkpointLocation", cp).toTable(traced, partitionBy="day"),
                   tmp_path / "cp-traced", fail_after_write(FileSink), env)
    same_rows([r.asDict() for r in spark.table(traced).collect()],
              [r.asDict() for r in spark.table(untraced).collect()], expected)
    columns = {name: spark.catalog.listColumns(name) for name in (traced, untraced)}
    assert [c.name for c in columns[traced] if c.isPartition] == ["day"]
    assert [(c.name, c.isPartition) for c in columns[traced] if c.name != "_hw_rid"] == \
        [(c.name, c.isPartition) for c in columns[untraced]]


def test_users_foreach_batch_gets_the_same_calls_after_a_retry(spark, env, expected, tmp_path):
    """The user's foreachBatch writes each batch's rows over that batch's folder; it fails once after
    writing batch 1, traced and untraced alike (the fault is the user's code): Spark calls it again."""
    calls = {}

    def user_function(root: Path, called: list):
        def write(df, batch_id):
            called.append(batch_id)
            df.write.mode("overwrite").parquet(str(root / f"batch={batch_id}"))
            if batch_id == FAULT_BATCH and called.count(batch_id) == 1:
                raise InjectedFault(f"after the write of batch {batch_id}")
        return write

    for traced in (False, True):
        root = tmp_path / ("traced" if traced else "untraced")
        function = user_function(root, calls.setdefault(traced, []))

        def start(cp, traced=traced, function=function):
            frame = stream(spark, env)
            writer = (env.tracer.trace(frame, name=f"fb-{uuid.uuid4().hex[:6]}", keys={"dims": "k"}).writeStream
                      if traced else frame.writeStream)
            return writer.foreachBatch(function).option("checkpointLocation", cp).start()
        run_with_retry(start, tmp_path / f"cp-{traced}", contextlib.nullcontext([FAULT_BATCH]), env)
    same_rows([r.asDict() for r in spark.read.parquet(str(tmp_path / "traced")).drop("batch").collect()],
              [r.asDict() for r in spark.read.parquet(str(tmp_path / "untraced")).drop("batch").collect()], expected)
    assert calls[True] == calls[False] == [0, 1, 1, 2]


class RowFiles:
    """A user's foreach writer: each (epoch, partition) to a file of its own, written over on a retry."""

    def __init__(self, root: str, fail_marker: str):
        self.root, self.fail_marker = root, fail_marker

    def open(self, partition_id, epoch_id):
        self.path = Path(self.root, f"{epoch_id}-{partition_id}.jsonl")
        self.rows = []
        self.epoch = epoch_id
        return True

    def process(self, row):
        self.rows.append(row.asDict())

    def close(self, error):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("".join(json.dumps(r) + "\n" for r in self.rows))
        marker = Path(self.fail_marker)
        if self.epoch == FAULT_BATCH and not marker.exists():  # the user's code fails once, after writing
            marker.touch()
            raise InjectedFault(f"after the write of batch {self.epoch}")


def test_users_foreach_writer_gets_the_same_calls_after_a_retry(spark, env, expected, tmp_path):
    for traced in (False, True):
        root = tmp_path / ("traced" if traced else "untraced")

        def start(cp, traced=traced, root=root):
            frame = stream(spark, env)
            writer = (env.tracer.trace(frame, name=f"fe-{uuid.uuid4().hex[:6]}", keys={"dims": "k"}).writeStream
                      if traced else frame.writeStream)
            return (writer.foreach(RowFiles(str(root), str(root) + ".failed")).option("checkpointLocation", cp)
                    .start())
        run_with_retry(start, tmp_path / f"cp-{traced}", contextlib.nullcontext([FAULT_BATCH]), env)
    rows = {t: [json.loads(line) for f in sorted((tmp_path / t).glob("*.jsonl")) for line in f.read_text().splitlines()]
            for t in ("traced", "untraced")}
    same_rows(rows["traced"], rows["untraced"], expected)


def test_memory_sink_is_a_view_named_after_the_query(spark, env, expected, tmp_path):
    name = f"hw_memory_{uuid.uuid4().hex[:6]}"
    run(lambda cp: env.tracer.trace(stream(spark, env), name=f"traced-{name}", keys={"dims": "k"}).writeStream
        .format("memory").queryName(name).option("checkpointLocation", cp).start(),
        tmp_path / "cp", env)
    rows = [r.asDict() for r in spark.table(name).collect()]
    assert sorted(r["id"] for r in rows) == sorted(expected) and all(r["_hw_rid"] is not None for r in rows)


def test_a_registered_sink_is_written_by_a_traced_query(spark, env, expected, tmp_path, monkeypatch):
    """A sink another package registers for its format (``register_sink``) gets every batch's rows, each with its
    rid; ``open`` is given the writer's settings."""
    from headwater.capture.sinks import AT_LEAST_ONCE, Sink, base, register_sink

    monkeypatch.setattr(base, "SINKS", dict(base.SINKS))  # the registration is this test's alone
    written, opened = [], []

    @register_sink("hw-collected")
    class Collected(Sink):
        guarantee = AT_LEAST_ONCE

        @classmethod
        def open(cls, spark, spec, schema, output_mode):
            opened.append((spec.options.get("label"), output_mode, "_hw_rid" in schema.fieldNames()))
            return cls()

        def write(self, df, batch_id):
            written.extend(r.asDict() for r in df.collect())

    with pytest.raises(ValueError, match="registered already"):
        register_sink("hw-collected")(type("Other", (Sink,), {}))
    name = f"hw_collected_{uuid.uuid4().hex[:6]}"
    run(lambda cp: env.tracer.trace(stream(spark, env), name=name, keys={"dims": "k"}).writeStream
        .format("hw-collected").option("label", "mine").option("checkpointLocation", cp).start(), tmp_path / "cp", env)
    assert opened == [("mine", "append", True)]
    assert sorted(r["id"] for r in written) == sorted(expected) and all(r["_hw_rid"] is not None for r in written)


def test_what_cannot_be_traced_as_asked_fails_at_start_naming_it(spark, env, tmp_path):
    traced = env.tracer.trace(stream(spark, env), name=f"refused-{uuid.uuid4().hex[:6]}")
    checkpoint = str(tmp_path / "cp")
    view = f"hw_view_{uuid.uuid4().hex[:6]}"
    spark.range(3).createOrReplaceTempView(view)
    cases = {
        "continuous": lambda w: w.trigger(continuous="1 second").format("parquet")
        .option("checkpointLocation", checkpoint).start(str(tmp_path / "a")),
        "partitionBy and clusterBy": lambda w: w.format("parquet").partitionBy("day").clusterBy("k")
        .option("checkpointLocation", checkpoint).start(str(tmp_path / "c")),
        "not among the output's columns": lambda w: w.format("parquet").partitionBy("nope")
        .option("checkpointLocation", checkpoint).start(str(tmp_path / "d")),
        "foreachBatch sink does not take partitionBy": lambda w: w.foreachBatch(lambda df, b: None)
        .partitionBy("day").start(),
        "given twice": lambda w: w.format("parquet").option("path", str(tmp_path / "e"))
        .option("checkpointLocation", checkpoint).start(str(tmp_path / "f")),
        "unknown output mode": lambda w: w.outputMode("upsert"),
        "memory sink needs a query name": lambda w: w.format("memory").start(),
        "emit_rid=False to write text": lambda w: w.format("text").option("checkpointLocation", checkpoint)
        .start(str(tmp_path / "i")),
        "format 'hive'": lambda w: w.format("hive").option("checkpointLocation", checkpoint)
        .start(str(tmp_path / "j")),
        "temporary view": lambda w: w.option("checkpointLocation", checkpoint).toTable(view),
        "no data source 'no-such-format'": lambda w: w.format("no-such-format")
        .option("checkpointLocation", checkpoint).start(str(tmp_path / "h")),
    }
    for said, start in cases.items():
        with pytest.raises(SinkError, match=said):
            start(traced.writeStream)
    assert not spark.streams.active


@pytest.mark.since("4.0")  # a Python data source (pyspark.sql.datasource) writes the batches
def test_streaming_writer_sinks_commit_with_the_batch_id(spark, env, expected, tmp_path):
    """A Python data source's streaming writer gets ``commit(messages, batch_id)`` as Spark calls it
    untraced, the retried batch's id again (this connector keeps the first commit of a batch id)."""
    from tests.sink_source import BatchFiles

    spark.dataSource.register(BatchFiles)
    roots = {traced: tmp_path / ("traced" if traced else "untraced") for traced in (False, True)}
    run(lambda cp: stream(spark, env).writeStream.format(BatchFiles.name()).option("path", str(roots[False]))
        .option("checkpointLocation", cp).start(), tmp_path / "cp-untraced", env)
    run_with_retry(lambda cp: env.tracer.trace(stream(spark, env), name=f"v2-{uuid.uuid4().hex[:6]}",
                                               keys={"dims": "k"}).writeStream.format(BatchFiles.name())
                   .option("path", str(roots[True])).option("checkpointLocation", cp)
                   .start(), tmp_path / "cp-traced", fail_after_write(StreamingWriteSink), env)
    rows = {t: [json.loads(line) for f in sorted(root.glob("*.jsonl")) for line in f.read_text().splitlines()]
            for t, root in roots.items()}
    assert sorted(p.name for p in roots[True].glob("*.jsonl")) == ["0.jsonl", "1.jsonl", "2.jsonl"]
    assert (roots[False] / "commits").read_text().split() == ["0", "1", "2"]
    assert (roots[True] / "commits").read_text().split() == ["0", "1", "1", "2"]
    same_rows(rows[True], rows[False], expected)


def kafka_rows(spark, env):
    """The stream as Kafka records: the id as key, the row as a JSON value."""
    return stream(spark, env).select(F.col("id").cast("string").alias("key"),
                                     F.to_json(F.struct(*COLUMNS)).alias("value"))


def run_rerunning_the_last_batch(start, checkpoint: Path, env) -> None:
    """Run the query to the end, then as if its driver died between the last batch's write and Spark's commit:
    that commit taken out of the checkpoint, the query started again, and Spark runs the batch a second time."""
    run(start, checkpoint, env)
    commits = Path(checkpoint, "commits")
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    for name in (str(last), f".{last}.crc"):
        (commits / name).unlink(missing_ok=True)
    run(start, checkpoint, env)


@pytest.mark.parametrize("place", ["header", "value"])
def test_kafka_sink_after_a_rerun_batch_has_the_untraced_records_each_with_its_rid(spark, env, expected, tmp_path,
                                                                                  place):
    """Spark's own Kafka sink, at least once: the same records and the same duplicates as untraced; each
    traced record carries its rid where ``headwater.rid`` says; forward lineage names each output row's
    record (``kafka:TOPIC:PARTITION:OFFSET``), and backward from such a record finds its inputs."""
    from headwater.adapters.kafka import ensure_topics
    from headwater.query.sink_records import carried_rid
    from tests.conftest import topic_records

    tag = uuid.uuid4().hex[:6]
    topics = {traced: f"snk-out-{'traced' if traced else 'untraced'}-{place}-{tag}" for traced in (False, True)}
    ensure_topics(env.config, list(topics.values()), 2)

    def to_kafka(rows, traced: bool):
        return (rows.writeStream.format("kafka").option("kafka.bootstrap.servers", env.config.bootstrap)
                .option("topic", topics[traced]))

    name = f"kafka-{place}-{tag}"
    run_rerunning_the_last_batch(lambda cp: to_kafka(kafka_rows(spark, env), False).option("checkpointLocation", cp)
                                 .start(), tmp_path / "cp-untraced", env)
    run_rerunning_the_last_batch(
        lambda cp: to_kafka(env.tracer.trace(kafka_rows(spark, env), name=name, keys={"dims": "k"}), True)
        .option("headwater.rid", place).option("checkpointLocation", cp).start(), tmp_path / "cp-traced", env)

    def content(record, traced: bool) -> tuple:
        value = json.loads(record.value)
        if place == "value" and traced:
            assert next(iter(value)) == "_hw_rid"  # first in the value, as the docs say
            value.pop("_hw_rid")
        headers = [(k, v) for k, v in record.headers or [] if k != "_hw_rid"]
        return record.key, tuple(sorted(value.items())), tuple(headers)

    records = {traced: topic_records(env.config, topics[traced]) for traced in (False, True)}
    counted = {traced: Counter(content(r, traced) for r in found) for traced, found in records.items()}
    assert counted[True] == counted[False]  # the same records, the same duplicates
    assert sorted({json.loads(r.value)["id"] for r in records[False]}) == sorted(expected)
    assert 2 in counted[False].values()  # the batch Spark ran again was written twice, untraced as traced
    where: dict[int, set] = {}
    for record in records[True]:
        rid = carried_rid(record)
        assert rid is not None and (place == "header") == any(k == "_hw_rid" for k, _ in record.headers or [])
        where.setdefault(rid, set()).add((record.topic, record.partition, record.offset))
    assert len(where) == len(expected)  # a rid a row, its duplicate the same rid

    index(env.config)
    read = {pipelines.parse(v)["id"]: c for v, c in zip(env.values, env.coordinates)}
    with LineageClient(env.config) as client:
        for rid, places in where.items():
            topic, partition, offset = sorted(places)[0]
            row = json.loads(next(r.value for r in records[True] if r.offset == offset and r.partition == partition))
            want = {("kafka", env.topic, *read[row["id"]])}
            if row["k"] in pipelines.DIM_KEYS:
                want.add(("table", "dims", str(row["k"])))
            back = client.backward(f"kafka:{topic}:{partition}:{offset}")
            assert {as_input(x) for x in back} == want and all(x.exact for x in back), row["id"]
            outputs = [x for x in client.forward(f"kafka:{env.topic}:{read[row['id']][0]}:{read[row['id']][1]}")
                       if x.kind == "output" and x.dataset == name]  # other tests' queries read the topic too
            assert [x.rid for x in outputs] == [rid]
            assert (outputs[0].topic, outputs[0].partition, outputs[0].offset) in places, row["id"]
        shown = client.forward(f"kafka:{env.topic}:{read[min(expected)][0]}:{read[min(expected)][1]}", payload=True)
        [output] = [x for x in shown if x.kind == "output" and x.dataset == name]
        value = output.payload["value"]
        assert (json.loads(value) if isinstance(value, (str, bytes)) else value)["id"] == min(expected)

    # Over HTTP the same: a sink record named by its address (source=), an input's outputs placed in the topic.
    from headwater.query import http

    server = http.serve(env.config, "127.0.0.1", 0, say=lambda _: None)
    try:
        rid, places = min(where.items())
        topic, partition, offset = sorted(places)[0]
        address = f"kafka:{topic}:{partition}:{offset}"
        with LineageClient(env.config) as client:
            expected_back = json.loads(json.dumps([x.to_dict() for x in client.backward(address)]))
        assert asked(server, "backward", address)["answer"] == expected_back
        row = json.loads(next(r.value for r in records[True] if r.offset == offset and r.partition == partition))
        found = asked(server, "forward", f"kafka:{env.topic}:{read[row['id']][0]}:{read[row['id']][1]}")["answer"]
        [output] = [x for x in found if x["kind"] == "output" and x["dataset"] == name]
        assert output["rid"] == rid and (output["topic"], output["partition"], output["offset"]) in places
    finally:
        server.close()
