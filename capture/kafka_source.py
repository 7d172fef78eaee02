"""A Kafka stream source for Spark as a Python Data Source, over kafka-python.

The Spark Kafka connector jar cannot be installed everywhere headwater runs (its tests
and demo among them), so this source stands in for it with the connector's own row
schema: ``key, value, topic, partition, offset, timestamp, timestampType``. A pipeline
written against it reads the same as one written against ``format("kafka")``::

    spark.dataSource.register(KafkaSource)
    orders = (spark.readStream.format("headwater_kafka")
              .option("kafka.bootstrap.servers", "127.0.0.1:9092")
              .option("subscribe", "orders")
              .load())

Offsets are ``{"topic:partition": next_offset}``. The latest offset comes from the
high-water mark the broker returns with a fetch, not from ``end_offsets()``, which
some Kafka-protocol brokers (tansu) answer wrongly.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Iterator

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from headwater.adapters.kafka import KafkaSourceError, high_watermark_client, high_watermarks, read_records

SOURCE_NAME = "headwater_kafka"

KAFKA_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType(), nullable=False),
        StructField("partition", IntegerType(), nullable=False),
        StructField("offset", LongType(), nullable=False),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
)



@dataclass(frozen=True)
class OffsetRange(InputPartition):
    topic: str
    partition: int
    start: int
    end: int


def _partition_key(topic: str, partition: int) -> str:
    return f"{topic}:{partition}"


def _split_key(key: str) -> tuple[str, int]:
    topic, _, partition = key.rpartition(":")
    return topic, int(partition)


def read_range(bootstrap: str, rng: OffsetRange) -> Iterator[tuple]:
    """Every record of ``rng`` in offset order, as rows of ``KAFKA_SCHEMA``."""
    for record in read_records(bootstrap, rng.topic, rng.partition, rng.start, rng.end):
        yield (
            record.key,
            record.value,
            rng.topic,
            rng.partition,
            record.offset,
            dt.datetime.fromtimestamp(record.timestamp / 1000, tz=dt.timezone.utc),
            record.timestamp_type,
        )


class KafkaStreamReader(DataSourceStreamReader):
    def __init__(self, options: dict):
        self.bootstrap = options.get("kafka.bootstrap.servers")
        topics = options.get("subscribe")
        if not self.bootstrap or not topics:
            raise KafkaSourceError(
                "the headwater_kafka source needs the options "
                "'kafka.bootstrap.servers' and 'subscribe'"
            )
        self.topics = [t.strip() for t in topics.split(",") if t.strip()]
        self.max_rows = int(options.get("maxOffsetsPerTrigger", 0)) or None
        self._consumer = None

    def _client(self):
        if self._consumer is None:
            self._consumer = high_watermark_client(self.bootstrap)
        return self._consumer

    def _partitions(self) -> list:
        from kafka import TopicPartition

        client = self._client()
        found = []
        for topic in self.topics:
            ids = client.partitions_for_topic(topic)
            if not ids:
                raise KafkaSourceError(f"topic {topic!r} does not exist on {self.bootstrap}")
            found.extend(TopicPartition(topic, p) for p in sorted(ids))
        return found

    def initialOffset(self) -> dict:
        client = self._client()
        tps = self._partitions()
        return {_partition_key(tp.topic, tp.partition): off for tp, off in client.beginning_offsets(tps).items()}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows) if self.max_rows else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        tps = {tp: start.get(_partition_key(tp.topic, tp.partition), 0) for tp in self._partitions()}
        marks = high_watermarks(self._client(), tps)
        end = {_partition_key(tp.topic, tp.partition): max(mark, tps[tp]) for tp, mark in marks.items()}
        if isinstance(limit, ReadMaxRows):
            end = _cap_rows(start, end, limit.max_rows)
        return end

    def partitions(self, start: dict, end: dict) -> list:
        ranges = []
        for key, stop in sorted(end.items()):
            begin = start.get(key, 0)
            if stop > begin:
                topic, partition = _split_key(key)
                ranges.append(OffsetRange(topic, partition, begin, stop))
        return ranges

    def read(self, partition: OffsetRange) -> Iterator[tuple]:
        return read_range(self.bootstrap, partition)

    def commit(self, end: dict) -> None:
        """Nothing to do: offsets live in Spark's checkpoint, not in a consumer group."""

    def stop(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def _cap_rows(start: dict, end: dict, max_rows: int) -> dict:
    """Share ``max_rows`` evenly over the partitions that have records, so none starves."""
    capped = {key: start.get(key, 0) for key in end}
    budget = max_rows
    while budget > 0:
        open_keys = sorted(k for k in end if capped[k] < end[k])
        if not open_keys:
            break
        share = max(1, budget // len(open_keys))
        for key in open_keys:
            take = min(share, end[key] - capped[key], budget)
            capped[key] += take
            budget -= take
    return capped


class KafkaSource(DataSource):
    """``spark.readStream.format("headwater_kafka")``: see the module docstring."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        return KAFKA_SCHEMA

    def streamReader(self, schema: StructType) -> KafkaStreamReader:
        return KafkaStreamReader(self.options)
