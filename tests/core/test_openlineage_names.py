"""OpenLineage without Spark: datasets named as its naming spec and its Spark agent name them (and back from the URI
they form), when events are sent, how runs are named, what a run counts between events."""

import pytest

from headwater.capture.openlineage import Coverage, _offsets_read, run_id, wanted
from headwater.core.config import Config
from headwater.core.openlineage import DatasetName, catalog_table, kafka, location, parse


@pytest.mark.parametrize("bootstrap, namespace", [
    ("127.0.0.1:9092", "kafka://127.0.0.1:9092"),
    ("b1.prod:9093,b2.prod:9093", "kafka://b1.prod:9093"),  # the first broker, as the agent names it
    ("SASL_SSL://b1.prod:9094,SASL_SSL://b2.prod:9094", "kafka://b1.prod:9094"),
    (" b1:9092 , b2:9092", "kafka://b1:9092"),
])
def test_a_kafka_topic_is_named_by_its_first_broker(bootstrap, namespace):
    assert kafka(bootstrap, "orders") == DatasetName(namespace, "orders")
    assert parse(kafka(bootstrap, "orders").uri) == DatasetName(namespace, "orders")


@pytest.mark.parametrize("path, name, uri", [
    ("file:/data/out", DatasetName("file", "/data/out"), "file:/data/out"),
    ("file:///data/out/", DatasetName("file", "/data/out"), "file:/data/out"),
    ("/data/customers.parquet", DatasetName("file", "/data/customers.parquet"), "file:/data/customers.parquet"),
    ("s3a://bucket/lake/out/", DatasetName("s3://bucket", "lake/out"), "s3://bucket/lake/out"),
    ("s3://bucket/out", DatasetName("s3://bucket", "out"), "s3://bucket/out"),
    ("gs://bucket/out", DatasetName("gs://bucket", "out"), "gs://bucket/out"),
    ("abfs://box@acct.dfs.core.windows.net/out", DatasetName("abfss://box@acct.dfs.core.windows.net", "out"),
     "abfss://box@acct.dfs.core.windows.net/out"),
    ("hdfs://nn:8020/data/out", DatasetName("hdfs://nn:8020", "/data/out"), "hdfs://nn:8020/data/out"),
])
def test_files_are_named_by_their_file_system_and_path(path, name, uri):
    assert location(path) == name
    assert name.uri == uri
    assert parse(uri) == name


def test_a_catalog_table_without_a_location_is_named_by_its_catalog_or_metastore():
    assert catalog_table("spark_catalog.prod.customers") == DatasetName("spark_catalog", "prod.customers")
    assert catalog_table("prod.customers") == DatasetName("spark_catalog", "prod.customers")
    assert catalog_table("lake.prod.customers", "thrift://ms:9083") == DatasetName("lake", "prod.customers")
    hive = catalog_table("spark_catalog.prod.customers", "thrift://ms:9083,thrift://ms2:9083")
    assert hive == DatasetName("hive://ms:9083", "prod.customers") and parse(hive.uri) == hive


@pytest.mark.parametrize("text", ["kafka:orders", "table:customers:17", "orders", "file:relative/path", "parquet:"])
def test_headwater_s_own_names_are_not_openlineage_uris(text):
    assert parse(text) is None


def test_events_are_sent_where_the_client_is_configured_or_asked(monkeypatch, tmp_path):
    for name in ("OPENLINEAGE_URL", "OPENLINEAGE_CONFIG", "OPENLINEAGE_DISABLED", "OPENLINEAGE__TRANSPORT__TYPE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert not wanted(Config()) and wanted(Config(openlineage="on")) and not wanted(Config(openlineage="off"))
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__TYPE", "console")
    assert wanted(Config())
    monkeypatch.delenv("OPENLINEAGE__TRANSPORT__TYPE")
    (tmp_path / "openlineage.yml").write_text("transport:\n  type: console\n")
    assert wanted(Config()) and not wanted(Config(openlineage="off"))
    monkeypatch.setenv("OPENLINEAGE_DISABLED", "true")  # the client's own switch, which it honours too
    assert not wanted(Config()) and not wanted(Config(openlineage="on"))
    with pytest.raises(ValueError, match="openlineage='yes'"):
        Config(openlineage="yes")


def test_a_run_is_named_by_the_query_its_plan_and_the_batch_the_plan_first_ran():
    assert run_id("q-1", "abc", 0) == run_id("q-1", "abc", 0)
    assert len({run_id("q-1", "abc", 0), run_id("q-1", "abd", 0), run_id("q-1", "abc", 5), run_id("q-2", "abc", 0),
                run_id("q-1", "abc", None)}) == 5


def test_the_rows_read_between_two_offsets_per_topic_and_a_batch_s_coverage():
    start = {"a": {"0": 5, "1": 7}, "b": {"0": 0}}
    end = {"a": {"0": 9, "1": 7, "2": 3}, "b": {"0": 10}}
    assert _offsets_read(start, end) == {"a": 4, "b": 10}  # a new partition has no start: none counted
    assert _offsets_read(None, end) == {"a": 0, "b": 0}
    coverage = Coverage()
    for batch, status in ((4, "full"), (3, "sampled"), (5, "log-only"), (6, "lost?")):
        coverage.batch({"batch": batch, "status": status, "rows_out": 2, "edges": 3})
    assert coverage.statuses == {"full": 1, "sampled": 1, "log-only": 1, "failed": 1}
    assert (coverage.first, coverage.last, coverage.rows_out, coverage.edges, coverage.batches) == (3, 6, 8, 12, 4)


def test_a_configuration_the_client_refuses_leaves_events_off_and_says_why(monkeypatch, tmp_path, caplog):
    from headwater.capture.openlineage import OpenLineageEvents

    bad = tmp_path / "openlineage.yml"
    bad.write_text("transport:\n  type: nonsense\n")
    monkeypatch.setenv("OPENLINEAGE_CONFIG", str(bad))
    with caplog.at_level("ERROR", logger="headwater.capture"):
        assert OpenLineageEvents.start(spark=None, config=Config()) is None
    assert "OpenLineage events are off" in caplog.text
