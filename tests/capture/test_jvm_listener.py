"""The JVM listener of job times (JobTimes.java), on the real SparkContext's listener bus."""

from headwater.capture import jar
from headwater.capture.jvm_listener import CAPTURE_PROPERTY, QUERY_ID_PROPERTY, JobTimes


def test_job_time_of_streaming_batches_is_split_into_user_and_capture(spark, tmp_path):
    times = JobTimes(spark, jar.Journals(spark, str(tmp_path), 1 << 20).job_times())
    context = spark.sparkContext
    bus = context._jsc.sc().listenerBus()
    try:
        spark.range(10).selectExpr("sum(id)").collect()  # no streaming query's job: not counted
        context.setLocalProperty(QUERY_ID_PROPERTY, "query-id-1")
        spark.range(1000).selectExpr("sum(id)").collect()
        context.setLocalProperty(CAPTURE_PROPERTY, "publish")
        spark.range(10).selectExpr("sum(id)").collect()
        context.setLocalProperty(CAPTURE_PROPERTY, None)
        context.setLocalProperty(QUERY_ID_PROPERTY, "query-id-2")
        spark.range(10).selectExpr("sum(id)").collect()
        bus.waitUntilEmpty(10_000)
        first = times.seconds()
        assert set(first) == {("query-id-1", "user"), ("query-id-1", "capture"), ("query-id-2", "user")}
        assert all(seconds > 0 for seconds in first.values())
        assert times.seconds() == {}  # each job's time is given once
        context.setLocalProperty(QUERY_ID_PROPERTY, "query-id-1")
        spark.range(10).selectExpr("sum(id)").collect()
        bus.waitUntilEmpty(10_000)
        assert set(times.seconds()) == {("query-id-1", "user")}
    finally:
        for key in (QUERY_ID_PROPERTY, CAPTURE_PROPERTY):
            context.setLocalProperty(key, None)
        times.close()
    context.setLocalProperty(QUERY_ID_PROPERTY, "query-id-1")
    try:
        spark.range(10).selectExpr("sum(id)").collect()  # removed from the bus: hears nothing more
        bus.waitUntilEmpty(10_000)
    finally:
        context.setLocalProperty(QUERY_ID_PROPERTY, None)
    assert times.seconds() == {}
