"""``headwater index``: the consumer group from the edges and log topics to the graph.

Offsets are committed only after the graph write of every message before them has
succeeded; a message that cannot be decoded goes to the dlq topic with its reason
(and is then committed); a graph failure rewinds to the first unwritten message and
retries, so nothing is lost and MERGE keeps repeats harmless.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Callable

from kafka import KafkaConsumer
from kafka.structs import OffsetAndMetadata
from neo4j.exceptions import Neo4jError, ServiceUnavailable, SessionExpired, TransientError

from headwater.adapters.kafka import ensure_topics, producer
from headwater.core.config import Config
from headwater.core.schema import LOG_BATCH, LOG_PLAN, LOG_PROGRESS, PayloadError, decode_lineage, decode_log

from .graph import GraphWriter

GROUP = "headwater-indexer"

# Failures that pass: the message is retried. Any other failure is the message's own
# fault and sends it to the dlq.
RETRYABLE = (ServiceUnavailable, SessionExpired, TransientError, OSError)


@dataclass
class IndexerStats:
    messages: int = 0
    rows: int = 0
    edges: int = 0
    log_records: int = 0
    dlq: int = 0
    retries: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def _dataset_props(source: dict) -> dict:
    location = source.get("location") or {}
    return {k: v for k, v in {
        "source": source.get("source"),
        "location": ",".join(location.get("paths", [])) or None,
        "format": location.get("format"),
        "key": ",".join(source.get("key") or []) or None,
    }.items() if v is not None}


class Indexer:
    def __init__(self, config: Config, group: str = GROUP, say: Callable[[str], None] = lambda _: None):
        self.config = config
        self.group = group
        self.say = say
        self.stats = IndexerStats()
        self.graph = GraphWriter(config)
        self._dlq = None

    def _consumer(self) -> KafkaConsumer:
        return KafkaConsumer(
            self.config.edges_topic, self.config.log_topic,
            bootstrap_servers=self.config.bootstrap, group_id=self.group,
            enable_auto_commit=False, auto_offset_reset="earliest",
            session_timeout_ms=6000, heartbeat_interval_ms=1000, max_poll_records=20,
            max_poll_interval_ms=600000,
        )

    def to_dlq(self, message, reason: str) -> None:
        if self._dlq is None:
            self._dlq = producer(self.config.bootstrap, linger_ms=0)
        headers = [("reason", reason.encode()[:1000]),
                   ("from", f"{message.topic}:{message.partition}:{message.offset}".encode())]
        self._dlq.send(self.config.dlq_topic, key=message.key, value=message.value or b"", headers=headers)
        self._dlq.flush(timeout=10)
        self.stats.dlq += 1
        self.say(f"dlq: {message.topic}:{message.partition}:{message.offset}: {reason}")

    def handle(self, message) -> None:
        """Write one message to the graph; undecodable ones go to the dlq."""
        try:
            if message.topic == self.config.edges_topic:
                nodes, edges = decode_lineage(message.value)
            else:
                record = decode_log(message.value)
        except PayloadError as exc:
            self.to_dlq(message, str(exc))
            return
        try:
            if message.topic == self.config.edges_topic:
                self.graph.write_lineage(nodes, edges)
                self.stats.rows += nodes.num_rows
                self.stats.edges += edges.num_rows
            else:
                self._write_log(record)
                self.stats.log_records += 1
        except RETRYABLE:
            raise
        except (Neo4jError, ValueError, TypeError, KeyError) as exc:
            self.to_dlq(message, f"graph store rejected it: {type(exc).__name__}: {exc}")
            return
        self.stats.messages += 1

    def _write_log(self, record: dict) -> None:
        if record["schema"] == LOG_PLAN:
            for source in record.get("sources", []):
                if source.get("source") == "static" and source.get("dataset"):
                    self.graph.write_dataset(source["dataset"], _dataset_props(source))
        elif record["schema"] in (LOG_BATCH, LOG_PROGRESS):
            # Both halves of a batch's log entry land on one Batch node; nested values
            # (source offsets, durations) as JSON text, since properties are flat.
            props = {k: v if isinstance(v, (int, float, str, bool)) else json.dumps(v, sort_keys=True)
                     for k, v in record.items() if k not in ("schema", "query", "batch") and v is not None}
            self.graph.write_batch(record["query"], int(record["batch"]), props)

    def run(self, drain: bool = False, idle_s: float = 3.0, max_seconds: float | None = None) -> IndexerStats:
        """Index until stopped; with ``drain``, until caught up and idle for ``idle_s``."""
        ensure_topics(self.config.bootstrap, [self.config.edges_topic, self.config.log_topic,
                                              self.config.dlq_topic], self.config.topic_partitions)
        self.graph.ensure_schema()
        consumer = self._consumer()
        started = time.monotonic()
        last_activity = time.monotonic()
        try:
            while max_seconds is None or time.monotonic() - started < max_seconds:
                polled = consumer.poll(timeout_ms=500)
                if polled:
                    last_activity = time.monotonic()
                    self._process(consumer, polled)
                elif drain and time.monotonic() - last_activity > idle_s and self._caught_up(consumer):
                    break
        finally:
            consumer.close()
        return self.stats

    def _process(self, consumer: KafkaConsumer, polled: dict) -> None:
        done: dict = {}
        for tp, messages in polled.items():
            for message in messages:
                try:
                    self.handle(message)
                except RETRYABLE as exc:  # the graph store is away: retry from this message
                    self.stats.retries += 1
                    self.say(f"graph write failed, retrying {tp.topic}:{tp.partition}:{message.offset}: {exc}")
                    consumer.seek(tp, message.offset)
                    time.sleep(1.0)
                    break
                done[tp] = OffsetAndMetadata(message.offset + 1, "", -1)
        if done:
            consumer.commit(done)

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

    def close(self) -> None:
        self.graph.close()
        if self._dlq is not None:
            self._dlq.close()


def summary(stats: IndexerStats) -> str:
    return json.dumps(stats.to_dict())
