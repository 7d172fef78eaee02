"""The JVM SparkListener, registered through py4j on the real SparkContext."""

from headwater.capture.jvm_listener import (BATCH_ID_PROPERTY, CAPTURE_PROPERTY, QUERY_ID_PROPERTY, JobListener,
                                            register, unregister)


def test_job_time_of_traced_batches_is_split_into_user_and_capture(spark):
    seen = []
    proxy = register(spark, JobListener({"query-id-1": "orders"}.get, lambda *job: seen.append(job)))
    context = spark.sparkContext
    try:
        context.setLocalProperty(QUERY_ID_PROPERTY, "query-id-1")
        context.setLocalProperty(BATCH_ID_PROPERTY, "7")
        spark.range(1000).selectExpr("sum(id)").collect()
        context.setLocalProperty(CAPTURE_PROPERTY, "publish")
        spark.range(10).selectExpr("sum(id)").collect()
        context.setLocalProperty(CAPTURE_PROPERTY, None)
        context.setLocalProperty(QUERY_ID_PROPERTY, "someone-elses")
        spark.range(10).selectExpr("sum(id)").collect()
        context._jsc.sc().listenerBus().waitUntilEmpty(10_000)
    finally:
        for key in (QUERY_ID_PROPERTY, BATCH_ID_PROPERTY, CAPTURE_PROPERTY):
            context.setLocalProperty(key, None)
        unregister(spark, proxy)
    assert {(query, batch, part) for query, batch, part, _ in seen} == {("orders", 7, "user"), ("orders", 7, "capture")}
    assert all(seconds >= 0 for *_, seconds in seen)

    heard = len(seen)
    context.setLocalProperty(QUERY_ID_PROPERTY, "query-id-1")
    try:
        spark.range(10).selectExpr("sum(id)").collect()  # unregistered: hears nothing more
        context._jsc.sc().listenerBus().waitUntilEmpty(10_000)
    finally:
        context.setLocalProperty(QUERY_ID_PROPERTY, None)
    assert len(seen) == heard
