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
its ``_spark_metadata`` log committed, ``headwater.spark.table_files``), lowers the predicate
with Spark's types and coercions (``headwater.spark.sql``), evaluates it over the Arrow columns
with Spark's NULL logic (``headwater.spark.evaluate``, exactly), and returns the distinct
``_hw_rid`` of the rows it holds for. What it cannot evaluate exactly as Spark would
(``_Unsupported``: a table sink, a remote or globbed path, a column of a date, timestamp,
decimal, binary or nested type used other than in ``IS NULL``, a float column holding NaN,
decimal arithmetic, an overflow or a division by zero, a function of ``FUNCTIONS`` not
modelled there, non-ASCII text under ``lower``/``upper``) goes to Spark (``sink.select``),
quietly (the JVM's output goes to a log file, not the caller's stderr), or with
``fallback=False`` raises ``NeedsSpark``.

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

        from headwater.spark import evaluate
        from headwater.spark.arrow_values import scalar
        from headwater.spark.sql import NotLowered, lower

        table, types = _read(self.sink, self.tree)
        try:
            lowered = lower(self.tree, types)
        except NotLowered as exc:
            raise _Unsupported(str(exc)) from None
        if lowered.type != "boolean":
            raise WhereError(f"--where is {'NULL' if lowered.type == 'void' else lowered.type}, not a boolean "
                             f"expression: compare it with something")
        columns = {expr_id: table.column(name) for expr_id, name in lowered.columns.items()}
        try:
            mask = evaluate.predicate(lowered.expr, columns, table.num_rows, exact=True)
        except evaluate.NotEvaluable as exc:
            raise _Unsupported(str(exc)) from None
        except RecursionError:
            raise _Unsupported("nested too deeply to evaluate here") from None
        rids = table.column(RID_COLUMN).filter(pc.fill_null(mask, scalar(False, "boolean")))
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
    """The sink's rid column and the columns the predicate names, as Spark reads them; and, by lower-cased name,
    each one's name and Spark type."""
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
    return table, {name.lower(): (name, spark_type) for name, spark_type in wanted.items()}


def _json_text(column) -> bool:
    """Whether a string column of a JSON sink holds what may be an object's or an array's text."""
    import pyarrow.compute as pc

    return bool(pc.any(pc.match_substring_regex(column, r"^[{\[]")).as_py())


def _spark_name(arrow_type) -> str:
    """A JSON sink's column type as read here (scalars: bigint, double, boolean, string), in Spark's words."""
    import pyarrow as pa

    return {pa.int64(): "bigint", pa.float64(): "double", pa.bool_(): "boolean", pa.string(): "string"}.get(
        arrow_type, str(arrow_type))


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
