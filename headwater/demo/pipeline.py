"""The demo's streaming job, written as a user would, with no headwater code in it.

Kafka ``orders`` → parse → keep valid orders of at least 20 → convert the amount →
join the static ``customers`` table → select.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

ORDER_SCHEMA = "order_id long, customer_id int, amount double, event_time string"
MIN_AMOUNT = 20.0
EUR_PER_USD = 0.92


def enriched_orders(spark: SparkSession, bootstrap: str, topic: str, customers_path: str,
                    max_per_batch: int = 400) -> DataFrame:
    raw = (
        spark.readStream.format("kafka").option("startingOffsets", "earliest")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("maxOffsetsPerTrigger", max_per_batch)
        .load()
    )
    orders = raw.select(F.from_json(F.col("value").cast("string"), ORDER_SCHEMA).alias("o")).select("o.*")
    valid = orders.where("order_id IS NOT NULL AND customer_id IS NOT NULL AND amount IS NOT NULL")
    large = valid.where(F.col("amount") >= MIN_AMOUNT).withColumn(
        "amount_eur", F.round(F.col("amount") * EUR_PER_USD, 2)
    )
    customers = spark.read.parquet(customers_path)
    return large.join(customers, "customer_id").select(
        "order_id", "customer_id", "name", "region", "amount_eur", "event_time"
    )
