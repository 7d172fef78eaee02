"""Shards set aside (``Indexer.set_aside``): every backend still answers every row any store holds.

A broker of this test's own loses what it held (killed and started again: the in-memory
broker keeps nothing, the group's committed offsets included), so the indexer sets its
shards aside and indexes the partitions again from the topics' new beginning; later a new
consumer group reads the topics again and sets the rebuilt shards aside too, while they
hold ranges no generation holds, so the store reads some edges twice. Compactions run
between the set-asides and after them. At every step, for every row produced so far, the
Cypher, CSProv, RQ and auto backends give the records and summary an oracle gives over
every edge produced (the graph never lost one); each generation holds every edge once,
and the set-aside shards stay as they were set aside.
"""

from __future__ import annotations

import uuid

import pyarrow.dataset as ds
import pytest

from headwater.adapters.kafka import ensure_topics, producer
from headwater.core.schema import EDGE_SCHEMA, LOG_BATCH, encode_lineage, encode_log
from headwater.indexer.compaction import compact
from headwater.query.api import LineageClient
from headwater.query.backend import ROW_FIELDS
from headwater.query.errors import UnknownRow
from headwater.query.parquet import StoreView
from headwater.store.edges import LineageTables
from headwater.store.generation import Generation
from tests.conftest import index
from tests.query.test_query_backends import oracle, pipeline

BACKENDS = ("cypher", "csprov", "rq", "auto")
QUERIES = ("enrich", "totals", "alerts")


class Runs:
    """What was produced: the edges (the oracle's), and each row's record as first described."""

    def __init__(self, config, tag: str, batches: int):
        self.config, self.tag = config, tag
        self.messages, self.kinds = pipeline(seed=4, batches=batches, tag=tag)  # a seed of few rows
        self.edges: set[tuple] = set()
        self.nodes: dict[int, dict] = {}
        self.sent = 0

    def produce(self, batches: range) -> None:
        """The messages of ``batches`` onto the edges topic (both partitions), their capture status onto the log."""
        config = self.config
        ensure_topics(config.bootstrap, [config.edges_topic, config.log_topic, config.dlq_topic], 2)
        client = producer(config.bootstrap)
        for nodes, edges in self.messages[3 * batches.start: 3 * batches.stop]:
            client.send(config.edges_topic, value=encode_lineage(nodes, edges), partition=self.sent % 2)
            self.sent += 1
            self.edges |= {tuple(e[name] for name in EDGE_SCHEMA.names) for e in edges.to_pylist()}
            for node in nodes.to_pylist():
                self.nodes.setdefault(node["rid"], {name: node[name] for name in ROW_FIELDS})
        for batch in batches:
            for query in QUERIES:
                client.send(config.log_topic, value=encode_log(LOG_BATCH, query=f"{self.tag}.{query}", batch=batch,
                                                               status="full"))
        client.flush()
        client.close()

    def expected(self, rid: int, backward: bool) -> tuple[list[dict], dict]:
        produced = [dict(zip(EDGE_SCHEMA.names, e)) for e in self.edges]
        found = oracle(produced, self.kinds, rid, "source" if backward else "output", 16, backward)
        records = [{"of": rid, **self.nodes[f["rid"]], "ops": f["ops"], "cols": f["cols"], "batches": f["batches"],
                    "exact": f["exact"], "via": "edges"} for f in found]
        return records, {"of": rid, "records": len(records), "complete": True, "gaps": [], "unexplained": [],
                         "read_by": []}

    def check(self) -> None:
        """Every row produced so far, both ways, from every backend: the oracle's records and summary."""
        clients = {name: LineageClient(self.config, backend=name) for name in BACKENDS}
        try:
            for rid in sorted(self.nodes):
                for backward in (True, False):
                    records, summary = self.expected(rid, backward)
                    answers = {}
                    for name, client in clients.items():
                        answer = client.backward(rid) if backward else client.forward(rid)
                        # Without plans kept, ``operators`` name the ops by id only
                        # (tests/query/test_explain.py checks them).
                        answers[name] = ([{k: v for k, v in x.to_dict().items() if k != "operators"} for x in answer],
                                         answer.summary())
                        got = sorted(answers[name][0], key=lambda x: x["rid"])
                        assert (got, answers[name][1]) == (records, summary), (name, rid, backward)
                    assert all(a == answers["cypher"] for a in answers.values()), rid  # in one order, too
            for client in clients.values():
                with pytest.raises(UnknownRow):
                    client.backward(12345)
        finally:
            for client in clients.values():
                client.close()

    def generation_holds_each_edge_once(self) -> None:
        gen = Generation.current(self.config.store_uri(), self.config.edges_topic)
        assert gen is not None and not gen.snapshot.shard_files  # the generation took in every shard's ranges
        table = ds.dataset(gen.edge_files(), format="parquet", filesystem=gen.tables.edges.filesystem).to_table(
            columns=EDGE_SCHEMA.names)
        held = [tuple(e[name] for name in EDGE_SCHEMA.names) for e in table.to_pylist()]
        assert sorted(held) == sorted(self.edges)

    def epochs(self) -> list[int]:
        tables = LineageTables(self.config.store_uri(), self.config.edges_topic)
        return [tables.epoch(p) for p in (0, 1)]


@pytest.mark.spark
@pytest.mark.stack
def test_every_backend_answers_the_rows_of_set_aside_shards(spark, stack_config, broker, tmp_path):
    tag = "sa" + uuid.uuid4().hex[:6]
    config = stack_config.with_overrides(
        bootstrap=f"127.0.0.1:{broker.port}", store_dir=str(tmp_path / "store"), edges_topic=f"{tag}.edges",
        log_topic=f"{tag}.log", dlq_topic=f"{tag}.dlq")
    runs = Runs(config, tag, batches=3)

    runs.produce(range(0, 1))
    index(config, idle_s=0.5)
    broker.kill()
    broker.start(empty=True)  # a broker replaced by an empty one: every record and committed offset gone
    runs.produce(range(1, 2))  # a second run, whose totals aggregate rows of the first
    index(config, idle_s=0.5)
    assert runs.epochs() == [1, 1]  # both shards set aside, rebuilt from the second run alone
    runs.check()  # no generation: the first run's rows are in the set-aside shards only

    compact(spark, config.store_uri(), config.edges_topic, threshold=30, buckets=4)
    runs.generation_holds_each_edge_once()  # the set-aside shards' too

    runs.produce(range(2, 3))
    index(config, idle_s=0.5)  # ranges of the rebuilt shards that the generation does not hold
    index(config, group=f"{tag}-new", idle_s=0.5)  # a new group: the rebuilt shards set aside, the topic read again
    assert runs.epochs() == [2, 2]
    recent = StoreView(config.store_uri(), config.edges_topic).recent_edges
    assert recent.num_rows > recent.group_by(EDGE_SCHEMA.names).aggregate([]).num_rows  # edges read twice
    runs.check()  # the later runs' edges twice over: in the generation or set-aside shards, and rebuilt

    compact(spark, config.store_uri(), config.edges_topic, threshold=30, buckets=4)
    runs.generation_holds_each_edge_once()  # once, though in the generation before and in two shards
    runs.check()


@pytest.mark.spark
@pytest.mark.stack
def test_a_shard_set_aside_before_any_compaction_is_kept_once_beside_its_successor(spark, stack_config, tmp_path):
    """A new group reads the topic again before any generation covers it: the set-aside shard and its
    successor hold the same edges, and the first compaction keeps each once."""
    tag = "sb" + uuid.uuid4().hex[:6]
    config = stack_config.with_overrides(store_dir=str(tmp_path / "store"), edges_topic=f"{tag}.edges",
                                         log_topic=f"{tag}.log", dlq_topic=f"{tag}.dlq")
    runs = Runs(config, tag, batches=1)
    runs.produce(range(0, 1))
    index(config, idle_s=0.5)
    index(config, group=f"{tag}-new", idle_s=0.5)
    assert runs.epochs() == [1, 1]
    compact(spark, config.store_uri(), config.edges_topic, threshold=30, buckets=4)
    runs.generation_holds_each_edge_once()
    runs.check()
