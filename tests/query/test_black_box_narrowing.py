"""Black boxes narrowed by re-running the user's function (issue 24), against brute-force oracles.

Each test streams the module's Kafka events through a Python black box, traced, then asks every output
row's lineage backward and every entered record's forward. The oracle is computed from the events
themselves, by what each function does (not by running it): a dispatcher's output row derives from the
record carrying its values; a per-key normalisation's from its key's records of the batch; a function
mixing rows across groups, or a random one, from the whole batch (a superset, flagged); a sessionisation's
from its key's records since its state last began.
"""

from __future__ import annotations

import base64
import uuid
from types import SimpleNamespace

import pandas as pd
import pytest
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupStateTimeout

from bench.black_box_narrowing import sessions
from headwater.adapters.spark_lines import recent_progress
from headwater.core import signing
from headwater.core.offsets import partition_offsets
from headwater.core.rid import kafka_rid
from headwater.demo.run import end_offsets, run_until
from headwater.query.api import LineageClient, choices
from headwater.query.narrow import metrics
from headwater.query.narrow.follow import Follower
from headwater.query.narrow.narrower import NarrowStore
from headwater.store.batch_log import BatchLog
from headwater.store.plans import PlanStore
from tests import pipelines
from tests.capture.test_black_boxes import parsed, records_read
from tests.conftest import index, local_file, sink_file_batches, while_initializing
from tests.oracle import as_input
from tests.query.test_reexecute import centre, jitter

pytestmark = pytest.mark.every_line  # runs on every supported Spark line (./dev test)

KEY = "narrowing-test-key"
EVENTS = 300
WAIT_S = 120.0  # the tests' questions wait for a narrowing they start (the service's answer at once: pending)


@pytest.fixture(scope="module")
def env(spark, stack_config, tmp_path_factory):
    config = stack_config.with_overrides(narrowing_key=KEY)
    yield from pipelines.event_env(spark, config, tmp_path_factory.mktemp("narrow"), "nw", EVENTS, seed=11)


def valid(spark, env):
    return parsed(spark, env).where("v IS NOT NULL AND id IS NOT NULL").select("id", "k", "v")


# The black boxes ------------------------------------------------------------------------------------

def filter_enrich_split(frames):
    """Row-wise: drops v divisible by 3, adds a label, splits each even v into two rows."""
    for frame in frames:
        kept = frame[frame["v"] % 3 != 0]
        rows = []
        for r in kept.itertuples(index=False):
            parts = 2 if r.v % 2 == 0 else 1
            rows.extend((r.id, r.k, part, r.v * 3, f"k{r.k}-{part}") for part in range(parts))
        yield pd.DataFrame(rows, columns=["id", "k", "part", "v3", "label"])


def normalise(frame):
    """Per key: each row's share of its key's total."""
    total = frame["v"].abs().sum() or 1
    return pd.DataFrame({"id": frame["id"], "k": frame["k"], "share": frame["v"].abs() / total})


SPLIT_SCHEMA = "id long, k int, part int, v3 long, label string"
BLACK_BOXES = {  # each test's traced query: its black box over the valid events
    "map": lambda df: df.mapInPandas(filter_enrich_split, SPLIT_SCHEMA),
    "group": lambda df: df.groupBy("k").applyInPandas(normalise, "id long, k int, share double"),
    "centre": lambda df: df.mapInPandas(centre, "id long, d double"),
    "jitter": lambda df: df.mapInPandas(jitter, "id long, r double"),
    "sessions": lambda df: df.groupBy("k").applyInPandasWithState(
        sessions, "k int, start long, n long", "start long, n long", "append", GroupStateTimeout.NoTimeout),
    "tamper": lambda df: df.mapInPandas(filter_enrich_split, SPLIT_SCHEMA),
}


@pytest.fixture(scope="module")
def runs(spark, env):
    """Every query of the module traced at once over the events (their batches interleave, which saves the
    suite minutes), stopped once each read them all, then indexed once: per query, its name, its sink rows
    with the batch that wrote each, and each batch's offsets."""
    tag = uuid.uuid4().hex[:6]
    started = {}
    for key, black_box in BLACK_BOXES.items():
        name = f"nw-{key}-{tag}"
        while_initializing([q for _, q in started.values()])
        query = (env.tracer.trace(black_box(valid(spark, env)), name=name).writeStream.format("parquet")
                 .option("checkpointLocation", str(env.workdir / f"cp-{name}"))
                 .trigger(processingTime="200 milliseconds").start(str(env.workdir / f"sink-{name}")))
        started[key] = (name, query)
    until = end_offsets(env.topic, env.coordinates)
    for _, query in started.values():
        run_until(query, until, say=print)
    index(env.config)
    found = {}
    for key, (name, query) in started.items():
        batch_of = sink_file_batches(env.config, name)
        rows = spark.read.parquet(str(env.workdir / f"sink-{name}")).withColumn("_file", F.input_file_name()).collect()
        batches = {}
        for progress in recent_progress(query):
            if progress.numInputRows:
                source = progress.sources[0]
                batches[progress.batchId] = (partition_offsets(source.startOffset),
                                             partition_offsets(source.endOffset))
        found[key] = SimpleNamespace(name=name, batches=batches,
                                     rows=[(r.asDict(), batch_of[local_file(r["_file"])]) for r in rows])
    return found


# Helpers --------------------------------------------------------------------------------------------

def entered(env, batches) -> dict[int, list[tuple]]:
    """Per batch, (coordinates, event) of each record that entered the black box (valid id and v)."""
    return {b: [(c, e) for c, e in records_read(env, *batches[b]) if e["v"] is not None and e["id"] is not None]
            for b in batches}


def backward_of(client, row) -> tuple[set, object]:
    answer = client.backward(row["_hw_rid"])
    return {as_input(x) for x in answer if x.topic}, answer


def check_forward(client, env, name, truth: dict[tuple, set[int]]):
    """Forward from each record: exactly the outputs whose oracle lineage holds it."""
    for record, outputs in truth.items():
        _, topic, p, o = record
        reached = {x.rid for x in client.forward(kafka_rid(topic, p, o), to=name)}
        assert reached == outputs, record


# Tests ----------------------------------------------------------------------------------------------

def test_a_question_before_the_narrowing_answers_at_once_with_the_flagged_superset_and_starts_it(env, runs):
    name, rows, batches = runs["map"].name, runs["map"].rows, runs["map"].batches
    inputs = entered(env, batches)
    row, batch = rows[0]
    with LineageClient(env.config) as client:
        found, answer = backward_of(client, row)
        assert found == {c for c, _ in inputs[batch]}, "the superset: every row that entered the batch"
        assert not any(x.exact for x in answer)
        (pending,) = answer.narrowed
        assert pending["kind"] == "pending" and "under way" in pending["reason"]
        narrower = client.narrower()
        assert narrower is not None and narrower.under_way() == [(name, pending["op"], batch)]
        narrower.wait(WAIT_S)
        assert NarrowStore(env.config).get(name, pending["op"], batch).kind == "dispatcher", "kept for every question"
        found, answer = backward_of(client, row)
        assert [n["kind"] for n in answer.narrowed] == ["dispatcher"] and all(x.exact for x in answer)
        assert len(found) == 1


def test_a_pending_batch_too_large_to_list_is_described_by_what_it_read(env, runs, monkeypatch):
    """Past ``PENDING_LISTED`` rows read, a pending batch's superset is not listed (100,000 records would take
    seconds to answer): the walk stops at the black box's node and the answer says what the batch read."""
    from headwater.query.narrow import narrower as narrowing

    monkeypatch.setattr(narrowing, "PENDING_LISTED", 5)
    name, rows, batches = runs["map"].name, runs["map"].rows, runs["map"].batches
    inputs = entered(env, batches)
    (op,) = [b["node_id"] for b in PlanStore(env.config.store_uri(), env.config.log_topic).latest(name)["black_boxes"]]
    store = NarrowStore(env.config)
    row, batch = next((r, b) for r, b in rows if store.get(name, op, b) is None and len(inputs[b]) > 5)
    with LineageClient(env.config) as client:
        found, answer = backward_of(client, row)
        assert found == set() and answer.unexplained == [], "the box's rows are described, not listed"
        (pending,) = answer.narrowed
        assert pending["kind"] == "pending"
        superset = pending["superset"]
        start, end = batches[batch]
        assert superset["rows_read"] >= len(inputs[batch]) and superset["tables"] == []
        assert {(r["topic"], r["partition"]): (r["from"], r["to"]) for r in superset["read"]} == {
            (t, p): (start.get((t, p), 0), o) for (t, p), o in end.items() if o > start.get((t, p), 0)}
        assert all(any(r["topic"] == t and r["partition"] == p and r["from"] <= o < r["to"] for r in superset["read"])
                   for (_, t, p, o), _ in inputs[batch]), "every row that entered the box is in what it read"
        client.narrower().wait(WAIT_S)
        found, answer = backward_of(client, row)
        assert [n["kind"] for n in answer.narrowed] == ["dispatcher"] and len(found) == 1


def test_narrowing_ahead_narrows_each_black_box_batch_once_and_questions_find_it_ready(env, runs):
    """``headwater narrow --follow``'s loop, once: every full batch of every query with a black box narrowed and
    kept, none twice; then a question answers narrowed at once, never pending."""
    follower = Follower(env.config)
    try:
        narrowed = follower.once()
        assert follower.once() == 0 and not follower.waiting(), "each batch once"
        assert metrics.WAITING._value.get() == 0 and metrics.LAG._value.get() == 0
    finally:
        follower.close()
    log = BatchLog(env.config.store_uri(), env.config.log_topic)
    store = NarrowStore(env.config)
    expected = 0
    for key in BLACK_BOXES:
        name = runs[key].name
        (op,) = [b["node_id"] for b in PlanStore(env.config.store_uri(), env.config.log_topic).latest(name)
                 ["black_boxes"]]
        for batch in log.batches(name):
            if (log.batch(name, batch) or {}).get("status") == "full":
                assert store.get(name, op, batch) is not None, (key, batch)
                expected += 1
    assert 0 < narrowed <= expected  # a stateful box's replay keeps every batch up to the one asked at once
    row, batch = runs["group"].rows[0]
    with LineageClient(env.config) as client:
        _, answer = backward_of(client, row)
        assert [n["kind"] for n in answer.narrowed] == ["grouped"]

def test_a_row_wise_map_is_narrowed_to_one_record_per_output(env, runs):
    name, rows, batches = runs["map"].name, runs["map"].rows, runs["map"].batches
    inputs = entered(env, batches)
    forward: dict[tuple, set[int]] = {c: set() for b in inputs for c, _ in inputs[b]}
    with LineageClient(env.config, narrow_wait_s=WAIT_S) as client:
        for row, batch in rows:
            truth = {c for c, e in inputs[batch] if e["id"] == row["id"] and e["k"] == row["k"]
                     and e["v"] * 3 == row["v3"]}
            found, answer = backward_of(client, row)
            assert found == truth and len(truth) >= 1, [n["reason"] for n in answer.narrowed]
            assert all(x.exact and x.via == "reexecution" for x in answer)
            assert [n["kind"] for n in answer.narrowed] == ["dispatcher"]
            for c in truth:
                forward[c].add(row["_hw_rid"])
        check_forward(client, env, name, forward)
    for backend in choices():  # every backend walks the same narrowed edges
        with LineageClient(env.config, backend=backend, narrow_wait_s=WAIT_S) as client:
            for row, batch in rows[:5]:
                answer = client.backward(row["_hw_rid"])
                assert {as_input(x) for x in answer if x.topic} == {
                    c for c, e in inputs[batch] if e["id"] == row["id"] and e["v"] * 3 == row["v3"]}, backend
                assert all(x.exact and x.via == "reexecution" for x in answer), backend
    assert any(not outs for outs in forward.values()), "some records are dropped by the function"
    assert any(len(outs) == 2 for outs in forward.values()), "some records are split in two"


def test_a_per_key_normalisation_is_narrowed_to_its_keys_rows(env, runs):
    name, rows, batches = runs["group"].name, runs["group"].rows, runs["group"].batches
    inputs = entered(env, batches)
    forward: dict[tuple, set[int]] = {c: set() for b in inputs for c, _ in inputs[b]}
    with LineageClient(env.config, narrow_wait_s=WAIT_S) as client:
        for row, batch in rows:
            truth = {c for c, e in inputs[batch] if e["k"] == row["k"]}
            found, answer = backward_of(client, row)
            assert found == truth
            assert all(x.exact and x.via == "reexecution" for x in answer)
            assert answer.narrowed[0]["kind"] == "grouped"
            for c in truth:
                forward[c].add(row["_hw_rid"])
        check_forward(client, env, name, forward)


@pytest.mark.parametrize("key, reason", [("centre", ""), ("jitter", "non-deterministic")])
def test_mixing_and_random_functions_stay_flagged_supersets(env, runs, key, reason):
    name, rows, batches = runs[key].name, runs[key].rows, runs[key].batches
    inputs = entered(env, batches)
    with LineageClient(env.config, narrow_wait_s=WAIT_S) as client:
        for row, batch in rows:
            found, answer = backward_of(client, row)
            assert found == {c for c, _ in inputs[batch]}
            assert not any(x.exact for x in answer) and all(x.via == "edges" for x in answer)
            (narrowed,) = answer.narrowed
            assert narrowed["kind"] == "superset" and reason in narrowed["reason"]
        outputs = {}
        for row, batch in rows:
            outputs.setdefault(batch, set()).add(row["_hw_rid"])
        check_forward(client, env, name, {c: outputs.get(b, set()) for b in inputs for c, _ in inputs[b]})


def test_a_sessionisation_is_narrowed_to_its_keys_rows_since_its_state_began(env, runs):
    name, rows, batches = runs["sessions"].name, runs["sessions"].rows, runs["sessions"].batches
    inputs = entered(env, batches)
    # The oracle: per key, replay the sessions over the batches in order; each closed session's own
    # records (its true lineage), and the key's records since its state began (what narrowing may claim).
    own: dict[tuple, set] = {}
    span: dict[tuple, set] = {}
    for k in {e["k"] for b in inputs for _, e in inputs[b]}:
        open_rows: list = []
        since: list = []
        for b in sorted(inputs):
            mine = sorted(((e["id"], c, e) for c, e in inputs[b] if e["k"] == k), key=lambda t: t[0])
            if not mine:
                continue
            if not open_rows:
                since = []
            since.extend(c for _, c, _ in mine)
            closed_here = []
            for _, c, e in mine:
                open_rows.append((c, e))
                if e["v"] % 5 == 0:
                    closed_here.append(open_rows)
                    open_rows = []
            for session in closed_here:
                key = (k, session[0][1]["id"], len(session), b)
                own[key] = {c for c, _ in session}
                span[key] = set(since)
    assert own, "some sessions close"
    with LineageClient(env.config, narrow_wait_s=WAIT_S) as client:
        for row, batch in rows:
            key = (row["k"], row["start"], row["n"], batch)
            found, answer = backward_of(client, row)
            assert own[key] <= found, "no record of the session may be missing"
            assert found == span[key], (key, sorted(found - span[key]), sorted(span[key] - found), sorted(own[key]),
                                        {b: sorted(c for c, e in inputs[b] if e["k"] == row["k"]) for b in inputs})
            assert all(x.via == "reexecution" for x in answer)
            assert answer.narrowed[0]["kind"] == "per key"
            so_far = {c for b in inputs if b <= batch for c, _ in inputs[b]}
            assert len(found) < len(so_far) or len(so_far) == len(found)
        # Forward: every output whose span holds the record (all batches with outputs are narrowed by now).
        reaching: dict = {c: set() for b in inputs for c, _ in inputs[b]}
        for row, batch in rows:
            for c in span[(row["k"], row["start"], row["n"], batch)]:
                reaching[c].add(row["_hw_rid"])
        check_forward(client, env, name, reaching)
    assert sum(len(span[k]) for k in span) < sum(len({c for b in inputs if b <= k[3] for c, _ in inputs[b]})
                                                 for k in span), "narrowing made the answers smaller"


def test_a_tampered_function_is_refused_and_the_superset_kept(env, runs):
    name, rows, batches = runs["tamper"].name, runs["tamper"].rows, runs["tamper"].batches
    inputs = entered(env, batches)
    # Someone with write access to the store swaps the function's bytes for others of the same length.
    plans = PlanStore(env.config.store_uri(), env.config.log_topic)
    plan = plans.latest(name)
    (box,) = plan["black_boxes"]
    command = base64.b64decode(box["function"]["command"])
    box["function"]["command"] = base64.b64encode(command.replace(b"filter_enrich_split", b"centre".ljust(19, b"_"))
                                                  ).decode()
    with pytest.raises(signing.Unverified, match="signature does not match"):
        signing.verified(name, box["node_id"], box, KEY.encode())
    plans.write(name, plan.pop("from_batch"), plan.pop("fingerprint"), {k: v for k, v in plan.items() if k != "query"})
    # Other tests' forward walks went through this query too and narrowed its batches: a query tier that has
    # not narrowed them yet reads the tampered log.
    NarrowStore(env.config).remove(name)
    with LineageClient(env.config, narrow_wait_s=WAIT_S) as client:
        row, batch = rows[0]
        found, answer = backward_of(client, row)
        assert found == {c for c, _ in inputs[batch]} and not any(x.exact for x in answer)
        assert "signature does not match" in answer.narrowed[0]["reason"]
    assert NarrowStore(env.config).get(name, box["node_id"], batch) is None, "nothing narrowed is kept"
    # Nor does a key other than capture's verify it.
    with LineageClient(env.config.with_overrides(narrowing_key="another key"), narrow_wait_s=WAIT_S) as client:
        assert "signature does not match" in client.narrow(name, box["node_id"], batch + 1)["reason"]
