import uuid

from headwater.adapters.kafka import ensure_topics, producer
from headwater.capture.kafka_source import KafkaSource, _cap_rows

from .conftest import stop_when_idle


def test_cap_rows_shares_the_limit_and_never_exceeds_the_end():
    start = {"t:0": 0, "t:1": 5, "t:2": 7}
    end = {"t:0": 100, "t:1": 6, "t:2": 7}
    capped = _cap_rows(start, end, 10)
    assert sum(capped[k] - start[k] for k in end) == 10
    assert all(start[k] <= capped[k] <= end[k] for k in end)
    assert _cap_rows(start, end, 10_000) == end


def test_stream_reads_every_record_exactly_once_in_bounded_batches(spark, stack_config, tmp_path):
    topic = f"src-{uuid.uuid4().hex[:8]}"
    ensure_topics(stack_config.bootstrap, [topic], 3)
    client = producer(stack_config.bootstrap)
    sent = {}
    for i in range(250):
        meta = client.send(topic, key=str(i % 7).encode(), value=f"v{i}".encode()).get(timeout=10)
        sent[(meta.partition, meta.offset)] = f"v{i}".encode()
    client.close()

    spark.dataSource.register(KafkaSource)
    seen, sizes = [], []

    def collect(batch, batch_id):
        rows = batch.select("topic", "partition", "offset", "value").collect()
        sizes.append(len(rows))
        seen.extend(rows)

    stream = (spark.readStream.format("headwater_kafka")
              .option("kafka.bootstrap.servers", stack_config.bootstrap)
              .option("subscribe", topic).option("maxOffsetsPerTrigger", 100).load())
    query = (stream.writeStream.foreachBatch(collect).trigger(processingTime="200 milliseconds")
             .option("checkpointLocation", str(tmp_path / "cp")).start())
    try:
        import time

        deadline = time.monotonic() + 120
        while len(seen) < len(sent) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        stop_when_idle(query)
    assert all(r.topic == topic for r in seen)
    got = {(r.partition, r.offset): bytes(r.value) for r in seen}
    assert len(seen) == len(got) == len(sent)
    assert got == sent
    assert max(sizes) <= 100


def test_the_latest_offset_of_a_stream_with_nothing_new_comes_at_once(stack_config):
    """At a partition's end the broker holds a fetch as long as the consumer allows (500 ms by default), and
    every trigger of an idle stream asks: the source's consumer allows ``HIGH_WATERMARK_WAIT_MS``."""
    import statistics
    import time

    from headwater.adapters.kafka import HIGH_WATERMARK_WAIT_MS

    topic = f"src-{uuid.uuid4().hex[:8]}"
    ensure_topics(stack_config.bootstrap, [topic], 2)
    client = producer(stack_config.bootstrap)
    for i in range(10):
        client.send(topic, value=f"v{i}".encode(), partition=i % 2)
    client.flush(10)
    client.close()
    reader = KafkaSource({"kafka.bootstrap.servers": stack_config.bootstrap, "subscribe": topic}) \
        .streamReader(KafkaSource({}).schema())
    try:
        end = reader.latestOffset(reader.initialOffset(), reader.getDefaultReadLimit())
        assert end == {f"{topic}:0": 5, f"{topic}:1": 5}
        seconds = []
        for _ in range(5):
            started = time.monotonic()
            assert reader.latestOffset(end, reader.getDefaultReadLimit()) == end
            seconds.append(time.monotonic() - started)
    finally:
        reader.stop()
    # Both partitions at their end, in one fetch: the broker holds it 10 ms; kafka-python's default, 500 ms.
    assert statistics.median(seconds) < 0.25, (HIGH_WATERMARK_WAIT_MS, seconds)
