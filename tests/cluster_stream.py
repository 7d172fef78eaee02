"""A traced file stream on a Spark cluster of one executor JVM (``local-cluster``), run by
``test_executor_drain`` in a process of its own (one SparkSession per process).

The executor journals into the folder its environment names (``HEADWATER_SPILL_DIR``), as an
executor on another host would, not the tracer's. Prints one JSON line: the sink's rows and the
Spark executor ids.

    python -m tests.cluster_stream NAME IN SINK CHECKPOINT EXECUTOR_FOLDER FILES
"""

from __future__ import annotations

import json
import sys

from pyspark.sql import functions as F

from headwater.adapters.spark import spark_session
from headwater.adapters.spark_lines import recent_progress
from headwater.capture import attach


def main(name: str, folder: str, sink: str, checkpoint: str, executor_folder: str, files: int) -> None:
    spark = spark_session("headwater-cluster-test", **{
        "spark.master": "local-cluster[1,1,1024]",
        "spark.executorEnv.HEADWATER_SPILL_DIR": executor_folder,
    })
    tracer = attach(spark)  # HEADWATER_* settings from the test's environment
    try:
        source = spark.readStream.schema("id long, v long").option("maxFilesPerTrigger", 1).parquet(folder)
        df = source.where(F.col("v") % 3 != 0).withColumn("w", F.col("v") * 2)
        query = (tracer.trace(df, name=name).writeStream.format("parquet").trigger(availableNow=True)
                 .option("checkpointLocation", checkpoint).start(sink))
        query.awaitTermination(300)
        assert query.exception() is None, query.exception()
        ran = sum(1 for p in recent_progress(query) if p.numInputRows)
        assert ran == files, f"{ran} batches ran, {files} expected"
    finally:
        tracer.close()
    executors = str(spark.sparkContext._jsc.sc().getExecutorIds().mkString(",")).split(",")
    rows = [(r.id, r._hw_rid) for r in spark.read.parquet(sink).collect()]
    spark.stop()
    print(json.dumps({"rows": rows, "executors": executors}))


if __name__ == "__main__":
    main(*sys.argv[1:6], int(sys.argv[6]))
