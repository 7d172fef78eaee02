"""The progress listener: Spark's progress of traced queries, heard in the JVM (Progress.java) on the real
session's listener bus, published as progress records; its work inside a traced stream is checked end to end
(``test_end_to_end.py::test_batch_log_records_the_offsets_each_batch_read``)."""

import json

from headwater.adapters.spark_lines import recent_progress
from headwater.capture import jar
from headwater.capture.listener import ProgressListener, progress_record
from headwater.core.schema import LOG_PROGRESS


def progress(name="spark-name", batch=3, start=None, end=None):
    """A progress as Spark's ``StreamingQueryProgress.json`` gives it (the fields a record reads)."""
    source = {"description": "kafka", "startOffset": {"t": {"0": 5}} if start is None else start,
              "endOffset": {"t": {"0": 9}} if end is None else end, "latestOffset": None, "numInputRows": 4}
    return {"id": "i-1", "runId": "r-1", "name": name, "timestamp": "2026-11-22T00:00:00.000Z", "batchId": batch,
            "numInputRows": 4, "durationMs": {"triggerExecution": 12}, "sources": [source]}


def test_progress_record_names_the_traced_query_and_keeps_offsets():
    record = progress_record(progress(), "orders")
    assert record["query"] == "orders" and record["batch"] == 3 and record["rows_in"] == 4
    assert record["run_id"] == "r-1" and record["durations_ms"] == {"triggerExecution": 12}
    assert record["at"] == "2026-11-22T00:00:00.000Z"
    assert record["sources"] == [{"description": "kafka", "start": {"t": {"0": 5}}, "end": {"t": {"0": 9}},
                                  "rows_in": 4}]
    # A first batch has no start; offsets Spark could not parse as JSON are its text.
    first = progress()
    first["sources"][0]["startOffset"] = None
    assert progress_record(first, "orders")["sources"][0]["start"] is None
    for text in ("None", "null"):
        assert progress_record(progress(start=text), "orders")["sources"][0]["start"] is None
    assert progress_record(progress(end="not json"), "orders")["sources"][0]["end"] == {"raw": "not json"}
    assert progress_record(progress(end='{"t": 1}'), "orders")["sources"][0]["end"] == {"t": 1}
    assert progress_record(progress(end=7), "orders")["sources"][0]["end"] == 7


def test_only_watched_queries_are_published_and_a_failing_publish_loses_only_its_record(spark, tmp_path):
    published, calls = [], []

    def publish(schema, **fields):
        calls.append(fields["batch"])
        if len(calls) == 1:
            raise ConnectionError("broker away")  # the first record is lost; the listener goes on
        published.append((schema, fields))

    listener = ProgressListener(spark, jar.Journals(spark, str(tmp_path / "spill"), 1 << 20).progress(),
                                {"watched-query": "orders"}.get, publish)
    try:
        listener.watch("watched-query")
        for name in ("watched-query", "someone-elses"):
            query = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 7).load()
                     .writeStream.format("noop").queryName(name).trigger(processingTime="100 milliseconds")
                     .option("checkpointLocation", str(tmp_path / name)).start())
            try:
                while len([p for p in recent_progress(query) if p.numInputRows]) < 3:
                    query.awaitTermination(0.1)
            finally:
                query.stop()
            if name == "watched-query":
                spark_progress = [json.loads(p.json) for p in recent_progress(query)]
    finally:
        listener.close()
    assert calls[0] == 0 and calls == sorted(calls) and len(calls) == len(spark_progress)
    assert [fields for _, fields in published] == [progress_record(p, "orders") for p in spark_progress[1:]]
    assert {schema for schema, _ in published} == {LOG_PROGRESS}
    batch = [fields for _, fields in published if fields["rows_in"]][0]
    assert batch["rows_in"] == 7 and batch["sources"][0]["end"] is not None


def test_a_closed_listener_hears_nothing_more(spark, tmp_path):
    published = []
    listener = ProgressListener(spark, jar.Journals(spark, str(tmp_path / "spill"), 1 << 20).progress(),
                                {"late-query": "orders"}.get, lambda schema, **fields: published.append(fields))
    listener.watch("late-query")
    listener.close()
    query = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 3).load()
             .writeStream.format("noop").queryName("late-query").trigger(availableNow=True)
             .option("checkpointLocation", str(tmp_path / "cp")).start())
    query.awaitTermination(60)
    spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(10_000)
    listener.handle("")
    assert published == []
