import json

import pyarrow as pa
from kafka import KafkaConsumer
from prometheus_client import REGISTRY

from headwater.adapters.kafka import ensure_topics, producer
from headwater.core.schema import EDGE_SCHEMA, LOG_BATCH, LOG_PROGRESS, NODE_SCHEMA, encode_lineage, encode_log
from headwater.indexer.service import Indexer
from headwater.query.api import LineageClient


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
    indexer = Indexer(config)
    try:
        stats = indexer.run(drain=True, idle_s=1.5, max_seconds=120)
    finally:
        indexer.close()
    assert stats.dlq == 2
    assert stats.edges == 2 and stats.log_records == 2 and stats.parquet_edges == 2
    assert {store: sample("headwater_indexer_edges_total", store=store) - before[store]
            for store in before} == {"graph": 2, "parquet": 2}
    assert sample("headwater_indexer_dlq_total") - dlq_before == 2
    lag = REGISTRY.get_sample_value("headwater_indexer_lag", {"topic": config.edges_topic, "partition": "0"})
    assert lag == 0  # set from the fetched high-water mark, and caught up
    assert sample("headwater_indexer_write_seconds_count", store="graph") > 0

    dlq = KafkaConsumer(config.dlq_topic, bootstrap_servers=config.bootstrap, auto_offset_reset="earliest",
                        consumer_timeout_ms=3000)
    dead = list(dlq)
    dlq.close()
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
    assert batch["status"] == "full" and batch["rows_in"] == 2
    assert json.loads(batch["sources"]) == [{"start": None, "end": {"t:0": 2}}]


def test_indexing_twice_changes_nothing(config):
    ensure_topics(config.bootstrap, [config.edges_topic, config.log_topic, config.dlq_topic], 1)
    client = producer(config.bootstrap)
    for _ in range(2):
        client.send(config.edges_topic, value=lineage_payload(8001, 8002))
    client.flush()
    client.close()
    for group in ("first", "second"):  # a second group replays everything again
        indexer = Indexer(config, group=group)
        try:
            indexer.run(drain=True, idle_s=1.5, max_seconds=120)
        finally:
            indexer.close()
    from headwater.adapters.graph import driver

    with driver(config) as d, d.session(database=config.graph_database) as s:
        count = s.run("MATCH (a:Row {rid: 8001})-[e:DERIVED]->(b:Row {rid: 8002}) RETURN count(e) AS c").single()["c"]
        nodes = s.run("MATCH (n:Row) WHERE n.rid IN [8001, 8002] RETURN count(n) AS c").single()["c"]
    assert count == 1 and nodes == 2
