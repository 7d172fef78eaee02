"""``toTable``: the table's sink, chosen as ``DataStreamWriter.toTable`` chooses it.

The table is made if it does not exist (the traced columns, ``_hw_rid`` among them, with the
writer's format, location and partitioning or clustering); then a table whose catalog
streams into it (V2) gets its streaming writer, and a table of files (V1) gets Spark's
file sink at its location, with the same ``_spark_metadata`` log, so a retried batch is
written once.
"""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from headwater.adapters import spark_lines

from ..spark_plan import Jvm, session_jvm
from .base import Sink, SinkError, SinkSpec, option
from .jvm import case_insensitive, is_instance, java_schema, message
from .spark_sinks import spark_sink, supports_streaming_write
from .streaming_write import StreamingWriteSink

V1_TABLES = ("org.apache.spark.sql.connector.catalog.V1Table",
             "org.apache.spark.sql.connector.catalog.V2TableWithV1Fallback")


def table_sink(spark: SparkSession, spec: SinkSpec, schema: StructType, output_mode: str) -> Sink:
    jvm = session_jvm(spark)
    state = spark._jsparkSession.sessionState()
    name = spec.table
    if name is None:
        raise ValueError("table_sink writes the table a toTable spec names: the spec has none")
    try:
        parts = state.sqlParser().parseMultipartIdentifier(name)
    except Exception as exc:
        raise SinkError(f"toTable({name!r}): not a table name: {message(exc)}") from exc
    if state.catalog().isTempView(parts):
        raise SinkError(f"toTable({name!r}): a temporary view cannot be written by a streaming query")
    catalog, ident = _resolve(state, parts, name)
    if not catalog.tableExists(ident):
        _create(spark, parts, spec, schema)
    table = catalog.loadTable(ident)
    if supports_streaming_write(jvm, table):
        relation = spark_lines.running(spark).v2_relation(jvm, table, jvm.scala.Some(catalog), jvm.scala.Some(ident),
                                                          case_insensitive(jvm, spec.options))
        return StreamingWriteSink(spark, relation, spec.options, output_mode)
    if not any(is_instance(jvm, kind, table) for kind in V1_TABLES):
        raise SinkError(f"toTable({name!r}): the table ({table.getClass().getName()}) cannot be written by a "
                        f"streaming query")
    v1 = table.v1Table()
    if v1.tableType().name() == "VIEW":
        raise SinkError(f"toTable({name!r}): a view cannot be written by a streaming query")
    provider = v1.provider().get()
    if provider.lower() == "hive":
        raise SinkError(f"toTable({name!r}): a Hive table's files cannot be written by a streaming query")
    if spec.format != provider:
        raise SinkError(f"toTable({name!r}): the writer's format {spec.format!r} is not the table's "
                        f"({provider!r}): call .format({provider!r}) or leave the table to its own format")
    location = jvm.org.apache.hadoop.fs.Path(v1.location()).toString()
    options = {k: v for k, v in spec.options.items() if k.lower() != "path"}
    return spark_sink(spark, provider, {**options, "path": location}, spec.partition_by, spec.cluster_by,
                      output_mode, schema)


def _resolve(state, parts, name: str):
    resolved = state.analyzer().CatalogAndIdentifier().unapply(parts)
    if not resolved.isDefined():
        raise SinkError(f"toTable({name!r}): no catalog holds a table of that name")
    return resolved.get()._1(), resolved.get()._2()


def _create(spark: SparkSession, parts, spec: SinkSpec, schema: StructType) -> None:
    """``CREATE TABLE`` as ``toTable`` makes it: nullable columns, the writer's format, location
    and partitioning (or clustering), no other options."""
    columns = java_schema(spark, schema).asNullable().toDDL()
    statement = f"CREATE TABLE {'.'.join(_quoted(p) for p in Jvm.items(parts))} ({columns}) USING {spec.format}"
    if spec.cluster_by:
        statement += f" CLUSTER BY ({', '.join(map(_quoted, spec.cluster_by))})"
    elif spec.partition_by:
        statement += f" PARTITIONED BY ({', '.join(map(_quoted, spec.partition_by))})"
    path = option(spec.options, "path")
    if path:
        statement += " LOCATION '" + path.replace("\\", "\\\\").replace("'", "\\'") + "'"
    try:
        spark.sql(statement)
    except Exception as exc:
        raise SinkError(f"toTable({spec.table!r}): the table could not be made: {message(exc)}") from exc


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"
