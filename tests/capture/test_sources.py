"""File and rate stream sources: rids from (path, position) and from the rate value.

Files arrive one per micro-batch; each output row must trace back exactly to its file
row (Parquet: by position; JSON, which has no positions in Spark: by path and content)
and to the dims row it joined, and forward from a file row to exactly its outputs.
"""

from __future__ import annotations

import json
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F

from headwater.adapters.spark_lines import recent_progress
from headwater.capture import attach
from headwater.core.rid import file_rid
from headwater.query.api import LineageClient
from tests import pipelines
from tests.conftest import index, own_topics, stop_when_idle
from tests.oracle import as_input

FILES = 3
ROWS_PER_FILE = 25


def file_rows(number: int) -> list[dict]:
    return [{"id": number * 100 + i, "k": (i * 7 + number) % 13, "v": (i * 11 + number) % 17 - 6}
            for i in range(ROWS_PER_FILE)]


@pytest.mark.parametrize("file_format", ["parquet", "json"])
def test_file_source_lineage_by_path_and_position(spark, stack_config, tmp_path, file_format):
    config, tag = own_topics(stack_config, "src")
    folder = tmp_path / "in"
    folder.mkdir()
    for number in range(FILES):
        name = folder / f"part-{number}.{file_format}"
        if file_format == "parquet":
            pq.write_table(pa.Table.from_pylist(file_rows(number)), name)
        else:
            name.write_text("".join(json.dumps(r) + "\n" for r in file_rows(number)))
    pq.write_table(pa.Table.from_pylist(pipelines.dims()), tmp_path / "dims.parquet")
    dims = spark.read.parquet(str(tmp_path / "dims.parquet"))

    source = spark.readStream.schema("id long, k long, v long").option("maxFilesPerTrigger", 1) \
        .format(file_format).load(str(folder))
    df = source.where("v > 0").withColumn("v2", F.col("v") * 2).join(dims, "k", "left").select("id", "v2", "name")
    tracer = attach(spark, config)
    try:
        query = (tracer.trace(df, name=f"files-{tag}", keys={"dims": "k"}).writeStream.format("parquet")
                 .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True)
                 .start(str(tmp_path / "sink")))
        query.awaitTermination(180)
        assert query.exception() is None, query.exception()
    finally:
        tracer.close()
    assert sum(1 for p in recent_progress(query) if p.numInputRows) == FILES
    index(config)

    expected = {}
    for number in range(FILES):
        for position, row in enumerate(file_rows(number)):
            if row["v"] > 0:
                lineage = {("file", f"part-{number}.{file_format}", position if file_format == "parquet" else None)}
                if row["k"] in pipelines.DIM_KEYS:
                    lineage.add(("table", "dims", str(row["k"])))
                expected[row["id"]] = lineage
    got = spark.read.parquet(str(tmp_path / "sink")).collect()
    assert sorted(r.id for r in got) == sorted(expected)
    with LineageClient(config) as client:
        for row in got:
            found = client.backward(row._hw_rid, payload=True)
            assert {as_input(x) for x in found} == expected[row.id], row.id
            assert all(x.exact for x in found)
            (file_item,) = [x for x in found if x.path]
            # The file's row: by position in Parquet; in JSON, found by the rid of its content.
            assert file_item.payload == next(r for n in range(FILES) for r in file_rows(n) if r["id"] == row.id)
            assert [x.rid for x in client.forward(file_item.rid)] == [row._hw_rid]
            if file_format == "parquet":
                assert file_rid(file_item.path, file_item.position) == file_item.rid


def test_rate_source_lineage_by_value(spark, stack_config, tmp_path):
    config, tag = own_topics(stack_config, "src")
    df = (spark.readStream.format("rate").option("rowsPerSecond", 40).option("numPartitions", 1).load()
          .where("value % 3 = 0").select("value", (F.col("value") * 2).alias("double")))
    tracer = attach(spark, config)
    try:
        query = (tracer.trace(df, name=f"rate-{tag}").writeStream.format("parquet")
                 .option("checkpointLocation", str(tmp_path / "cp")).trigger(processingTime="1 second")
                 .start(str(tmp_path / "sink")))
        deadline = time.monotonic() + 60
        while sum(p.numInputRows for p in recent_progress(query)) < 60 and time.monotonic() < deadline:
            time.sleep(0.2)
        stop_when_idle(query)
    finally:
        tracer.close()
    index(config)
    got = spark.read.parquet(str(tmp_path / "sink")).collect()
    assert len(got) >= 20 and all(r.value % 3 == 0 and r.double == 2 * r.value for r in got)
    with LineageClient(config) as client:
        for row in got:
            found = client.backward(row._hw_rid, payload=True)
            assert [as_input(x) for x in found] == [("rate", row.value)]
            assert found[0].payload == {"value": row.value}
