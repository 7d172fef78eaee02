"""The journal of the hot path: the JVM filter that writes lineage rows (``Journal.java``, run in Spark
here) and the drain that turns them into payloads (``journal.py``, pure Python), each against rows
whose edges are worked out by hand.

The filter is checked on a real SparkSession: with the batch's setting as a local property it keeps
every row and journals exactly the rows (or inputs) a sample keeps and the rows that are not late,
counting their edges; without the setting it journals nothing; past the folder's bound it journals
nothing and counts the edges dropped; with the breaker open it counts them spilled.
"""

from __future__ import annotations

import shutil
import subprocess
import zipfile

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from headwater.adapters import spark_lines
from headwater.capture import jar
from headwater.capture.delivery import DeliverySettings
from headwater.capture.journal import PROPERTY, Drain, Group, Publisher, Setting, payloads, read, sampled
from headwater.capture.lineage import BatchContext, SourceEdges
from headwater.core import rid as rids
from headwater.core.schema import decode_lineage
from headwater.deploy.stack import free_port

pytestmark = pytest.mark.every_line  # runs on every supported Spark line (./dev test)

N = 400
RUN = 77


def outputs(query: str = "q") -> Publisher:
    template = BatchContext(query, query, 0, 9, (SourceEdges("src", "kafka", None, 0b11),))
    return Publisher("outputs", query, ("_hw_rid", "src"), ("src",), (Group(template, dst="_hw_rid"),))


def entering(query: str = "q", op: int = 5) -> Publisher:
    groups = tuple(Group(BatchContext(query, query, 0, op, (SourceEdges(f"s{i}", kind, dataset, 1),), dst_kind="state",
                                      dst_dataset=f"Aggregate#{op}", dst_in_batch=False), dst=f"k{i}", state_key=True)
                   for i, (kind, dataset) in enumerate((("kafka", None), ("static", "table:t"))))
    return Publisher(f"enter-{op}", query, ("k0", "k1", "s0", "s1", "late"), ("s0", "s1"), groups, mode="input",
                     late="late", op=op)


def kafka(i: int) -> dict:
    return {"rid": 1000 + i * 7919, "topic": "orders", "partition": 0, "offset": i}


def decoded(messages) -> tuple[set, set]:
    nodes, edges = set(), set()
    for payload in messages:
        n, e = decode_lineage(payload)
        nodes |= {(r["rid"], r["kind"]) for r in n.to_pylist()}
        edges |= {(r["src"], r["dst"], r["batch"], r["exact"]) for r in e.to_pylist()}
    return nodes, edges


@pytest.mark.parametrize("line", spark_lines.LINES, ids=lambda line: line.minor)
def test_each_lines_jar_is_built_from_its_sources(tmp_path, line):
    shipped = jar.jar_path(line)
    assert jar.built_digest(shipped) == jar.source_digest(line), "rebuild it: python -m headwater.capture.jar"
    if shutil.which("javac") is None:
        pytest.skip("no javac here to build it again")
    built = jar.build(line, tmp_path / "again.jar")
    assert jar.built_digest(built) == jar.source_digest(line)
    with zipfile.ZipFile(built) as fresh, zipfile.ZipFile(shipped) as ours:
        assert sorted(fresh.namelist()) == sorted(ours.namelist())


def test_outputs_become_one_edge_per_source_row_in_chunks():
    rows = pa.table({"_hw_rid": [i * 3 for i in range(N)], "src": [kafka(i) for i in range(N)]})
    messages = list(payloads(outputs(), Setting(4, RUN, None, {}), rows, max_rows=150))
    assert len(messages) == 3
    nodes, edges = decoded(messages)
    assert edges == {(1000 + i * 7919, i * 3, 4, True) for i in range(N)}
    assert {k for _, k in nodes} == {"source", "output"} and len(nodes) == 2 * N


def test_payloads_over_the_brokers_message_size_are_halved_until_they_fit():
    """Kafka refuses a message over its message.max.bytes (1 MiB by default): a part of the rows whose payload
    is over ``max_bytes`` is halved until each fits, each row's lineage in one payload, none lost or doubled."""
    rows = pa.table({"_hw_rid": [i * 3 for i in range(N)], "src": [kafka(i) for i in range(N)]})
    whole = list(payloads(outputs(), Setting(4, RUN, None, {}), rows))
    limit = len(whole[0]) // 3
    fitted = list(payloads(outputs(), Setting(4, RUN, None, {}), rows, max_bytes=limit))
    assert len(whole) == 1 and 3 <= len(fitted) <= 16 and all(len(p) <= limit for p in fitted), \
        (len(whole[0]), [len(p) for p in fitted])
    assert decoded(fitted) == decoded(whole)
    edges = [e for p in fitted for e in decode_lineage(p)[1].to_pylist()]
    assert len(edges) == N, "each row's edge once"


def test_entering_rows_link_each_present_input_to_its_state_node_in_the_run():
    keys = [[11, 12, 13], [21, 22, 23]]
    rows = pa.table({"k0": keys[0], "k1": keys[1], "s0": [kafka(0), None, kafka(2)],
                     "s1": [{"rid": 5, "key": "a"}, {"rid": 6, "key": "b"}, None], "late": [1, 2, 3]})
    nodes, edges = decoded(payloads(entering(), Setting(8, RUN, None, {"5": None}), rows))
    state = rids.state_node_rids
    expected = {(1000, int(state(np.array([11]), RUN)[0])), (1000 + 2 * 7919, int(state(np.array([13]), RUN)[0])),
                (5, int(state(np.array([21]), RUN)[0])), (6, int(state(np.array([22]), RUN)[0]))}
    assert {(s, d) for s, d, _, _ in edges} == expected
    # A row whose input is null (left out of the sample) makes no state node of that input either.
    assert int(state(np.array([23]), RUN)[0]) not in {r for r, _ in nodes}


def test_a_black_box_group_ends_at_its_state_node_of_the_batch_or_of_all_batches():
    source = SourceEdges("src", "kafka", None, 1)
    for stateful, node in ((False, rids.state_rid("q", 3, 6)), (True, rids.state_rid("q", 3, None))):
        template = BatchContext("q", "q", 0, 3, (source,), dst_kind="state", dst_dataset="MapInPandas#3", exact=False)
        publisher = Publisher("box-3", "q", ("src",), ("src",), (Group(template, node=3, stateful=stateful),),
                              mode="input")
        _, edges = decoded(payloads(publisher, Setting(6, RUN, None, {}), pa.table({"src": [kafka(1), kafka(2)]})))
        assert edges == {(1000 + 7919, node, 6, False), (1000 + 2 * 7919, node, 6, False)}


def test_a_publisher_survives_its_json():
    for publisher in (outputs(), entering()):
        assert Publisher.from_json(publisher.to_json()) == publisher


@pytest.fixture(scope="module")
def journals(spark, tmp_path_factory):
    folder = tmp_path_factory.mktemp("journal")
    return jar.Journals(spark, str(folder), 1 << 30), folder


def journal_run(spark, journals, publisher: Publisher, frame, columns, setting: Setting | None,
                max_bytes: int | None = None):
    """Run ``frame`` through the publisher's journal filter once; (rows it kept, counts, files written)."""
    made, folder = journals
    if max_bytes is not None:
        made = jar.Journals(spark, str(folder), max_bytes)
    for old in folder.glob("*.rows"):
        old.unlink()
    counts = jar.Counts.make(spark, publisher.query)
    column = made.column(publisher, counts, frame, columns)
    context = spark.sparkContext
    context.setLocalProperty(PROPERTY, setting.to_json() if setting else None)
    try:
        kept = frame.where(column).count()
    finally:
        context.setLocalProperty(PROPERTY, None)
    return kept, counts.value(), sorted(folder.glob("*.rows"))


def source_frame(spark):
    return spark.range(N, numPartitions=3).select(
        (F.col("id") * 7777).alias("_hw_rid"),  # spread over several moduli of the sample
        F.struct((F.lit(1000) + F.col("id") * 7919).alias("rid"), F.lit("orders").alias("topic"),
                 F.lit(0).alias("partition"), F.col("id").alias("offset")).alias("src"))


def test_the_filter_journals_every_row_of_a_full_batch_and_counts_it(spark, journals):
    frame = source_frame(spark)
    kept, counts, files = journal_run(spark, journals, outputs(), frame, [F.col("_hw_rid"), F.col("src")],
                                      Setting(2, RUN, None, {}))
    assert kept == N and counts["rows"] == N and counts["edges"] == N and counts["failed"] == 0
    assert len(files) == 3 and counts["bytes"] == sum(f.stat().st_size for f in files)
    publisher, setting, rows = read(files[0])
    assert publisher == outputs() and setting.batch == 2
    journaled = pa.concat_tables([read(f)[2] for f in files])
    assert sorted(journaled.column("_hw_rid").to_pylist()) == [i * 7777 for i in range(N)]
    assert sorted(r["offset"] for r in journaled.column("src").to_pylist()) == list(range(N))


def test_without_the_batch_setting_nothing_is_journaled(spark, journals):
    kept, counts, files = journal_run(spark, journals, outputs(), source_frame(spark),
                                      [F.col("_hw_rid"), F.col("src")], None)
    assert kept == N and files == [] and counts["edges"] == 0


def test_a_sample_keeps_rows_by_their_rid_as_the_drain_would(spark, journals):
    kept, counts, files = journal_run(spark, journals, outputs(), source_frame(spark),
                                      [F.col("_hw_rid"), F.col("src")], Setting(2, RUN, 0.3, {}))
    chosen = [i * 7777 for i in range(N) if sampled(np.array([i * 7777]), 0.3)[0]]
    journaled = pa.concat_tables([read(f)[2] for f in files])
    assert kept == N and counts["rows"] == N  # every row passes on: the sample is of lineage only
    assert sorted(journaled.column("_hw_rid").to_pylist()) == chosen and counts["edges"] == len(chosen)
    assert 0 < len(chosen) < N


def test_entering_rows_drop_late_rows_and_sample_each_input_by_its_own_rid(spark, journals):
    frame = spark.range(N, numPartitions=2).select(
        F.col("id").alias("k0"), (F.col("id") + 10_000).alias("k1"),
        F.struct((F.col("id") * 11).alias("rid"), F.lit("orders").alias("topic"), F.lit(0).alias("partition"),
                 F.col("id").alias("offset")).alias("s0"),
        F.struct((F.col("id") * 13 + 5).alias("rid"), F.col("id").cast("string").alias("key")).alias("s1"),
        F.timestamp_seconds(F.col("id")).alias("late"))
    watermark = 100 * 1_000_000  # rows with ``late`` at or before 100 s are late
    columns = [F.col(c) for c in ("k0", "k1", "s0", "s1", "late")]
    kept, counts, files = journal_run(spark, journals, entering(), frame, columns,
                                      Setting(3, RUN, 0.5, {"5": watermark}))
    journaled = pa.concat_tables([read(f)[2] for f in files]).to_pylist()
    expected = {}
    for i in range(101, N):
        s0, s1 = sampled(np.array([i * 11]), 0.5)[0], sampled(np.array([i * 13 + 5]), 0.5)[0]
        if s0 or s1:
            expected[i] = (bool(s0), bool(s1))
    assert kept == N and counts["rows"] == 0  # an aggregate's entering rows are not the sink's
    assert {r["k0"]: (r["s0"] is not None, r["s1"] is not None) for r in journaled} == expected
    assert counts["edges"] == sum(a + b for a, b in expected.values())
    # Without a watermark known for the aggregate its rows are not journaled, and the task says so.
    kept, counts, files = journal_run(spark, journals, entering(), frame, columns, Setting(3, RUN, None, {}))
    assert kept == N and files == [] and counts["edges"] == 0 and counts["failed"] == 2


def test_past_the_bound_the_edges_are_dropped_and_with_the_breaker_open_spilled(spark, journals):
    _, folder = journals
    columns = [F.col("_hw_rid"), F.col("src")]
    kept, counts, files = journal_run(spark, journals, outputs(), source_frame(spark), columns,
                                      Setting(2, RUN, None, {}), max_bytes=100)
    assert kept == N and files == [] and counts["dropped_edges"] == N and counts["edges"] == 0
    (folder / "breaker").write_text("9e99")
    try:
        kept, counts, files = journal_run(spark, journals, outputs(), source_frame(spark), columns,
                                          Setting(2, RUN, None, {}))
    finally:
        (folder / "breaker").unlink()
    assert counts["spilled_edges"] == counts["edges"] == N and len(files) == 3


def test_a_job_spark_runs_before_the_hook_names_the_batch_s_run_as_the_hook_does(spark, journals):
    """Spark's own batch and query id properties give a job the hook did not start its setting
    (``Journal.sparkSetting``): the run hashed in the JVM as ``rid.run_hash`` hashes it in Python."""
    made, _ = journals
    gateway = spark.sparkContext._gateway
    string = gateway.jvm.java.lang.Class.forName("java.lang.String")
    method = made._class.getMethod("runHash", made._classes([string]))
    for query_id in ("8b9c4a52-7a36-4f5c-9d0e-1f2a3b4c5d6e", "q", "é"):
        args = gateway.new_array(gateway.jvm.java.lang.Object, 1)
        args[0] = query_id
        assert method.invoke(None, args) == rids.run_hash(query_id)


def test_the_drain_sends_or_spills_each_file_once_and_deletes_it(spark, journals, tmp_path):
    """No broker answers (a free port): the drain converts each journal file into spilled messages
    that hold exactly its edges, and deletes it."""
    _, folder = journals
    journal_run(spark, journals, outputs(), source_frame(spark), [F.col("_hw_rid"), F.col("src")],
                Setting(2, RUN, None, {}))
    settings = DeliverySettings(f"127.0.0.1:{free_port()}", str(folder), send_timeout_s=1.0, breaker_cooldown_s=60)
    sent = []
    drain = Drain(settings, "edges", on_sent=lambda *a: sent.append(a))
    try:
        assert drain.run_once() == 3
    finally:
        drain.close()
        (folder / "breaker").unlink(missing_ok=True)
    assert drain.files() == [] and len(sent) == 3 and {q for q, *_ in sent} == {"q"}
    values = []
    for path in drain.spill.files():
        claimed, topic, key, value = drain.spill.claim(path)
        claimed.unlink()
        assert topic == "edges" and key == b"q/2"
        values.append(value)
    assert {(s, d) for s, d, _, _ in decoded(values)[1]} == {(1000 + i * 7919, i * 7777) for i in range(N)}


def test_a_file_the_drain_cannot_read_is_kept_aside(tmp_path):
    (tmp_path / "00000000000000000001-0-0-0-1.rows").write_bytes(b"not a journal file")
    drain = Drain(DeliverySettings(f"127.0.0.1:{free_port()}", str(tmp_path)), "edges")
    assert drain.run_once() == 0 and drain.files() == []
    assert [p.name for p in tmp_path.glob("*.bad")] == ["00000000000000000001-0-0-0-1.rows.bad"]


def test_a_dead_drains_claim_is_given_back_at_once(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    claimed = tmp_path / f".00000000000000000001-0-0-0-1.rows.{dead.pid}.claimed"
    claimed.write_bytes(b"x")
    drain = Drain(DeliverySettings(f"127.0.0.1:{free_port()}", str(tmp_path)), "edges")
    assert drain.spill.release_stale() == 1 and [p.name for p in drain.files()] == ["00000000000000000001-0-0-0-1.rows"]
