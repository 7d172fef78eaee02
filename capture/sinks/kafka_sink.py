"""Spark's Kafka sink (``format("kafka")``), traced: Spark's own streaming write, each record carrying its rid.

A batch is written by the connector's ``KafkaStreamingWrite`` with the batch id, as untraced
(``StreamingWriteSink``): at least once, so a batch Spark runs again is written again, the same
duplicates as untraced. What headwater adds:

- each record's rid, where the writer's option ``headwater.rid`` says (the option is not passed to the
  connector): ``header`` (the default) adds a header ``_hw_rid`` (the rid in decimal, UTF-8) after the
  record's own headers; ``value`` puts ``"_hw_rid": <rid>`` first in the record's value, which must
  then be a JSON object (a batch with another value fails, naming the option); ``none`` adds nothing (as
  ``emit_rid=False`` does);
- where the batch's records went: the end offsets of the topics it writes to before and after the
  write (Kafka's own admin client, with the writer's ``kafka.*`` options, as the connector connects),
  logged in the batch's capture record as ``sink_offsets``, ``{topic: {partition: [first, end)}}``.
  The query tier reads those ranges to answer forward lineage as ``kafka:TOPIC:PARTITION:OFFSET``
  (another writer's records in a range are told apart by their rid).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType

from ..rewrite import RID_COLUMN
from ..spark_plan import session_jvm
from .base import SinkError, option
from .jvm import message
from .streaming_write import StreamingWriteSink

RID_OPTION = "headwater.rid"
RID_HEADER = RID_COLUMN  # the header's key
HEADER, VALUE, NONE = "header", "value", "none"
PLACES = (HEADER, VALUE, NONE)
KAFKA = "kafka"
KEPT_BATCHES = 100


def rid_place(options: dict) -> str:
    """Where the writer's options put each record's rid; ``SinkError`` for a place there is not."""
    place = (option(options, RID_OPTION) or HEADER).lower()
    if place not in PLACES:
        raise SinkError(f"option {RID_OPTION}={place!r}: expected one of {', '.join(PLACES)}")
    return place


def connector_options(options: dict) -> dict:
    """The writer's options as the connector gets them: headwater's own taken out."""
    return {k: v for k, v in options.items() if k.lower() != RID_OPTION}


def with_rid(df: DataFrame, place: str) -> DataFrame:
    """The sink's rows as the connector writes them: ``_hw_rid`` moved into each record's header or value."""
    if RID_COLUMN not in df.columns:
        return df
    rid = F.col(RID_COLUMN).cast("string")
    if place == HEADER:
        header = F.array(F.struct(F.lit(RID_HEADER).alias("key"), rid.cast("binary").alias("value")))
        headers = F.concat(F.coalesce(F.col("headers"), F.array().cast(df.schema["headers"].dataType)), header) \
            if "headers" in df.columns else header
        df = df.withColumn("headers", headers)
    elif place == VALUE and "value" in df.columns:
        df = df.withColumn("value", _value_with_rid(F.col("value"), rid, df.schema["value"].dataType))
    return df.drop(RID_COLUMN)


def _value_with_rid(value: Column, rid: Column, kind) -> Column:
    text = value.cast("string")
    empty = text.rlike(r"^\s*\{\s*\}\s*$")
    put = F.when(empty, F.concat(F.lit('{"' + RID_HEADER + '":'), rid, F.lit("}"))) \
        .when(text.rlike(r"^\s*\{"), F.concat(F.lit('{"' + RID_HEADER + '":'), rid, F.lit(","),
                                              F.regexp_replace(text, r"^\s*\{", ""))) \
        .when(value.isNull(), F.lit(None).cast("string")) \
        .otherwise(F.raise_error(F.lit(f"{RID_OPTION}=value puts each record's rid in its value, which must be a "
                                       f"JSON object; a record's value is not: write its rid in a header "
                                       f"({RID_OPTION}=header, the default) instead")))
    return put.cast("binary") if isinstance(kind, BinaryType) else put


class KafkaSink(StreamingWriteSink):
    """``format("kafka")``: the connector's streaming write; the rid in each record; the batch's offsets logged."""

    def __init__(self, spark: SparkSession, relation, options: dict, output_mode: str, place: str):
        super().__init__(spark, relation, connector_options(options), output_mode)
        self.place = place
        self._topic = option(options, "topic")
        self._client = {k[len("kafka."):]: v for k, v in options.items() if k.lower().startswith("kafka.")}
        self._ends: dict[str, dict[int, int]] = {}  # after the last batch this sink wrote
        self._written: dict[int, dict] = {}

    def write(self, df: DataFrame, batch_id: int) -> None:
        traced = RID_COLUMN in df.columns and self.place != NONE
        topics = self._topics(df) if traced else []
        admin = self._admin() if topics else None
        try:
            before = {t: self._ends.get(t) or self._end_offsets(admin, t, missing_ok=True) for t in topics}
            super().write(with_rid(df, self.place), batch_id)
            after = {t: self._end_offsets(admin, t) for t in topics}
        finally:
            if admin is not None:
                admin.close()
        self._ends.update(after)
        if topics:
            self._written[batch_id] = {t: {str(p): [before[t].get(p, 0), end] for p, end in sorted(after[t].items())
                                           if end > before[t].get(p, 0)} for t in topics}
            while len(self._written) > KEPT_BATCHES:  # a log record never asked for them
                self._written.pop(min(self._written))

    def offsets(self, batch_id: int) -> dict | None:
        """Where the batch's records went, once (the batch's log record takes them)."""
        return self._written.pop(batch_id, None)

    def _topics(self, df: DataFrame) -> list[str]:
        """The topics the batch writes to: the ``topic`` option's, else those its rows name (a job)."""
        if self._topic:
            return [self._topic]
        if "topic" not in df.columns:
            return []  # the connector refuses the batch itself, with its own message
        return sorted(r[0] for r in df.select("topic").distinct().collect() if r[0] is not None)

    def _admin(self):
        jvm = session_jvm(self._spark)
        properties = jvm.java.util.Properties()
        for key, value in self._client.items():
            properties.setProperty(key, value)
        properties.setProperty("client.id", "headwater-sink-offsets")
        try:
            return jvm.org.apache.kafka.clients.admin.Admin.create(properties)
        except Exception as exc:
            raise SinkError(f"cannot reach the Kafka sink's brokers to log where its records go: {message(exc)}") \
                from exc

    def _end_offsets(self, admin, topic: str, missing_ok: bool = False) -> dict[int, int]:
        """Each partition of ``topic`` and its end offset (the next offset written), as Kafka's admin gives it;
        none for a topic not there yet (``missing_ok``: the batch's write may make it, as the broker allows)."""
        jvm = session_jvm(self._spark)
        kafka = jvm.org.apache.kafka
        names = jvm.java.util.ArrayList()
        names.add(topic)
        try:
            described = admin.describeTopics(names).allTopicNames().get().get(topic)
        except Exception as exc:
            if missing_ok and "UnknownTopicOrPartition" in message(exc):
                return {}
            raise SinkError(f"cannot read the end offsets of the Kafka sink's topic {topic!r}: {message(exc)}") \
                from exc
        wanted = jvm.java.util.HashMap()
        for info in described.partitions():
            wanted.put(kafka.common.TopicPartition(topic, info.partition()), kafka.clients.admin.OffsetSpec.latest())
        listed = admin.listOffsets(wanted).all().get()
        return {int(tp.partition()): int(listed.get(tp).offset()) for tp in listed.keySet()}
