"""A local SparkSession as headwater's own tools start one (the demo, compaction, ``--where`` when Spark must
evaluate it, the benches and tests): ``local[2]``, on 127.0.0.1 only, no UI, two shuffle partitions, Spark's own
Kafka connector of pyspark's version from the tools cache (``deploy.tools.spark_kafka_jars``) unless ``spark.jars``
is given; ``conf`` adds or overrides settings."""

from __future__ import annotations

import os
import sys


def spark_session(app: str = "headwater", **conf: str):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master("local[2]")
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
    )
    if "spark.jars" not in conf:  # Spark's own Kafka connector, of pyspark's version, from the tools cache
        from headwater.deploy.tools import spark_kafka_jars

        builder = builder.config("spark.jars", ",".join(spark_kafka_jars()))
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
