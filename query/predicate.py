"""What ``--dataset SINK --where SQL`` may say, checked before any file is read or JVM starts: the sink's name
(``parse_dataset``) and the predicate (``parse_predicate``, sqlglot in Spark's dialect), refused with the character
position where it goes wrong (``WhereError``). ``where`` evaluates a checked predicate over a sink's rows with pyarrow,
``sink`` with Spark; both check it here first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import LineageError, UnknownRow

RID_COLUMN = "_hw_rid"
READABLE = ("parquet", "json", "orc")  # file sinks read back with their schema
MAX_SELECTED = 1000  # rows a predicate may select; more is refused, not cut
MAX_PREDICATE = 4096  # characters
MAX_DATASET = 4096  # characters: a path as long as Linux allows
# Functions a predicate may call: comparisons, logic, arithmetic, strings, dates, nulls, casts.
FUNCTIONS = frozenset("""
abs acos asin atan ceil ceiling cos exp floor ln log log10 log2 mod pmod pow power round bround sign signum sin sqrt tan
greatest least isnull isnotnull isnan nvl nvl2 coalesce ifnull nullif if between
lower upper lcase ucase length char_length character_length trim ltrim rtrim substr substring substring_index left right
concat concat_ws replace instr locate position lpad rpad reverse startswith endswith contains like ilike rlike regexp
regexp_like split_part format_number initcap
date to_date to_timestamp timestamp year month day dayofmonth dayofweek dayofyear hour minute second weekofyear
quarter date_add date_sub datediff add_months months_between date_trunc trunc unix_timestamp from_unixtime
current_date current_timestamp now make_date
cast int bigint smallint tinyint double float string boolean decimal
array_contains size element_at
""".split())

_TABLE_NAME = re.compile(r"(?:[A-Za-z_][A-Za-z0-9_]*|`[^`]+`)(?:\.(?:[A-Za-z_][A-Za-z0-9_]*|`[^`]+`)){0,2}")


class WhereError(LineageError):
    """A ``--dataset``/``--where`` refused or failed; ``details`` are further keys for the error record
    (``position``: the character, from 0, where the predicate goes wrong)."""

    def __init__(self, message: str, **details):
        super().__init__(message)
        self.details = details


class NothingSelected(WhereError, UnknownRow):
    """The predicate holds for none of the sink's rows."""


@dataclass(frozen=True)
class Sink:
    kind: str  # parquet, json, orc or table
    location: str  # a path (or URI), or a table's name

    def __str__(self) -> str:
        return f"{self.kind}:{self.location}"


def parse_dataset(text: str) -> Sink:
    """A sink as lineage names it (``parquet:PATH``…, ``table:NAME``), else ``WhereError``."""
    forms = ", ".join(k + ":PATH" for k in READABLE) + " or table:NAME"
    if not isinstance(text, str) or not text.strip():
        raise WhereError(f"--dataset names a sink: {forms}")
    if len(text) > MAX_DATASET:
        raise WhereError(f"--dataset is {len(text)} characters long; at most {MAX_DATASET}")
    bad = next((i for i, c in enumerate(text) if ord(c) < 32 or ord(c) == 127), None)
    if bad is not None:
        raise WhereError(f"--dataset holds a control character at position {bad}", position=bad)
    kind, _, location = text.partition(":")
    if kind == "table" and _TABLE_NAME.fullmatch(location):
        return Sink(kind, location)
    if kind in READABLE and location:
        return Sink(kind, location)
    if kind == "table":
        raise WhereError(f"{text!r}: a table is named table:NAME (NAME as db.table, letters, digits and _, "
                         f"or `quoted`)")
    raise WhereError(f"{text!r}: give a sink as lineage names it, one of {forms}")


def parse_predicate(text: str):
    """The predicate's sqlglot expression (Spark's dialect), checked; else ``WhereError``."""
    if not isinstance(text, str) or not text.strip():
        raise WhereError(f"--where needs one SQL expression of at most {MAX_PREDICATE} characters")
    if len(text) > MAX_PREDICATE:
        raise WhereError(f"--where is {len(text)} characters long; it needs one SQL expression of at most "
                         f"{MAX_PREDICATE} characters")
    import sqlglot
    from sqlglot import exp
    from sqlglot.errors import ParseError, TokenError

    dialect = sqlglot.Dialect.get_or_raise("spark")
    try:
        tokens = dialect.tokenize(text)
    except TokenError as exc:
        found = re.search(r"from \d+:(\d+)", str(exc.__cause__ or ""))
        position = int(found.group(1)) if found else getattr(exc, "start", None)
        raise WhereError(f"--where is not a SQL expression: {str(exc.__cause__ or exc)[:200]}"
                         + (f" (at position {position})" if position is not None else ""),
                         **({"position": position} if position is not None else {})) from None
    semicolon = next((t for t in tokens if t.token_type == sqlglot.TokenType.SEMICOLON), None)
    if semicolon is not None:
        raise WhereError(f"--where is not a SQL expression: ';' at position {semicolon.start} ends a statement",
                         position=semicolon.start)
    try:
        trees = dialect.parser().parse(tokens, text)
    except ParseError as exc:
        error = (exc.errors or [{}])[0]
        near = error.get("highlight") or ""
        position = _offset(text, error.get("line"), error.get("col"), near)
        what = error.get("description") or str(exc).splitlines()[0]
        what = "an operand is missing" if what.startswith("Required keyword") else \
            "unexpected token" if what.startswith("Invalid expression") else what
        what += f" near {near!r}" if near else ""
        raise WhereError(f"--where is not a SQL expression: {what}"
                         + (f" (at position {position})" if position is not None else ""),
                         **({"position": position} if position is not None else {})) from None
    except RecursionError:
        raise WhereError("--where is nested too deeply") from None
    if len(trees) != 1 or trees[0] is None:
        raise WhereError("--where is not a SQL expression: it holds no expression, or several")
    _refuse(trees[0], text, exp)
    return trees[0]


def _offset(text: str, line, col, highlight: str) -> int | None:
    """The character offset of a parser error's token (sqlglot gives its line and the column of its end)."""
    if not line or not col:
        return None
    lines = text.split("\n")
    start = sum(len(x) + 1 for x in lines[:line - 1]) + col - len(highlight)
    return max(0, min(start, len(text)))


def node_position(node) -> dict:
    """``{"position": …}`` of a sqlglot node where its place in the text is known (``WhereError``'s details)."""
    start = (node.meta or {}).get("start")
    return {} if start is None else {"position": start}


def _refuse(tree, text: str, exp) -> None:
    """``WhereError`` unless the tree only tests the sink's own columns with value functions."""
    structure = (exp.Column, exp.Identifier, exp.Literal, exp.Boolean, exp.Null, exp.Paren, exp.And, exp.Or, exp.Not,
                 exp.Xor, exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ, exp.NullSafeNEQ, exp.Is,
                 exp.In, exp.Between, exp.Like, exp.ILike, exp.RegexpLike, exp.Escape, exp.Add, exp.Sub, exp.Mul,
                 exp.Div, exp.Mod, exp.IntDiv, exp.Neg, exp.BitwiseAnd, exp.BitwiseOr, exp.BitwiseXor,
                 exp.BitwiseNot, exp.DataType, exp.DataTypeParam, exp.Interval, exp.Bracket, exp.Dot, exp.DPipe,
                 exp.Tuple, exp.HexString, exp.Collate)
    syntax = (exp.Cast, exp.TryCast, exp.Case, exp.If, exp.Trim, exp.Substring, exp.StrPosition)
    beyond = (exp.Subquery, exp.Query, exp.Exists, exp.Lateral, exp.Lambda, exp.Placeholder, exp.Parameter,
              exp.Star, exp.Window)
    predicates = (exp.Is, exp.In, exp.Between, exp.Like, exp.ILike, exp.RegexpLike, exp.Escape)
    operands = (*predicates, exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ, exp.NullSafeNEQ,
                exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod, exp.IntDiv, exp.Neg, exp.DPipe, exp.BitwiseAnd,
                exp.BitwiseOr, exp.BitwiseXor, exp.BitwiseNot)
    for node in tree.walk():
        name = type(node).__name__
        if isinstance(node, predicates) and not isinstance(node.parent, exp.Escape):
            holder = node.parent
            while isinstance(holder, exp.Not):  # NOT IN, NOT LIKE, IS NOT NULL
                holder = holder.parent
            if isinstance(holder, operands):  # Spark's grammar: one predicate on a value, `a IN (1) IS NULL` refused
                first = node  # the predicate's place: its leftmost token's, the first that sqlglot placed
                while isinstance(first, exp.Expression) and not node_position(first):
                    first = first.this
                raise WhereError(f"--where is not a SQL expression: {node.sql('spark')!r} is tested again without "
                                 f"parentheses, which Spark's parser refuses",
                                 **(node_position(first) if isinstance(first, exp.Expression) else {}))
        if isinstance(node, beyond):
            raise WhereError(f"--where may only test the sink's own columns: {name} is not allowed",
                             **node_position(node))
        if isinstance(node, exp.Alias):
            raise WhereError(f"--where is not a SQL expression: unexpected {node.alias!r} after it"
                             + (f" (at position {node.args['alias'].meta['start']})"
                                if (node.args["alias"].meta or {}).get("start") is not None else ""),
                             **node_position(node.args["alias"]))
        if isinstance(node, structure):  # before functions: sqlglot makes AND, OR and mod() functions too
            continue
        if isinstance(node, exp.Func):
            called = _called(node, text)
            if isinstance(node.parent, exp.Dot):
                raise WhereError(f"--where may not call {node.parent.sql('spark')!r}: only built-in value "
                                 f"functions, by their plain names", **node_position(node))
            if called is None:  # special syntax (CAST, CASE, TRIM(… FROM …)), or a node sqlglot made itself
                if isinstance(node, syntax) or _synthesized(node, exp) or \
                        any(n.lower() in FUNCTIONS for n in type(node).sql_names()):
                    continue
                called = type(node).sql_names()[0].lower()
            if called not in FUNCTIONS:
                raise WhereError(f"--where may not call {called!r}: only value functions (comparisons, "
                                 f"arithmetic, strings, dates, nulls, casts) are allowed", function=called,
                                 **node_position(node))
            continue
        if not (isinstance(node, exp.Var) and isinstance(node.parent, (exp.Interval, exp.DataType, exp.Func))):
            # (a Var is a unit or a type's name: INTERVAL 1 DAY, date_add's day)
            raise WhereError(f"--where may only hold columns, values, operators and value functions: "
                             f"{name} is not allowed", **node_position(node))


def _called(node, text: str) -> str | None:
    """The function's name as the predicate spells it (sqlglot keeps the name token's place), lowered."""
    meta = node.meta or {}
    if "start" not in meta:
        return node.name.lower() if type(node).__name__ == "Anonymous" else None
    return text[meta["start"]: meta["end"] + 1].strip("`").lower()


def _synthesized(node, exp) -> bool:
    """A node sqlglot built around an argument of a function the predicate called (``year(d)`` wraps ``d``)."""
    parent = node.parent
    while parent is not None:
        if isinstance(parent, exp.Func) and (parent.meta or {}).get("start") is not None:
            return True
        parent = parent.parent
    return False
