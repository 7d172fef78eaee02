"""``headwater.spark.sql``: a ``--where`` predicate lowered to an ``Expr`` tree with Spark's coercions explicit.

The predicates of ``tests/cli/test_cli.py``, which that test checks against Spark itself: each one it answers
without Spark lowers to a boolean tree, each one it leaves to Spark for its types is refused here. Beyond them,
over 200 predicates at the edges (``MORE``): what ``--where`` answers of them without Spark (lowered here, then
evaluated by ``headwater.spark.evaluate``) is checked against Spark's own answers over the same sink.
"""

from __future__ import annotations

import pytest
from sqlglot import exp

from headwater.query import where
from headwater.query.predicate import WhereError, parse_predicate
from headwater.spark.expr import Expr, cmp, col, conjuncts, lit, show
from headwater.spark.sql import Lowered, NotLowered, lower
from tests.cli.test_cli import NAMES, PREDICATES, sink_rows

SPARK_TYPES = {"id": "bigint", "i": "int", "t": "tinyint", "s": "smallint", "f": "float", "d": "double",
               "name": "string", "flag": "boolean", "big": "bigint", "dec": "decimal(10,2)", "ts": "timestamp",
               "_hw_rid": "bigint"}
TYPES = {name.lower(): (name, spark_type) for name, spark_type in SPARK_TYPES.items()}


def lowered(text: str) -> Lowered:
    return lower(parse_predicate(text), TYPES)


# --- shapes ------------------------------------------------------------------------------------------------------

SHAPES = [
    ("id = 7", "(id#0 = 7)"),
    ("i + t > 10", "((i#0 + cast(t#1 as integer)) > 10)"),
    ("id / 2 = 3.5", "((cast(id#0 as double) / 2.0) = 3.5)"),
    ("f > 5.5", "(cast(f#0 as double) > 5.5)"),
    ("f = 1", "(f#0 = 1.0)"),
    ("id = 2.0", "(id#0 = 2)"),
    ("id IN (1, 2.0, 3)", "(id#0 IN (1, 2, 3))"),
    ("t IN (0, 1)", "(cast(t#0 as integer) IN (0, 1))"),
    ("t = 200.0", "(cast(t#0 as integer) = 200)"),
    ("-id < -55", "(neg(id#0) < -55)"),
    ("i != t", "not((i#0 = cast(t#1 as integer)))"),
    ("i IS DISTINCT FROM t", "not((i#0 <=> cast(t#1 as integer)))"),
    ("i IS NOT NULL OR ts IS NULL", "(isnotnull(i#0) OR isnull(ts#1))"),
    ("isnotnull(dec)", "isnotnull(dec#0)"),
    ("flag IS NOT FALSE", "not((flag#0 <=> false))"),
    ("i NOT BETWEEN -10 AND 10", "not(((i#0 >= -10) AND (i#0 <= 10)))"),
    ("name NOT LIKE '50!%' ESCAPE '!'", "not(like[!](name#0, '50!%'))"),
    ("substr(name, -2) = 'ta'", "(substring(name#0, -2, 2147483647) = 'ta')"),
    ("left(name, 2) = 'al'", "(substring(name#0, 1, 2) = 'al')"),
    ("right(name, 2) = 'ha'", "(substring(name#0, -2, 2147483647) = 'ha')"),
    ("right(name, 0) = ''", "(substring(name#0, 1, 0) = '')"),
    ("trim(LEADING FROM name) = 'a' OR rtrim(name) = 'b'", "((ltrim(name#0) = 'a') OR (rtrim(name#0) = 'b'))"),
    ("'it''s' = name OR name || 'x' = 'Betax'", "(('its' = name#0) OR (concat(name#0, 'x') = 'Betax'))"),
    ("nvl(d, -1) < 0", "(coalesce(d#0, -1.0) < 0.0)"),
    ("if(flag, i, f) > 1", "(if(flag#0, cast(i#1 as float), f#2) > 1.0)"),
    ("CASE t WHEN 0 THEN true WHEN 1 THEN false END",
     "case((cast(t#0 as integer) = 0), true, (cast(t#0 as integer) = 1), false, None)"),
    ("5L = id OR 1.5D > id OR 3BD = id OR 1E1 = id",
     "((((5 = id#0) OR (1.5 > cast(id#0 as double))) OR (3 = id#0)) OR (10.0 = cast(id#0 as double)))"),
    ("substring(name, -(2), 1) = 'a'", "(substring(name#0, -2, 1) = 'a')"),
    ("1.5 IS NULL OR true", "(false OR true)"),
    ("name LIKE NULL OR i > NULL", "(None OR (i#1 > None))"),
]


@pytest.mark.parametrize("text, expected", SHAPES)
def test_lowered_shapes(text, expected):
    found = lowered(text)
    assert (show(found.expr), found.type) == (expected, "boolean")


def test_literals_and_columns_are_typed():
    found = lowered("ID = 7 OR s + 1 > 3000000000 OR name = 'a' AND flag")
    ident, small, name, flag = col(0, "id", "bigint"), col(1, "s", "smallint"), col(2, "name", "string"), \
        col(3, "flag", "boolean")
    plus = Expr("+", (Expr("cast", (small,), dtype="integer"), lit(1, "integer")), dtype="integer")
    assert found.expr == Expr("or", (
        Expr("or", (cmp("=", ident, lit(7, "long")),
                    cmp(">", Expr("cast", (plus,), dtype="long"), lit(3000000000, "long"))), dtype="boolean"),
        Expr("and", (cmp("=", name, lit("a", "string")), flag), dtype="boolean")), dtype="boolean")
    assert found.columns == {0: "id", 1: "s", 2: "name", 3: "flag"}
    assert lower(parse_predicate("Name = 'a'"), {"name": ("NAME", "string")}).columns == {0: "NAME"}
    assert conjuncts(lowered("f = 1 AND d = 1.5 AND i IS NULL").expr) == [
        cmp("=", col(0, "f", "float"), lit(1.0, "float")), cmp("=", col(1, "d", "double"), lit(1.5, "double")),
        Expr("isnull", (col(2, "i", "int"),), dtype="boolean")]
    assert lowered("CASE WHEN flag THEN 'a' END = 'a'").expr.args[0].args[-1] == lit(None, "string")
    assert lowered("name = NULL").expr == cmp("=", col(0, "name", "string"), lit(None, "string"))


def test_a_predicate_not_boolean_says_its_type():
    assert {text: lowered(text).type for text in ("NULL", "1", "3000000000", "'a'", "1.5", "-0.05", "d + 1",
                                                  "name LIKE NULL")} == \
        {"NULL": "void", "1": "integer", "3000000000": "long", "'a'": "string", "1.5": "decimal(2,1)",
         "-0.05": "decimal(2,2)", "d + 1": "double", "name LIKE NULL": "void"}


# --- refusals ----------------------------------------------------------------------------------------------------

REFUSED = [
    ("id > 1.5", "decimal arithmetic and comparisons are Spark's"),
    ("id IN (1, 2.5)", "decimal arithmetic"), ("i BETWEEN 1 AND 10.5", "decimal arithmetic"),
    ("id / 2.0 = 1", "decimal arithmetic"), ("1.5 = 1.5", "decimal arithmetic"),
    ("dec > 5", "coercion of these is not modelled here"), ("id = '7'", "bigint with string"),
    ("ts > '2026-11-02'", "other:timestamp with string"), ("flag = 1", "boolean with int"),
    ("coalesce(ts, ts) IS NULL", "other:timestamp"), ("ts", "the predicate is timestamp, not boolean"),
    ("round(d, 0) = 3", "Round is evaluated by Spark"), ("name RLIKE '^a'", "RegexpLike is evaluated by Spark"),
    ("name ILIKE 'A%'", "ILike"), ("year(ts) = 2026 AND id < 4", "Year"), ("pmod(i, 3) = 1", "pmod()"),
    ("id DIV 2 = 1", "IntDiv"), ("x'ab' = name", "HexString"), ("nullif(i, 1) = 2", "Nullif"),
    ("d % 2 = 1", "% over double"), ("abs(1.5) < d", "abs of decimal"), ("-NULL = 1", "- of void"),
    ("cast(i as smallint) = 1", "only widening numeric casts"), ("cast(1.5 as float) < f", "only widening"),
    ("cast(NULL as int) = 1", "only widening"), ("cast(dec as double) > 1", "only widening"),
    ("cast(2.5 as int) = i", "a literal out of its type's range"), ("99999999999999999999L = id", "out of"),
    ("cast('3.001' as decimal(10,2)) = id", "only widening"),
    ("i IS TRUE", "IS TRUE"), ("NOT i", "NOT of int"), ("i AND flag", "int in a logical operator"),
    ("if(i, 1, 2) = 1", "a condition of int"), ("if(flag, 1.5, 2) > 1", "decimal arithmetic"),
    ("name LIKE name", "LIKE with a pattern that is not a literal"),
    ("startswith(name, name)", "only a literal pattern"),
    ("name LIKE 'a!b' ESCAPE '!'", "a LIKE pattern Spark refuses"), (r"name LIKE 'a\\b'", "refuses"),
    ("name LIKE 'a' ESCAPE 'xy'", "ESCAPE other than one character"),
    ("substring(name, i, 2) = 'a'", "only integer literals as positions and lengths"),
    ("left(name, 2.0) = 'a'", "only integer literals"), ("substring(name, NULL, 2) = 'a'", "only integer"),
    ("substring(name, 3000000000, 1) = 'a'", "beyond an int"),
    ("trim(BOTH 'x' FROM name) = 'a'", "TRIM of given characters"),
    ("i BETWEEN SYMMETRIC 1 AND 2", "BETWEEN SYMMETRIC"),
    ("length(i) = 1", "i is int, not a string"),
]


@pytest.mark.parametrize("text, reason", REFUSED)
def test_refused_for_spark(text, reason):
    with pytest.raises(NotLowered) as refused:
        lowered(text)
    assert reason in str(refused.value)


def test_nested_too_deeply_is_spark_s():
    tree = exp.column("i")
    for _ in range(5000):
        tree = exp.Add(this=tree, expression=exp.Literal.number(1))
    with pytest.raises(NotLowered, match="nested too deeply"):
        lower(exp.GT(this=tree, expression=exp.Literal.number(1)), TYPES)


# --- what test_cli's Spark oracle says ---------------------------------------------------------------------------

@pytest.mark.parametrize("text", [text for text, engine in PREDICATES if engine == "arrow"])
def test_every_predicate_answered_without_spark_lowers_to_a_boolean(text):
    assert lowered(text).type == "boolean"


def refused(text: str) -> bool:
    try:
        lowered(text)
    except NotLowered:
        return True
    return False


def test_the_predicates_left_to_spark_for_their_types_are_refused():
    # lower() and upper() are left to Spark for the rows' non-ASCII text, not for their types.
    assert [text for text, engine in PREDICATES if engine == "spark" and not refused(text)] == \
        ["lower(name) = 'alpha'", "upper(name) = 'CAFÉ'"]


# --- evaluated: what --where answers without Spark is what Spark answers ---------------------------------------

# Beyond test_cli's: coercions, literals, NULLs and refusals at their edges, each evaluated both ways.
MORE = """id = -2.0; id = -(2.0); t = 200.0; t = 1.0; i = 3000000000; i = 99999999999999999999; d = 99999999999999999999
id > 1e2; id / 2.0 = 1; d / 2.0 > 1; f * 1.5 > 2; id % 2.5 = 1; d % 2 = 1; f % 2 = 1; -(1.5) < d; abs(1.5) < d
cast(1.5 as double) < d; cast(2.0 as int) = i; cast(2.5 as int) = i; cast(1.5 as float) < f
cast('3' as decimal(10,2)) = id; cast('3.001' as decimal(10,2)) = id; cast(i as smallint) = 1; cast(i as string) = '1'
cast(NULL as int) = 1; 100Y = t; s + 1Y > 0; s = 2S; 99999999999999999999L = id; CAST(5 AS BIGINT) = id
try_cast(i as bigint) = 1; cast(t as float) = 1; cast(big as float) > 1; cast(i as double) / 2 = 1.5; NULL; 1; 'a'; 1.5
ts; name; NULL IS NULL; 1.5 IS NULL; 1.5 IS NOT NULL; isnull(1.5); NULL IS TRUE; i IS TRUE; NOT i; i AND flag
flag AND NULL; NOT NULL; coalesce(NULL); coalesce(flag, NULL); coalesce(ts, ts) IS NULL; coalesce(dec, 1) = 1
coalesce(f, 1) > 1; coalesce(f, 1.5) > 1; coalesce(i, t, big) > 1; coalesce(f, d) > 1; coalesce(name, 1) = 'a'
if(flag, 1.5, d) > 1; if(flag, 1.5, 2) > 1; if(i, 1, 2) = 1; if(NULL, 1, 2) = 1; if(flag, NULL, NULL)
if(flag, i, f) > 1; if(flag, name, NULL) = 'alpha'; CASE WHEN NULL THEN 1 END = 1; CASE i WHEN 1.0 THEN 'a' END = 'a'
CASE i WHEN 1.5 THEN 'a' END = 'a'; CASE WHEN flag THEN 1 WHEN i > 0 THEN 2.5D END > 1
CASE t WHEN 0 THEN i WHEN 1 THEN big END > 0; name LIKE NULL; name LIKE NULL OR id = 1; startswith(name, NULL) OR id = 1
startswith(name, name); name LIKE name; name LIKE 'a!b' ESCAPE '!'; name LIKE 'a!!b' ESCAPE '!'
name LIKE 'a' ESCAPE 'xy'; name LIKE 'a' ESCAPE NULL; name NOT LIKE 'a!%' ESCAPE '!'; name LIKE 'a' '%'
name LIKE concat('a', '%'); name LIKE 'ü%'; contains(name, ''); substring(name, 1.0, 2) = 'a'
substring(name, i, 2) = 'a'; substring(name, 2L, 2) = 'a'; substring(name, -(2), 1) = 'a'
substring(name, NULL, 2) = 'a'; substring(name, 1, 1) = '日'; left(name, -1) = ''; right(name, -5) = ''
left(name, 2.0) = 'a'; length(NULL) IS NULL; upper(NULL) IS NULL; lower(NULL) IS NULL; concat(name, NULL) IS NULL
concat('a', 'b') = name; name || NULL IS NULL; 'a' || 'b' = name; startswith(name, 'a' || 'b')
trim(BOTH 'x' FROM name) = 'a'; trim(BOTH FROM name) = 'a'; trim(LEADING FROM name) = 'a'; upper(name) = 'A' AND id < 0
length(name) = 2 AND name LIKE '日%'; name < 'b'; name > 'ü'; i BETWEEN SYMMETRIC 1 AND 2; i BETWEEN 1 AND 10.5
id IN (1, NULL); id IN (i, 3); id IN ('a'); name IN (1); flag IN (true, NULL); NULL IN (1, 2); f IN (0.0, 1); d IN (d)
i <=> 1.0; i IS DISTINCT FROM t; i != t; i <> 2.0; f = 1 / 3; id DIV 2 = 1; i & 1 = 1; ~i = 1; x'ab' = name
nullif(i, 1) = 2; pmod(i, 3) = 1; mod(i, 3) = 1; mod(i, 3.0) = 1; -NULL = 1; abs(NULL) = 1; +5 = id; 1 = 1; 1 = NULL
NULL = NULL; 'a' < 'b'; true AND false; true > false; flag = NULL; name = NULL; f = NULL; d <=> NULL; ts IS NOT NULL
isnotnull(ts); isnull(dec); dec IS NULL AND id > 3; ts = ts; dec = dec; ts IN (ts); length(name) = 2L
length(name) = 2.0; s * t > 100; s * s > 0; t * t > 0; big - 1 < 0; big * 2 > 0; big + big > 0; id * 1000000000000 > 0
f + d > 3; f * f > 1; f + 1.5D > 3; i / t > 1; i % t = 0; i % 3 = -1; -f < -5; -t < 0; -t = 2; abs(f) > 1; abs(t) > 1
abs(t) = 2; 1.5 = 1.5; 1.5 + 1 = 2; 1.5D + 1 = 2.5; 1e1 = 10; -1e1 < 0; .5 < d; 5. = id; 1.5e-3 < d
cast(t as tinyint) = 1; cast(t as bigint) = 1; cast(i as float) > 1; cast(big as double) > 1; cast(dec as double) > 1
cast(ts as string) = 'a'; flag = 1; flag > false; name > 1; id = true; 2147483647 + 1 > 0; 1 / 0 > 0; i / 0 > 1
d / 0.0 > 1; -(-2147483648) > 0; -(-9223372036854775808) > 0; 9223372036854775807 + 1 > 0; abs(-2147483648) > 0
1 % 0 = 0; -(5) + 1 = -4; abs(-5) = 5; 5 % 3 = 2; -7 % 3 = -1; 1.5D / 2 > 0; NULL <=> NULL; NOT NULL IS NULL
cast(5 as double) = 5; 1 IN (1, 2); NULL IN (1, 2) IS NULL; coalesce(NULL, 1) = 1; if(true, 1, 2) = 1
CASE WHEN true THEN 'a' END = 'a'; length('ab') = 2; trim(' a ') = 'a'; ltrim(NULL) IS NULL; upper('a') = 'A'
lower('A') = 'a'""".replace("\n", "; ").split("; ")
# Over literals only, the evaluator computes these value by value and leaves them to Spark (NotExact).
LITERAL_ONLY = ["startswith('abc', 'a')", "endswith('abc', 'c')", "contains('abc', 'b')",
                "startswith(NULL, 'a') IS NULL", "endswith(NULL, 'a') IS NULL", "contains(NULL, 'a') IS NULL",
                "'abc' LIKE 'a%'", "NULL LIKE 'a%' IS NULL", "substring('abc', 1, 2) = 'ab'",
                "substring(NULL, 1, 2) IS NULL"]


def answered_here(sink: str, text: str) -> list[int] | None:
    """The rids ``--where`` selects without Spark (``headwater.spark.sql`` then ``headwater.spark.evaluate``), or
    None where it leaves the predicate to Spark or refuses it."""
    try:
        return where.check(sink, text).select(10_000, fallback=False).rids
    except where.NothingSelected:
        return []
    except WhereError:  # NeedsSpark, or a predicate that is not boolean
        return None


@pytest.mark.spark
def test_what_is_answered_without_spark_is_what_spark_answers(spark, tmp_path):
    """Every edge case (coercions, literals, NULLs, overflow, division by zero, refusals) that ``--where`` answers
    itself, against Spark's own evaluation over the same sink; one Spark job for all, then one per predicate to
    name any Spark fails on (which ``--where`` must have left to Spark)."""
    from tests.cli.test_cli import spark_rids, spark_selections, write_sink

    sink = write_sink(tmp_path / "sink", sink_rows(90, NAMES))
    answered = {text: found for text in MORE + LITERAL_ONLY if (found := answered_here(sink, text)) is not None}
    assert len(answered) > 140, sorted(set(MORE) - set(answered))
    try:
        expected = spark_selections(spark, sink, list(answered))
    except Exception:  # a predicate Spark fails on: name it
        expected = {text: spark_rids(spark, sink, text) for text in answered}
    assert {t: found for t, found in answered.items() if expected[t] != found} == {}
