"""The memory sink: Spark's own ``MemorySink``, read through a temporary view named after the query."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from headwater.adapters import spark_lines

from ..spark_plan import session_jvm
from .base import MEMORY, Sink, SinkError, option, register_sink
from .jvm import java_schema

EXACTLY_ONCE_IN_SESSION = "exactly-once while the session lives"


@register_sink(MEMORY)
class MemorySink(Sink):
    """As ``DataStreamWriter`` starts a memory sink: a ``MemorySink``, and a temporary view of
    the query's name over it; in complete mode each batch replaces the rows before it."""

    guarantee = EXACTLY_ONCE_IN_SESSION

    @classmethod
    def open(cls, spark, spec, schema, output_mode) -> "MemorySink":
        return cls(spark, option(spec.options, "queryName"), schema, complete=output_mode.lower() == "complete")

    def __init__(self, spark: SparkSession, query_name: str | None, schema: StructType, complete: bool):
        if not query_name:
            raise SinkError("the memory sink needs a query name: .queryName('…')")
        self._spark = spark
        self._schema = schema
        self._jsink = session_jvm(spark).org.apache.spark.sql.execution.streaming.sources.MemorySink()
        self.complete = complete

    def started(self, query_name: str) -> None:
        """The view, made as Spark makes it: once the query has started."""
        jvm = session_jvm(self._spark)
        attributes = jvm.org.apache.spark.sql.catalyst.types.DataTypeUtils.toAttributes(
            java_schema(self._spark, self._schema))
        plan = jvm.org.apache.spark.sql.execution.streaming.sources.MemoryPlan(self._jsink, attributes)
        spark_lines.running(self._spark).dataset_of(jvm, self._spark._jsparkSession, plan) \
            .createOrReplaceTempView(query_name)

    def latest_batch(self) -> int:
        latest = self._jsink.latestBatchId()
        return int(latest.get()) if latest.isDefined() else -1

    def write(self, df: DataFrame, batch_id: int) -> None:
        self._jsink.write(batch_id, self.complete, df._jdf.collect())
