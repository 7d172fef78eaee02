"""Static tables read from their files, against Spark itself as the oracle.

For each shape of table, Spark (or pyarrow, or a hand-written file) writes it, Spark reads it
back, and ``read_table`` given the location and columns of that read's analyzed plan (what
capture logs) must return exactly Spark's rows.
"""

from __future__ import annotations

import gzip
import math
import os
import re
import shutil
from datetime import date, datetime, timezone
from decimal import Decimal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import Row

from headwater.spark.table_files import TableUnreadable, local_path, read_table, table_version

TYPED_SCHEMA = ("id bigint, name string, amount decimal(15,2), day date, ts timestamp, ok boolean, "
                "ratio double, small int")
TYPED_ROWS = [
    (1, "plain", Decimal("12.50"), date(2026, 1, 1), datetime(2026, 1, 1, 12, 0, 0, 123456), True, 0.5, 7),
    (2, 'quote " semicolon ; comma , back \\ slash', Decimal("-0.01"), date(1999, 12, 31),
     datetime(1999, 12, 31, 23, 59, 59), False, -1e10, None),
    (3, "", None, None, None, None, None, -3),
    (4, None, Decimal("9999999999999.99"), date(2026, 6, 15), datetime(2026, 6, 15), True, math.nan, 0),
    (5, "ünïcode", Decimal("0.00"), date(2000, 2, 29), datetime(2000, 2, 29, 1, 2, 3), False, 1.25, 2147483647),
]


def relation(df) -> tuple[dict, list[tuple[str, str]]]:
    """The location and columns capture logs for a batch read: from its analyzed plan's
    ``LogicalRelation`` over a ``HadoopFsRelation``."""
    plan = df._jdf.queryExecution().analyzed()
    fs_relation = plan.relation()
    roots = fs_relation.location().rootPaths()
    options = df.sparkSession._jvm.scala.jdk.javaapi.CollectionConverters.asJava(fs_relation.options())
    output = plan.output()
    location = {"paths": [roots.apply(i).toString() for i in range(roots.size())],
                "format": fs_relation.fileFormat().toString().lower(),
                "options": dict(options)}
    columns = [(output.apply(i).name(), output.apply(i).dataType().simpleString()) for i in range(output.size())]
    return location, columns


def _plain(value, spark_side: bool):
    """A value as a comparable plain Python value: NaN equal to NaN, timestamps as PySpark
    collects them (naive, local time), structs and arrays as tuples, maps as sorted items."""
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone().replace(tzinfo=None)
    if isinstance(value, Row):
        return tuple(_plain(v, spark_side) for v in value)
    if isinstance(value, dict):  # a map from Spark, a struct from Arrow
        if spark_side:
            return tuple(sorted(((k, _plain(v, spark_side)) for k, v in value.items()), key=repr))
        return tuple(_plain(v, spark_side) for v in value.values())
    if isinstance(value, list):
        if not spark_side and value and all(isinstance(x, tuple) for x in value):  # an Arrow map's entries
            return tuple(sorted(((k, _plain(v, spark_side)) for k, v in value), key=repr))
        return tuple(_plain(v, spark_side) for v in value)
    if isinstance(value, bytearray):
        return bytes(value)
    return value


def spark_rows(df) -> list[tuple]:
    return sorted((tuple(_plain(v, True) for v in row) for row in df.collect()), key=repr)


def our_rows(table: pa.Table) -> list[tuple]:
    return sorted((tuple(_plain(v, False) for v in row.values()) for row in table.to_pylist()), key=repr)


def assert_reads_as_spark(df, best_effort: bool = False) -> pa.Table:
    """``read_table`` of the DataFrame's location and columns returns Spark's rows, with Spark's
    column names; with ``best_effort``, also without the columns."""
    location, columns = relation(df)
    table = read_table(location, columns)
    assert table.column_names == df.columns
    expected = spark_rows(df)
    assert our_rows(table) == expected
    if best_effort:
        guessed = read_table(location)
        assert guessed.column_names == df.columns
        assert our_rows(guessed) == expected
    return table


def typed_df(spark):
    return spark.createDataFrame(TYPED_ROWS, TYPED_SCHEMA)


def test_single_parquet_file_written_by_pyarrow(spark, tmp_path):
    path = tmp_path / "sites.parquet"
    pq.write_table(pa.table({
        "site": pa.array([1, 2, None], pa.int64()),
        "name": ["north", None, "süd"],
        "opened": pa.array([datetime(2026, 1, 1, 8, tzinfo=timezone.utc), None,
                            datetime(1900, 5, 6, 7, 8, 9, 10, tzinfo=timezone.utc)], pa.timestamp("us", tz="UTC")),
        "local": pa.array([datetime(2026, 1, 1, 8), None, datetime(2026, 3, 1)], pa.timestamp("us")),
        "area": pa.array([Decimal("1.250"), Decimal("-3.000"), None], pa.decimal128(7, 3)),
        "tags": pa.array([[1, 2], [], None], pa.list_(pa.int32())),
        "owner": pa.array([{"id": 1, "who": "a"}, None, {"id": None, "who": "c"}],
                          pa.struct([("id", pa.int64()), ("who", pa.string())])),
        "limits": pa.array([[("a", 1)], None, [("b", 2), ("c", None)]], pa.map_(pa.string(), pa.int32())),
    }), path)
    df = spark.read.parquet(str(path))
    table = assert_reads_as_spark(df, best_effort=True)
    assert table.schema.field("opened").type == pa.timestamp("us", tz="UTC")
    assert relation(df)[0]["paths"] == [f"file:{path}"]


def test_spark_parquet_folder_of_part_files(spark, tmp_path):
    path = tmp_path / "typed"
    typed_df(spark).repartition(3).write.parquet(str(path))
    names = os.listdir(path)
    assert "_SUCCESS" in names and any(n.endswith(".crc") for n in names)
    assert sum(n.startswith("part-") for n in names) >= 3
    # Files Spark leaves out: a marker-like name and a hidden one, both holding real rows.
    extra = pa.table({"id": pa.array([99], pa.int64())})
    pq.write_table(extra, path / "_stray.parquet")
    pq.write_table(extra, path / ".hidden.parquet")
    df = spark.read.parquet(str(path))
    table = assert_reads_as_spark(df, best_effort=True)
    assert dict(zip(table.column_names, table.schema.types)) == {
        "id": pa.int64(), "name": pa.string(), "amount": pa.decimal128(15, 2), "day": pa.date32(),
        "ts": pa.timestamp("us", tz="UTC"), "ok": pa.bool_(), "ratio": pa.float64(), "small": pa.int32()}


def test_partitioned_folder(spark, tmp_path):
    path = tmp_path / "by_year_region"
    rows = [(i, i * 1.5, 2025 + i % 2, ["eu", "us/west:1 %", None][i % 3]) for i in range(12)]
    spark.createDataFrame(rows, "id bigint, v double, year int, region string") \
        .write.partitionBy("year", "region").parquet(str(path))
    assert os.path.isdir(path / "year=2026" / "region=__HIVE_DEFAULT_PARTITION__")
    df = spark.read.parquet(str(path))
    assert relation(df)[1] == [("id", "bigint"), ("v", "double"), ("year", "int"), ("region", "string")]
    table = assert_reads_as_spark(df, best_effort=True)
    assert table.schema.field("year").type == pa.int32()
    assert None in table.column("region").to_pylist()
    # One partition folder read as its own table, its partitions found from basePath.
    assert_reads_as_spark(spark.read.option("basePath", str(path)).parquet(str(path / "year=2026")))


def test_csv_with_header_sep_and_inferred_schema(spark, tmp_path):
    path = tmp_path / "typed.csv"
    typed_df(spark).repartition(2).write.option("header", True).option("sep", ";").csv(str(path))
    df = spark.read.option("header", True).option("sep", ";").option("inferSchema", True).csv(str(path))
    location, columns = relation(df)
    assert location["format"] == "csv"
    assert {"header": "true", "sep": ";", "inferschema": "true"}.items() <= location["options"].items()
    assert {t for _, t in columns} >= {"int", "double", "date", "timestamp", "boolean"}
    assert_reads_as_spark(df)
    assert_reads_as_spark(spark.read.schema(TYPED_SCHEMA).option("header", True).option("sep", ";").csv(str(path)))


def test_csv_without_header(spark, tmp_path):
    path = tmp_path / "plain.csv"
    typed_df(spark).write.csv(str(path))
    df = spark.read.csv(str(path))
    assert df.columns[:2] == ["_c0", "_c1"]
    assert_reads_as_spark(df, best_effort=True)


CSV_EDGES = (
    'a,"",,x\n'
    '"q\\"uote","dbl""q",C:\\path\\x, sp \n'
    '"unterminated,b,c,d\n'
    '\n'
    '   \n'
    '1,2\n'
    '1,2,3,4,5\n'
    '"a"b,c,"d" ,e\n'
    'x,\\"y\\",z\r\n'
    '"a\\\\b","C:\\path","x\\"",y\r'
    'NULL,"",,"NULL"\n'
    ' "lead",trail ,"q" x,"\\\\"\n'
    '"multi\nline",b,c,d\n'
    '#c,1,2,3\n'
    'last,row,no,newline'
)
CSV_VALUES = (
    "i,d,dec,dt,ts,b\n"
    "1,1.5,1.005,2026-01-02,2026-01-02T03:04:05.123456Z,true\n"
    " 2,1e3,12345678901234,2026-1-2,2026-01-02 03:04,TRUE\n"
    "+3,NaN,-1.5,2026-01-02T10:00,2026-01-02,False\n"
    "x,Inf,1.2.3,bad,2026-01-02T03:04:05+02:00,yes\n"
    "2147483648,-Inf,,2026,2026-01-02 03:04:05 UTC,\n"
    "4, 5.5 ,1,2026-01,2026-01-02T03:04:05.1234567,t\n"
    "5,Infinity,1_0,2026-01-02 x,2026-01-02T03:04:05 America/Los_Angeles,1\n"
    "-6,-0.0,\"1,234.5\",0001-01-01,1970-01-01T00:00:00-08:00,false\n"
)


def test_csv_quoting_nulls_and_values_as_spark_parses_them(spark, tmp_path):
    edges = tmp_path / "edges.csv"
    edges.write_text(CSV_EDGES)
    for options in ({}, {"nullValue": "NULL"}, {"escape": '"'}, {"multiLine": "true"},
                    {"comment": "#", "ignoreLeadingWhiteSpace": "true", "ignoreTrailingWhiteSpace": "true"},
                    {"mode": "DROPMALFORMED"}):
        df = spark.read.schema("a string, b string, c string, d string").options(**options).csv(str(edges))
        assert_reads_as_spark(df)
    values = tmp_path / "values.csv"
    values.write_text(CSV_VALUES)
    df = spark.read.schema("i int, d double, dec decimal(5,2), dt date, ts timestamp, b boolean") \
        .option("header", True).csv(str(values))
    assert_reads_as_spark(df)
    # With multiLine, univocity keeps to the first line's ending: the others are values' text.
    for name, data in {"crlf": b'a,b\r\n"x\r\ny",z\r\n\r\n  \r\n"p\nq",1\r\nlast,"r\rs"\r\n',
                       "lf": b'a,b\n"x\r\ny",z\n\n  \nlast,"r\rs"\n  x,1\n',
                       "cr": b'a,b\r"x\r\ny",z\rlast,"r\ns"\r'}.items():
        (tmp_path / f"{name}.csv").write_bytes(data)
        assert_reads_as_spark(spark.read.schema("a string, b string").option("multiLine", True)
                              .csv(str(tmp_path / f"{name}.csv")))
    assert_reads_as_spark(spark.read.schema("a string, b string").option("lineSep", ";").csv(str(tmp_path / "lf.csv")))
    assert_reads_as_spark(spark.read.schema("i int, d double, dec decimal(5,2), dt date, ts timestamp, b boolean")
                          .options(header=True, timeZone="Asia/Kolkata").csv(str(values)))
    odd = tmp_path / "odd.csv"
    odd.write_text("a||b||,||c\n1||'x||y'||\n''||'it''s'||z\n")
    assert_reads_as_spark(spark.read.options(sep="||", quote="'", escape="'", header="true").csv(str(odd)),
                          best_effort=True)


JSON_EDGES = (
    '{"i": 1, "d": 1.50, "s": 1.50, "dec": "2.345", "dt": "2026-01-02", "ts": 1700000000, "b": "true", '
    '"n": {"x": [1, 2.0]}}\n'
    '{"i": 1.0, "d": "NaN", "s": true, "dec": 2.345, "dt": "2026-1-2", "ts": "2026-01-02 03:04", "b": true, '
    '"n": null}\n'
    '{"i": "5", "d": "Infinity", "s": {"b": 1, "a": "x"}, "dec": 1e2, "dt": 5, "ts": "bad", "b": 1, "n": [1]}\n'
    '[{"i": 7}, {"i": 8}]\n'
    'not json\n'
    '  \n'
    '5\n'
    '{"i": 2147483648, "I": 3, "d": NaN, "s": "x\\u00e9", "unknown": 1}\n'
    "{'i': 9, 's': 'it\\'s \"q\"'}\r\n"
    '{"i": -4, "d": -Infinity, "s": "\\"esc\\"\\n", "dec": -0.005}'
)


def test_json_lines(spark, tmp_path):
    path = tmp_path / "typed.json"
    typed_df(spark).repartition(2).write.json(str(path))
    df = spark.read.json(str(path))
    assert relation(df)[0]["format"] == "json"
    assert_reads_as_spark(df, best_effort=True)
    assert_reads_as_spark(spark.read.schema(TYPED_SCHEMA).json(str(path)))
    edges = tmp_path / "edges.json"
    edges.write_text(JSON_EDGES)
    schema = "i int, d double, s string, dec decimal(5,2), dt date, ts timestamp, b boolean, n string"
    assert_reads_as_spark(spark.read.schema(schema).json(str(edges)))
    assert_reads_as_spark(spark.read.schema(schema).option("mode", "DROPMALFORMED").json(str(edges)))


def test_json_nested_and_multiline(spark, tmp_path):
    path = tmp_path / "nested.json"
    path.write_text('{"id": 1, "tags": [1, 2], "owner": {"who": "a", "since": "2026-01-01"}, '
                    '"limits": {"x": 1.5}}\n'
                    '{"id": 2, "tags": [], "owner": null, "limits": {}}\n'
                    '{"id": 3, "tags": null, "owner": {"who": null}, "limits": {"y": null}}\n')
    schema = "id bigint, tags array<int>, owner struct<who:string,since:date>, limits map<string,double>"
    assert_reads_as_spark(spark.read.schema(schema).json(str(path)))
    many = tmp_path / "many.json"
    many.write_text('[\n  {"id": 1, "name": "a"},\n  {"id": 2,\n   "name": null}\n]\n')
    df = spark.read.option("multiLine", True).json(str(many))
    assert_reads_as_spark(df, best_effort=True)


def test_text(spark, tmp_path):
    path = tmp_path / "names.txt"
    typed_df(spark).select("name").na.fill("-").repartition(2).write.text(str(path))
    assert_reads_as_spark(spark.read.text(str(path)), best_effort=True)
    lines = tmp_path / "lines"
    lines.mkdir()
    (lines / "a.txt").write_bytes(b"x\r\n\r\ny\rz\n\nlast")
    (lines / "b.txt").write_bytes(b"only\n")
    (lines / "empty.txt").write_bytes(b"")
    assert_reads_as_spark(spark.read.text(str(lines)), best_effort=True)
    assert_reads_as_spark(spark.read.text(str(lines), wholetext=True))


def test_compressed_filtered_and_nested_files(spark, tmp_path):
    """Hadoop decompresses by extension; pathGlobFilter and recursiveFileLookup choose the files."""
    root = tmp_path / "drops"
    (root / "day=1" / "late").mkdir(parents=True)
    with gzip.open(root / "day=1" / "a.csv.gz", "wt") as f:
        f.write("1,one\n2,two\n")
    (root / "day=1" / "late" / "b.csv").write_text("3,three\n")
    (root / "day=1" / "notes.txt").write_text("4,four\n")
    assert_reads_as_spark(spark.read.schema("id int, name string, day int").csv(str(root)))
    assert_reads_as_spark(spark.read.option("pathGlobFilter", "*.csv*").csv(str(root)), best_effort=True)
    assert_reads_as_spark(spark.read.option("recursiveFileLookup", True).csv(str(root)), best_effort=True)


def test_orc(spark, tmp_path):
    path = tmp_path / "typed.orc"
    typed_df(spark).repartition(2).write.orc(str(path))
    df = spark.read.orc(str(path))
    assert relation(df)[0]["format"] == "orc"
    assert_reads_as_spark(df, best_effort=True)
    local = tmp_path / "local.orc"
    typed_df(spark).selectExpr("id", "cast(ts as timestamp_ntz) as wall").write.orc(str(local))
    assert_reads_as_spark(spark.read.orc(str(local)), best_effort=True)


def test_several_root_paths_are_their_union(spark, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    typed_df(spark).where("id < 3").write.parquet(str(first))
    typed_df(spark).write.parquet(str(second))
    df = spark.read.parquet(str(first), str(second))
    assert len(relation(df)[0]["paths"]) == 2
    table = assert_reads_as_spark(df)
    assert table.column("id").to_pylist()[:2] == [1, 2]  # the first root's rows first


def test_folder_a_stream_wrote_is_what_its_log_committed(spark, tmp_path):
    incoming, out = tmp_path / "in", tmp_path / "out"
    incoming.mkdir()
    for n in range(2):
        (incoming / f"f{n}.json").write_text("".join(f'{{"id": {n * 10 + i}, "name": "r{i}"}}\n' for i in range(3)))
    query = (spark.readStream.schema("id bigint, name string").json(str(incoming)).writeStream
             .format("parquet").option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True)
             .start(str(out)))
    query.awaitTermination(120)
    assert query.exception() is None
    assert os.path.isdir(out / "_spark_metadata")
    committed = table_version({"paths": [f"file:{out}"], "format": "parquet"})
    # A file a failed batch left behind: in the folder, not in the log, so not in the table.
    part = next(n for n in sorted(os.listdir(out)) if n.startswith("part-"))
    shutil.copy(out / part, out / "part-99999-left-behind.snappy.parquet")
    assert_reads_as_spark(spark.read.parquet(str(out)), best_effort=True)
    assert table_version({"paths": [f"file:{out}"], "format": "parquet"}) == committed
    assert len(committed["files"]) >= 1 and all("left-behind" not in f[0] for f in committed["files"])


def test_table_version_follows_the_files(spark, tmp_path):
    path = tmp_path / "versioned"
    typed_df(spark).repartition(2).write.parquet(str(path))
    location = {"paths": [f"file://{path}"], "format": "parquet"}
    first = table_version(location)
    parts = sorted(str(path / n) for n in os.listdir(path) if n.startswith("part-"))
    assert [f[0] for f in first["files"]] == parts  # no _SUCCESS, no .crc
    assert [f[1] for f in first["files"]] == [os.path.getsize(p) for p in parts]
    assert len(first["digest"]) == 16 and int(first["digest"], 16) >= 0
    assert table_version(location) == first

    stat = os.stat(parts[0])
    os.utime(parts[0], ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # rewritten: same bytes, later
    touched = table_version(location)
    assert touched["digest"] != first["digest"]

    shutil.copy(parts[0], path / "part-99999-added.snappy.parquet")
    added = table_version(location)
    assert added["digest"] != touched["digest"] and len(added["files"]) == len(parts) + 1
    (path / "_SUCCESS").write_text("not data")
    assert table_version(location) == added

    os.remove(path / "part-99999-added.snappy.parquet")
    assert table_version(location) == touched


def test_errors_name_the_path(tmp_path):
    missing = tmp_path / "nowhere"
    for call in (lambda loc: read_table(loc), table_version):
        with pytest.raises(TableUnreadable, match=re.escape(str(missing))):
            call({"paths": [f"file:{missing}"], "format": "parquet"})
        with pytest.raises(TableUnreadable, match="s3a://bucket/sites.*s3a"):
            call({"paths": ["s3a://bucket/sites"], "format": "parquet"})
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"not parquet at all")
    with pytest.raises(TableUnreadable, match=re.escape(str(broken))):
        read_table({"paths": [str(broken)], "format": "parquet"}, [("id", "bigint")])
    with pytest.raises(TableUnreadable, match="avro"):
        read_table({"paths": [str(broken)], "format": "avro"})
    with pytest.raises(TableUnreadable, match="interval"):
        read_table({"paths": [str(broken)], "format": "parquet"}, [("id", "interval day")])


def test_local_path():
    assert local_path("file:/tmp/x/sites.parquet") == "/tmp/x/sites.parquet"
    assert local_path("file:///tmp/x") == "/tmp/x"
    assert local_path("file://localhost/tmp/x") == "/tmp/x"
    assert local_path("/tmp/x") == "/tmp/x"
    for remote in ("s3a://bucket/x", "hdfs://namenode/x", "file://otherhost/x"):
        with pytest.raises(TableUnreadable, match=remote):
            local_path(remote)
