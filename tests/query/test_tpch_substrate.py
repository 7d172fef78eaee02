"""The TPC-H substrate of the lineage benchmark: generator, queries and the exact-lineage oracle.

The oracle (``bench.tpch_lineage``) is checked two independent ways:

- on generated data, for every query: every lineage row exists, and re-running the query
  on only the lineage rows (each table filtered to its lineage, with pyarrow, outside
  Spark) reproduces the traced row. Lineage must be enough to produce its row (PredTrace's
  Definition 3.2) whatever the semantics' choices; only an anti join breaks the property,
  because its lineage leaves out the rows that kept other rows out: Q22's NOT EXISTS runs
  against all of orders (its lineage has no orders, and customers of the scalar average's
  input that have orders would otherwise join the group). Q16's NOT IN and Q21's NOT EXISTS
  need no exemption: with the lineage only, nothing they excluded comes back.
- on hand-built tables of a few rows, for an EXISTS (Q4), a left outer join under an
  aggregate (Q13), a NOT IN under count distinct (Q16) and a correlated scalar subquery
  (Q17): the exact sets, worked out by hand.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from bench.tpch_data import SCHEMAS, TABLES, build, generate, part_suppliers, retail_cents
from bench.tpch_lineage import exact_lineage, pick_row
from bench.tpch_queries import QUERIES, register

SCALE = 0.01
KEEP_WHOLE = {22: {"orders"}}  # see the module docstring


@pytest.fixture(scope="module")
def tpch(tmp_path_factory) -> dict[str, Path]:
    return generate(tmp_path_factory.mktemp("tpch"), scale=SCALE)


@pytest.fixture
def full(spark, tpch) -> dict[str, Path]:
    """The generated tables registered (tests of hand-built tables register their own)."""
    register(spark, tpch)
    return tpch


def test_generator_is_deterministic_and_follows_the_spec(tpch):
    assert build(0.002, 5)["lineitem"].equals(build(0.002, 5)["lineitem"])
    t = {name: pq.read_table(path).to_pandas() for name, path in tpch.items()}
    assert {k: len(v) for k, v in t.items() if k != "lineitem"} == {
        "region": 5, "nation": 25, "supplier": 100, "customer": 1500, "part": 2000, "partsupp": 8000,
        "orders": 15000}
    assert 15000 < len(t["lineitem"]) < 7 * 15000
    for name, frame in t.items():
        assert (frame["_row"].to_numpy() == np.arange(len(frame))).all(), name

    ps, lines, orders = t["partsupp"], t["lineitem"], t["orders"]
    assert not ps.duplicated(["ps_partkey", "ps_suppkey"]).any()
    assert (ps.groupby("ps_partkey").size() == 4).all()
    assert set(zip(lines.l_partkey, lines.l_suppkey)) <= set(zip(ps.ps_partkey, ps.ps_suppkey))
    assert (orders.o_custkey % 3 != 0).all()
    lo = lines.merge(orders, left_on="l_orderkey", right_on="o_orderkey")
    assert _days(lo.l_shipdate, lo.o_orderdate).between(1, 121).all()
    assert _days(lo.l_commitdate, lo.o_orderdate).between(30, 90).all()
    assert _days(lo.l_receiptdate, lo.l_shipdate).between(1, 30).all()
    current = dt.date(1995, 6, 17)
    assert ((lo.l_returnflag == "N") == (lo.l_receiptdate > current)).all()
    assert ((lo.l_linestatus == "O") == (lo.l_shipdate > current)).all()
    statuses = lo.groupby("o_orderkey").agg(status=("o_orderstatus", "first"), lines=("l_linestatus", set))
    assert all({"F": {"F"}, "O": {"O"}, "P": {"F", "O"}}[s] == ls for s, ls in statuses.itertuples(index=False))
    prices = lines.merge(t["part"], left_on="l_partkey", right_on="p_partkey")
    assert (prices.l_extendedprice == prices.l_quantity * prices.p_retailprice).all()
    assert (retail_cents(np.array([1, 1000, 123456])) == [90_100, 90_100, 147_945]).all()
    assert t["supplier"].s_comment.str.contains("Customer.*Complaints").any()
    customers = t["customer"]
    assert (customers.c_phone.str[:2].astype(int) == customers.c_nationkey + 10).all()
    tiny = part_suppliers(np.arange(1, 401), 20)  # SF 0.002: where the spec's formula repeats suppliers
    assert all(len(set(row)) == 4 for row in tiny.tolist())


def _days(later: pd.Series, earlier: pd.Series) -> pd.Series:
    return (later - earlier).map(lambda delta: delta.days)


@pytest.mark.spark
@pytest.mark.parametrize("qnum", sorted(QUERIES))
def test_lineage_exists_and_reproduces_the_row(spark, full, tmp_path, qnum):
    row = pick_row(spark, qnum)
    lineage = exact_lineage(spark, qnum, row)
    assert any(lineage.values()), f"Q{qnum}'s row {row} has empty lineage"

    restricted = {}
    for table, path in full.items():
        whole = pq.read_table(path)
        rows = lineage[table]
        kept = whole.filter(pc.is_in(whole["_row"], pa.array(sorted(rows), pa.int64())))
        assert kept.num_rows == len(rows), f"Q{qnum}: {table} lineage names rows that do not exist"
        restricted[table] = tmp_path / f"{table}.parquet"
        pq.write_table(whole if table in KEEP_WHOLE.get(qnum, ()) else kept, restricted[table])
    register(spark, restricted)
    rerun = [r.asDict() for r in spark.sql(QUERIES[qnum]).collect()]
    assert row in rerun, f"Q{qnum} on its row's lineage gave {rerun[:5]}, not {row}"


def _write_tables(out: Path, rows: dict[str, list[dict]]) -> dict[str, Path]:
    """All 8 tables from a few hand-written rows (tables not given are empty, columns not given a neutral default)."""
    defaults = {pa.int64(): 0, pa.int32(): 0, pa.string(): "", pa.decimal128(15, 2): Decimal("0.00"),
                pa.date32(): dt.date(1995, 1, 1)}
    paths = {}
    for table in TABLES:
        schema = SCHEMAS[table]
        filled = [{f.name: given.get(f.name, defaults[f.type]) for f in schema} | {"_row": i}
                  for i, given in enumerate(rows.get(table, []))]
        paths[table] = out / f"{table}.parquet"
        pq.write_table(pa.Table.from_pylist(filled, schema=schema), paths[table])
    return paths


def _result(spark, qnum: int) -> list[dict]:
    return [r.asDict() for r in spark.sql(QUERIES[qnum]).collect()]


def _sets(**tables: set[int]) -> dict[str, set[int]]:
    return {table: tables.get(table, set()) for table in TABLES}


@pytest.mark.spark
def test_exists_lineage_is_the_orders_and_their_witnesses(spark, tmp_path):
    d = dt.date
    register(spark, _write_tables(tmp_path, {
        "orders": [
            {"o_orderkey": 1, "o_orderdate": d(1993, 8, 1), "o_orderpriority": "1-URGENT"},
            {"o_orderkey": 2, "o_orderdate": d(1993, 8, 15), "o_orderpriority": "1-URGENT"},  # nothing late
            {"o_orderkey": 3, "o_orderdate": d(1994, 1, 1), "o_orderpriority": "1-URGENT"},  # out of the quarter
            {"o_orderkey": 4, "o_orderdate": d(1993, 9, 1), "o_orderpriority": "2-HIGH"},
        ],
        "lineitem": [
            {"l_orderkey": 1, "l_commitdate": d(1993, 9, 1), "l_receiptdate": d(1993, 9, 5)},
            {"l_orderkey": 1, "l_commitdate": d(1993, 9, 10), "l_receiptdate": d(1993, 9, 5)},
            {"l_orderkey": 1, "l_commitdate": d(1993, 9, 1), "l_receiptdate": d(1993, 9, 2)},
            {"l_orderkey": 2, "l_commitdate": d(1993, 9, 10), "l_receiptdate": d(1993, 9, 1)},
            {"l_orderkey": 3, "l_commitdate": d(1994, 2, 1), "l_receiptdate": d(1994, 2, 5)},
            {"l_orderkey": 4, "l_commitdate": d(1993, 10, 1), "l_receiptdate": d(1993, 10, 5)},
        ],
    }))
    urgent, high = {"o_orderpriority": "1-URGENT", "order_count": 1}, {"o_orderpriority": "2-HIGH", "order_count": 1}
    assert _result(spark, 4) == [urgent, high]
    assert exact_lineage(spark, 4, urgent) == _sets(orders={0}, lineitem={0, 2})
    assert exact_lineage(spark, 4, high) == _sets(orders={3}, lineitem={5})
    assert exact_lineage(spark, 4, {**urgent, "order_count": 2}) == _sets()  # no such output row


@pytest.mark.spark
def test_outer_join_lineage_is_the_customers_and_their_joined_orders(spark, tmp_path):
    register(spark, _write_tables(tmp_path, {
        "customer": [{"c_custkey": k} for k in (1, 2, 3, 4)],
        "orders": [
            {"o_custkey": 1, "o_orderkey": 1, "o_comment": "quick packages"},
            {"o_custkey": 1, "o_orderkey": 2, "o_comment": "special packages and requests"},  # not joined
            {"o_custkey": 2, "o_orderkey": 3, "o_comment": "regular deposits"},
            {"o_custkey": 4, "o_orderkey": 4, "o_comment": "special requests"},  # not joined
            {"o_custkey": 4, "o_orderkey": 5, "o_comment": "bold ideas"},
            {"o_custkey": 4, "o_orderkey": 6, "o_comment": "slow foxes"},
        ],
    }))
    assert _result(spark, 13) == [{"c_count": 1, "custdist": 2}, {"c_count": 2, "custdist": 1},
                                  {"c_count": 0, "custdist": 1}]
    assert exact_lineage(spark, 13, {"c_count": 1, "custdist": 2}) == _sets(customer={0, 1}, orders={0, 2})
    assert exact_lineage(spark, 13, {"c_count": 2, "custdist": 1}) == _sets(customer={3}, orders={4, 5})
    assert exact_lineage(spark, 13, {"c_count": 0, "custdist": 1}) == _sets(customer={2})


@pytest.mark.spark
def test_not_in_lineage_has_nothing_of_the_subquery(spark, tmp_path):
    group = {"p_brand": "Brand#12", "p_type": "STANDARD POLISHED TIN", "p_size": 49}
    register(spark, _write_tables(tmp_path, {
        "part": [{"p_partkey": 1, **group}, {"p_partkey": 2, **group, "p_brand": "Brand#45"},
                 {"p_partkey": 3, **group}],
        "supplier": [{"s_suppkey": 1, "s_comment": "fine"},
                     {"s_suppkey": 2, "s_comment": "a Customer slow Complaints"},
                     {"s_suppkey": 3, "s_comment": "Customer Recommends"}],
        "partsupp": [{"ps_partkey": 1, "ps_suppkey": 1}, {"ps_partkey": 1, "ps_suppkey": 2},
                     {"ps_partkey": 1, "ps_suppkey": 3}, {"ps_partkey": 2, "ps_suppkey": 1},
                     {"ps_partkey": 3, "ps_suppkey": 1}],
    }))
    row = {**group, "supplier_cnt": 2}
    assert _result(spark, 16) == [row]
    # count(distinct): every row of the group counts, the repeated supplier 1 too.
    assert exact_lineage(spark, 16, row) == _sets(part={0, 2}, partsupp={0, 2, 4})


@pytest.mark.spark
def test_correlated_scalar_lineage_is_the_outer_rows_and_their_parts_lineitems(spark, tmp_path):
    chosen = {"p_brand": "Brand#23", "p_container": "MED BOX"}
    lines = [(1, 1, "70.00"), (1, 10, "1.00"), (1, 10, "1.00"), (1, 19, "1.00"),  # average 10: only 1 < 2
             (2, 5, "1.00"), (2, 5, "1.00"),  # average 5: none below 1
             (3, 1, "1.00"), (3, 10, "1.00")]  # the part is of another brand
    register(spark, _write_tables(tmp_path, {
        "part": [{"p_partkey": 1, **chosen}, {"p_partkey": 2, **chosen},
                 {"p_partkey": 3, **chosen, "p_brand": "Brand#12"}],
        "lineitem": [{"l_partkey": p, "l_quantity": Decimal(q), "l_extendedprice": Decimal(price)}
                     for p, q, price in lines],
    }))
    [row] = _result(spark, 17)
    assert row["avg_yearly"] == 10
    assert exact_lineage(spark, 17, row) == _sets(part={0}, lineitem={0, 1, 2, 3})
