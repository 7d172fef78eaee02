"""The progress listener's own logic; its work on a live stream is checked end to end
(``test_end_to_end.py::test_batch_log_records_the_offsets_each_batch_read``)."""

from types import SimpleNamespace

from headwater.capture.listener import ProgressListener, progress_record
from headwater.core.schema import LOG_PROGRESS


def progress(name="spark-name", batch=3):
    source = SimpleNamespace(description="kafka", startOffset='{"t:0": 5}', endOffset='{"t:0": 9}', numInputRows=4)
    return SimpleNamespace(name=name, batchId=batch, runId="r-1", numInputRows=4,
                           durationMs={"triggerExecution": 12}, sources=[source], timestamp="2026-11-22T00:00:00Z")


def test_progress_record_names_the_traced_query_and_parses_offsets():
    record = progress_record(progress(), "orders")
    assert record["query"] == "orders" and record["batch"] == 3 and record["rows_in"] == 4
    assert record["sources"] == [{"description": "kafka", "start": {"t:0": 5}, "end": {"t:0": 9}, "rows_in": 4}]
    first = progress()
    first.sources[0].startOffset = "None"
    assert progress_record(first, "orders")["sources"][0]["start"] is None


def test_listener_publishes_traced_queries_only_and_never_raises():
    published = []
    listener = ProgressListener({"spark-name": "orders"}.get, lambda schema, **f: published.append((schema, f)))
    listener.onQueryProgress(SimpleNamespace(progress=progress()))
    listener.onQueryProgress(SimpleNamespace(progress=progress(name="someone-elses")))
    assert [(s, f["query"], f["batch"]) for s, f in published] == [(LOG_PROGRESS, "orders", 3)]

    def broker_down(schema, **fields):
        raise ConnectionError("broker away")

    ProgressListener({"spark-name": "orders"}.get, broker_down).onQueryProgress(SimpleNamespace(progress=progress()))
