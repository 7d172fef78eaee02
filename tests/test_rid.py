import random
import string

import pytest

from headwater.core import rid
from headwater.core.rid import Int, kafka_rid, spark_xxhash64, table_rid, xxh64


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


def test_python_twin_equals_spark_xxhash64(spark):
    rng = random.Random(3)
    rows = []
    for _ in range(300):
        text = "".join(rng.choice(string.printable + "éß中") for _ in range(rng.randint(0, 80)))
        rows.append((text, rng.randint(-(1 << 31), (1 << 31) - 1), rng.randint(-(1 << 63), (1 << 63) - 1)))
    df = spark.createDataFrame(rows, "s string, i int, l long")
    got = df.selectExpr("s", "i", "l", "xxhash64('kafka', s, i, l) AS h", "xxhash64('table', 'customers', s) AS t").collect()
    for row in got:
        assert row.h == spark_xxhash64("kafka", row.s, Int(row.i), row.l)
        assert row.t == table_rid("customers", row.s)
    composite = spark.sql("SELECT xxhash64('table', 'c', concat_ws('\u001f', '1', 'x')) AS h").first().h
    assert composite == table_rid("c", ("1", "x"))
