"""The exact lineage of one TPC-H output row, written by hand per query: the benchmark's oracle.

``exact_lineage(spark, q, row)`` answers, for one output row of ``tpch_queries.QUERIES[q]``
(as ``{column: value}``, the values as Spark returned them), the set of ``_row`` values
per source table that produced it. Nothing here infers anything: per query, Spark SQL
written in the style of GProM/Perm provenance rewriting carries ``_row`` of every table
occurrence through the query's joins and keeps the rows that produce the given row.

Lineage semantics (why-provenance; PredTrace's Table 2 defaults):

- Filter, Project, ORDER BY: the rows of the row they pass.
- LIMIT / top-k: the lineage of the chosen rows only (a row cut off is no output).
- Inner join: the left and right rows joined into the row.
- GROUP BY with any aggregate (min/max and count distinct too): every input row of the
  group, after WHERE and before HAVING; a global aggregate: every input row.
- HAVING: the group's rows, as above, if the group passed.
- EXISTS / IN (semi join): the outer row's lineage plus the lineage of every row of the
  subquery's result that matches it; for a correlated subquery, its rows with the outer
  row's correlated values that satisfy its own predicates.
- NOT EXISTS / NOT IN (anti join): the outer row's lineage only.
- Scalar subquery, in a predicate or the select list: the outer row's lineage plus every
  row used to compute the value (correlated: the inner rows with the outer row's
  correlated values; uncorrelated aggregate: every row of the aggregate's input).
- Left outer join: the left row, plus the joined right row if there was one.
- Set semantics: output rows are identified by their values; several output rows with
  the given values give the union of their lineages.
- Views / CTEs: their rows' lineage, recursively.

How the oracle is built: first the row must be an output of the query (set semantics,
every column compared null-safely); if it is not, every set is empty. Then each query
has one or more *parts*, SQL whose columns are named ``<table>_row[suffix]`` (one column
per table occurrence, e.g. ``nation_row1`` and ``nation_row2`` for Q7's two nations);
the lineage is the union over the parts of their non-NULL values. Parts read the row's
values as named parameters (``:column``): group keys for aggregates, every output column
for the row-preserving Q2 and Q20; where a subquery is correlated with the outer rows,
the part is written against the outer rows themselves (Q17, Q20). Parts use the
queries' own subqueries where they only filter outer rows; they never use a generic
pushdown.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from functools import reduce

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bench.tpch_data import TABLES
from bench.tpch_queries import QUERIES

_PARAM = re.compile(r":([A-Za-z_]\w*)")

_Q22_CODES = "('13', '31', '23', '29', '30', '18', '17')"


@dataclass(frozen=True)
class Oracle:
    """One query's lineage: ``parts`` (SELECTs of ``<table>_row`` columns), each run after ``ctes`` if any."""

    parts: tuple[str, ...]
    ctes: str = ""


ORACLES: dict[int, Oracle] = {
    1: Oracle((
        """SELECT _row AS lineitem_row FROM lineitem
           WHERE l_shipdate <= date '1998-12-01' - interval '90' day
             AND l_returnflag = :l_returnflag AND l_linestatus = :l_linestatus""",
    )),
    2: Oracle((
        # The outer rows: the query's join and filters (its correlated minimum kept as a filter) and F^row.
        """SELECT p._row AS part_row, s._row AS supplier_row, ps._row AS partsupp_row,
                  n._row AS nation_row, r._row AS region_row
           FROM part p, supplier s, partsupp ps, nation n, region r
           WHERE p.p_partkey = ps.ps_partkey AND s.s_suppkey = ps.ps_suppkey AND p.p_size = 15
             AND p.p_type LIKE '%BRASS' AND s.s_nationkey = n.n_nationkey AND n.n_regionkey = r.r_regionkey
             AND r.r_name = 'EUROPE'
             AND ps.ps_supplycost = (
               SELECT min(ps2.ps_supplycost) FROM partsupp ps2, supplier s2, nation n2, region r2
               WHERE ps2.ps_partkey = p.p_partkey AND s2.s_suppkey = ps2.ps_suppkey
                 AND s2.s_nationkey = n2.n_nationkey AND n2.n_regionkey = r2.r_regionkey AND r2.r_name = 'EUROPE')
             AND s.s_acctbal = :s_acctbal AND s.s_name = :s_name AND n.n_name = :n_name
             AND p.p_partkey = :p_partkey AND p.p_mfgr = :p_mfgr AND s.s_address = :s_address
             AND s.s_phone = :s_phone AND s.s_comment = :s_comment""",
        # The correlated minimum's rows: its join for the outer rows' p_partkey (the row's).
        """SELECT ps._row AS partsupp_row, s._row AS supplier_row, n._row AS nation_row, r._row AS region_row
           FROM partsupp ps, supplier s, nation n, region r
           WHERE ps.ps_partkey = :p_partkey AND s.s_suppkey = ps.ps_suppkey AND s.s_nationkey = n.n_nationkey
             AND n.n_regionkey = r.r_regionkey AND r.r_name = 'EUROPE'""",
    )),
    3: Oracle((
        """SELECT c._row AS customer_row, o._row AS orders_row, l._row AS lineitem_row
           FROM customer c, orders o, lineitem l
           WHERE c.c_mktsegment = 'BUILDING' AND c.c_custkey = o.o_custkey AND l.l_orderkey = o.o_orderkey
             AND o.o_orderdate < date '1995-03-15' AND l.l_shipdate > date '1995-03-15'
             AND l.l_orderkey = :l_orderkey AND o.o_orderdate = :o_orderdate
             AND o.o_shippriority = :o_shippriority""",
    )),
    4: Oracle((
        # The semi join as an inner join: each order of the group with every lineitem witnessing EXISTS.
        """SELECT o._row AS orders_row, l._row AS lineitem_row
           FROM orders o JOIN lineitem l ON l.l_orderkey = o.o_orderkey AND l.l_commitdate < l.l_receiptdate
           WHERE o.o_orderdate >= date '1993-07-01' AND o.o_orderdate < date '1993-07-01' + interval '3' month
             AND o.o_orderpriority = :o_orderpriority""",
    )),
    5: Oracle((
        """SELECT c._row AS customer_row, o._row AS orders_row, l._row AS lineitem_row, s._row AS supplier_row,
                  n._row AS nation_row, r._row AS region_row
           FROM customer c, orders o, lineitem l, supplier s, nation n, region r
           WHERE c.c_custkey = o.o_custkey AND l.l_orderkey = o.o_orderkey AND l.l_suppkey = s.s_suppkey
             AND c.c_nationkey = s.s_nationkey AND s.s_nationkey = n.n_nationkey
             AND n.n_regionkey = r.r_regionkey AND r.r_name = 'ASIA'
             AND o.o_orderdate >= date '1994-01-01' AND o.o_orderdate < date '1994-01-01' + interval '1' year
             AND n.n_name = :n_name""",
    )),
    6: Oracle((
        """SELECT _row AS lineitem_row FROM lineitem
           WHERE l_shipdate >= date '1994-01-01' AND l_shipdate < date '1994-01-01' + interval '1' year
             AND l_discount BETWEEN 0.06 - 0.01 AND 0.06 + 0.01 AND l_quantity < 24""",
    )),
    7: Oracle((
        """SELECT s._row AS supplier_row, l._row AS lineitem_row, o._row AS orders_row, c._row AS customer_row,
                  n1._row AS nation_row1, n2._row AS nation_row2
           FROM supplier s, lineitem l, orders o, customer c, nation n1, nation n2
           WHERE s.s_suppkey = l.l_suppkey AND o.o_orderkey = l.l_orderkey AND c.c_custkey = o.o_custkey
             AND s.s_nationkey = n1.n_nationkey AND c.c_nationkey = n2.n_nationkey
             AND ((n1.n_name = 'FRANCE' AND n2.n_name = 'GERMANY') OR (n1.n_name = 'GERMANY' AND n2.n_name = 'FRANCE'))
             AND l.l_shipdate BETWEEN date '1995-01-01' AND date '1996-12-31'
             AND n1.n_name = :supp_nation AND n2.n_name = :cust_nation
             AND extract(year FROM l.l_shipdate) = :l_year""",
    )),
    8: Oracle((
        # Every row of the year's group, not only Brazil's: the aggregate reads them all.
        """SELECT p._row AS part_row, s._row AS supplier_row, l._row AS lineitem_row, o._row AS orders_row,
                  c._row AS customer_row, n1._row AS nation_row1, n2._row AS nation_row2, r._row AS region_row
           FROM part p, supplier s, lineitem l, orders o, customer c, nation n1, nation n2, region r
           WHERE p.p_partkey = l.l_partkey AND s.s_suppkey = l.l_suppkey AND l.l_orderkey = o.o_orderkey
             AND o.o_custkey = c.c_custkey AND c.c_nationkey = n1.n_nationkey AND n1.n_regionkey = r.r_regionkey
             AND r.r_name = 'AMERICA' AND s.s_nationkey = n2.n_nationkey
             AND o.o_orderdate BETWEEN date '1995-01-01' AND date '1996-12-31'
             AND p.p_type = 'ECONOMY ANODIZED STEEL' AND extract(year FROM o.o_orderdate) = :o_year""",
    )),
    9: Oracle((
        """SELECT p._row AS part_row, s._row AS supplier_row, l._row AS lineitem_row, ps._row AS partsupp_row,
                  o._row AS orders_row, n._row AS nation_row
           FROM part p, supplier s, lineitem l, partsupp ps, orders o, nation n
           WHERE s.s_suppkey = l.l_suppkey AND ps.ps_suppkey = l.l_suppkey AND ps.ps_partkey = l.l_partkey
             AND p.p_partkey = l.l_partkey AND o.o_orderkey = l.l_orderkey AND s.s_nationkey = n.n_nationkey
             AND p.p_name LIKE '%green%' AND n.n_name = :nation AND extract(year FROM o.o_orderdate) = :o_year""",
    )),
    10: Oracle((
        """SELECT c._row AS customer_row, o._row AS orders_row, l._row AS lineitem_row, n._row AS nation_row
           FROM customer c, orders o, lineitem l, nation n
           WHERE c.c_custkey = o.o_custkey AND l.l_orderkey = o.o_orderkey
             AND o.o_orderdate >= date '1993-10-01' AND o.o_orderdate < date '1993-10-01' + interval '3' month
             AND l.l_returnflag = 'R' AND c.c_nationkey = n.n_nationkey
             AND c.c_custkey = :c_custkey AND c.c_name = :c_name AND c.c_acctbal = :c_acctbal
             AND c.c_phone = :c_phone AND n.n_name = :n_name AND c.c_address = :c_address
             AND c.c_comment = :c_comment""",
    )),
    11: Oracle((
        # The group (a subset of the next part's rows; stated so that each rule has its part).
        """SELECT ps._row AS partsupp_row, s._row AS supplier_row, n._row AS nation_row
           FROM partsupp ps, supplier s, nation n
           WHERE ps.ps_suppkey = s.s_suppkey AND s.s_nationkey = n.n_nationkey AND n.n_name = 'GERMANY'
             AND ps.ps_partkey = :ps_partkey""",
        # HAVING's uncorrelated scalar subquery: every row of its aggregate's input.
        """SELECT ps._row AS partsupp_row, s._row AS supplier_row, n._row AS nation_row
           FROM partsupp ps, supplier s, nation n
           WHERE ps.ps_suppkey = s.s_suppkey AND s.s_nationkey = n.n_nationkey AND n.n_name = 'GERMANY'""",
    )),
    12: Oracle((
        """SELECT o._row AS orders_row, l._row AS lineitem_row
           FROM orders o, lineitem l
           WHERE o.o_orderkey = l.l_orderkey AND l.l_shipmode IN ('MAIL', 'SHIP')
             AND l.l_commitdate < l.l_receiptdate AND l.l_shipdate < l.l_commitdate
             AND l.l_receiptdate >= date '1994-01-01' AND l.l_receiptdate < date '1994-01-01' + interval '1' year
             AND l.l_shipmode = :l_shipmode""",
    )),
    13: Oracle(
        # Every customer with c_count matching orders, with those orders (none for c_count = 0).
        ("""SELECT j.customer_row, j.orders_row
            FROM joined j JOIN c_orders k ON j.c_custkey = k.c_custkey
            WHERE k.c_count = :c_count""",),
        ctes="""
        joined AS (
          SELECT c._row AS customer_row, o._row AS orders_row, c.c_custkey, o.o_orderkey
          FROM customer c LEFT OUTER JOIN orders o
            ON c.c_custkey = o.o_custkey AND o.o_comment NOT LIKE '%special%requests%'),
        c_orders AS (SELECT c_custkey, count(o_orderkey) AS c_count FROM joined GROUP BY c_custkey)""",
    ),
    14: Oracle((
        """SELECT l._row AS lineitem_row, p._row AS part_row
           FROM lineitem l, part p
           WHERE l.l_partkey = p.p_partkey AND l.l_shipdate >= date '1995-09-01'
             AND l.l_shipdate < date '1995-09-01' + interval '1' month""",
    )),
    15: Oracle(
        (
            """SELECT _row AS supplier_row FROM supplier
               WHERE s_suppkey = :s_suppkey AND s_name = :s_name AND s_address = :s_address
                 AND s_phone = :s_phone""",
            # The joined revenue0 row's group (a subset of the next part's rows).
            "SELECT lineitem_row FROM quarter WHERE l_suppkey = :s_suppkey",
            # max(total_revenue)'s input: every revenue0 row, so every lineitem of the quarter.
            "SELECT lineitem_row FROM quarter",
        ),
        ctes="""
        quarter AS (
          SELECT _row AS lineitem_row, l_suppkey FROM lineitem
          WHERE l_shipdate >= date '1996-01-01' AND l_shipdate < date '1996-01-01' + interval '3' month)""",
    ),
    16: Oracle((
        # NOT IN: nothing from supplier.
        """SELECT ps._row AS partsupp_row, p._row AS part_row
           FROM partsupp ps, part p
           WHERE p.p_partkey = ps.ps_partkey AND p.p_brand <> 'Brand#45' AND p.p_type NOT LIKE 'MEDIUM POLISHED%'
             AND p.p_size IN (49, 14, 23, 45, 19, 3, 36, 9)
             AND ps.ps_suppkey NOT IN (SELECT s_suppkey FROM supplier WHERE s_comment LIKE '%Customer%Complaints%')
             AND p.p_brand = :p_brand AND p.p_type = :p_type AND p.p_size = :p_size""",
    )),
    17: Oracle(
        (
            "SELECT lineitem_row, part_row FROM outer_rows",
            # The correlated average's rows, for each outer row's part.
            "SELECT _row AS lineitem_row FROM lineitem WHERE l_partkey IN (SELECT p_partkey FROM outer_rows)",
        ),
        ctes="""
        outer_rows AS (
          SELECT l._row AS lineitem_row, p._row AS part_row, p.p_partkey
          FROM lineitem l, part p
          WHERE p.p_partkey = l.l_partkey AND p.p_brand = 'Brand#23' AND p.p_container = 'MED BOX'
            AND l.l_quantity < (SELECT 0.2 * avg(l2.l_quantity) FROM lineitem l2 WHERE l2.l_partkey = p.p_partkey))""",
    ),
    18: Oracle((
        """SELECT c._row AS customer_row, o._row AS orders_row, l._row AS lineitem_row
           FROM customer c, orders o, lineitem l
           WHERE o.o_orderkey IN (SELECT l_orderkey FROM lineitem GROUP BY l_orderkey HAVING sum(l_quantity) > 250)
             AND c.c_custkey = o.o_custkey AND o.o_orderkey = l.l_orderkey
             AND c.c_name = :c_name AND c.c_custkey = :c_custkey AND o.o_orderkey = :o_orderkey
             AND o.o_orderdate = :o_orderdate AND o.o_totalprice = :o_totalprice""",
        # The IN subquery's matching row is the group of l_orderkey = o_orderkey: all its lineitems
        # (the same rows as the join's; stated so that each rule has its part).
        "SELECT _row AS lineitem_row FROM lineitem WHERE l_orderkey = :o_orderkey",
    )),
    19: Oracle((
        """SELECT l._row AS lineitem_row, p._row AS part_row
           FROM lineitem l, part p
           WHERE (p.p_partkey = l.l_partkey AND p.p_brand = 'Brand#12'
                  AND p.p_container IN ('SM CASE', 'SM BOX', 'SM PACK', 'SM PKG')
                  AND l.l_quantity >= 1 AND l.l_quantity <= 1 + 10 AND p.p_size BETWEEN 1 AND 5
                  AND l.l_shipmode IN ('AIR', 'AIR REG') AND l.l_shipinstruct = 'DELIVER IN PERSON')
              OR (p.p_partkey = l.l_partkey AND p.p_brand = 'Brand#23'
                  AND p.p_container IN ('MED BAG', 'MED BOX', 'MED PKG', 'MED PACK')
                  AND l.l_quantity >= 10 AND l.l_quantity <= 10 + 10 AND p.p_size BETWEEN 1 AND 10
                  AND l.l_shipmode IN ('AIR', 'AIR REG') AND l.l_shipinstruct = 'DELIVER IN PERSON')
              OR (p.p_partkey = l.l_partkey AND p.p_brand = 'Brand#34'
                  AND p.p_container IN ('LG CASE', 'LG BOX', 'LG PACK', 'LG PKG')
                  AND l.l_quantity >= 20 AND l.l_quantity <= 20 + 10 AND p.p_size BETWEEN 1 AND 15
                  AND l.l_shipmode IN ('AIR', 'AIR REG') AND l.l_shipinstruct = 'DELIVER IN PERSON')""",
    )),
    20: Oracle(
        (
            "SELECT supplier_row, nation_row FROM outer_rows",
            "SELECT partsupp_row FROM witnesses",
            # Each witness's nested IN: its part.
            """SELECT p._row AS part_row FROM part p
               WHERE p.p_name LIKE 'forest%' AND p.p_partkey IN (SELECT ps_partkey FROM witnesses)""",
            # Each witness's correlated sum: its part's and supplier's lineitems of the year.
            """SELECT l._row AS lineitem_row
               FROM lineitem l JOIN witnesses w ON l.l_partkey = w.ps_partkey AND l.l_suppkey = w.ps_suppkey
               WHERE l.l_shipdate >= date '1994-01-01' AND l.l_shipdate < date '1994-01-01' + interval '1' year""",
        ),
        ctes="""
        matches AS (
          SELECT ps._row AS partsupp_row, ps.ps_partkey, ps.ps_suppkey
          FROM partsupp ps
          WHERE ps.ps_partkey IN (SELECT p_partkey FROM part WHERE p_name LIKE 'forest%')
            AND ps.ps_availqty > (
              SELECT 0.5 * sum(l_quantity) FROM lineitem
              WHERE l_partkey = ps.ps_partkey AND l_suppkey = ps.ps_suppkey
                AND l_shipdate >= date '1994-01-01' AND l_shipdate < date '1994-01-01' + interval '1' year)),
        outer_rows AS (
          SELECT s._row AS supplier_row, n._row AS nation_row, s.s_suppkey
          FROM supplier s, nation n
          WHERE s.s_suppkey IN (SELECT ps_suppkey FROM matches) AND s.s_nationkey = n.n_nationkey
            AND n.n_name = 'CANADA' AND s.s_name = :s_name AND s.s_address = :s_address),
        witnesses AS (SELECT * FROM matches WHERE ps_suppkey IN (SELECT s_suppkey FROM outer_rows))""",
    ),
    21: Oracle((
        # EXISTS as an inner join with its witnesses l2; NOT EXISTS stays a filter and adds nothing.
        """SELECT s._row AS supplier_row, l1._row AS lineitem_row1, o._row AS orders_row, n._row AS nation_row,
                  l2._row AS lineitem_row2
           FROM supplier s, lineitem l1, orders o, nation n, lineitem l2
           WHERE s.s_suppkey = l1.l_suppkey AND o.o_orderkey = l1.l_orderkey AND o.o_orderstatus = 'F'
             AND l1.l_receiptdate > l1.l_commitdate
             AND l2.l_orderkey = l1.l_orderkey AND l2.l_suppkey <> l1.l_suppkey
             AND NOT EXISTS (
               SELECT * FROM lineitem l3
               WHERE l3.l_orderkey = l1.l_orderkey AND l3.l_suppkey <> l1.l_suppkey
                 AND l3.l_receiptdate > l3.l_commitdate)
             AND s.s_nationkey = n.n_nationkey AND n.n_name = 'SAUDI ARABIA' AND s.s_name = :s_name""",
    )),
    22: Oracle((
        # The group; NOT EXISTS adds nothing from orders. (A subset of the next part's rows: such a
        # customer's balance exceeds an average of positive balances.)
        f"""SELECT c._row AS customer_row FROM customer c
            WHERE substring(c.c_phone, 1, 2) IN {_Q22_CODES}
              AND c.c_acctbal > (
                SELECT avg(c_acctbal) FROM customer
                WHERE c_acctbal > 0.00 AND substring(c_phone, 1, 2) IN {_Q22_CODES})
              AND NOT EXISTS (SELECT * FROM orders o WHERE o.o_custkey = c.c_custkey)
              AND substring(c.c_phone, 1, 2) = :cntrycode""",
        # The uncorrelated average's input.
        f"""SELECT _row AS customer_row FROM customer
            WHERE c_acctbal > 0.00 AND substring(c_phone, 1, 2) IN {_Q22_CODES}""",
    )),
}


def exact_lineage(spark: SparkSession, qnum: int, row: dict) -> dict[str, set[int]]:
    """``{table: {_row, ...}}`` for every one of the 8 tables (empty where none contributes) for one output row."""
    lineage: dict[str, set[int]] = {table: set() for table in TABLES}
    if not is_output(spark, qnum, row):
        return lineage
    oracle = ORACLES[qnum]
    for part in oracle.parts:
        sql = f"WITH {oracle.ctes}\n{part}" if oracle.ctes else part
        args = {name: row[name] for name in set(_PARAM.findall(sql))}
        rows = spark.sql(sql, args=args or None)
        found = rows.agg(*[F.collect_set(c).alias(c) for c in rows.columns]).first()
        for column in rows.columns:
            lineage[table_of(column)].update(found[column])
    return lineage


def table_of(column: str) -> str:
    """``nation_row2`` -> ``nation``: a part's column names its table."""
    table = column[:column.index("_row")]
    if table not in TABLES:
        raise ValueError(f"lineage column {column!r} names no table")
    return table


def is_output(spark: SparkSession, qnum: int, row: dict) -> bool:
    """Whether ``row`` is one of the query's output rows (all columns equal, NULLs equal to NULLs)."""
    result = spark.sql(QUERIES[qnum])
    if set(result.columns) != set(row):
        raise ValueError(f"Q{qnum} has columns {result.columns}, the row has {sorted(row)}")
    same = reduce(operator.and_, [F.col(f"`{c}`").eqNullSafe(F.lit(row[c])) for c in result.columns])
    return bool(result.filter(same).take(1))


def pick_row(spark: SparkSession, qnum: int) -> dict:
    """Row ``n // 2`` of the query's ordered result of ``n`` rows: deterministic, and typical rather than extreme."""
    rows = spark.sql(QUERIES[qnum]).collect()
    if not rows:
        raise ValueError(f"Q{qnum} returned no rows")
    return rows[len(rows) // 2].asDict()
