"""Traced queries stopped in the middle of a batch, run by ``test_start_and_stop`` in a process of its own,
so that the test reads everything its JVM prints (Spark's log, a stream thread's uncaught error).

Each try starts a traced query and stops it while a batch runs: a user's ``foreachBatch`` function that
sleeps and then asks Spark (the stop lands in the sleep, the next call into the JVM is interrupted), or
a Parquet sink whose batch is being written. Prints one JSON line: per try, whether a batch was running
when ``stop()`` was called and the query's exception (None when it stopped as untraced does).

    python -m tests.stop_mid_batch IN WORK TRIES
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from pyspark.sql import functions as F

from headwater.adapters.spark import spark_session
from headwater.adapters.spark_lines import last_progress
from headwater.capture import attach


def sleep_then_count(df, batch_id):
    time.sleep(1.5)
    df.count()


def main(source: str, work: str, tries: int) -> None:
    spark = spark_session("headwater-stop-mid-batch")
    tracer = attach(spark)  # HEADWATER_* settings from the test's environment
    results = []
    try:
        for number in range(tries):
            stream = spark.readStream.schema("id long, v long").option("maxFilesPerTrigger", 1).parquet(source)
            df = stream.where(F.col("v") % 3 != 0).withColumn("w", F.col("v") * 2)
            writer = tracer.trace(df, name=f"stop{number}").writeStream \
                .option("checkpointLocation", str(Path(work) / f"cp{number}"))
            if number % 2 == 0:
                query = writer.foreachBatch(sleep_then_count).start()
            else:
                query = writer.format("parquet").start(str(Path(work) / f"sink{number}"))
            deadline = time.monotonic() + 120
            while not (query.status["isTriggerActive"] and last_progress(query) is not None) \
                    and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.3 if number % 2 == 0 else 0.05 * (number % 5))
            running = query.status["isTriggerActive"]
            query.stop()
            results.append({"try": number, "running": running,
                            "exception": None if query.exception() is None else str(query.exception())[:2000]})
    finally:
        tracer.close()
        spark.stop()
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
