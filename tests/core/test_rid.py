import datetime
import decimal
import random
import string
import struct

import pytest

from headwater.core import rid
from headwater.core.rid import (
    Int,
    UnhashableType,
    kafka_offset,
    kafka_rid,
    kafka_rids,
    spark_xxhash64,
    table_rid,
    table_row_rid,
    xxh64,
)


@pytest.mark.parametrize(
    "data, expected",
    [
        (b"", 0xEF46DB3751D8E999),
        (b"a", 0xD24EC4F1A98C6E5B),
        (b"abc", 0x44BC2CF5AD770999),
        (b"Nobody inspects the spammish repetition", 0xFBCEA83C8A378BF1),
    ],
)
def test_xxh64_matches_the_reference_vectors(data, expected):
    assert xxh64(data, 0) == expected


def test_rids_are_signed_64_bit_and_namespaced():
    r = kafka_rid("orders", 0, 0)
    assert -(1 << 63) <= r < 1 << 63
    assert r == kafka_rid("orders", 0, 0)
    assert r != kafka_rid("orders", 1, 0) != kafka_rid("orders", 0, 1)
    assert table_rid("customers", "0") != spark_xxhash64(rid.KAFKA, "customers", "0")


def test_a_kafka_rid_gives_back_its_offset():
    rng = random.Random(5)
    for _ in range(2000):
        topic = "".join(rng.choice(string.ascii_letters + "-._") for _ in range(rng.randint(1, 40)))
        partition = rng.randint(0, 999)
        offset = rng.choice([rng.randint(0, 10**9), rng.randint(-(1 << 63), (1 << 63) - 1)])
        assert kafka_offset(kafka_rid(topic, partition, offset), topic, partition) == offset
    # A rid of another partition maps to some offset, not to the record's.
    assert kafka_offset(kafka_rid("orders", 0, 17), "orders", 1) != 17


def test_kafka_rids_vectorised_equal_each_kafka_rid():
    rng = random.Random(8)
    for topic, partition in (("orders", 0), ("orders", 7), ("é-topic.x", 999)):
        offsets = [0, 1, (1 << 63) - 1, -(1 << 63)] + [rng.randint(0, 10**12) for _ in range(500)]
        assert kafka_rids(topic, partition, offsets).tolist() == [kafka_rid(topic, partition, o) for o in offsets]
    assert kafka_rids("orders", 0, []).tolist() == []


def test_python_twin_equals_spark_xxhash64(spark):
    rng = random.Random(3)
    rows = []
    for _ in range(300):
        text = "".join(rng.choice(string.printable + "éß中") for _ in range(rng.randint(0, 80)))
        rows.append((text, rng.randint(-(1 << 31), (1 << 31) - 1), rng.randint(-(1 << 63), (1 << 63) - 1)))
    df = spark.createDataFrame(rows, "s string, i int, l long")
    got = df.selectExpr("s", "i", "l", "xxhash64('kafka', s, i, l) AS h",
                        "xxhash64('table', 'customers', s) AS t").collect()
    for row in got:
        assert row.h == spark_xxhash64("kafka", row.s, Int(row.i), row.l)
        assert row.t == table_rid("customers", row.s)
    composite = spark.sql("SELECT xxhash64('table', 'c', concat_ws('\u001f', '1', 'x')) AS h").first().h
    assert composite == table_rid("c", ("1", "x"))


# One column per type a keyless static table's rid hashes, each with its hard values.
TYPED_COLUMNS = (
    "id long, b boolean, y byte, sh short, i int, l long, f float, d double, s string, bi binary, "
    "dc decimal(15,2), d18 decimal(18,4), d19 decimal(19,4), dw decimal(38,10), dn decimal(20,0), "
    "dt date, ts timestamp, tn timestamp_ntz"
)
_FLOATS = [0.0, -0.0, float("nan"), float("inf"), float("-inf"), 1.5, -2.25, 1e-310, 3.4e38, -1e-45]


def _decimal(rng: random.Random, precision: int, scale: int) -> decimal.Decimal:
    digits = rng.choice([1, precision // 2, precision])
    unscaled = rng.randint(-(10**digits - 1), 10**digits - 1)
    return decimal.Decimal(unscaled).scaleb(-scale)


def _typed_row(rng: random.Random, i: int) -> tuple:
    def when(value):  # NULL in about one value in six
        return None if rng.random() < 0.16 else value
    moment = datetime.datetime(1900, 1, 1) + datetime.timedelta(microseconds=rng.randint(0, 300 * 365 * 86_400 * 10**6))
    return (
        i,
        when(rng.random() < 0.5),
        when(rng.choice([-128, 127, 0, rng.randint(-128, 127)])),
        when(rng.choice([-32768, 32767, rng.randint(-32768, 32767)])),
        when(rng.choice([-(1 << 31), (1 << 31) - 1, rng.randint(-(1 << 31), (1 << 31) - 1)])),
        when(rng.choice([-(1 << 63), (1 << 63) - 1, rng.randint(-(1 << 63), (1 << 63) - 1)])),
        when(rng.choice(_FLOATS[:5] + [struct.unpack("<f", struct.pack("<f", rng.uniform(-1e6, 1e6)))[0]])),
        when(rng.choice(_FLOATS + [rng.uniform(-1e300, 1e300)])),
        when("".join(rng.choice(string.printable + "éß中😀") for _ in range(rng.randint(0, 40)))),
        when(bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 40)))),
        when(_decimal(rng, 15, 2)),
        when(_decimal(rng, 18, 4)),
        when(_decimal(rng, 19, 4)),
        when(_decimal(rng, 38, 10)),
        when(_decimal(rng, 20, 0)),
        when(rng.choice([datetime.date(1970, 1, 1), datetime.date(1969, 12, 31), datetime.date(9999, 12, 31),
                         moment.date()])),
        when(rng.choice([datetime.datetime(1970, 1, 1), datetime.datetime(1969, 12, 31, 23, 59, 59, 999999),
                         moment])),
        when(rng.choice([datetime.datetime(1, 1, 1), datetime.datetime(9999, 12, 31, 23, 59, 59, 999999),
                         moment])),
    )


@pytest.mark.spark
def test_a_keyless_table_rows_rid_equals_sparks_hash_of_its_content(spark, tmp_path):
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import functions as F

    rng = random.Random(11)
    rows = [_typed_row(rng, i) for i in range(400)] + [(400, *[None] * 17)]
    path = str(tmp_path / "typed")
    spark.createDataFrame(rows, TYPED_COLUMNS).write.parquet(path)
    # Odd NaN payloads and -0.0 written by another writer: Spark folds every NaN to Java's one.
    odd = str(tmp_path / "odd.parquet")
    nans = [0x7FF0000000000001, 0xFFF8000000000000, 0x7FFFFFFFFFFFFFFF, 0x8000000000000000]
    pq.write_table(pa.table({
        "id": pa.array(range(len(nans)), pa.int64()),
        "f": pa.array([struct.unpack("<f", struct.pack("<I", b))[0] for b in (0x7F800001, 0xFFC00000, 0x7FFFFFFF,
                                                                              0x80000000)], pa.float32()),
        "d": pa.array([struct.unpack("<d", struct.pack("<Q", b))[0] for b in nans], pa.float64()),
    }), odd)
    for name, where in (("typed", path), ("odd", odd)):
        table = spark.read.parquet(where)
        dtypes = [t for _, t in table.dtypes]
        hashed = table.select("id", F.xxhash64(F.lit(rid.TABLE), F.lit(name), *[F.col(c) for c in table.columns]))
        expected = dict(hashed.collect())
        # As the fallback reads a table back (pyarrow), and as pandas reads it without loss.
        read = pq.read_table(where)
        assert read.column_names == table.columns
        by_arrow = {row["id"]: table_row_rid(name, list(row.values()), dtypes) for row in read.to_pylist()}
        frame = pd.read_parquet(where, dtype_backend="pyarrow")
        by_pandas = {row[0]: table_row_rid(name, list(row), dtypes) for row in frame.itertuples(index=False)}
        assert by_arrow == expected and by_pandas == expected, name


@pytest.mark.parametrize("dtype", ["", "array<int>", "struct<a:int>", "map<string,int>", "interval day to second",
                                   "string collate UTF8_LCASE", "void", "variant"])
def test_a_column_type_without_a_twin_raises_whatever_its_values(dtype):
    for value in (None, 1, [1]):
        with pytest.raises(UnhashableType, match="no rid twin"):
            table_row_rid("t", ["x", value], ["string", dtype])


def test_null_and_nan_in_a_float_column_hash_apart():
    assert table_row_rid("t", [None], ["double"]) == table_row_rid("t", [], []) == spark_xxhash64(rid.TABLE, "t")
    assert table_row_rid("t", [float("nan")], ["double"]) != table_row_rid("t", [None], ["double"])
    assert table_row_rid("t", [float("nan")], ["long"]) == table_row_rid("t", [None], ["long"])  # pandas' NULL
    assert table_row_rid("t", [-0.0], ["float"]) == table_row_rid("t", [0.0], ["float"])


def test_state_node_rids_vectorised_equal_the_scalar_twin_and_spark(spark):
    import numpy as np
    from pyspark.sql import functions as F

    keys = np.array([0, 1, -1, 2**63 - 1, -(2**63), 123456789012345], dtype=np.int64)
    run = rid.run_hash("5519024a-1a4e-4de3-833c-45e289ecae7c")
    vectorised = rid.state_node_rids(keys, run).tolist()
    assert vectorised == [rid.state_node_rid(int(k), run) for k in keys]
    df = spark.createDataFrame([(int(k),) for k in keys], "k long")
    assert [r[0] for r in df.select(F.xxhash64("k", F.lit(run))).collect()] == vectorised


def test_black_box_output_digests_vectorised_equal_the_twin():
    """``box_output_digests_arrow`` (numpy, for the narrowing worker) names every row as the value-by-value twin."""
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(7)
    n = 200
    nulls = rng.random(n) < 0.2
    doubles = rng.normal(size=n) * 1e6
    doubles[:4] = [0.0, -0.0, np.nan, np.inf]
    columns = {
        "long": pa.array(rng.integers(-2**62, 2**62, n), pa.int64(), mask=nulls),
        "integer": pa.array(rng.integers(-2**31, 2**31 - 1, n), pa.int32(), mask=nulls),
        "short": pa.array(rng.integers(-2**15, 2**15 - 1, n), pa.int16(), mask=nulls),
        "double": pa.array(doubles, pa.float64(), mask=nulls),
        "float": pa.array(doubles.astype(np.float32), pa.float32(), mask=nulls),
        "boolean": pa.array(rng.random(n) < 0.5, mask=nulls),
        "string": pa.array([None if m else f"s{v}é" for m, v in zip(nulls, rng.integers(0, 99, n))]),
        "date": pa.array([None if m else datetime.date(1950, 1, 1) + datetime.timedelta(days=int(d))
                          for m, d in zip(nulls, rng.integers(0, 40000, n))]),
        "timestamp": pa.array(rng.integers(-2**50, 2**50, n), pa.int64(), mask=nulls).cast(pa.timestamp("us", "UTC")),
        "decimal(12,3)": pa.array([None if m else decimal.Decimal(int(v)).scaleb(-3)
                                   for m, v in zip(nulls, rng.integers(-10**9, 10**9, n))], pa.decimal128(12, 3)),
    }
    dtypes, arrays = list(columns), list(columns.values())
    assert rid.box_output_digests_arrow("MapInPandas#4", arrays, dtypes).tolist() == \
        rid.box_output_digests("MapInPandas#4", [a.to_pylist() for a in arrays], dtypes)
