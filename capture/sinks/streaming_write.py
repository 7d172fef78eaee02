"""A table with a streaming writer (Kafka, Python data sources, catalogs' V2 tables), written batch by batch by
the plan Spark's micro-batch engine runs for it (``spark_sinks`` picks it; ``kafka_sink`` subclasses it)."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession

from headwater.adapters import spark_lines

from ..jvm_listener import QUERY_ID_PROPERTY
from ..spark_plan import session_jvm
from .base import Sink, SinkError
from .jvm import output_mode as java_output_mode
from .jvm import scala_map

AS_THE_CONNECTOR = "as the connector commits"  # a streaming writer's guarantee is its own


class StreamingWriteSink(Sink):
    """A table with a streaming writer: each batch runs the write Spark's micro-batch engine runs."""

    guarantee = AS_THE_CONNECTOR

    def __init__(self, spark: SparkSession, relation, options: dict, output_mode: str):
        self._spark = spark
        self._relation = relation
        jvm = session_jvm(spark)
        self._options = scala_map(jvm, options)
        self._mode = java_output_mode(jvm, output_mode)
        self._line = spark_lines.running(spark)  # asked once: it is a call into the JVM

    def write(self, df: DataFrame, batch_id: int) -> None:
        jvm = session_jvm(self._spark)
        query_id = self._spark.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
        if not query_id:  # a connector may key its commits on it: never write without it
            raise SinkError(f"batch {batch_id}: no streaming query id on the thread writing it ({QUERY_ID_PROPERTY})")
        plan = self._line.write_to_micro_batch(jvm, self._relation, df._jdf.queryExecution().analyzed(), query_id,
                                               self._options, self._mode).withNewBatchId(batch_id)
        # In the batch's own session, as Spark's micro-batch engine runs it (its settings, not the tracer's).
        self._line.dataset_of(jvm, df._jdf.sparkSession(), plan).collect()
