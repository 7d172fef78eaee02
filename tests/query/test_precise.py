"""Precise mode (query/infer/precise.py) against the oracle, on the inference tests' queries
and tables: with the intermediate results it asks for saved, every answer contains the
oracle's lineage and equals it when it says ``exact``; and saving is what earns ``exact``
where inference alone cannot."""

from __future__ import annotations

import pytest

from headwater.capture.spark_plan import optimized_records
from headwater.query.infer.precise import plan_saves, save, trace
from headwater.query.infer.refine import infer
from headwater.spark.operators import build
from tests.query.test_inference import QUERIES, ROWS_PER_QUERY, _found, _oracle, random_tables

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def tables(spark, tmp_path_factory):
    return random_tables(spark, tmp_path_factory.mktemp("precise"))


def _precise(spark, tables, query: str):
    df = spark.sql(query)
    plan = build(optimized_records(df))
    precise = plan_saves(plan)
    return plan, precise, save(precise, tables), [list(r) for r in df.collect()]


@pytest.mark.parametrize("query", QUERIES)
def test_precise_lineage_contains_the_oracle_and_equals_it_when_exact(spark, tables, query):
    plan, precise, saved, rows = _precise(spark, tables, query)
    assert set(saved.frames) == set(precise.saves)
    for values in rows[:ROWS_PER_QUERY]:
        truth = _oracle(plan, tables, values)
        traced = trace(precise, saved, values, tables)
        assert truth <= _found(traced), f"lineage lost for {values}: {sorted(truth - _found(traced))[:5]}"
        if traced.exact:
            assert _found(traced) == truth, f"said exact, but selects more for {values}"
        else:
            assert traced.reasons


@pytest.mark.parametrize("query", [
    # The join's condition reads both sides: no predicate pushed from (a, x) alone says which pairs passed b > y.
    "select a, x from r join s on a = x and b > y",
    # The inner count drops its group key from its output: the saved rows keep it (PredTrace §5).
    "select cnt, count(*) from (select a, count(x) as cnt from r join s on a = x group by a) group by cnt",
])
def test_saving_earns_exact_answers_where_inference_cannot(spark, tables, query):
    plan, precise, saved, rows = _precise(spark, tables, query)
    assert precise.saves and saved.rows
    exact_only_when_saved = 0
    for values in rows[:ROWS_PER_QUERY]:
        truth = _oracle(plan, tables, values)
        traced = trace(precise, saved, values, tables)
        assert traced.exact and _found(traced) == truth, (values, traced.reasons)
        exact_only_when_saved += not infer(plan, values, tables, replay=False).exact
    assert exact_only_when_saved


def test_nothing_is_saved_where_the_pushdown_is_already_exact(spark, tables):
    plan, precise, saved, rows = _precise(spark, tables, "select a, x, y from r join s on a = x where y > 20")
    assert precise.saves == [] and saved.rows == 0
    for values in rows[:ROWS_PER_QUERY]:
        traced = trace(precise, saved, values, tables)
        assert traced.exact and _found(traced) == _oracle(plan, tables, values)
