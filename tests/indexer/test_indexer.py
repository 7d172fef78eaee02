import json
import os
import random
import subprocess
import sys
import time
import uuid

import pyarrow as pa
from kafka import KafkaConsumer
from prometheus_client import REGISTRY

from bench.graph_hub_writes import black_box_write
from headwater.adapters.kafka import ensure_topics, producer
from headwater.core.schema import EDGE_SCHEMA, LOG_BATCH, LOG_PROGRESS, NODE_SCHEMA, encode_lineage, encode_log
from headwater.query.api import LineageClient
from headwater.store.graph import GraphWriter
from tests.conftest import index, topic_records


def lineage_payload(src: int, dst: int) -> bytes:
    nodes = pa.Table.from_pylist([
        {"rid": src, "kind": "source", "dataset": "kafka:t", "topic": "t", "partition": 0, "offset": src},
        {"rid": dst, "kind": "output", "dataset": "sink", "query": "q-indexer", "batch": 0},
    ], schema=NODE_SCHEMA)
    edges = pa.Table.from_pylist(
        [{"src": src, "dst": dst, "query": "q-indexer", "batch": 0, "op": 0, "exact": True, "cols": 1}],
        schema=EDGE_SCHEMA)
    return encode_lineage(nodes, edges)


def test_bad_messages_go_to_the_dlq_and_good_ones_around_them_are_indexed(config):
    ensure_topics(config.bootstrap, [config.edges_topic, config.log_topic, config.dlq_topic], 1)
    client = producer(config.bootstrap)
    client.send(config.edges_topic, value=lineage_payload(7001, 7002))
    client.send(config.edges_topic, value=b"garbage, not a payload")
    client.send(config.log_topic, value=b'{"no": "schema"}')
    client.send(config.edges_topic, value=lineage_payload(7003, 7002))
    client.send(config.log_topic, value=encode_log(LOG_BATCH, query="q-indexer", batch=0, status="full"))
    client.send(config.log_topic, value=encode_log(
        LOG_PROGRESS, query="q-indexer", batch=0, rows_in=2, sources=[{"start": None, "end": {"t:0": 2}}]))
    client.flush()
    client.close()

    def sample(name: str, **labels) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    before = {store: sample("headwater_indexer_edges_total", store=store) for store in ("graph", "parquet")}
    dlq_before = sample("headwater_indexer_dlq_total")
    stats = index(config)
    assert stats.dlq == 2
    assert stats.edges == 2 and stats.log_records == 2 and stats.parquet_edges == 2
    assert {store: sample("headwater_indexer_edges_total", store=store) - before[store]
            for store in before} == {"graph": 2, "parquet": 2}
    assert sample("headwater_indexer_dlq_total") - dlq_before == 2
    lag = REGISTRY.get_sample_value("headwater_indexer_lag", {"topic": config.edges_topic, "partition": "0"})
    assert lag == 0  # set from the fetched high-water mark, and caught up
    assert sample("headwater_indexer_write_seconds_count", store="graph") > 0

    dead = topic_records(config, config.dlq_topic)
    reasons = sorted(dict(m.headers)["reason"].decode() for m in dead)
    assert len(dead) == 2
    assert "bad magic" in reasons[1] and "schema" in reasons[0]
    assert {m.value for m in dead} == {b"garbage, not a payload", b'{"no": "schema"}'}

    with LineageClient(config) as lineage:
        assert sorted(x.rid for x in lineage.backward(7002)) == [7001, 7003]

    # Both halves of the batch's log entry, capture status and progress, on one Batch node.
    from headwater.adapters.graph import driver

    with driver(config) as d, d.session(database=config.graph_database) as s:
        batch = s.run("MATCH (b:Batch {query: 'q-indexer', batch: 0}) RETURN properties(b) AS p").single()["p"]
        read = [r.data() for r in s.run("MATCH (:Batch {query: 'q-indexer', batch: 0})-[r:READ]->(d:Dataset) "
                                        "RETURN d.name AS dataset, properties(r) AS read")]
    assert batch["status"] == "full" and batch["rows_in"] == 2 and "sources" not in batch
    assert read == [{"dataset": "kafka:t", "read": {"topic": "t", "partition": 0, "start_offset": 0, "end_offset": 2}}]


def test_indexing_twice_changes_nothing(config):
    ensure_topics(config.bootstrap, [config.edges_topic, config.log_topic, config.dlq_topic], 1)
    client = producer(config.bootstrap)
    for _ in range(2):
        client.send(config.edges_topic, value=lineage_payload(8001, 8002))
    client.flush()
    client.close()
    for group in ("first", "second"):  # a second group replays everything again
        index(config, group=group)
    from headwater.adapters.graph import driver

    with driver(config) as d, d.session(database=config.graph_database) as s:
        count = s.run("MATCH (a:Row {rid: 8001})-[e:DERIVED]->(b:Row {rid: 8002}) RETURN count(e) AS c").single()["c"]
        nodes = s.run("MATCH (n:Row) WHERE n.rid IN [8001, 8002] RETURN count(n) AS c").single()["c"]
    assert count == 1 and nodes == 2


def test_an_indexer_is_not_held_up_by_the_group_of_another_edges_topic(stack, config):
    """A member that stops polling holds up its group's rebalance (for its poll interval on
    Kafka; for good where the broker keeps a gone member as the group's leader, as tansu did in
    CI after the kill -9 test). Indexers of other edges topics are in other groups, so they
    never wait for it."""
    from headwater.indexer.service import default_group
    from tests.conftest import own_topics

    other, _ = own_topics(config, "held")
    assert default_group(other) != default_group(config)
    ensure_topics(config.bootstrap, [other.edges_topic, config.edges_topic, config.log_topic, config.dlq_topic], 1)
    # The other topic's group, held: a member that joined, then never polls again, and would
    # keep any rebalance waiting for ten minutes.
    held = KafkaConsumer(bootstrap_servers=config.bootstrap, group_id=default_group(other),
                         session_timeout_ms=6000, heartbeat_interval_ms=1000, max_poll_interval_ms=600000)
    try:
        held.subscribe([other.edges_topic])
        for _ in range(60):
            held.poll(timeout_ms=500)
            if held.assignment():
                break
        assert held.assignment(), "the holding member never joined its group"
        client = producer(config.bootstrap)
        client.send(config.edges_topic, value=lineage_payload(9001, 9002))
        client.flush()
        client.close()
        stats = index(config, max_seconds=60)
        assert stats.edges == 1
        # The held group itself does wait: `headwater index --drain` for the other topic gets no
        # partitions and says it did not catch up; in a group of its own, it does.
        env = {**os.environ, "HEADWATER_EDGES_TOPIC": other.edges_topic, "HEADWATER_LOG_TOPIC": other.log_topic,
               "HEADWATER_DLQ_TOPIC": other.dlq_topic, "HEADWATER_STORE_DIR": other.store_dir}

        def index_other(*args) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "headwater.cli", "--home", str(stack.home), "index",
                                   "--drain", "--idle", "1", "--max-seconds", "8", *args],
                                  env=env, capture_output=True, text=True, timeout=120)

        done = index_other()
        assert done.returncode == 1, done.stderr[-2000:]
        assert json.loads(done.stdout.strip().splitlines()[-1])["caught_up"] is False
        assert "not caught up with the topics after 8s" in done.stderr
        done = index_other("--group", default_group(other) + ".own")
        assert done.returncode == 0, done.stderr[-2000:]
        assert json.loads(done.stdout.strip().splitlines()[-1])["caught_up"] is True
    finally:
        held.close()


def test_edges_into_a_black_box_node_cost_the_same_each_write_and_are_written_once(stack_config):
    """A black box's node gains an edge from every row entering it: merged from that node, each write
    scanned all its edges so far (bench/graph_hub_writes.py: the third write took 4.3 times the first)."""
    query, base = f"q-box-{uuid.uuid4().hex[:6]}", random.randrange(1 << 40, 1 << 50)
    writer = GraphWriter(stack_config)
    try:
        writer.ensure_schema()
        seconds = []
        for lo in (0, 3000, 6000, 0):  # the last: a replay of the first
            nodes, edges = black_box_write(lo, lo + 3000, query, base=base)
            started = time.perf_counter()
            writer.write_lineage(nodes, edges)
            seconds.append(time.perf_counter() - started)
        with writer._session() as s:
            counts = {r["op"]: r["n"] for r in s.run(
                "MATCH ()-[e:DERIVED]->() WHERE e.query = $q RETURN e.op AS op, count(e) AS n", q=query)}
    finally:
        writer.close()
    assert counts == {1: 9000, 2: 9000, 3: 9000}
    assert seconds[2] <= 2 * seconds[0] + 0.5, f"writes into a black box's node grow: {seconds}"


def _graph_edges(writer: GraphWriter, prefix: str) -> list[tuple]:
    with writer._session() as s:
        return sorted(tuple(r) for r in s.run(
            "MATCH (a:Row)-[e:DERIVED]->(b:Row) WHERE e.query STARTS WITH $prefix "
            "RETURN a.rid, b.rid, e.query, e.batch, e.op, coalesce(e.exact, true), e.cols", prefix=prefix))


def test_concurrent_sessions_write_exactly_the_edges_and_a_write_cut_short_is_completed_once(stack_config):
    """Rows, then edges, each in ``graph_write_sessions`` transactions at once: the graph holds exactly the
    workload's edges (hub rows shared by every session, aggregates of fan-in up to 1,000), with one or four
    sessions; a write whose last edge transaction never ran (a crash) and is then written again, and a
    replay, leave the same edge set, with no edge twice."""
    from bench.workload import lineage_messages
    from headwater.core.schema import concat_lineage

    class CutShort(GraphWriter):
        cut = True

        def _concurrently(self, transactions):
            if self.cut and transactions[0][0][0] != graph.MERGE_ROWS:
                self.cut, transactions = False, transactions[:-1]
            super()._concurrently(transactions)

    from headwater.store import graph

    for sessions, seed in ((1, 31), (4, 32)):
        prefix = f"q-sessions-{uuid.uuid4().hex[:6]}-"
        nodes, edges = concat_lineage(list(lineage_messages(12_000, seed=seed, edges_per_message=3000,
                                                            prefix=prefix)))
        expected = sorted(zip(*(edges[c].to_pylist() for c in ("src", "dst", "query", "batch", "op", "exact",
                                                                  "cols"))))
        writer = CutShort(stack_config.with_overrides(graph_write_sessions=sessions))
        try:
            writer.ensure_schema()
            writer.write_lineage(nodes, edges)
            cut = len(_graph_edges(writer, prefix))
            assert cut < len(expected) and (cut > 0) == (sessions > 1)  # the last transaction wrote nothing
            assert writer.write_lineage(nodes, edges) == len(expected) - cut  # what committed is skipped
            assert writer.write_lineage(nodes, edges) == 0  # a replay
            assert _graph_edges(writer, prefix) == expected
        finally:
            writer.close()
