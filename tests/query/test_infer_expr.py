"""Expressions of logged plans: read from Spark's JSON, evaluated with SQL's NULL semantics."""

from __future__ import annotations

import datetime
from decimal import Decimal

import pandas as pd
import pytest

from headwater.query.infer.evaluate import Binding, NotEvaluable, evaluate, generated, holds
from headwater.spark.expr import TRUE, Expr, cmp, col, conj, conjuncts, in_set, lit, parse, show

P = "org.apache.spark.sql.catalyst.expressions."


def attr(name: str, eid: int, dtype: str) -> dict:
    return {"class": P + "AttributeReference", "num-children": 0, "name": name, "dataType": dtype,
            "exprId": {"id": eid}}


def test_spark_json_becomes_a_tree_by_num_children():
    flat = [
        {"class": P + "And", "num-children": 2},
        {"class": P + "IsNotNull", "num-children": 1}, attr("a", 1, "long"),
        {"class": P + "GreaterThanOrEqual", "num-children": 2}, attr("d", 2, "date"),
        {"class": P + "Literal", "num-children": 0, "value": "2019-01-04", "dataType": "date"},
    ]
    e = parse(flat)
    assert e.op == "and" and e.args[0] == Expr("isnotnull", (col(1, "a", "long"),), dtype="boolean")
    assert e.args[1].args[1] == lit(datetime.date(2019, 1, 4), "date")
    assert show(e) == "(isnotnull(a#1) AND (d#2 >= 2019-01-04))"
    # Spark's internal form of a date literal (days since the epoch) reads the same.
    assert parse([{"class": P + "Literal", "num-children": 0, "value": "17900", "dataType": "date"}]).value \
        == datetime.date(2019, 1, 4)


def test_what_it_does_not_know_stays_opaque_and_an_empty_inset_too():
    e = parse([{"class": P + "Murmur3Hash", "num-children": 1}, attr("a", 1, "long")])
    assert e.op == "opaque" and e.value == "Murmur3Hash"
    e = parse([{"class": P + "InSet", "num-children": 1, "hset": None}, attr("a", 1, "long")])
    assert e.op == "opaque"  # Spark's JSON dropped the values: never guess them


def test_kleene_logic_and_filters_keep_only_true():
    frame = pd.DataFrame({1: [1, None, 3, None], 2: ["x", "y", None, None]})
    a_gt_1 = cmp(">", col(1), lit(1, "long"))
    b_is_x = cmp("=", col(2), lit("x", "string"))
    assert holds(a_gt_1, frame).tolist() == [False, False, True, False]
    # NOT(NULL) is NULL, so the NULL rows pass neither a predicate nor its negation.
    assert holds(Expr("not", (a_gt_1,)), frame).tolist() == [True, False, False, False]
    # FALSE AND NULL is FALSE; TRUE OR NULL is TRUE.
    both = evaluate(Expr("and", (a_gt_1, b_is_x)), frame)
    assert both[1] is not pd.NA and not both[1]  # (NULL > 1) AND ('y' = 'x')
    assert both[2] is pd.NA  # (3 > 1) AND (NULL = 'x')
    assert holds(Expr("or", (a_gt_1, b_is_x)), frame).tolist() == [True, False, True, False]
    assert holds(cmp("<=>", col(2), lit(None)), frame).tolist() == [False, False, True, True]


def test_values_compare_as_spark_compares_them():
    frame = pd.DataFrame({1: [Decimal("1.50"), Decimal("2.00"), None], 2: ["apple", "banana", "cherry"]})
    bind = Binding(params={"p": 2}, sets={"v": frozenset({2, 3})})
    assert holds(cmp("=", col(1), Expr("param", value="p")), frame, bind).tolist() == [False, True, False]
    assert holds(in_set(col(1), "v"), frame, bind).tolist() == [False, True, False]
    cast = Expr("cast", (Expr("*", (col(1), lit(Decimal("0.333"), "decimal(4,3)"))),), dtype="decimal(10,2)")
    assert evaluate(cast, frame).tolist()[:2] == [Decimal("0.50"), Decimal("0.67")]  # HALF_UP, as Spark rounds
    sub = Expr("substring", (col(2), lit(2, "integer"), lit(3, "integer")), dtype="string")
    assert evaluate(sub, frame).tolist() == ["ppl", "ana", "her"]
    like = Expr("like", (col(2), lit("%an_n%", "string")), value="\\", dtype="boolean")
    assert holds(like, frame).tolist() == [False, True, False]


def test_remainder_in_and_substring_as_spark_computes_them():
    """Java's remainder (the dividend's sign), IN with a NULL in its list, substring's end counted before its
    start is clamped: Spark's answers, each of which Python's own operators get wrong."""
    frame = pd.DataFrame({1: [-7, 7, -7, None], 2: [3, -3, 0, 3], 3: [-7.5, 7.5, 1.0, None],
                          4: [Decimal("-7.5"), Decimal("7.5"), None, None]})
    assert evaluate(Expr("%", (col(1), col(2))), frame).tolist() == [-1, 1, None, None]
    assert evaluate(Expr("%", (col(3), lit(2.0, "double"))), frame).tolist()[:2] == [-1.5, 1.5]
    assert evaluate(Expr("%", (col(4), lit(Decimal(2), "decimal(1,0)"))), frame).tolist()[:2] == \
        [Decimal("-1.5"), Decimal("1.5")]
    # -7 % 3 = -1: a predicate over it keeps the row Spark keeps
    assert holds(cmp("=", Expr("%", (col(1), lit(3, "integer"))), lit(-1, "integer")), frame).tolist() == \
        [True, False, True, False]
    in_list = Expr("in", (col(1), lit(7, "integer"), lit(None, "integer")), dtype="boolean")
    assert evaluate(in_list, frame).tolist() == [pd.NA, True, pd.NA, pd.NA]  # no match, a NULL listed: NULL
    assert holds(Expr("not", (in_list,)), frame).tolist() == [False, False, False, False]
    assert evaluate(Expr("in", (col(1), lit(7, "integer")), dtype="boolean"), frame).tolist() == \
        [False, True, False, pd.NA]
    # one value listed twice (7 and 7.0 are one) is no NULL: no match stays FALSE
    twice = Expr("in", (col(1), lit(7, "integer"), lit(7.0, "double")), dtype="boolean")
    assert evaluate(twice, frame).tolist() == [False, True, False, pd.NA]
    words = pd.DataFrame({1: ["abcde"] * 6})
    for pos, length, spark in [(-7, 3, "a"), (-3, 2, "cd"), (0, 2, "ab"), (2, 10, "bcde"), (-7, 1, ""), (3, -1, "")]:
        sub = Expr("substring", (col(1), lit(pos, "integer"), lit(length, "integer")), dtype="string")
        assert evaluate(sub, words).tolist()[0] == spark, (pos, length)


def test_those_answers_are_sparks(spark):
    """The oracle of the test above: Spark's own answers to the same expressions."""
    row = spark.sql("SELECT -7 % 3, 7 % -3, -7.5D % 2.0D, CAST(-7.5 AS DECIMAL(2,1)) % 2, -7 IN (7, NULL), "
                    "NOT (-7 IN (7, NULL)), 7 IN (7, NULL), substring('abcde', -7, 3), substring('abcde', -3, 2), "
                    "substring('abcde', 0, 2), substring('abcde', 2, 10), substring('abcde', -7, 1), "
                    "substring('abcde', 3, -1)").first()
    assert list(row) == [-1, 1, -1.5, Decimal("-1.5"), None, None, True, "a", "cd", "ab", "bcde", "", ""]


def test_conjunctions_flatten_and_absorb():
    a = cmp("=", col(1), lit(1))
    b = cmp("=", col(2), lit(2))
    assert conjuncts(conj([a, conj([b, a]), TRUE])) == [a, b]
    assert conj([]) == TRUE


def test_kafka_json_records_parse_as_spark_parses_them():
    frame = pd.DataFrame({1: [b'{"order_id": 7, "amount": 20.675}', b"not json", None, b'{"order_id": "x"}']})
    parsed = Expr("from_json", (Expr("cast", (col(1),), dtype="string"),),
                  value=(("order_id", "long"), ("amount", "double")))
    amount = Expr("round", (Expr("*", (Expr("field", (parsed,), value=1), lit(1.0, "double"))), lit(2, "integer")))
    order = Expr("field", (parsed,), value=0)
    assert evaluate(order, frame).tolist() == [7, None, None, None]  # malformed or mistyped: NULL fields
    assert evaluate(amount, frame).tolist()[:2] == [20.68, None]  # half up on the decimal value, as Spark rounds
    concat = Expr("concat", (lit("id-", "string"), Expr("cast", (order,), dtype="string")))
    assert evaluate(concat, frame).tolist() == ["id-7", None, None, None]


def test_a_window_expression_keeps_its_function_partition_order_and_frame():
    flat = [
        {"class": P + "WindowExpression", "num-children": 2, "windowFunction": 0, "windowSpec": 1},
        {"class": P + "aggregate.AggregateExpression", "num-children": 1, "isDistinct": False},
        {"class": P + "aggregate.Sum", "num-children": 1}, attr("v", 2, "long"),
        {"class": P + "WindowSpecDefinition", "num-children": 3, "partitionSpec": [0], "orderSpec": [1],
         "frameSpecification": 2},
        attr("k", 1, "long"),
        {"class": P + "SortOrder", "num-children": 1, "direction": {"object": P + "Ascending$"},
         "nullOrdering": {"object": P + "NullsFirst$"}}, attr("v", 2, "long"),
        {"class": P + "SpecifiedWindowFrame", "num-children": 2, "frameType": {"object": P + "RangeFrame$"}},
        {"class": P + "UnboundedPreceding$", "num-children": 0}, {"class": P + "CurrentRow$", "num-children": 0},
    ]
    fn, spec = parse(flat).args
    assert fn.op == "agg" and fn.value == ("sum", False)
    assert spec.value == (1, 1) and spec.args[0] == col(1, "k", "long") and spec.args[1].value == ("Ascending", True)
    frame = spec.args[2]
    assert (frame.value, [b.value for b in frame.args]) == ("range", ["unbounded_preceding", "current_row"])
    lag = parse([{"class": P + "Lag", "num-children": 3, "ignoreNulls": True}, attr("v", 2, "long"),
                 {"class": P + "Literal", "num-children": 0, "value": "1", "dataType": "integer"},
                 {"class": P + "Literal", "num-children": 0, "value": None, "dataType": "long"}])
    assert lag.op == "opaque"  # skipping NULLs is not modelled: never run as a plain lag


def test_split_arrays_and_what_a_generator_yields():
    frame = pd.DataFrame({1: ["a,b,,", None, ""], 2: pd.Series([1, None, 3], dtype=object)})
    split = Expr("split", (col(1), lit(",", "string"), lit(-1, "integer")))
    assert evaluate(split, frame).tolist() == [("a", "b", "", ""), None, ("",)]  # trailing empties kept, as Java's
    assert evaluate(Expr("split", (col(1), lit("\\|", "string"), lit(2, "integer"))), frame).tolist()[0] == ("a,b,,",)
    with pytest.raises(NotEvaluable):  # a regex proper: Java's and Python's may differ, so never run
        evaluate(Expr("split", (col(1), lit("[,;]", "string"), lit(-1, "integer"))), frame)
    assert evaluate(Expr("array", (col(2), lit(7, "long"))), frame).tolist() == [(1, 7), (None, 7), (3, 7)]
    at_one = Expr("yields", (split, lit(1, "integer"), lit("b", "string")),
                  value=("posexplode", False, ("integer", "string")))
    assert holds(at_one, frame).tolist() == [True, False, False]
    # An outer generator yields one row of NULLs for a NULL or empty collection; NULLs match null-safe.
    nothing = Expr("yields", (split, lit(None), lit(None)), value=("posexplode", True, ("integer", "string")))
    assert holds(nothing, frame).tolist() == [False, True, False]
    assert generated("inline", ((1, "a"), None), 2) == [(1, "a"), (None, None)]  # Spark's row for a NULL struct
    with pytest.raises(NotEvaluable):  # a generator not known here (stack, a UDTF…) is never run as an explode
        generated("Stack", (1, 2), 1)
