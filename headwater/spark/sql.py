"""A ``--where`` predicate lowered from SQL to an ``Expr`` tree, as Spark's analyzer resolves it.

    from headwater.spark.sql import NotLowered, lower

    lowered = lower(tree, {"id": ("ID", "bigint"), "name": ("name", "string")})
    lowered.expr      # (ID#0 = 7), the 7 a bigint literal: every coercion explicit
    lowered.type      # "boolean"; another type is a predicate the caller refuses (a bare NULL is "void")
    lowered.columns   # {0: "ID"}: the exprId given to each column read, and the column's name in the table

The tree is sqlglot's, in Spark's dialect, as ``headwater.query.predicate.parse_predicate`` checks it;
``types`` maps each column's lower-cased name to its name in the table and its Spark ``simpleString`` type.
Lowering types each literal as Spark's parser does (``_number``: int, then bigint, else decimal; with an
exponent double; ``-5`` one literal; ``5L``, ``4S``, ``5Y``, ``1.5D``, ``3BD``), and casts each operand to the
type Spark's coercion gives all of them (``_common``), so the evaluator over the tree coerces nothing itself.
A decimal is only ever a literal here: beside a float or a double it is that double, in a comparison with
integers an integral one is the integer it is, and anything else with it is Spark's. A column of a type other
than the numeric ones, string and boolean may only be tested for NULL.

What Spark must evaluate instead raises ``NotLowered`` with the reason: a function or an operator not
modelled here, a coercion not modelled here (a string beside a number), a narrowing cast, a pattern or a
position that is not a literal, ``TRIM`` of given characters, ``BETWEEN SYMMETRIC``, a LIKE pattern Spark
refuses. What only the rows tell (an overflow, a division by zero, NaN, non-ASCII text under ``lower``) is the
evaluator's to raise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from .expr import FALSE, TRUE, Expr, cmp, col, lit, type_name
from .semantics import NotEvaluable, like_regex

_NUMERIC = ("tinyint", "smallint", "int", "bigint", "float", "double")  # Spark's numeric precedence
_INTEGRAL = _NUMERIC[:4]
_FLOATING = _NUMERIC[4:]
_BOUNDS = {"tinyint": 1 << 7, "smallint": 1 << 15, "int": 1 << 31, "bigint": 1 << 63}
_EXACT = {"float": 1 << 24, "double": 1 << 53}  # integers every float (double) holds exactly
_CAST_TYPES = {"TINYINT": "tinyint", "SMALLINT": "smallint", "INT": "int", "BIGINT": "bigint", "FLOAT": "float",
               "DOUBLE": "double", "DECIMAL": "decimal"}
_CHOSEN = (*_NUMERIC, "string", "boolean")  # what coalesce, if and case may choose between
_MAX_INT = (1 << 31) - 1
_COMPARISONS = {"EQ": "=", "GT": ">", "GTE": ">=", "LT": "<", "LTE": "<="}
_ARITHMETIC = {"Add": "+", "Sub": "-", "Mul": "*"}
_AFFIXES = {"StartsWith": "startswith", "EndsWith": "endswith", "Contains": "contains"}
_TRIMS = {"LEADING": "ltrim", "TRAILING": "rtrim"}


class NotLowered(Exception):
    """Not lowered exactly here: Spark must evaluate it (carries a readable reason)."""


@dataclass(frozen=True)
class Lowered:
    expr: Expr  # the predicate
    type: str  # its Spark JSON type: "boolean", "void" (a bare NULL), "integer", "string", "decimal(2,1)"…
    columns: dict[int, str]  # exprId given to each column read -> the column's name in the table


def lower(tree, types: dict[str, tuple[str, str]]) -> Lowered:
    """``tree`` as an ``Expr`` with Spark's coercions explicit (module docstring), else ``NotLowered``."""
    lowering = _Lowering(types)
    try:
        found = lowering.lower(tree)
    except RecursionError:
        raise NotLowered("nested too deeply to evaluate here") from None
    if found.type.startswith("other:"):
        raise NotLowered(f"the predicate is {found.type[len('other:'):]}, not boolean")
    return Lowered(found.expr, _json_type(found), dict(lowering.columns))


@dataclass(frozen=True)
class _Typed:
    """A lowered operand and its type in Spark's ``simpleString`` words: one of ``_NUMERIC``, string, boolean,
    decimal (a literal's only), void (NULL), or ``other:`` a column's other type (only NULL tests take it)."""

    expr: Expr
    type: str

    @property
    def literal(self) -> bool:
        return self.expr.op == "lit"

    @property
    def value(self) -> Any:
        return self.expr.value


_NULL = _Typed(lit(None, "void"), "void")


def _json_type(v: _Typed) -> str:
    return str(v.expr.dtype) if v.type == "decimal" else str(type_name(v.type))


@dataclass
class _Lowering:
    """One predicate's lowering, node by node (``_`` and sqlglot's class name); ``ids`` are the exprIds given
    to its columns so far, by lower-cased name."""

    types: dict[str, tuple[str, str]]
    columns: dict[int, str] = field(default_factory=dict)
    ids: dict[str, int] = field(default_factory=dict)

    def lower(self, node) -> _Typed:
        handler = getattr(self, f"_{type(node).__name__}", None)
        if handler is None:
            raise NotLowered(f"{type(node).__name__} is evaluated by Spark")
        return handler(node)

    # Coercion, as Spark's analyzer does it.
    def _common(self, operands: list[_Typed], compare: bool) -> str:
        """The type Spark casts all of ``operands`` to (``NotLowered`` where it is not modelled here)."""
        kinds = {o.type for o in operands} - {"void"}
        if not kinds:
            return "boolean"
        if kinds == {"string"} or kinds == {"boolean"}:
            return next(iter(kinds))
        if not kinds <= {*_NUMERIC, "decimal"}:
            raise NotLowered(f"{' with '.join(sorted(kinds))}: Spark's coercion of these is not modelled here")
        plain = kinds - {"decimal"}
        if "decimal" not in kinds:
            return max(plain, key=_NUMERIC.index)
        if plain & set(_FLOATING):
            return "double"  # Spark casts a decimal to double beside a float or double
        decimals = [o.value for o in operands if o.type == "decimal"]
        if compare and plain and all(d == d.to_integral_value() and -(1 << 63) <= d < 1 << 63 for d in decimals):
            # An integral decimal compares with integers as the integer it is.
            return max(plain | {_integral_type(int(d)) for d in decimals}, key=_NUMERIC.index)
        raise NotLowered("decimal arithmetic and comparisons are Spark's")

    def _as(self, v: _Typed, to: str) -> Expr:
        """``v`` cast to ``to`` (a type ``_common`` gave): a literal folded where the value stays exact."""
        if v.type == "void":
            return lit(None, type_name(to))
        if v.type == "decimal":
            return _decimal_as(v.value, to)
        if v.type == to:
            return v.expr
        if v.literal and v.type in _INTEGRAL and (to in _INTEGRAL or abs(v.value) <= _EXACT.get(to, 0)):
            return lit(v.value if to in _INTEGRAL else float(v.value), type_name(to))
        return Expr("cast", (v.expr,), dtype=type_name(to))

    def _coerced(self, operands: list[_Typed], compare: bool) -> tuple[str, list[Expr]]:
        to = self._common(operands, compare)
        return to, [self._as(o, to) for o in operands]

    def _boolean(self, v: _Typed, refusal: str) -> Expr:
        """``v`` as a boolean operand, else ``NotLowered`` with ``refusal`` naming its type (``{}``)."""
        if v.type not in ("boolean", "void"):
            raise NotLowered(refusal.format(v.type))
        return self._as(v, "boolean")

    # Leaves.
    def _Paren(self, node) -> _Typed:
        return self.lower(node.this)

    def _Column(self, node) -> _Typed:
        if node.table:
            raise NotLowered(f"{node.sql('spark')}: qualified names and struct fields are resolved by Spark")
        key = node.name.lower()
        if key not in self.types:
            raise NotLowered(f"no column {node.name!r} read here")
        name, spark_type = self.types[key]
        expr_id = self.ids.setdefault(key, len(self.ids))
        self.columns[expr_id] = name
        kind = spark_type if spark_type in (*_NUMERIC, "string", "boolean") else f"other:{spark_type}"
        return _Typed(col(expr_id, name, spark_type), kind)

    def _Literal(self, node) -> _Typed:
        if node.is_string:
            return _Typed(lit(node.this, "string"), "string")
        return _number(node.this)

    def _Boolean(self, node) -> _Typed:
        return _Typed(lit(bool(node.this), "boolean"), "boolean")

    def _Null(self, node) -> _Typed:
        return _NULL

    # Logic (Kleene: NULL is unknown).
    def _logic(self, node, op: str) -> _Typed:
        # A chain of ANDs (or ORs) at once, not one level of recursion per operator.
        operands = [self._boolean(self.lower(x), "{} in a logical operator") for x in node.flatten()]
        result = operands[0]
        for operand in operands[1:]:
            result = Expr(op, (result, operand), dtype="boolean")
        return _Typed(result, "boolean")

    def _And(self, node) -> _Typed:
        return self._logic(node, "and")

    def _Or(self, node) -> _Typed:
        return self._logic(node, "or")

    def _Not(self, node) -> _Typed:
        if type(node.this).__name__ == "Is" and type(node.this.expression).__name__ == "Null":
            return self._null_test(node.this.this, "isnotnull")  # sqlglot's IS NOT NULL
        return _Typed(Expr("not", (self._boolean(self.lower(node.this), "NOT of {}"),), dtype="boolean"), "boolean")

    # Comparisons.
    def _compare(self, op: str, left: _Typed, right: _Typed) -> Expr:
        _, (a, b) = self._coerced([left, right], compare=True)
        return cmp(op, a, b)

    def _comparison(self, node) -> _Typed:
        left, right = self.lower(node.this), self.lower(node.expression)
        return _Typed(self._compare(_COMPARISONS[type(node).__name__], left, right), "boolean")

    _EQ = _GT = _GTE = _LT = _LTE = _comparison

    def _NEQ(self, node) -> _Typed:
        left, right = self.lower(node.this), self.lower(node.expression)
        return _Typed(Expr("not", (self._compare("=", left, right),), dtype="boolean"), "boolean")

    def _NullSafeEQ(self, node) -> _Typed:
        return _Typed(self._compare("<=>", self.lower(node.this), self.lower(node.expression)), "boolean")

    def _NullSafeNEQ(self, node) -> _Typed:
        return _Typed(Expr("not", (self._NullSafeEQ(node).expr,), dtype="boolean"), "boolean")

    def _Between(self, node) -> _Typed:
        if node.args.get("symmetric"):
            raise NotLowered("BETWEEN SYMMETRIC")
        value, low, high = self.lower(node.this), self.lower(node.args["low"]), self.lower(node.args["high"])
        above, below = self._compare(">=", value, low), self._compare("<=", value, high)
        return _Typed(Expr("and", (above, below), dtype="boolean"), "boolean")

    def _In(self, node) -> _Typed:
        if node.args.get("query") or node.args.get("unnest") or node.args.get("field"):
            raise NotLowered("IN over anything but a list")
        value = self.lower(node.this)
        items = [self.lower(x) for x in node.expressions]
        if not items:
            raise NotLowered("an empty IN list")
        _, args = self._coerced([value, *items], compare=True)
        return _Typed(Expr("in", tuple(args), dtype="boolean"), "boolean")

    def _Is(self, node) -> _Typed:
        target = type(node.expression).__name__
        if target == "Null":
            return self._null_test(node.this, "isnull")
        value = self.lower(node.this)
        if target == "Boolean" and value.type in ("boolean", "void"):
            return _Typed(cmp("<=>", self._as(value, "boolean"), lit(bool(node.expression.this), "boolean")),
                          "boolean")
        raise NotLowered(f"IS {node.expression.sql('spark')}")

    def _null_test(self, node, op: str) -> _Typed:
        value = self.lower(node)
        if value.type == "decimal":  # a literal: never NULL
            return _Typed(FALSE if op == "isnull" else TRUE, "boolean")
        return _Typed(Expr(op, (value.expr,), dtype="boolean"), "boolean")

    def _Anonymous(self, node) -> _Typed:
        name = node.name.lower()
        if name in ("isnull", "isnotnull") and len(node.expressions) == 1:
            return self._null_test(node.expressions[0], name)
        raise NotLowered(f"{name}() is evaluated by Spark")

    # Arithmetic.
    def _arithmetic(self, node) -> _Typed:
        to, args = self._coerced([self.lower(node.this), self.lower(node.expression)], compare=False)
        if to not in _NUMERIC:
            raise NotLowered(f"arithmetic over {to}")
        return _Typed(Expr(_ARITHMETIC[type(node).__name__], tuple(args), dtype=type_name(to)), to)

    _Add = _Sub = _Mul = _arithmetic

    def _Div(self, node) -> _Typed:
        left, right = self.lower(node.this), self.lower(node.expression)
        if self._common([left, right], compare=False) not in _NUMERIC:  # refuses decimal division too
            raise NotLowered("/ over what is not a number")
        return _Typed(Expr("/", (self._as(left, "double"), self._as(right, "double")), dtype="double"), "double")

    def _Mod(self, node) -> _Typed:
        to, args = self._coerced([self.lower(node.this), self.lower(node.expression)], compare=False)
        if to not in _INTEGRAL:
            raise NotLowered(f"% over {to}")
        return _Typed(Expr("%", tuple(args), dtype=type_name(to)), to)

    def _Neg(self, node) -> _Typed:
        if type(node.this).__name__ == "Literal" and not node.this.is_string:
            return _number(node.this.this, negative=True)  # Spark's grammar reads -5 as one literal
        inner = self.lower(node.this)
        if inner.type == "decimal":
            return _Typed(lit(-inner.value, inner.expr.dtype), "decimal")
        if inner.type not in _NUMERIC:
            raise NotLowered(f"- of {inner.type}")
        if inner.literal and (inner.type in _FLOATING or -inner.value < _BOUNDS[inner.type]):
            return _Typed(lit(-inner.value, inner.expr.dtype), inner.type)  # -(5): still a literal, as -5 is
        return _Typed(Expr("neg", (inner.expr,), dtype=inner.expr.dtype), inner.type)

    def _Abs(self, node) -> _Typed:
        inner = self.lower(node.this)
        if inner.type not in _NUMERIC:
            raise NotLowered(f"abs of {inner.type}")
        return _Typed(Expr("abs", (inner.expr,), dtype=inner.expr.dtype), inner.type)

    def _cast(self, node) -> _Typed:
        to_type = node.args["to"]
        to = _CAST_TYPES.get(to_type.this.name)
        inner = self.lower(node.this)
        if to == "decimal" and inner.literal and inner.type == "string":
            found = _decimal_text(inner.value, [int(p.this.this) for p in to_type.expressions] or [10, 0])
            if found is not None:
                return found  # 3BD, or a CAST of digits that fit the type as they are
        if inner.literal and inner.type == "decimal" and to in ("double", *_INTEGRAL):
            return _decimal_cast(inner.value, to, node)
        if inner.type in _NUMERIC and to in _NUMERIC and _NUMERIC.index(to) >= _NUMERIC.index(inner.type):
            return _Typed(self._as(inner, to), to)  # widening: exact, or rounded as Java does
        raise NotLowered(f"{node.sql('spark')}: only widening numeric casts are evaluated here")

    _Cast = _TryCast = _cast  # sqlglot reads Spark's CAST (and the 5L, 1.5D, 3BD literals) as TryCast

    # Strings.
    def _string(self, node) -> _Typed:
        found = self.lower(node)
        if found.type not in ("string", "void"):
            raise NotLowered(f"{node.sql('spark')} is {found.type}, not a string")
        return _Typed(self._as(found, "string"), "string") if found.type == "void" else found

    def _literal_int(self, node) -> int:
        found = self.lower(node)
        if not found.literal or found.type not in _INTEGRAL:
            raise NotLowered(f"{node.sql('spark')}: only integer literals as positions and lengths")
        if not -_MAX_INT - 1 <= found.value <= _MAX_INT:
            raise NotLowered(f"{node.sql('spark')}: a position or a length beyond an int")
        return found.value

    def _Length(self, node) -> _Typed:
        return _Typed(Expr("length", (self._string(node.this).expr,), dtype="integer"), "int")

    def _string_function(self, op: str, *args: Expr) -> _Typed:
        return _Typed(Expr(op, args, dtype="string"), "string")

    def _Lower(self, node) -> _Typed:
        return self._string_function("lower", self._string(node.this).expr)

    def _Upper(self, node) -> _Typed:
        return self._string_function("upper", self._string(node.this).expr)

    def _Trim(self, node) -> _Typed:
        if node.args.get("expression") is not None or node.args.get("collation") is not None:
            raise NotLowered("TRIM of given characters")
        op = _TRIMS.get(str(node.args.get("position") or "").upper(), "trim")
        return self._string_function(op, self._string(node.this).expr)

    def _substring(self, inner: _Typed, start: int, length: int) -> _Typed:
        return self._string_function("substring", inner.expr, lit(start, "integer"), lit(length, "integer"))

    def _Substring(self, node) -> _Typed:
        inner = self._string(node.this)
        start = self._literal_int(node.args["start"]) if node.args.get("start") is not None else 1
        length = self._literal_int(node.args["length"]) if node.args.get("length") is not None else _MAX_INT
        return self._substring(inner, start, length)

    def _Left(self, node) -> _Typed:
        inner, count = self._string(node.this), self._literal_int(node.expression)
        return self._substring(inner, 1, count)

    def _Right(self, node) -> _Typed:
        inner, count = self._string(node.this), self._literal_int(node.expression)
        return self._substring(inner, -count, _MAX_INT) if count > 0 else self._substring(inner, 1, 0)

    def _concat(self, parts: list) -> _Typed:
        args = [self._string(p) for p in parts]
        if all(a.literal for a in args):  # 'it''s': Spark's parser joins adjacent literals into one
            values = [a.value for a in args]
            return _Typed(lit(None if None in values else "".join(values), "string"), "string")
        return self._string_function("concat", *(a.expr for a in args))

    def _Concat(self, node) -> _Typed:
        return self._concat(node.expressions)

    def _DPipe(self, node) -> _Typed:
        return self._concat([node.this, node.expression])

    def _pattern(self, node, refusal: str) -> str | None:
        found = self._string(node)
        if not found.literal:
            raise NotLowered(refusal)
        return found.value

    def _affix(self, node) -> _Typed:
        inner = self._string(node.this)
        pattern = self._pattern(node.expression, f"{node.sql('spark')}: only a literal pattern")
        if pattern is None:
            return _NULL
        op = _AFFIXES[type(node).__name__]
        return _Typed(Expr(op, (inner.expr, lit(pattern, "string")), dtype="boolean"), "boolean")

    _StartsWith = _EndsWith = _Contains = _affix

    def _like(self, like, escape: str) -> _Typed:
        inner = self._string(like.this)
        pattern = self._pattern(like.expression, "LIKE with a pattern that is not a literal")
        if pattern is None:
            return _NULL
        try:
            like_regex(pattern, escape)
        except NotEvaluable:
            raise NotLowered("a LIKE pattern Spark refuses") from None
        found = Expr("like", (inner.expr, lit(pattern, "string")), value=escape, dtype="boolean")
        if like.args.get("negate"):
            found = Expr("not", (found,), dtype="boolean")
        return _Typed(found, "boolean")

    def _Like(self, node) -> _Typed:
        return self._like(node, "\\")

    def _Escape(self, node) -> _Typed:
        escape = self.lower(node.expression)
        if type(node.this).__name__ != "Like" or not escape.literal or escape.type != "string" \
                or escape.value is None or len(escape.value) != 1:
            raise NotLowered("ESCAPE other than one character after LIKE")
        return self._like(node.this, escape.value)

    # Nulls and conditions.
    def _Coalesce(self, node) -> _Typed:
        operands = [self.lower(x) for x in [node.this, *node.expressions]]
        if all(o.type == "void" for o in operands):
            return _NULL  # Spark types it VOID: a predicate of it is refused, not FALSE
        to, args = self._coerced(operands, compare=False)
        if to not in _CHOSEN:
            raise NotLowered(f"coalesce of {to}")
        return _Typed(Expr("coalesce", tuple(args), dtype=type_name(to)), to)

    def _choose(self, op: str, branches: list[tuple[_Typed, _Typed]], otherwise: _Typed) -> _Typed:
        if all(v.type == "void" for _, v in branches) and otherwise.type == "void":
            return _NULL  # Spark types it VOID, as coalesce(NULL)
        to = self._common([v for _, v in branches] + [otherwise], compare=False)
        if to not in _CHOSEN:
            raise NotLowered(f"a condition choosing {to}")
        args: list[Expr] = []
        for condition, value in branches:
            if condition.type not in ("boolean", "void"):
                raise NotLowered(f"a condition of {condition.type}")
            args += [self._as(condition, "boolean"), self._as(value, to)]
        return _Typed(Expr(op, (*args, self._as(otherwise, to)), dtype=type_name(to)), to)

    def _If(self, node) -> _Typed:
        branch = (self.lower(node.this), self.lower(node.args["true"]))
        otherwise = self.lower(node.args["false"]) if node.args.get("false") is not None else _NULL
        return self._choose("if", [branch], otherwise)

    def _Case(self, node) -> _Typed:
        subject = self.lower(node.this) if node.this is not None else None
        branches = []
        for branch in node.args.get("ifs") or []:
            condition = self.lower(branch.this) if subject is None else \
                _Typed(self._compare("=", subject, self.lower(branch.this)), "boolean")
            if condition.type == "void":  # IF(NULL, …) is taken as FALSE, CASE WHEN NULL refused
                raise NotLowered("CASE WHEN NULL: Spark wants a boolean condition")
            branches.append((condition, self.lower(branch.args["true"])))
        default = node.args.get("default")
        return self._choose("case", branches, self.lower(default) if default is not None else _NULL)


def _integral_type(value: int) -> str:
    return next(t for t in ("int", "bigint") if -_BOUNDS[t] <= value < _BOUNDS[t])


def _decimal(value: Decimal, dtype: str | None = None) -> _Typed:
    """A decimal literal; its type is Spark's for its digits unless a cast gave it one."""
    if dtype is None:
        digits, exponent = value.as_tuple()[1:]
        scale = max(-int(exponent), 0)
        dtype = f"decimal({max(len(digits) + max(int(exponent), 0), scale)},{scale})"
    return _Typed(lit(value, dtype), "decimal")


def _number(text: str, negative: bool = False) -> _Typed:
    """A numeric literal typed as Spark's parser types it: int, then bigint, else decimal; with an
    exponent, double (Spark 4)."""
    sign = "-" if negative else ""
    if re.fullmatch(r"\d+", text):
        value = int(sign + text)
        if -(1 << 63) <= value < 1 << 63:
            kind = _integral_type(value)
            return _Typed(lit(value, type_name(kind)), kind)
        return _decimal(Decimal(sign + text))
    if re.fullmatch(r"(\d+\.?\d*|\.\d+)[eE][+-]?\d+", text):
        return _Typed(lit(float(sign + text), "double"), "double")
    if re.fullmatch(r"\d+\.\d*|\.\d+", text):
        return _decimal(Decimal(sign + text))
    raise NotLowered(f"the literal {text}")


def _decimal_as(value: Decimal, to: str) -> Expr:
    """A decimal literal as the type ``_common`` gave it."""
    if to in _FLOATING:
        return lit(float(value), to)
    if to in _INTEGRAL and value == value.to_integral_value():
        return lit(int(value), type_name(to))
    raise NotLowered(f"a decimal literal as {to}")


def _decimal_text(text: str | None, params: list[int]) -> _Typed | None:
    """``CAST('digits' AS DECIMAL(p, s))`` as a decimal literal, where the digits fit the type as they are."""
    if text is None or not re.fullmatch(r"\d+(\.\d*)?", text):
        return None
    value, (precision, scale) = Decimal(text), params
    if value == value.quantize(Decimal(1).scaleb(-scale)) and value.adjusted() < precision - scale:
        return _decimal(value, f"decimal({precision},{scale})")
    return None


def _decimal_cast(value: Decimal, to: str, node) -> _Typed:
    """A decimal literal cast to double (1.5D: the double nearest the digits, as Java parses them) or to an
    integral type (``CAST(2.0 AS INT)``; ``99999999999999999999L``, a decimal by its size, is out of range)."""
    if to == "double":
        return _Typed(lit(float(value), "double"), "double")
    if value == value.to_integral_value() and -_BOUNDS[to] <= int(value) < _BOUNDS[to]:
        return _Typed(lit(int(value), type_name(to)), to)
    raise NotLowered(f"{node.sql('spark')}: a literal out of its type's range")
