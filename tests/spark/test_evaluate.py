"""The one evaluator of Spark expressions (``headwater.spark.evaluate``): its Arrow form and its Python form give
the same answer for every operation, and ``exact`` refuses what could differ from Spark's.

Each case is evaluated three ways over the same rows: columns as Arrow arrays, exactly (``--where``'s use); as
Arrow arrays, not exactly; and as object arrays of Python values (inference's use). Spark's own answers for these
rules are checked where Spark runs: ``tests/cli/test_cli.py`` (``--where`` against Spark over a sink) and
``tests/query/test_infer_expr.py`` (inference's evaluator against Spark's).
"""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa
import pytest

from headwater.spark import evaluate as ev
from headwater.spark.expr import Expr, cmp, col, in_set, lit

ROWS = {
    1: ("long", [7, -7, 0, None, 12, 3]),
    2: ("integer", [3, 3, 5, 2, None, -2]),
    3: ("string", ["alpha", "Beta", "", None, "50%_off", " padded "]),
    4: ("double", [1.5, -2.25, 0.0, None, 10.0, 3.0]),
    5: ("boolean", [True, False, None, True, None, False]),
    6: ("byte", [1, -2, 3, None, 0, 5]),
}
ARROW = {k: ev.array_of(values, t) for k, (t, values) in ROWS.items()}
OBJECTS = {k: ev.objects(values) for k, (_, values) in ROWS.items()}
N = 6

a, b, s, d, flag, t = (col(k, f"c{k}", ROWS[k][0]) for k in ROWS)


def op(name: str, *args: Expr, value=None, dtype: str | None = None) -> Expr:
    return Expr(name, tuple(args), value=value, dtype=dtype)


def num(v, dtype: str = "long") -> Expr:
    return lit(v, dtype)


def text(v) -> Expr:
    return lit(v, "string")


NULL = lit(None, "void")

CASES = [
    cmp("=", a, num(7)), cmp("<", a, num(0)), cmp(">=", d, lit(1.5, "double")), cmp("<=>", a, NULL),
    cmp("<=>", b, b), cmp("=", s, text("alpha")), cmp(">", s, text("B")),
    op("and", cmp(">", a, num(0)), flag), op("or", cmp(">", a, num(0)), flag), op("not", flag),
    op("and", flag, NULL), op("or", flag, NULL), op("not", NULL, dtype="boolean"),
    op("isnull", a), op("isnotnull", s), op("isnull", NULL),
    op("in", a, num(7), num(12)), op("in", a, num(7), NULL), op("not", op("in", a, num(7), NULL)),
    op("in", s, text("alpha"), text("Beta")), op("in", a, b, num(0)),
    op("+", a, num(1)), op("-", a, num(3)), op("*", a, num(2)), op("+", d, lit(0.5, "double")),
    op("%", a, num(3)), op("%", num(-7), b), op("neg", a), op("abs", a), op("neg", d),
    op("startswith", s, text("al")), op("endswith", s, text("a")), op("contains", s, text("%")),
    op("startswith", s, NULL),
    op("like", s, text("a%"), value="\\"), op("like", s, text("_e%"), value="\\"),
    op("like", s, text("50!%!_off"), value="!"), op("like", s, text("%"), value="\\"),
    op("like", s, text("a.p%"), value="\\"), op("like", s, text("(al)%"), value="\\"),
    op("upper", s), op("lower", s), op("length", s), op("trim", s), op("ltrim", s), op("rtrim", s),
    op("substring", s, num(2, "integer"), num(3, "integer")), op("substring", s, num(0, "integer"), num(2, "integer")),
    op("substring", s, num(-3, "integer"), num(2, "integer")), op("substring", s, num(-10, "integer"),
                                                                  num(8, "integer")),
    op("substring", s, num(2, "integer"), num(-1, "integer")),
    op("substring", s, num(-2, "integer"), num(2147483647, "integer")),
    op("concat", s, text("!")), op("concat", s, NULL), op("concat", text("x"), text("y")),
    op("if", flag, num(1), num(0), dtype="long"), op("if", cmp(">", a, num(0)), s, text("neg"), dtype="string"),
    op("case", cmp(">", a, num(10)), text("a"), cmp(">", a, num(0)), text("b"), text("c"), dtype="string"),
    op("case", cmp("=", b, num(3, "integer")), lit(True, "boolean"), dtype="boolean"),
    op("coalesce", a, num(0)), op("coalesce", s, text("none")), op("coalesce", NULL, b),
    op("cast", b, dtype="long"), op("cast", t, dtype="double"), op("cast", num(5, "integer"), dtype="long"),
    cmp("=", op("+", t, num(1, "byte")), num(2, "byte")), cmp("<", op("length", s), num(5, "integer")),
    num(3), text("x"), lit(True, "boolean"),
]


def _three_ways(e: Expr):
    exact = ev.as_objects(ev.evaluate(e, ARROW, N, exact=True), N).tolist()
    arrow = ev.as_objects(ev.evaluate(e, ARROW, N), N).tolist()
    python = ev.as_objects(ev.evaluate(e, OBJECTS, N), N).tolist()
    return exact, arrow, python


@pytest.mark.parametrize("e", CASES, ids=[repr(c) for c in CASES])
def test_arrow_and_python_forms_agree(e):
    exact, arrow, python = _three_ways(e)
    assert exact == arrow == python


def test_the_rules_themselves():
    """A few answers written out: what Spark gives, where Python or IEEE would give another."""
    def values(e):
        return _three_ways(e)[2]
    assert values(op("%", a, num(3))) == [1, -1, 0, None, 0, 0]  # Java's remainder: the dividend's sign
    assert values(op("in", a, num(7), NULL)) == [True, None, None, None, None, None]
    assert values(op("substring", s, num(-10, "integer"), num(8, "integer"))) == \
        ["alp", "Be", "", None, "50%_o", " padde"]  # the end counted from the start before it is clamped
    assert values(op("like", s, text("50!%!_off"), value="!")) == [False, False, False, None, True, False]
    assert values(op("trim", s))[5] == "padded"
    assert values(cmp("<=>", a, NULL)) == [False, False, False, True, False, False]


def test_division_by_zero_is_null_unless_exact():
    by_zero = op("/", a, op("cast", b, dtype="double"))
    zero_rows = Expr("/", (a, op("-", b, b)))
    assert ev.as_objects(ev.evaluate(zero_rows, OBJECTS, N), N).tolist() == [None] * N
    assert ev.as_objects(ev.evaluate(zero_rows, ARROW, N), N).tolist() == [None] * N
    with pytest.raises(ev.NotExact):
        ev.evaluate(zero_rows, ARROW, N, exact=True)
    assert ev.as_objects(ev.evaluate(by_zero, ARROW, N, exact=True), N).tolist()[:2] == [7 / 3, -7 / 3]


@pytest.mark.parametrize("e, why", [
    (op("upper", text("café")), "non-ASCII"),
    (cmp("=", d, lit(float("nan"), "double")), "NaN"),
    (op("*", a, num(1 << 62)), "overflow"),
    (op("round", d, num(0, "integer")), "value by value"),
    (op("%", d, lit(2.0, "double")), "value by value"),
    (op("opaque", a, value="Murmur3Hash"), "cannot evaluate"),
])
def test_exact_refuses_what_could_differ_from_spark(e, why):
    with pytest.raises(ev.NotEvaluable) as raised:
        ev.evaluate(e, ARROW, N, exact=True)
    assert why in str(raised.value) or isinstance(raised.value, ev.NotExact)


def test_a_nan_column_is_refused_exactly():
    nan = {9: pa.array([1.0, float("nan")])}
    with pytest.raises(ev.NotExact):
        ev.evaluate(cmp(">", col(9, "x", "double"), lit(0.0, "double")), nan, 2, exact=True)
    assert ev.as_objects(ev.evaluate(cmp(">", col(9, "x", "double"), lit(0.0, "double")), nan, 2), 2).tolist() == \
        [True, False]  # not exactly: IEEE's answer, where Spark's NaN is above every number


def test_literals_are_the_arrow_values_pyarrow_makes():
    """``array_of`` builds arrays from buffers (``pa.array`` imports pandas, which ``--where`` cannot afford)."""
    cases = {"tinyint": [0, -128, 127, None, 5], "smallint": [-(1 << 15), (1 << 15) - 1, None],
             "int": [None, -(1 << 31), (1 << 31) - 1, 0], "bigint": [-(1 << 63), (1 << 63) - 1, None, 42],
             "float": [1.5, None, 1e40, -0.0, float("nan"), 3, 1 / 3], "double": [1e308, -0.0, None, float("inf"), 7],
             "string": ["", "café", None, "日本", "a\x00b", "x" * 300], "boolean": [True, False, None, True] * 3}
    for spark_type, values in cases.items():
        for chosen in (values, [v for v in values if v is not None], [None], []):
            got = ev.array_of(chosen, spark_type)
            got.validate(full=True)
            want = pa.array(chosen, ev.arrow_type(spark_type))
            assert got.type == want.type and got.null_count == want.null_count, (spark_type, chosen)
            assert [repr(v) for v in got.to_pylist()] == [repr(v) for v in want.to_pylist()], (spark_type, chosen)
    for value, spark_type in ((128, "tinyint"), (1 << 63, "bigint"), ("1", "int"), (1, "string"), (1, "boolean"),
                              (True, "int")):
        with pytest.raises((OverflowError, pa.ArrowTypeError)):
            ev.array_of([value], spark_type)


@pytest.mark.parametrize("column, keys", [(1, {7, 12, 2.5, "7"}), (4, {1.5, 10, Decimal("3.0"), Decimal("0.1")}),
                                          (3, {"alpha", "", 7}), (5, {True}), (2, {3, Decimal(5)})])
def test_value_sets_hold_what_python_equality_holds(column, keys):
    """``in_set`` (refinement's value sets) by Arrow's hash over an Arrow column, as ``value_key`` over Python's."""
    bind = ev.Binding(sets={"v": frozenset(ev.value_key(k) for k in keys)})
    e = in_set(col(column, "c", ROWS[column][0]), "v")
    arrow = ev.as_objects(ev.evaluate(e, ARROW, N, bind), N).tolist()
    python = ev.as_objects(ev.evaluate(e, OBJECTS, N, bind), N).tolist()
    assert arrow == python
    assert python == [None if v is None else ev.value_key(v) in bind.sets["v"] for v in ROWS[column][1]]
