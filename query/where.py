"""Rows of a sink chosen by a predicate: ``--dataset SINK --where SQL``, without Spark where it can.

    from headwater.query import where

    rids = where.select("parquet:/data/enriched_orders", "order_id IN (7, 9)")   # [rid, …], sorted
    chosen = where.check(dataset, predicate)   # WhereError now, before any file is read or JVM starts
    found = chosen.select(limit=1000, spark=None, fallback=True)
    found.rids, found.engine, found.reason     # [rid, …], "arrow" or "spark", why Spark was needed

``check`` parses the sink's name and the predicate (``predicate.py``: sqlglot, Spark's dialect) and
refuses, naming the character position where it can: a sink not named as lineage names it
(``parquet:PATH``, ``json:PATH``, ``orc:PATH``, ``table:NAME``), a name or predicate
longer than ``MAX_DATASET`` or ``MAX_PREDICATE`` characters, a predicate that does not
parse or is more than one expression, one that reaches beyond the sink's rows (a
subquery, ``EXISTS``, a lambda, a parameter), and one that calls anything but the value
functions of ``FUNCTIONS`` (``reflect``, ``java_method``, ``input_file_name``, UDFs and
every reader of files are refused).

``Where.select`` then reads a local Parquet, ORC or JSON sink as Spark reads it (the files
its ``_spark_metadata`` log committed, ``headwater.spark.table_files``) and evaluates
the predicate with pyarrow, with Spark's types, coercions and NULL logic, and returns the
distinct ``_hw_rid`` of the rows it holds for. What it cannot evaluate exactly as Spark
would (``_Unsupported``: a table sink, a remote or globbed path, a column of a date,
timestamp, decimal, binary or nested type used other than in ``IS NULL``, a float column
holding NaN, decimal arithmetic, an overflow or a division by zero, a function of
``FUNCTIONS`` not modelled here, non-ASCII text under ``lower``/``upper``) goes to Spark
(``sink.select``), quietly (the JVM's output goes to a log file, not the caller's stderr),
or with ``fallback=False`` raises ``NeedsSpark``.

More than ``limit`` rows is an error (narrow the predicate), and so is none
(``NothingSelected``, an ``UnknownRow``): every caller says so in the same words.
Pure of the CLI: ``headwater lineage … --dataset --where`` and the HTTP API call this.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from .predicate import (
    MAX_SELECTED,
    READABLE,
    RID_COLUMN,
    NothingSelected,
    Sink,
    WhereError,
    node_position,
    parse_dataset,
    parse_predicate,
)

_GLOB = re.compile(r"[*?\[\]{}]")


class NeedsSpark(WhereError):
    """Only Spark can evaluate this predicate over this sink, and the caller said not to start it."""


class _Unsupported(Exception):
    """The fast path cannot evaluate this exactly as Spark would: Spark must."""


@dataclass(frozen=True)
class Selected:
    rids: list[int]
    engine: str  # "arrow": read and evaluated here; "spark": by Spark
    reason: str | None = None  # why Spark was needed


@dataclass(frozen=True)
class Where:
    """A sink and a predicate over its rows, both checked (``check``)."""

    sink: Sink
    text: str
    tree: object  # the predicate's sqlglot expression

    def select(self, limit: int = MAX_SELECTED, spark=None, fallback: bool = True) -> Selected:
        """The distinct rids of the sink's rows the predicate holds for, sorted.

        ``spark``: a session to use when Spark must evaluate it (else one is started, quietly, and
        stopped); ``fallback=False``: raise ``NeedsSpark`` instead. ``WhereError`` for more than
        ``limit`` rows, ``NothingSelected`` for none.
        """
        try:
            found, engine, reason = self._fast(limit), "arrow", None
        except _Unsupported as exc:
            if not fallback:
                raise NeedsSpark(f"--where over {self.sink}: {exc}; only Spark can evaluate it",
                                 dataset=str(self.sink), where=self.text) from None
            found, engine, reason = self._spark(limit, spark), "spark", str(exc)
        if not found:
            raise NothingSelected(f"--where selects no row of {self.sink}: {self.text}",
                                  dataset=str(self.sink), where=self.text)
        return Selected(found, engine, reason)

    def _fast(self, limit: int) -> list[int]:
        import pyarrow.compute as pc

        table, types = _read(self.sink, self.tree)
        try:
            mask = _Evaluator(table, types).predicate(self.tree)
        except RecursionError:
            raise _Unsupported("nested too deeply to evaluate here") from None
        column = table.column(RID_COLUMN)
        rids = column.filter(pc.fill_null(mask, _literal(False, "boolean"))) if not isinstance(mask, bool) else \
            column if mask else column.slice(0, 0)
        found = pc.unique(rids.drop_null()).to_pylist()
        if len(found) > limit:
            raise WhereError(f"--where selects more than {limit} rows of {self.sink}: narrow it",
                             dataset=str(self.sink), where=self.text)
        return sorted(found)

    def _spark(self, limit: int, spark) -> list[int]:
        from . import sink as spark_sink

        if spark is None and "pyspark" in sys.modules:
            from pyspark.sql import SparkSession

            spark = SparkSession.getActiveSession()  # a caller's session is used, and left running
        if spark is not None:
            return spark_sink.select(spark, str(self.sink), self.text, limit)
        session = _quiet_session()
        try:
            return spark_sink.select(session, str(self.sink), self.text, limit)
        finally:
            session.stop()


def check(dataset: str, where: str) -> Where:
    """The sink and the predicate, parsed and checked (module docstring), else ``WhereError``."""
    sink = parse_dataset(dataset)
    return Where(sink, where, parse_predicate(where))


def select(dataset: str, where: str, limit: int = MAX_SELECTED, spark=None, fallback: bool = True) -> list[int]:
    """``check(dataset, where).select(limit, spark, fallback).rids``."""
    return check(dataset, where).select(limit, spark, fallback).rids


# --- reading the sink -------------------------------------------------------------------------------------------

def _read(sink: Sink, tree):
    """The sink's rid column and the columns the predicate names, as Spark reads them; and their Spark types."""
    from sqlglot import exp

    from headwater.spark import table_files as tf

    if sink.kind not in READABLE:
        raise _Unsupported(f"a {sink.kind} sink is read by Spark")
    if _GLOB.search(sink.location):
        raise _Unsupported("a path with wildcards is expanded by Spark")
    try:
        path = tf.local_path(sink.location)
    except tf.TableUnreadable as exc:
        raise _Unsupported(str(exc)) from None
    if not os.path.exists(path):
        raise WhereError(f"{sink}: no such file or folder", dataset=str(sink))
    location = {"paths": [sink.location], "format": sink.kind, "options": {}}
    try:
        files = tf.data_files(location, {})
        partitions = tf.partition_names(files)
        if sink.kind == "json":
            table = tf.read_table(location)
            columns = [(f.name, _spark_name(f.type)) for f in table.schema]
        else:
            folded = {p.lower() for p in partitions}
            columns = [c for c in tf.file_schema_columns(sink.kind, files) if c[0].lower() not in folded]
            columns += [(p, tf.partition_type([v for f in files for c, v in f.partition if c == p]))
                        for p in partitions]
            table = None
    except tf.TableUnreadable as exc:
        raise _Unsupported(f"the sink's files: {exc}") from None
    if RID_COLUMN not in [name for name, _ in columns]:
        raise WhereError(f"{sink} has no {RID_COLUMN} column: its query was traced with emit_rid=False, "
                         f"or it is not a traced query's sink", dataset=str(sink))
    by_name: dict[str, list[tuple[str, str]]] = {}
    for name, spark_type in columns:
        by_name.setdefault(name.lower(), []).append((name, spark_type))
    wanted = {RID_COLUMN: dict(columns)[RID_COLUMN]}
    for column in tree.find_all(exp.Column):
        if column.table:
            raise _Unsupported(f"{column.sql('spark')}: qualified names and struct fields are resolved by Spark")
        found = by_name.get(column.name.lower(), [])
        if len(found) > 1:
            raise _Unsupported(f"{column.name}: several columns by that name, but for case")
        if not found:
            if sink.kind == "json":  # Spark may add a _corrupt_record column for lines it cannot parse
                raise _Unsupported(f"no column {column.name!r} read here")
            raise WhereError(f"--where over {sink}: no column {column.name!r}; its columns: "
                             f"{', '.join(name for name, _ in columns)}", dataset=str(sink),
                             **node_position(column.this))
        wanted.setdefault(*found[0])
    if table is None:
        try:
            table = tf.read_table(location, list(wanted.items()))
        except tf.TableUnreadable as exc:
            raise _Unsupported(f"the sink's files: {exc}") from None
    elif any(spark_type == "string" and _json_text(table.column(name)) for name, spark_type in wanted.items()):
        raise _Unsupported("a JSON object or array, read here as its text, which Spark reads as a struct or an array")
    return table, {name.lower(): spark_type for name, spark_type in wanted.items()}


def _json_text(column) -> bool:
    """Whether a string column of a JSON sink holds what may be an object's or an array's text."""
    import pyarrow.compute as pc

    return bool(pc.any(pc.match_substring_regex(column, r"^[{\[]")).as_py())


def _spark_name(arrow_type) -> str:
    """A JSON sink's column type as read here (scalars: bigint, double, boolean, string), in Spark's words."""
    import pyarrow as pa

    return {pa.int64(): "bigint", pa.float64(): "double", pa.bool_(): "boolean", pa.string(): "string"}.get(
        arrow_type, str(arrow_type))


# --- evaluating, as Spark does ----------------------------------------------------------------------------------

_NUMERIC = ("tinyint", "smallint", "int", "bigint", "float", "double")  # Spark's numeric precedence
_INTEGRAL = _NUMERIC[:4]
_FLOATING = _NUMERIC[4:]
_BOUNDS = {"tinyint": 1 << 7, "smallint": 1 << 15, "int": 1 << 31, "bigint": 1 << 63}
_CAST_TYPES = {"TINYINT": "tinyint", "SMALLINT": "smallint", "INT": "int", "BIGINT": "bigint", "FLOAT": "float",
               "DOUBLE": "double", "DECIMAL": "decimal"}


def _arrow(spark_type: str):
    import pyarrow as pa

    return {"tinyint": pa.int8(), "smallint": pa.int16(), "int": pa.int32(), "bigint": pa.int64(),
            "float": pa.float32(), "double": pa.float64(), "string": pa.string(), "boolean": pa.bool_()}[spark_type]


_PACKED = {"tinyint": "b", "smallint": "h", "int": "i", "bigint": "q", "double": "d"}


def _literals(values: list, spark_type: str):
    """An Arrow array of Python values (``None`` for NULL) of one of ``_arrow``'s types.

    Built from buffers: ``pa.array`` and ``pa.scalar`` import pandas to ask whether a value is a
    pandas object, which costs a CLI run of ``--where`` 0.3–0.5 s of its 1 s bar.
    """
    import itertools
    import struct

    import pyarrow as pa
    import pyarrow.compute as pc

    if spark_type == "float":  # a Python float is a double: narrowed as pyarrow narrows it
        return pc.cast(_literals(values, "double"), pa.float32(), safe=False)
    valid = [v is not None for v in values]
    present = [v for v in values if v is not None]
    wanted = {"boolean": bool, "string": str}.get(spark_type, int if spark_type in _INTEGRAL else (int, float))
    if any(isinstance(v, bool) != (wanted is bool) or not isinstance(v, wanted) for v in present):
        raise pa.ArrowTypeError(f"a {spark_type} literal of {[type(v).__name__ for v in present]}")
    bitmap = None if all(valid) else pa.py_buffer(_bits(valid))
    if spark_type == "boolean":
        buffers = [bitmap, pa.py_buffer(_bits([bool(v) for v in values]))]
    elif spark_type == "string":
        encoded = [(v or "").encode() for v in values]
        ends = list(itertools.accumulate(map(len, encoded), initial=0))
        buffers = [bitmap, pa.py_buffer(struct.pack(f"<{len(ends)}i", *ends)), pa.py_buffer(b"".join(encoded))]
    else:
        try:
            data = struct.pack(f"<{len(values)}{_PACKED[spark_type]}", *(0 if v is None else v for v in values))
        except struct.error as exc:
            raise OverflowError(f"a {spark_type} literal: {exc}") from None
        buffers = [bitmap, pa.py_buffer(data)]
    return pa.Array.from_buffers(_arrow(spark_type), len(values), buffers, null_count=valid.count(False))


def _literal(value, spark_type: str):
    """One value as an Arrow scalar (see ``_literals``)."""
    return _literals([value], spark_type)[0]


def _bits(flags: list[bool]) -> bytes:
    """Arrow's bitmap of ``flags``: least significant bit first."""
    import numpy as np

    return np.packbits(np.array(flags, dtype=bool), bitorder="little").tobytes()


@dataclass
class _V:
    """A value: an Arrow array (a column's), or a literal (a Python value; ``decimal`` a ``Decimal``)."""

    # Any: which Python type a literal is depends on ``type``, and pyarrow's arrays carry no types of their own
    value: Any
    type: str  # a Spark type name: _NUMERIC, string, boolean, decimal (literals only), void (NULL), or another
    literal: bool = False


class _Evaluator:
    """A checked predicate over the columns read, with Spark's semantics (ANSI mode, Spark 4's default).

    Each operand is cast to the type Spark's coercion gives both sides; what Spark would do
    differently here, or could fail on, raises ``_Unsupported``.
    """

    def __init__(self, table, types: dict[str, str]):
        import pyarrow as pa
        import pyarrow.compute as pc
        from sqlglot import exp

        self.pa, self.pc, self.exp = pa, pc, exp
        self.table, self.types = table, types

    def predicate(self, tree):
        """A boolean array (NULL where the predicate is unknown), or a bool when it depends on no row."""
        found = self.eval(tree)
        if found.type in (*_NUMERIC, "string", "decimal", "void"):  # Spark refuses these too
            raise WhereError(f"--where is {'NULL' if found.type == 'void' else found.type}, not a boolean "
                             f"expression: compare it with something")
        if found.type != "boolean":
            raise _Unsupported(f"the predicate is {found.type}, not boolean")
        return bool(found.value) if found.literal else found.value

    # Literals are kept as Python values; an operation over literals only is done on Arrow scalars.
    def _arrow_value(self, v: _V, to: str):
        pc = self.pc
        if v.type == "void":
            return _literal(None, to)
        if v.literal:
            value = v.value
            if v.type == "decimal":
                if to in _FLOATING:
                    value = float(value)
                elif to in _INTEGRAL and value == value.to_integral_value():
                    value = int(value)
                else:
                    raise _Unsupported(f"a decimal literal as {to}")
            elif v.type != to:
                return pc.cast(_literal(value, v.type), _arrow(to), safe=False)
            return _literal(value, to)
        if v.type == to:
            return v.value
        return pc.cast(v.value, _arrow(to), safe=False)

    def _result(self, value, spark_type: str, *operands: _V) -> _V:
        if all(o.literal for o in operands):
            return _V(value.as_py(), spark_type, True)
        return _V(value, spark_type)

    def _common(self, operands: list[_V], compare: bool) -> str:
        """The type Spark casts all of ``operands`` to (``_Unsupported`` where it is not modelled here)."""
        kinds = {o.type for o in operands} - {"void"}
        if not kinds:
            return "boolean"
        if kinds == {"string"} or kinds == {"boolean"}:
            return next(iter(kinds))
        if not kinds <= {*_NUMERIC, "decimal"}:
            raise _Unsupported(f"{' with '.join(sorted(kinds))}: Spark's coercion of these is not modelled here")
        plain = kinds - {"decimal"}
        if "decimal" not in kinds:
            return max(plain, key=_NUMERIC.index)
        if plain & set(_FLOATING):
            return "double"  # Spark casts a decimal to double beside a float or double
        decimals = [o.value for o in operands if o.type == "decimal"]
        if compare and plain and all(d == d.to_integral_value() and -(1 << 63) <= d < 1 << 63 for d in decimals):
            # An integral decimal compares with integers as the integer it is.
            return max(plain | {_integral_type(int(d)) for d in decimals}, key=_NUMERIC.index)
        raise _Unsupported("decimal arithmetic and comparisons are Spark's")

    def _no_nan(self, *values) -> None:
        pc = self.pc
        for value in values:
            if isinstance(value, self.pa.Scalar):
                if value.is_valid and value.as_py() != value.as_py():
                    raise _Unsupported("NaN compares as Spark orders it, not as IEEE does")
            elif pc.any(pc.is_nan(value)).as_py():
                raise _Unsupported("a float column holds NaN, which Spark compares unlike IEEE")

    def eval(self, node) -> _V:
        handler = getattr(self, f"_{type(node).__name__}", None)
        if handler is None:
            raise _Unsupported(f"{type(node).__name__} is evaluated by Spark")
        try:
            return handler(node)
        except (self.pa.ArrowInvalid, self.pa.ArrowNotImplementedError, self.pa.ArrowTypeError, OverflowError) as exc:
            # An overflow, a division by zero (ANSI mode fails the query), a kernel pyarrow lacks: Spark says.
            raise _Unsupported(f"{node.sql('spark')}: {exc}") from None

    # Leaves.
    def _Paren(self, node) -> _V:
        return self.eval(node.this)

    def _Column(self, node) -> _V:
        name = node.name.lower()
        spark_type = self.types[name]
        column = next(c for c in self.table.column_names if c.lower() == name)
        kind = spark_type if spark_type in (*_NUMERIC, "string", "boolean") else f"other:{spark_type}"
        return _V(self.table.column(column), kind)

    def _Literal(self, node) -> _V:
        text = node.this
        if node.is_string:
            return _V(text, "string", True)
        return _number(text)

    def _Boolean(self, node) -> _V:
        return _V(bool(node.this), "boolean", True)

    def _Null(self, node) -> _V:
        return _V(None, "void", True)

    # Logic (Kleene: NULL is unknown).
    def _logic(self, node, kernel) -> _V:
        # A chain of ANDs (or ORs) at once, not one level of recursion per operator.
        operands = [self.eval(x) for x in node.flatten()]
        for side in operands:
            if side.type not in ("boolean", "void"):
                raise _Unsupported(f"{side.type} in a logical operator")
        result = self._arrow_value(operands[0], "boolean")
        for operand in operands[1:]:
            result = kernel(result, self._arrow_value(operand, "boolean"))
        return self._result(result, "boolean", *operands)

    def _And(self, node) -> _V:
        return self._logic(node, self.pc.and_kleene)

    def _Or(self, node) -> _V:
        return self._logic(node, self.pc.or_kleene)

    def _Not(self, node) -> _V:
        inner = self.eval(node.this)
        if inner.type not in ("boolean", "void"):
            raise _Unsupported(f"NOT of {inner.type}")
        return self._result(self.pc.invert(self._arrow_value(inner, "boolean")), "boolean", inner)

    # Comparisons.
    def _compare(self, left: _V, right: _V, kernel: str):
        to = self._common([left, right], compare=True)
        a, b = self._arrow_value(left, to), self._arrow_value(right, to)
        if to in _FLOATING:
            self._no_nan(a, b)
        return getattr(self.pc, kernel)(a, b)

    def _comparison(self, node, kernel: str) -> _V:
        left, right = self.eval(node.this), self.eval(node.expression)
        return self._result(self._compare(left, right, kernel), "boolean", left, right)

    def _EQ(self, node) -> _V:
        return self._comparison(node, "equal")

    def _NEQ(self, node) -> _V:
        return self._comparison(node, "not_equal")

    def _GT(self, node) -> _V:
        return self._comparison(node, "greater")

    def _GTE(self, node) -> _V:
        return self._comparison(node, "greater_equal")

    def _LT(self, node) -> _V:
        return self._comparison(node, "less")

    def _LTE(self, node) -> _V:
        return self._comparison(node, "less_equal")

    def _NullSafeEQ(self, node) -> _V:
        pc = self.pc
        left, right = self.eval(node.this), self.eval(node.expression)
        equal = self._compare(left, right, "equal")
        to = self._common([left, right], compare=True)
        a, b = self._arrow_value(left, to), self._arrow_value(right, to)
        both = pc.and_(pc.is_null(a), pc.is_null(b))
        return self._result(pc.or_(both, pc.fill_null(equal, _literal(False, "boolean"))), "boolean", left, right)

    def _NullSafeNEQ(self, node) -> _V:
        same = self._NullSafeEQ(node)
        return self._result(self.pc.invert(self._arrow_value(same, "boolean")), "boolean", same)

    def _Between(self, node) -> _V:
        if node.args.get("symmetric"):
            raise _Unsupported("BETWEEN SYMMETRIC")
        value, low, high = self.eval(node.this), self.eval(node.args["low"]), self.eval(node.args["high"])
        above = self._compare(value, low, "greater_equal")
        below = self._compare(value, high, "less_equal")
        return self._result(self.pc.and_kleene(above, below), "boolean", value, low, high)

    def _In(self, node) -> _V:
        pc = self.pc
        if node.args.get("query") or node.args.get("unnest") or node.args.get("field"):
            raise _Unsupported("IN over anything but a list")
        value = self.eval(node.this)
        items = [self.eval(x) for x in node.expressions]
        if not items:
            raise _Unsupported("an empty IN list")
        to = self._common([value, *items], compare=True)
        left = self._arrow_value(value, to)
        if to in _FLOATING:
            self._no_nan(left, *(self._arrow_value(i, to) for i in items))
        if all(i.literal for i in items) and to not in _FLOATING:  # hashing: -0.0 and 0.0 differ there
            values = [self._arrow_value(i, to) for i in items]
            has_null = any(not v.is_valid for v in values)
            found = pc.is_in(left, value_set=_literals([v.as_py() for v in values if v.is_valid], to))
            unknown = pc.is_null(left)
            if has_null:
                unknown = pc.or_(unknown, pc.invert(found))
            result = pc.if_else(unknown, _literal(None, "boolean"), found)
        else:
            result = None
            for item in items:
                equal = pc.equal(left, self._arrow_value(item, to))
                result = equal if result is None else pc.or_kleene(result, equal)
        return self._result(result, "boolean", value, *items)

    def _Is(self, node) -> _V:
        pc, exp = self.pc, self.exp
        value = self.eval(node.this)
        target = node.expression
        if isinstance(target, exp.Null):
            found = pc.is_null(value.value) if not value.literal else _literal(value.value is None, "boolean")
            return self._result(found, "boolean", value)
        if isinstance(target, exp.Boolean) and value.type in ("boolean", "void"):
            a = self._arrow_value(value, "boolean")
            found = pc.fill_null(a if target.this else pc.invert(a), _literal(False, "boolean"))
            return self._result(found, "boolean", value)
        raise _Unsupported(f"IS {target.sql('spark')}")

    def _Anonymous(self, node) -> _V:
        name = node.name.lower()
        if name in ("isnull", "isnotnull") and len(node.expressions) == 1:
            found = self._Is(self.exp.Is(this=node.expressions[0], expression=self.exp.Null()))
            if name == "isnull":
                return found
            return self._result(self.pc.invert(self._arrow_value(found, "boolean")), "boolean", found)
        raise _Unsupported(f"{name}() is evaluated by Spark")

    # Arithmetic (ANSI: an overflow or a division by zero fails Spark's query; pyarrow's checked kernels raise).
    def _arithmetic(self, node, kernel: str) -> _V:
        left, right = self.eval(node.this), self.eval(node.expression)
        to = self._common([left, right], compare=False)
        if to not in _NUMERIC:
            raise _Unsupported(f"arithmetic over {to}")
        value = getattr(self.pc, kernel)(self._arrow_value(left, to), self._arrow_value(right, to))
        return self._result(value, to, left, right)

    def _Add(self, node) -> _V:
        return self._arithmetic(node, "add_checked")

    def _Sub(self, node) -> _V:
        return self._arithmetic(node, "subtract_checked")

    def _Mul(self, node) -> _V:
        return self._arithmetic(node, "multiply_checked")

    def _Div(self, node) -> _V:
        left, right = self.eval(node.this), self.eval(node.expression)
        if self._common([left, right], compare=False) not in _NUMERIC:  # refuses decimal division too
            raise _Unsupported("/ over what is not a number")
        a, b = self._arrow_value(left, "double"), self._arrow_value(right, "double")
        return self._result(self.pc.divide_checked(a, b), "double", left, right)

    def _Mod(self, node) -> _V:
        pc = self.pc
        left, right = self.eval(node.this), self.eval(node.expression)
        to = self._common([left, right], compare=False)
        if to not in _INTEGRAL:
            raise _Unsupported(f"% over {to}")
        a, b = self._arrow_value(left, to), self._arrow_value(right, to)
        # Java's remainder takes the dividend's sign: a - trunc(a / b) * b (pyarrow's integer division truncates).
        value = pc.subtract_checked(a, pc.multiply_checked(pc.divide_checked(a, b), b))
        return self._result(value, to, left, right)

    def _Neg(self, node) -> _V:
        if isinstance(node.this, self.exp.Literal) and not node.this.is_string:
            return _number(node.this.this, negative=True)  # Spark's grammar reads -5 as one literal
        inner = self.eval(node.this)
        if inner.type == "decimal":
            return _V(-inner.value, "decimal", True)
        if inner.type not in _NUMERIC:
            raise _Unsupported(f"- of {inner.type}")
        return self._result(self.pc.negate_checked(self._arrow_value(inner, inner.type)), inner.type, inner)

    def _Abs(self, node) -> _V:
        inner = self.eval(node.this)
        if inner.type not in _NUMERIC:
            raise _Unsupported(f"abs of {inner.type}")
        return self._result(self.pc.abs_checked(self._arrow_value(inner, inner.type)), inner.type, inner)

    def _cast(self, node) -> _V:
        to_type = node.args["to"]
        to = _CAST_TYPES.get(to_type.this.name)
        inner = self.eval(node.this)
        if to == "decimal" and inner.literal and inner.type == "string" and re.fullmatch(r"\d+(\.\d*)?", inner.value):
            value = Decimal(inner.value)  # 3BD, or a CAST of digits that fit the type as they are
            precision, scale = [int(p.this.this) for p in to_type.expressions] or [10, 0]
            if value == value.quantize(Decimal(1).scaleb(-scale)) and value.adjusted() < precision - scale:
                return _V(value, "decimal", True)
        if inner.literal and inner.type == "decimal" and to in ("double", *_INTEGRAL):
            if to == "double":  # 1.5D: the double nearest the digits, as Java parses them
                return _V(float(inner.value), "double", True)
            if inner.value == inner.value.to_integral_value():  # 5L, 4S, 5Y
                integral = int(inner.value)
                if -_BOUNDS[to] <= integral < _BOUNDS[to]:
                    return _V(integral, to, True)
            raise _Unsupported(f"{node.sql('spark')}: a literal out of its type's range")
        if inner.type in _NUMERIC and to in _NUMERIC and _NUMERIC.index(to) >= _NUMERIC.index(inner.type):
            return self._result(self._arrow_value(inner, to), to, inner)  # widening: exact, or rounded as Java does
        raise _Unsupported(f"{node.sql('spark')}: only widening numeric casts are evaluated here")

    def _Cast(self, node) -> _V:
        return self._cast(node)

    def _TryCast(self, node) -> _V:  # sqlglot reads Spark's CAST (and the 5L, 1.5D, 3BD literals) as TryCast
        return self._cast(node)

    # Strings.
    def _string(self, node) -> _V:
        found = self.eval(node)
        if found.type not in ("string", "void"):
            raise _Unsupported(f"{node.sql('spark')} is {found.type}, not a string")
        return found

    def _literal_int(self, node) -> int:
        found = self.eval(node)
        if not found.literal or found.type not in _INTEGRAL:
            raise _Unsupported(f"{node.sql('spark')}: only integer literals as positions and lengths")
        return found.value

    def _string_result(self, value, *operands: _V) -> _V:
        return self._result(value, "string", *operands)

    def _ascii(self, v: _V) -> None:
        pc = self.pc
        ascii_only = (v.value is None or v.value.isascii()) if v.literal else \
            pc.all(pc.string_is_ascii(v.value)).as_py() in (True, None)
        if not ascii_only:
            raise _Unsupported("changing the case of non-ASCII text is Spark's")

    def _Length(self, node) -> _V:
        inner = self._string(node.this)
        return self._result(self.pc.utf8_length(self._arrow_value(inner, "string")), "int", inner)

    def _Lower(self, node) -> _V:
        inner = self._string(node.this)
        self._ascii(inner)
        return self._string_result(self.pc.ascii_lower(self._arrow_value(inner, "string")), inner)

    def _Upper(self, node) -> _V:
        inner = self._string(node.this)
        self._ascii(inner)
        return self._string_result(self.pc.ascii_upper(self._arrow_value(inner, "string")), inner)

    def _Trim(self, node) -> _V:
        if node.args.get("expression") is not None or node.args.get("collation") is not None:
            raise _Unsupported("TRIM of given characters")
        inner = self._string(node.this)
        kernel = {"LEADING": "utf8_ltrim", "TRAILING": "utf8_rtrim"}.get(str(node.args.get("position") or "").upper(),
                                                                         "utf8_trim")
        # Spark's trim removes spaces (U+0020) only, not other whitespace.
        return self._string_result(getattr(self.pc, kernel)(self._arrow_value(inner, "string"), characters=" "), inner)

    def _slice(self, inner: _V, start: int, length: int | None) -> _V:
        """Spark's ``substring(s, start, length)``: 1-based, 0 taken as 1, a negative start counts from the end."""
        value = self._arrow_value(inner, "string")
        if length is not None and length <= 0:
            return self._string_result(self.pc.utf8_slice_codeunits(value, 0, 0), inner)
        if start > 0:
            begin, stop = start - 1, None if length is None else start - 1 + length
        elif start == 0:
            begin, stop = 0, length
        else:  # Python's negative slice bounds are Spark's: from the end, clamped at the start
            begin, stop = start, None if length is None or start + length >= 0 else start + length
        return self._string_result(self.pc.utf8_slice_codeunits(value, begin, stop), inner)

    def _Substring(self, node) -> _V:
        inner = self._string(node.this)
        start = self._literal_int(node.args["start"]) if node.args.get("start") is not None else 1
        length = self._literal_int(node.args["length"]) if node.args.get("length") is not None else None
        return self._slice(inner, start, length)

    def _Left(self, node) -> _V:
        inner, count = self._string(node.this), self._literal_int(node.expression)
        return self._slice(inner, 1, count)

    def _Right(self, node) -> _V:
        inner, count = self._string(node.this), self._literal_int(node.expression)
        return self._slice(inner, -count, None) if count > 0 else self._slice(inner, 1, 0)

    def _concat(self, parts: list) -> _V:
        values = [self._string(p) for p in parts]
        args = [self._arrow_value(v, "string") for v in values]
        if all(v.literal for v in values):
            joined = None if any(v.value is None for v in values) else "".join(v.value for v in values)
            return _V(joined, "string", True)
        return self._string_result(self.pc.binary_join_element_wise(*args, _literal("", "string")), *values)

    def _Concat(self, node) -> _V:
        return self._concat(node.expressions)

    def _DPipe(self, node) -> _V:
        return self._concat([node.this, node.expression])

    def _affix(self, node, kernel: str) -> _V:
        inner, pattern = self._string(node.this), self._string(node.expression)
        if not pattern.literal:
            raise _Unsupported(f"{node.sql('spark')}: only a literal pattern")
        if pattern.value is None:
            return _V(None, "void", True)
        return self._result(getattr(self.pc, kernel)(self._arrow_value(inner, "string"), pattern=pattern.value),
                            "boolean", inner)

    def _StartsWith(self, node) -> _V:
        return self._affix(node, "starts_with")

    def _EndsWith(self, node) -> _V:
        return self._affix(node, "ends_with")

    def _Contains(self, node) -> _V:
        return self._affix(node, "match_substring")

    def _like(self, like, escape: str) -> _V:
        inner, pattern = self._string(like.this), self._string(like.expression)
        if not pattern.literal:
            raise _Unsupported("LIKE with a pattern that is not a literal")
        if pattern.value is None:
            return _V(None, "void", True)
        found = self.pc.match_substring_regex(self._arrow_value(inner, "string"),
                                              pattern=_like_regex(pattern.value, escape))
        if like.args.get("negate"):
            found = self.pc.invert(found)
        return self._result(found, "boolean", inner)

    def _Like(self, node) -> _V:
        return self._like(node, "\\")

    def _Escape(self, node) -> _V:
        escape = self.eval(node.expression)
        if not isinstance(node.this, self.exp.Like) or not escape.literal or escape.type != "string" \
                or escape.value is None or len(escape.value) != 1:
            raise _Unsupported("ESCAPE other than one character after LIKE")
        return self._like(node.this, escape.value)

    # Nulls and conditions.
    def _Coalesce(self, node) -> _V:
        values = [self.eval(x) for x in [node.this, *node.expressions]]
        to = self._common(values, compare=False)
        if to not in (*_NUMERIC, "string", "boolean"):
            raise _Unsupported(f"coalesce of {to}")
        return self._result(self.pc.coalesce(*(self._arrow_value(v, to) for v in values)), to, *values)

    def _choose(self, branches: list[tuple[_V, _V]], otherwise: _V) -> _V:
        pc = self.pc
        to = self._common([v for _, v in branches] + [otherwise], compare=False)
        if to not in (*_NUMERIC, "string", "boolean"):
            raise _Unsupported(f"a condition choosing {to}")
        result = self._arrow_value(otherwise, to)
        for condition, value in reversed(branches):
            if condition.type not in ("boolean", "void"):
                raise _Unsupported(f"a condition of {condition.type}")
            # NULL is not true
            taken = pc.fill_null(self._arrow_value(condition, "boolean"), _literal(False, "boolean"))
            result = pc.if_else(taken, self._arrow_value(value, to), result)
        return self._result(result, to, otherwise, *(x for pair in branches for x in pair))

    def _If(self, node) -> _V:
        otherwise = self.eval(node.args["false"]) if node.args.get("false") is not None else _V(None, "void", True)
        return self._choose([(self.eval(node.this), self.eval(node.args["true"]))], otherwise)

    def _Case(self, node) -> _V:
        exp = self.exp
        subject = node.this
        branches = []
        for branch in node.args.get("ifs") or []:
            condition = branch.this if subject is None else exp.EQ(this=subject.copy(), expression=branch.this.copy())
            branches.append((self.eval(condition), self.eval(branch.args["true"])))
        default = node.args.get("default")
        return self._choose(branches, self.eval(default) if default is not None else _V(None, "void", True))


def _integral_type(value: int) -> str:
    return next(t for t in ("int", "bigint") if -_BOUNDS[t] <= value < _BOUNDS[t])


def _number(text: str, negative: bool = False) -> _V:
    """A numeric literal typed as Spark's parser types it: int, then bigint, else decimal; with an
    exponent, double (Spark 4)."""
    sign = "-" if negative else ""
    if re.fullmatch(r"\d+", text):
        value = int(sign + text)
        if -(1 << 63) <= value < 1 << 63:
            return _V(value, _integral_type(value), True)
        return _V(Decimal(sign + text), "decimal", True)
    if re.fullmatch(r"(\d+\.?\d*|\.\d+)[eE][+-]?\d+", text):
        return _V(float(sign + text), "double", True)
    if re.fullmatch(r"\d+\.\d*|\.\d+", text):
        return _V(Decimal(sign + text), "decimal", True)
    raise _Unsupported(f"the literal {text}")


def _like_regex(pattern: str, escape: str) -> str:
    r"""Spark's LIKE pattern as an RE2 expression matching whole strings: ``_`` one character, ``%`` any run
    (newlines too); ``escape`` before ``_``, ``%`` or itself takes it literally, before anything else Spark
    refuses the pattern (so the fast path leaves it to Spark)."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == escape:
            if i + 1 == len(pattern) or pattern[i + 1] not in ("_", "%", escape):
                raise _Unsupported("a LIKE pattern Spark refuses")
            out.append(_re2_literal(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if c == "%" else "." if c == "_" else _re2_literal(c))
        i += 1
    return r"\A(?s:" + "".join(out) + r")\z"


def _re2_literal(c: str) -> str:
    return c if c.isalnum() else f"\\x{{{ord(c):x}}}"


# --- Spark, when it must ----------------------------------------------------------------------------------------

def _quiet_session():
    """A local SparkSession whose JVM writes its logs to a file, not to this process's stdout and stderr.

    The JVM inherits this process's file descriptors 1 and 2 when it starts: they point to the
    log file for that moment only, so the JVM keeps writing there and this process gets its own back.
    """
    from headwater.adapters.spark import spark_session

    log = tempfile.NamedTemporaryFile(prefix="headwater-where-", suffix=".log", delete=False)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    try:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        session = spark_session("headwater-lineage-where")
    except Exception as exc:
        raise WhereError(f"Spark, needed to evaluate --where, did not start: {type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''} (its log: {log.name})") from None
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
        log.close()
    os.unlink(log.name)  # the JVM keeps writing to it, unseen: nobody reads a log of a session that started
    return session
