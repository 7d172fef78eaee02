"""Streaming programs of others, as their authors published them, changed only at their source and their sink.

Each function below is one published program's body. Its source (what the original reads from a
socket, a Kafka connector or ``spark.readStream. ...``) is Spark's Kafka connector over the topics it is
given, from their earliest offsets (the test produces before it starts the query), keeping the program's
own column handling, with the ``maxOffsetsPerTrigger`` the test gives (one micro-batch per round of its
events). It returns the program's final DataFrame and
its own output mode, for the test to write in place of the original's console sink: traced
(``tracer.trace(df, name=…).writeStream.outputMode(mode).format("parquet")`` with a checkpoint), or
untraced (``foreachBatch`` appending each batch to Parquet), with a processing-time trigger of 1 s
(2 s for the applyInPandasWithState program, below) where the originals have Spark's default. Nothing between the
source and the sink is changed but what the comment above a program says, not even the names (``bootstrapServers``,
``windowedCounts``, ``func``).
"""

from __future__ import annotations

import math
from typing import Iterator

import pandas as pd
from pyspark.sql.functions import col, explode, expr, from_json, session_window, split, window
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout
from pyspark.sql.types import LongType, StringType, StructField, StructType


# Origin: apache/spark, examples/src/main/python/sql/streaming/structured_kafka_wordcount.py
# (https://github.com/apache/spark/blob/master/examples/src/main/python/sql/streaming/structured_kafka_wordcount.py).
# Changed: the source's `subscribeType` argument is "subscribe", and `startingOffsets` ("earliest") and
# `maxOffsetsPerTrigger` are set; the sink, `.format('console')`, is the test's Parquet
# sink, in the program's own output mode, complete. Kept: `.selectExpr("CAST(value AS STRING)")`.
def structured_kafka_wordcount(spark, bootstrapServers: str, topics: str, maxOffsetsPerTrigger: int):
    # Create DataSet representing the stream of input lines from kafka
    lines = spark\
        .readStream\
        .format("kafka")\
        .option("startingOffsets", "earliest")\
        .option("kafka.bootstrap.servers", bootstrapServers)\
        .option("subscribe", topics)\
        .option("maxOffsetsPerTrigger", maxOffsetsPerTrigger)\
        .load()\
        .selectExpr("CAST(value AS STRING)")

    # Split the lines into words
    words = lines.select(
        # explode turns each item in an array into a separate row
        explode(
            split(lines.value, ' ')
        ).alias('word')
    )

    # Generate running word count
    wordCounts = words.groupBy('word').count()

    return wordCounts, 'complete'


# Origin: apache/spark, examples/src/main/python/sql/streaming/structured_network_wordcount_windowed.py
# (https://github.com/apache/spark/blob/master/examples/src/main/python/sql/streaming/structured_network_wordcount_windowed.py),
# with its docstring's recommended window of 10 s sliding every 5 s (`windowSize`, `slideSize`).
# Changed: the source, `format("socket")` with `includeTimestamp` (a string `value` and a `timestamp`
# per line), is the Kafka topic of the lines (with `maxOffsetsPerTrigger`),
# `selectExpr("CAST(value AS STRING) AS value", "timestamp")`: the line and its record's timestamp; the sink,
# `format("console")` with `truncate`, is the test's Parquet sink, in the program's own output mode, complete.
# Kept: `.orderBy("window")`.
def structured_network_wordcount_windowed(spark, bootstrap: str, topic: str, maxOffsetsPerTrigger: int,
                                          windowSize: int = 10, slideSize: int = 5):
    windowDuration = "{} seconds".format(windowSize)
    slideDuration = "{} seconds".format(slideSize)

    # Create DataFrame representing the stream of input lines from connection to host:port
    lines = (
        spark.readStream.format("kafka").option("startingOffsets", "earliest")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("maxOffsetsPerTrigger", maxOffsetsPerTrigger)
        .load()
        .selectExpr("CAST(value AS STRING) AS value", "timestamp")
    )

    # Split the lines into words, retaining timestamps
    # split() splits each line into an array, and explode() turns the array into multiple rows
    words = lines.select(explode(split(lines.value, " ")).alias("word"), lines.timestamp)

    # Group the data by window and word and compute the count of each group
    windowedCounts = (
        words.groupBy(window(words.timestamp, windowDuration, slideDuration), words.word)
        .count()
        .orderBy("window")
    )

    return windowedCounts, "complete"


# Origin: apache/spark, examples/src/main/python/sql/streaming/structured_network_wordcount_session_window.py
# (https://github.com/apache/spark/blob/master/examples/src/main/python/sql/streaming/structured_network_wordcount_session_window.py):
# sessions by applyInPandasWithState with a processing-time timeout of 10 s, emitted when they time out.
# Changed: the source, `format("socket")` with `includeTimestamp`, is the Kafka topic of the lines,
# `selectExpr("CAST(value AS STRING) AS value", "timestamp")`; the sink, `format("console")`, is the
# test's Parquet sink, in the program's own output mode, update, with a trigger of 2 s where the
# original has Spark's default (a batch as soon as the last ends: with a processing-time timeout
# Spark runs a batch at every trigger, which on two cores would starve the other programs); `func`,
# defined inside `__main__` there, is at module level here, so Spark's workers import it.
def func(
    key: tuple, pdf_iter: Iterator[pd.DataFrame], state: GroupState
) -> Iterator[pd.DataFrame]:
    if state.hasTimedOut:
        count, start, end = state.get
        state.remove()
        yield pd.DataFrame(
            {
                "sessionId": [key[0]],
                "count": [count],
                "start": [start],
                "end": [end],
            }
        )
    else:
        start = math.inf
        end = 0
        count = 0
        for pdf in pdf_iter:
            start = min(start, min(pdf["timestamp"]))
            end = max(end, max(pdf["timestamp"]))
            count = count + len(pdf)
        if state.exists:
            old_session = state.get
            count = count + old_session[0]
            start = old_session[1]
            end = max(end, old_session[2])
        state.update((count, start, end))
        state.setTimeoutDuration(10000)
        yield pd.DataFrame()


SESSION_WINDOW_TRIGGER = "2 seconds"


def structured_network_wordcount_session_window(spark, host_bootstrap: str, topic: str):
    # Create DataFrame representing the stream of input lines from connection to host:port
    lines = (
        spark.readStream.format("kafka").option("startingOffsets", "earliest")
        .option("kafka.bootstrap.servers", host_bootstrap)
        .option("subscribe", topic)
        .load()
        .selectExpr("CAST(value AS STRING) AS value", "timestamp")
    )

    # Split the lines into words, retaining timestamps
    # split() splits each line into an array, and explode() turns the array into multiple rows
    events = lines.select(
        explode(split(lines.value, " ")).alias("sessionId"),
        lines.timestamp.cast("long"),
    )
    session_fields = [
        StructField("sessionId", StringType()),
        StructField("count", LongType()),
        StructField("start", LongType()),
        StructField("end", LongType()),
    ]

    # Group the data by window and word and compute the count of each group
    sessions = events.groupBy(events["sessionId"]).applyInPandasWithState(
        func,
        StructType(session_fields),
        StructType(
            session_fields[1:]
        ),  # omit the session id in the state since it is available as group key
        "Update",
        GroupStateTimeout.ProcessingTimeTimeout,
    )

    return sessions, "update"


def _guide_stream(spark, bootstrap: str, topic: str, schema: str, maxOffsetsPerTrigger: int):
    """The source the Programming Guide leaves out (`spark.readStream. ...`): a Kafka topic of JSON
    events with the columns the guide names, read as its Kafka integration guide reads values,
    `CAST(value AS STRING)`, then parsed."""
    return (spark.readStream.format("kafka").option("startingOffsets", "earliest")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
            .option("maxOffsetsPerTrigger", maxOffsetsPerTrigger)
            .load()
            .selectExpr("CAST(value AS STRING) AS json")
            .select(from_json("json", schema).alias("event"))
            .select("event.*"))


# Origin: Spark's Structured Streaming Programming Guide, "Types of time windows", the session window
# with a static gap (apache/spark, docs/streaming/apis-on-dataframes-and-datasets.md;
# https://spark.apache.org/docs/latest/streaming/apis-on-dataframes-and-datasets.html#types-of-time-windows).
# Used in place of apache/spark's examples/src/main/python/sql/streaming/structured_sessionization.py,
# whose `session_window` in update output mode Spark 4 refuses at start, untraced too
# ("STREAMING_OUTPUT_MODE.UNSUPPORTED_OPERATION ... not supported for session window streaming
# aggregations"; the guide lists update mode as not supported for session windows). Changed: the
# source (the guide's `events = ...`, "streaming DataFrame of schema { timestamp: Timestamp, userId:
# String }") is a Kafka topic of JSON events parsed into those columns (with `maxOffsetsPerTrigger`);
# the sink, which the guide leaves out, is the test's Parquet sink in append mode, the mode the guide
# gives a watermarked aggregation whose groups close. One change inside: the guide's Python groups by
# `session_window(events.timestamp, "5 minutes")`, the column of the frame before `withWatermark`,
# which Spark 4.3 refuses in append mode untraced too ("STREAMING_OUTPUT_MODE.UNSUPPORTED_OPERATION:
# ... not supported for streaming aggregations without watermark"); its Scala and Java snippets name
# the column, `session_window($"timestamp", "5 minutes")`, `col("timestamp")`, resolved above the
# watermark, which Spark runs: that form is used, `col("timestamp")`.
def guide_session_window(spark, bootstrap: str, topic: str, maxOffsetsPerTrigger: int):
    events = _guide_stream(spark, bootstrap, topic, "timestamp TIMESTAMP, userId STRING", maxOffsetsPerTrigger)

    # Group the data by session window and userId, and compute the count of each group
    sessionizedCounts = events \
        .withWatermark("timestamp", "10 minutes") \
        .groupBy(
            session_window(col("timestamp"), "5 minutes"),
            events.userId) \
        .count()

    return sessionizedCounts, "append"


# Origin: Spark's Structured Streaming Programming Guide, "Stream-stream Joins", "Outer Joins with
# Watermarking": ad impressions joined with their clicks, watermarks of 2 and 3 hours, a click
# within an hour of its impression, "leftOuter" (apache/spark, docs/streaming/apis-on-dataframes-and-datasets.md;
# https://spark.apache.org/docs/latest/streaming/apis-on-dataframes-and-datasets.html#outer-joins-with-watermarking).
# Changed: the sources (the guide's `impressions = spark.readStream. ...`, `clicks = ...`) are two
# Kafka topics of JSON events parsed into the columns the guide's condition names (each with
# `maxOffsetsPerTrigger`); the sink, which the guide leaves out, is the test's Parquet sink in append
# mode (the only mode Spark allows a stream-stream join, as the guide says).
def guide_stream_stream_join(spark, bootstrap: str, impressions_topic: str, clicks_topic: str,
                             maxOffsetsPerTrigger: tuple[int, int]):
    impressions = _guide_stream(spark, bootstrap, impressions_topic, "impressionAdId LONG, impressionTime TIMESTAMP",
                                maxOffsetsPerTrigger[0])
    clicks = _guide_stream(spark, bootstrap, clicks_topic, "clickAdId LONG, clickTime TIMESTAMP",
                           maxOffsetsPerTrigger[1])

    # Apply watermarks on event-time columns
    impressionsWithWatermark = impressions.withWatermark("impressionTime", "2 hours")
    clicksWithWatermark = clicks.withWatermark("clickTime", "3 hours")

    joined = impressionsWithWatermark.join(
      clicksWithWatermark,
      expr("""
        clickAdId = impressionAdId AND
        clickTime >= impressionTime AND
        clickTime <= impressionTime + interval 1 hour
        """),
      "leftOuter"                 # can be "inner", "leftOuter", "rightOuter", "fullOuter", "leftSemi"
    )

    return joined, "append"


# Origin: Spark's Structured Streaming Programming Guide, "Streaming Deduplication", with watermark,
# using guid and eventTime columns (apache/spark, docs/streaming/apis-on-dataframes-and-datasets.md;
# https://spark.apache.org/docs/latest/streaming/apis-on-dataframes-and-datasets.html#streaming-deduplication).
# Changed: the source (`streamingDf = spark.readStream. ...`, "columns: guid, eventTime, ...") is a
# Kafka topic of JSON events (with `maxOffsetsPerTrigger`) with those columns and one more,
# `attempt` (which delivery of the event a record is, so the row kept names its record); the sink,
# which the guide leaves out, is the test's Parquet sink in append mode. The guide's Python passes the columns as
# arguments, `dropDuplicates("guid", "eventTime")`, which PySpark refuses (`subset` is one list): they are a list.
def guide_dedup_with_watermark(spark, bootstrap: str, topic: str, maxOffsetsPerTrigger: int):
    streamingDf = _guide_stream(spark, bootstrap, topic, "guid STRING, eventTime TIMESTAMP, attempt INT",
                                maxOffsetsPerTrigger)

    # With watermark using guid and eventTime columns
    deduplicated = streamingDf \
      .withWatermark("eventTime", "10 seconds") \
      .dropDuplicates(["guid", "eventTime"])

    return deduplicated, "append"


# Origin: Spark's Structured Streaming Programming Guide, "Streaming Deduplication",
# dropDuplicatesWithinWatermark (apache/spark, docs/streaming/apis-on-dataframes-and-datasets.md;
# https://spark.apache.org/docs/latest/streaming/apis-on-dataframes-and-datasets.html#streaming-deduplication).
# Changed: as for the deduplication above (a Kafka topic of JSON events: guid, eventTime, attempt;
# the test's Parquet sink in append mode); the guide's `dropDuplicatesWithinWatermark("guid")`, which
# PySpark refuses (`subset` is a list, not a string), is given `["guid"]`.
def guide_dedup_within_watermark(spark, bootstrap: str, topic: str, maxOffsetsPerTrigger: int):
    streamingDf = _guide_stream(spark, bootstrap, topic, "guid STRING, eventTime TIMESTAMP, attempt INT",
                                maxOffsetsPerTrigger)

    # deduplicate using guid column with watermark based on eventTime column
    deduplicated = streamingDf \
      .withWatermark("eventTime", "10 hours") \
      .dropDuplicatesWithinWatermark(["guid"])

    return deduplicated, "append"


# Origin: Spark's Structured Streaming Programming Guide, "Stream-static Joins", the left outer
# equi-join with a static DataFrame (apache/spark, docs/streaming/apis-on-dataframes-and-datasets.md;
# https://spark.apache.org/docs/latest/streaming/apis-on-dataframes-and-datasets.html#stream-static-joins).
# Changed: the sources (`staticDf = spark.read. ...`, `streamingDf = spark.readStream. ...`) are a
# Parquet file of types (type, label) and a Kafka topic of JSON events (id, type, amount), with
# `maxOffsetsPerTrigger`; the sink, which the guide leaves out, is the test's Parquet sink in append
# mode.
def guide_stream_static_join(spark, bootstrap: str, topic: str, types_path: str, maxOffsetsPerTrigger: int):
    staticDf = spark.read.parquet(types_path)
    streamingDf = _guide_stream(spark, bootstrap, topic, "id LONG, type STRING, amount INT", maxOffsetsPerTrigger)

    joined = streamingDf.join(staticDf, "type", "left_outer")  # left outer join with a static DF

    return joined, "append"
