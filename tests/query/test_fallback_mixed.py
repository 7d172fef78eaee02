"""One demo stream whose capture an operator switches mid-stream, on the same checkpoint and sink:
fully captured, then log-only, then full again under an overhead budget no capture fits (so
it degrades to sampled, then log-only). Every output row's backward lineage, and every input
record's forward lineage, asked by its rid as usual, equals the brute-force oracle: from edges
where its batch published them, inferred from the log where it did not, with the batch that was
not captured named as the answer's gap."""

from __future__ import annotations

import numpy as np
import pyarrow.dataset as ds
import pytest

from headwater.adapters.kafka import ensure_topics
from headwater.adapters.spark_lines import recent_progress
from headwater.capture.budget import FULL, LOG_ONLY, SAMPLED
from headwater.capture.journal import sampled
from headwater.core.rid import kafka_rid
from headwater.core.schema import LOG_BATCH
from headwater.demo import orders as data
from headwater.demo.run import end_offsets, run_pipeline
from headwater.query.api import LineageClient
from tests.conftest import index, local_file, own_topics, read_log, records_read, sink_file_batches
from tests.oracle import as_input, demo_lineage, derived_from, parse

pytestmark = pytest.mark.every_line  # runs on every supported Spark line (./dev test)

QUERY = "enriched_orders"
MAX_PER_BATCH = 40
# (events, config overrides) of each run of the stream, one after the other on one checkpoint.
# Any capture exceeds the last run's budget: its first batch is full, then capture steps down.
RUNS = ((80, {}), (100, {"capture": LOG_ONLY}), (120, {"overhead_budget": 1e-6}))
ORDERS = sum(count for count, _ in RUNS)


@pytest.fixture(scope="module")
def run(spark, stack_config, tmp_path_factory):
    config, tag = own_topics(stack_config, "mixed")
    topic = f"orders-{tag}"
    ensure_topics(config.bootstrap, [topic], 2)
    events = data.order_events(ORDERS, malformed_every=31)
    workdir = tmp_path_factory.mktemp("mixed")
    coordinates: list[tuple[int, int]] = []
    runs = []  # the batches each run made
    read = {}  # the batch that read each record
    for count, overrides in RUNS:
        # Each run's events arrive while the stream is stopped, so no run reads another's.
        coordinates += data.produce(config.bootstrap, topic, events[len(coordinates):len(coordinates) + count])
        # run_pipeline keeps its checkpoint and sink in workdir by topic: a second call resumes the stream.
        sink, query = run_pipeline(spark, config.with_overrides(**overrides), workdir, topic,
                                   end_offsets(topic, coordinates), say=print, max_per_batch=MAX_PER_BATCH)
        runs.append(sorted(p.batchId for p in recent_progress(query) if p.numInputRows))
        read.update(records_read(query))
    index(config)
    logged = {r["batch"]: r for r in read_log(config) if r["schema"] == LOG_BATCH and r["query"] == QUERY}
    rows = []  # (order_id, rid, batch) of every sink row, its batch from the files capture logged
    batch_of = sink_file_batches(config, QUERY)
    for fragment in ds.dataset(sink, format="parquet").get_fragments():
        batch = batch_of[local_file(fragment.path)]
        table = fragment.to_table(columns=["order_id", "_hw_rid"])
        rows += [(order, rid, batch) for order, rid in zip(*(c.to_pylist() for c in table.columns))]
    # Each event's record: (topic, partition, offset), the batch that read it, whether it is garbage.
    records = [((topic, partition, offset), read[topic, partition, offset], parse(value) is None)
               for (_, value), (partition, offset) in zip(events, coordinates)]
    return config, runs, logged, rows, demo_lineage(topic, events, coordinates, data.customers()), records


def captured(record: dict, rid: int) -> bool:
    """Whether capture published the edges of row ``rid`` of the batch ``record`` logs."""
    if record["status"] == SAMPLED:
        return bool(sampled(np.array([rid]), record["sampled_fraction"])[0])
    return record["status"] == FULL


def test_the_stream_resumes_with_each_runs_capture_logged_per_batch(run):
    _, runs, logged, rows, expected, _ = run
    first, off, budgeted = runs
    assert first and off and len(budgeted) >= 2
    assert first[-1] < off[0] and off[-1] < budgeted[0]  # one stream, its batches numbered on across restarts
    assert sorted(logged) == [*first, *off, *budgeted]
    assert [logged[b]["status"] for b in first + off] == [FULL] * len(first) + [LOG_ONLY] * len(off)
    # Over budget, capture steps down; how far by the run's end depends on the batches' timings.
    assert [logged[b]["status"] for b in budgeted[:2]] == [FULL, SAMPLED]
    assert {logged[b]["status"] for b in budgeted[2:]} <= {SAMPLED, LOG_ONLY}
    # Every order the oracle keeps is in the sink once, in a batch of the run its event arrived in
    # (an order's id is its event's index): no run read again what an earlier run had read.
    assert sorted(order for order, _, _ in rows) == sorted(expected)
    ends = [sum(count for count, _ in RUNS[:i + 1]) for i in range(len(RUNS))]
    assert all(batch in runs[next(i for i, end in enumerate(ends) if order < end)] for order, _, batch in rows)


def test_rows_of_captured_batches_are_answered_from_edges(run):
    config, _, logged, rows, expected, _ = run
    mine = [(order, rid, batch) for order, rid, batch in rows if captured(logged[batch], rid)]
    assert {logged[batch]["status"] for _, _, batch in mine} >= {FULL}
    with LineageClient(config) as client:
        for order, rid, batch in mine:
            answer = client.backward(rid)
            assert {as_input(x) for x in answer} == expected[order], order
            assert all(x.via == "edges" and x.exact and x.kind == "source" and x.batches == [batch]
                       for x in answer), order
            # A sampled batch is not fully captured even where this row's edges were kept.
            gaps = [(g.query, g.batch, g.status) for g in answer.gaps]
            assert gaps == ([] if logged[batch]["status"] == FULL else [(QUERY, batch, SAMPLED)]), order
            assert answer.complete == (logged[batch]["status"] == FULL) and not answer.unexplained


def test_rows_of_uncaptured_batches_are_inferred_and_name_their_gap(run):
    config, _, logged, rows, expected, _ = run
    mine = [(order, rid, batch) for order, rid, batch in rows if not captured(logged[batch], rid)]
    # Both kinds of batch left without a row's edges: log-only ones, and rows a sample left out.
    assert {logged[batch]["status"] for _, _, batch in mine} == {LOG_ONLY, SAMPLED}
    supersets = []
    with LineageClient(config) as client:
        for order, rid, batch in mine:
            answer = client.backward(rid)
            found = {as_input(x) for x in answer}
            assert all(x.via == "inference" and x.kind == "source" and x.batches == [batch] for x in answer), order
            if all(x.exact for x in answer):
                assert found == expected[order], order
            else:  # a superset is allowed only flagged as one
                assert found >= expected[order] and not any(x.exact for x in answer), order
                supersets.append(order)
            assert [(g.query, g.batch, g.status) for g in answer.gaps] == [(QUERY, batch, logged[batch]["status"])]
            assert not answer.complete
    # The demo's plan is invertible: every inferred answer is exact, as eager capture's is.
    assert supersets == []


def test_every_record_of_an_uncaptured_batch_gets_its_forward_lineage(run):
    config, _, logged, rows, expected, records = run
    derived = derived_from(expected)
    order_of = {rid: order for order, rid, _ in rows}
    mine = [(record, batch, garbage) for record, batch, garbage in records if logged[batch]["status"] != FULL]
    assert {logged[batch]["status"] for _, batch, _ in mine} == {LOG_ONLY, SAMPLED}
    # Garbage records and valid ones the stream filtered out are asked too: their answers are empty.
    assert any(garbage for _, _, garbage in mine)
    assert any(not garbage and ("kafka", *record) not in derived for record, _, garbage in mine)
    with LineageClient(config) as client:
        record = next(r for r, batch, _ in records if logged[batch]["status"] == FULL and ("kafka", *r) in derived)
        (edge,) = client.forward(kafka_rid(*record))
        for record, batch, _ in mine:
            answer = client.forward(kafka_rid(*record))
            assert {order_of[x.rid] for x in answer} == derived.get(("kafka", *record), set()), record
            for x in answer:  # from edges where capture kept the output row's, else inferred, alike otherwise
                assert x.via == ("edges" if captured(logged[batch], x.rid) else "inference"), record
                assert (x.kind, x.dataset, x.cols, x.batches, x.exact) == (edge.kind, edge.dataset, edge.cols,
                                                                           [batch], True), record
            assert [(g.query, g.batch, g.status) for g in answer.gaps] == [(QUERY, batch, logged[batch]["status"])]
            assert not answer.complete
