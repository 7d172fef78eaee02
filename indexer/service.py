"""``headwater index``: the consumer group from the edges and log topics to the graph and the lineage tables.

A poll batch of an edges partition is cut into runs of about ``WRITE_BYTES`` of
payload, each one write: its messages are decoded (those that cannot be, or whose
edges name rows they do not describe, go to the dlq topic with the reason), their
rows and edges go to the graph in one transaction (``graph.py``: replays are skipped),
and at the same time their edges are written as the partition's shard's files of the
lineage tables (``store/edges.py``). The shard's Delta commit is made only once the graph
write has succeeded, and the Kafka offset is committed only after both. On assignment, a
partition resumes where the edges table says its shard's last committed range ends (the
commit's application transaction), so a crash at any point writes no edge twice into the store.

A log record goes to the graph, then to the store's batch log (``batch_log.py``: the
gap map, readable without the graph); its offset is committed once both hold it.

A graph that is away (connection lost, transient errors) is retried from the first
unwritten message, and so is a store that fails (``OSError``, a Delta error); a write the graph
rejects is retried message by message, and the messages it still rejects go to the dlq.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Callable

import pyarrow as pa
from deltalake.exceptions import DeltaError
from kafka import ConsumerRebalanceListener, KafkaConsumer, KafkaProducer
from kafka.errors import CommitFailedError
from kafka.structs import OffsetAndMetadata
from neo4j.exceptions import Neo4jError, ServiceUnavailable, SessionExpired, TransientError

from headwater.adapters.kafka import consumer as kafka_consumer
from headwater.adapters.kafka import ensure_topics, producer
from headwater.adapters.readiness import GraphProbe, store_problem
from headwater.core.config import Config
from headwater.core.schema import (
    LOG_BATCH,
    LOG_PLAN,
    LOG_PROGRESS,
    PayloadError,
    concat_lineage,
    decode_lineage,
    decode_log,
)
from headwater.store.batch_log import BatchLogWriter
from headwater.store.edges import LineageTables, ShardMoved
from headwater.store.graph import GraphWriter
from headwater.store.plans import PlanStore

from . import metrics
from .shard import Shard

log = logging.getLogger("headwater.indexer")

GROUP = "headwater-indexer"
JOIN_WARN_S = 30.0  # an indexer with no partitions this long after starting says why it may be waiting
MAX_POLL_RECORDS = 200
# Payload bytes per write (about 30 bytes an edge: some 30,000 edges, seconds of graph
# work): big enough to amortize each write's files and round trips, small enough that
# a crash loses little work and a restart makes progress.
WRITE_BYTES = 1 << 20
# Fault injection for the crash and many-writers tests only: seconds to wait before the shard's Delta commit
# (its files written) and again before the offset commit, widening the windows a kill -9 or a cut network
# must hit to expose a replay or a late commit.
FAULT_PAUSE_ENV = "HEADWATER_INDEXER_FAULT_PAUSE_S"

# Failures that pass: the write is retried (``ShardMoved``: from where another writer of the partition left
# the shard). Any other failure is the message's own fault and sends it to the dlq.
RETRYABLE = (ServiceUnavailable, SessionExpired, TransientError, OSError, DeltaError, ShardMoved)
REJECTED = (Neo4jError, ValueError, TypeError, KeyError)


class GraphRejected(Exception):
    """The graph refused a combined write for a reason that is not its being away."""


def default_group(config: Config) -> str:
    """The consumer group of the indexers of ``config``'s topics: one group per edges topic, so
    indexers of other topic sets on the same broker (other deployments, other tests) never
    rebalance with these, and a member that holds up its group's rebalance holds up no other."""
    return f"{GROUP}.{config.edges_topic}"


@dataclass
class IndexerStats:
    messages: int = 0
    rows: int = 0
    edges: int = 0
    log_records: int = 0
    dlq: int = 0
    retries: int = 0
    parquet_edges: int = 0
    parquet_bytes: int = 0
    graph_seconds: float = 0.0
    parquet_seconds: float = 0.0
    caught_up: bool = False  # a drain that ended because everything was indexed (not by max_seconds)

    def to_dict(self) -> dict:
        return asdict(self)


def _dataset_props(source: dict) -> dict:
    """A static table's description, as the graph's ``(:Dataset)`` node and the store's batch log keep it
    (flat values: graph properties cannot nest)."""
    location = source.get("location") or {}
    return {k: v for k, v in {
        "source": source.get("source"),
        "short_name": source.get("name"),
        "table": source.get("table"),
        "location": ",".join(location.get("paths", [])) or None,
        "format": location.get("format"),
        "options": json.dumps(location["options"], sort_keys=True) if location.get("options") else None,
        "columns": json.dumps(location["columns"]) if location.get("columns") else None,
        "catalog_table": location.get("table"),
        "key": ",".join(source.get("key") or []) or None,
        "hashed": ",".join(source.get("hashed") or []) or None,
    }.items() if v is not None}


def runs(messages: list, max_bytes: int) -> list[list]:
    """Consecutive messages in runs of at most ``max_bytes`` of payload (a bigger message alone)."""
    found: list[list] = []
    run: list = []
    size = 0
    for message in messages:
        length = len(message.value or b"")
        if run and size + length > max_bytes:
            found.append(run)
            run, size = [], 0
        run.append(message)
        size += length
    return found + ([run] if run else [])


class _Assignment(ConsumerRebalanceListener):
    def __init__(self, indexer: "Indexer", consumer: KafkaConsumer):
        self.indexer = indexer
        self.consumer = consumer

    def on_partitions_revoked(self, revoked):
        self.indexer.joined = False
        self.indexer.release([tp.partition for tp in revoked if tp.topic == self.indexer.config.edges_topic])
        self.indexer.batch_log.release([tp.partition for tp in revoked if tp.topic == self.indexer.config.log_topic])
        if not self.indexer.closing:  # moved to another member, which reports their lag from now on
            metrics.forget_lag(revoked)

    def on_partitions_assigned(self, assigned):
        # Called at the end of every join (eager rebalancing, the default assignors), with no partitions
        # too (a replica beyond the partition count): a member of the group, fetching what it was given.
        self.indexer.joined = True
        for tp in assigned:
            if tp.topic == self.indexer.config.edges_topic:
                self.consumer.seek(tp, self.indexer.shard(tp.partition).resume)
            self.indexer.unverified.add(tp)  # checked after the poll: no blocking calls here


class Indexer:
    def __init__(self, config: Config, group: str | None = None, say: Callable[[str], None] = lambda _: None):
        self.config = config
        self.group = group or default_group(config)
        self.say = say
        self.stats = IndexerStats()
        self.graph = GraphWriter(config)
        self.store_dir = config.store_uri()
        self.shards: dict[int, Shard] = {}
        self.batch_log = BatchLogWriter(self.store_dir, config.log_topic)
        self.plans = PlanStore(self.store_dir, config.log_topic)
        self._graph_thread = ThreadPoolExecutor(1, thread_name_prefix="headwater-graph")
        self._dlq: KafkaProducer | None = None
        self._fault_pause_s = float(os.environ.get(FAULT_PAUSE_ENV, "0"))
        self.unverified: set = set()  # partitions assigned whose store folder is not checked against the group yet
        self.joined = False  # the consumer is a member of its group (``_Assignment``), so it fetches
        self.closing = False  # the consumer is closing: what it held is revoked, its last lag stays as it was
        self._graph_probe = GraphProbe(config)

    def shard(self, partition: int) -> Shard:
        """The store shard of an edges partition, opened (recovered, index rebuilt) on first use."""
        if partition not in self.shards:
            started = time.monotonic()
            shard = Shard(self.store_dir, self.config.edges_topic, partition).open()
            self.shards[partition] = shard
            self.say(f"store shard {self.config.edges_topic}/{partition}: resuming at offset {shard.resume} "
                     f"({len(shard.index.parent)} rows indexed, {time.monotonic() - started:.1f}s)")
        return self.shards[partition]

    def set_aside(self, partition: int) -> Shard:
        """Start the partition's shard afresh under a new store id: the old one's data stay in the tables, read
        as before and taken in by the next compaction (``store/edges.py``)."""
        old = self.shard(partition).store.identity()
        new = LineageTables(self.store_dir, self.config.edges_topic).set_aside(partition)
        self.shards.pop(partition, None)
        self.say(f"store shard {self.config.edges_topic}/{partition}: the consumer group has no offset for it, "
                 f"so its store {old} was set aside and {new} is rebuilt from the topic")
        return self.shard(partition)

    def release(self, partitions: list[int]) -> None:
        for partition in partitions:
            self.shards.pop(partition, None)

    def _consumer(self) -> KafkaConsumer:
        consumer = kafka_consumer(
            self.config, group_id=self.group, auto_offset_reset="earliest",
            session_timeout_ms=6000, heartbeat_interval_ms=1000, max_poll_records=MAX_POLL_RECORDS,
            max_poll_interval_ms=600000,
        )
        consumer.subscribe([self.config.edges_topic, self.config.log_topic], listener=_Assignment(self, consumer))
        return consumer

    def to_dlq(self, message, reason: str) -> None:
        if self._dlq is None:
            self._dlq = producer(self.config, linger_ms=0)
        headers = [("reason", reason.encode()[:1000]),
                   ("from", f"{message.topic}:{message.partition}:{message.offset}".encode())]
        self._dlq.send(self.config.dlq_topic, key=message.key, value=message.value or b"", headers=headers)
        self._dlq.flush(timeout=10)
        self.stats.dlq += 1
        metrics.DLQ.inc()
        self.say(f"dlq: {message.topic}:{message.partition}:{message.offset}: {reason}")

    # -- the edges topic: one write per run of a poll batch's messages of a partition

    def write_edges(self, partition: int, messages: list) -> None:
        """Index a run of messages of one edges partition, in offset order."""
        shard = self.shard(partition)
        messages = [m for m in messages if m.offset >= shard.resume]  # the store has the rest
        if not messages:
            return
        decoded = []
        for message in messages:
            try:
                decoded.append((message, *decode_lineage(message.value)))
            except PayloadError as exc:
                self.to_dlq(message, str(exc))
        first, last = messages[0].offset, messages[-1].offset
        try:
            self._write_both(shard, decoded, first, last)
        except GraphRejected:
            accepted = []
            for item in decoded:
                try:
                    self.graph.write_lineage(item[1], item[2])
                    accepted.append(item)
                except RETRYABLE:
                    raise
                except REJECTED as exc:
                    self.to_dlq(item[0], f"graph store rejected it: {type(exc).__name__}: {exc}")
            self._write_both(shard, accepted, first, last)
        self.stats.messages += len(messages)

    def _write_both(self, shard: Shard, decoded: list, first: int, last: int) -> None:
        """The graph and the shard at once; the shard commits only once the graph has succeeded."""
        nodes, edges = concat_lineage([(n, e) for _, n, e in decoded])
        graph = self._graph_thread.submit(self._write_graph, nodes, edges)

        waited = 0.0
        paused = False

        def graph_done() -> None:
            nonlocal waited, paused
            began = time.monotonic()
            try:
                graph.result()
            except RETRYABLE:
                raise
            except REJECTED as exc:
                raise GraphRejected(f"{type(exc).__name__}: {exc}") from exc
            finally:
                waited += time.monotonic() - began
            if self._fault_pause_s and not paused:
                paused = True
                self.say(f"fault pause: {self._fault_pause_s}s before the store's commit of partition "
                         f"{shard.partition} offsets {first}..{last}")
                time.sleep(self._fault_pause_s)

        started = time.monotonic()
        try:
            written = shard.write(nodes, edges, first, last, before_commit=graph_done)
        finally:
            graph.exception()  # never leave the graph write running behind a failure
        graph_done()  # its failure counts even where the store had nothing to commit
        seconds = time.monotonic() - started - waited  # the store's own time, not the wait for the graph
        self.stats.parquet_edges += edges.num_rows
        self.stats.parquet_bytes += written
        self.stats.parquet_seconds += seconds
        metrics.record_write("parquet", edges.num_rows, seconds)

    def _write_graph(self, nodes: pa.Table, edges: pa.Table) -> None:
        started = time.monotonic()
        written = self.graph.write_lineage(nodes, edges) if nodes.num_rows else 0
        seconds = time.monotonic() - started
        self.stats.rows += nodes.num_rows
        self.stats.edges += written
        self.stats.graph_seconds += seconds
        metrics.record_write("graph", written, seconds)

    # -- the log topic: small records, one by one

    def write_log(self, message) -> None:
        try:
            record = decode_log(message.value)
        except PayloadError as exc:
            self.to_dlq(message, str(exc))
            return
        try:
            self._write_log(record, message.partition, message.offset)
        except RETRYABLE:
            raise
        except REJECTED as exc:
            self.to_dlq(message, f"graph store rejected it: {type(exc).__name__}: {exc}")
            return
        self.stats.log_records += 1
        self.stats.messages += 1

    def _write_log(self, record: dict, partition: int, offset: int) -> None:
        """Into the graph, then into the store's batch log (``batch_log.py``): both durable before the offset commit."""
        if record["schema"] == LOG_PLAN:
            datasets: dict[str, dict] = {}
            for source in record.get("sources", []):
                if source.get("source") == "static" and source.get("dataset"):
                    props = _dataset_props(source)
                    self.graph.write_dataset(source["dataset"], props)
                    datasets.setdefault(source["dataset"], {}).update(props)
            if datasets:
                self.batch_log.append_datasets(partition, offset, datasets)
            if record.get("optimized") and re.fullmatch(r"[0-9a-f]+", str(record.get("fingerprint"))):
                self.plans.write(record["query"], int(record.get("from_batch") or 0), record["fingerprint"],
                                 {"optimized": record["optimized"], "sink": record.get("sink"),
                                  "sources": record.get("sources", []), "at": record.get("at"),
                                  "ir": record.get("ir"), "output_columns": record.get("output_columns"),
                                  "sink_location": record.get("sink_location"),
                                  "state": record.get("state", []), "black_boxes": record.get("black_boxes", [])})
        elif record["schema"] in (LOG_BATCH, LOG_PROGRESS):
            fields = {k: v for k, v in record.items() if k not in ("schema", "query", "batch") and v is not None}
            # Both halves of a batch's log entry land on one Batch node and its links (graph.batch_graph).
            self.graph.write_batch(record["query"], int(record["batch"]), fields)
            self.batch_log.append_batch(partition, offset, record["query"], int(record["batch"]), fields)

    def run(self, drain: bool = False, idle_s: float = 3.0, max_seconds: float | None = None) -> IndexerStats:
        """Index until stopped; with ``drain``, until caught up and idle for ``idle_s``."""
        ensure_topics(self.config, [self.config.edges_topic, self.config.log_topic, self.config.dlq_topic])
        self.graph.ensure_schema()
        consumer = self._consumer()
        started = time.monotonic()
        last_activity = time.monotonic()
        warned = False
        try:
            while max_seconds is None or time.monotonic() - started < max_seconds:
                polled = consumer.poll(timeout_ms=500)
                if not warned and not consumer.assignment() and time.monotonic() - started > JOIN_WARN_S:
                    warned = True
                    self._waiting_to_join()
                if self.unverified:
                    polled = self._verify(consumer, polled)
                if polled:
                    last_activity = time.monotonic()
                    self._process(consumer, polled)
                elif drain and time.monotonic() - last_activity > idle_s and self._caught_up(consumer):
                    self.stats.caught_up = True
                    break
                self._record_lag(consumer)
            else:  # max_seconds ran out
                if drain:
                    lag = {f"{tp.topic}:{tp.partition}": n for tp, n in self._lag(consumer).items()}
                    log.warning("indexer stopped after %.0fs, not caught up (lag %s): %s", max_seconds, lag,
                                summary(self.stats))
        finally:
            self.joined, self.closing = False, True
            consumer.close()
            self.closing = False
        return self.stats

    def _waiting_to_join(self) -> None:
        log.warning("no partitions assigned after %.0fs: consumer group %r is still rebalancing. A member "
                    "that stopped polling holds a rebalance until its poll interval ends, and a broker that "
                    "keeps a gone member holds it for good: stop the group's other indexers, or index with "
                    "another group (headwater index --group)", JOIN_WARN_S, self.group)

    def _verify(self, consumer: KafkaConsumer, polled: dict) -> dict:
        """Set aside the shards of newly assigned partitions the group has no offset for.

        The shard then has data the group never committed: the topic is not the one the
        shard was built from (a broker that lost its data, a topic recreated), or the
        group is new. Either way the shard cannot say where to resume, so it is set
        aside and the partition is indexed again from its beginning. A log partition's
        batch log starts a new epoch instead: what the partition is read for again from
        its beginning then comes after what the batch log holds, which it keeps.
        """
        polled = dict(polled)
        for tp in self.unverified & consumer.assignment():
            try:
                self._verify_partition(consumer, tp, polled)
            except RETRYABLE as exc:  # the store is away: verified at a later poll, its records fetched again
                self.stats.retries += 1
                metrics.RETRIES.inc()
                self.say(f"store unavailable while checking {tp.topic}:{tp.partition}, retrying: "
                         f"{type(exc).__name__}: {exc}")
                fetched = polled.pop(tp, None)
                if fetched:
                    consumer.seek(tp, fetched[0].offset)
                continue
            self.unverified.discard(tp)
        self.unverified &= consumer.assignment()  # those revoked meanwhile are their new owner's to check
        return polled

    def _verify_partition(self, consumer: KafkaConsumer, tp, polled: dict) -> None:
        if tp.topic == self.config.log_topic:
            if self.batch_log.holds(tp.partition) and consumer.committed(tp) is None:
                epoch = self.batch_log.new_epoch(tp.partition)
                self.say(f"batch log {self.config.log_topic}/{tp.partition}: the consumer group has no offset "
                         f"for it, so the partition is read again from its beginning in epoch {epoch}")
            return
        if self.shard(tp.partition).resume and consumer.committed(tp) is None:
            self.set_aside(tp.partition)
            consumer.seek_to_beginning(tp)
            polled.pop(tp, None)  # fetched from where the old shard ended

    def _process(self, consumer: KafkaConsumer, polled: dict) -> None:
        done: dict = {}
        for tp, messages in polled.items():
            if tp.topic == self.config.edges_topic:
                for run in runs(messages, WRITE_BYTES):  # each run committed as soon as it is written
                    if not self._retrying(consumer, tp, run[0].offset, lambda: self.write_edges(tp.partition, run)):
                        break
                    self._commit(consumer, {tp: OffsetAndMetadata(run[-1].offset + 1, "", -1)})
                    metrics.MESSAGES.labels(tp.topic).inc(len(run))
                continue
            for message in messages:
                if not self._retrying(consumer, tp, message.offset, lambda: self.write_log(message)):
                    break
                done[tp] = OffsetAndMetadata(message.offset + 1, "", -1)
                metrics.MESSAGES.labels(tp.topic).inc()
        self._commit(consumer, done)

    def _commit(self, consumer: KafkaConsumer, done: dict) -> None:
        if not done:
            return
        if self._fault_pause_s:
            self.say(f"fault pause: {self._fault_pause_s}s before committing offsets")
            time.sleep(self._fault_pause_s)
        try:
            consumer.commit(done)
        except CommitFailedError as exc:  # the partitions moved; their new owner resumes from the store
            self.say(f"offset commit failed after a rebalance: {exc}")

    def _retrying(self, consumer: KafkaConsumer, tp, offset: int, write) -> bool:
        """Run a write; if a store is away, rewind the partition to ``offset`` to retry it later."""
        try:
            write()
            return True
        except RETRYABLE as exc:
            self.stats.retries += 1
            metrics.RETRIES.inc()
            self.say(f"write failed, retrying {tp.topic}:{tp.partition}:{offset}: {type(exc).__name__}: {exc}")
            consumer.seek(tp, offset)
            time.sleep(1.0)
            return False

    @staticmethod
    def _lag(consumer: KafkaConsumer) -> dict:
        """Messages not yet indexed, per assigned partition whose high-water mark is known."""
        lag = {}
        for tp in consumer.assignment():
            mark = consumer.highwater(tp)
            if mark is not None:
                lag[tp] = max(0, mark - consumer.position(tp))
        return lag

    @classmethod
    def _record_lag(cls, consumer: KafkaConsumer) -> None:
        for tp, lag in cls._lag(consumer).items():
            metrics.LAG.labels(tp.topic, str(tp.partition)).set(lag)

    @staticmethod
    def _caught_up(consumer: KafkaConsumer) -> bool:
        assigned = consumer.assignment()
        if not assigned:
            return False
        for tp in assigned:
            mark = consumer.highwater(tp)
            if mark is None or consumer.position(tp) < mark:
                return False
        return True

    def unready(self) -> dict[str, str]:
        """What keeps this indexer from indexing now, by part (``/readyz``); empty when it is ready.

        A member of its group with no partitions (a replica beyond the partition count) is
        ready: it is where it should be, and takes partitions over when another leaves.
        """
        found = {}
        if not self.joined:
            found["consumer"] = f"not a member of consumer group {self.group!r} now (starting, or rebalancing)"
        graph = self._graph_probe.problem()
        if graph:
            found["graph"] = graph
        store = store_problem(self.store_dir, writable=True)
        if store:
            found["store"] = store
        return found

    def close(self) -> None:
        self._graph_probe.close()
        self._graph_thread.shutdown(wait=True)
        self.graph.close()
        self.batch_log.close()
        if self._dlq is not None:
            self._dlq.close()


def summary(stats: IndexerStats) -> str:
    return json.dumps(stats.to_dict())
