"""``headwater demo``: the whole path on the embedded local stack, with progress.

Starts the stack (unless it runs), produces orders to Kafka, runs the traced pipeline
to the end of the topic, indexes the lineage, and answers one backward lineage query.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from headwater.adapters.spark import spark_session
from headwater.adapters.spark_lines import last_progress, recent_progress
from headwater.core.config import Config
from headwater.core.offsets import Offsets, reached


@dataclass
class DemoResult:
    topic: str
    sink: str
    orders: int
    malformed: int
    output_rows: int
    batches: int
    edges: int
    rid: int
    lineage: list[dict]


def count_malformed(events: list[tuple[bytes, bytes]]) -> int:
    """Events whose value is not an order object with numeric ids and amount."""
    bad = 0
    for _, value in events:
        try:
            order = json.loads(value)
            ok = isinstance(order, dict) and all(
                isinstance(order.get(k), (int, float)) and not isinstance(order.get(k), bool)
                for k in ("order_id", "customer_id", "amount")
            )
        except (ValueError, UnicodeDecodeError):
            ok = False
        bad += not ok
    return bad


def end_offsets(topic: str, coordinates: list[tuple[int, int]]) -> Offsets:
    """The source's offsets (``{(topic, partition): next offset}``) once every event is read."""
    ends: Offsets = {}
    for partition, offset in coordinates:
        ends[topic, partition] = max(ends.get((topic, partition), 0), offset + 1)
    return ends


def run_until(query, until: Offsets, say: Callable[[str], None], timeout_s: float = 300.0) -> None:
    """Let a live ``query`` run until its source has read up to ``until``, then stop it."""
    deadline = time.monotonic() + timeout_s
    seen = -1
    while True:
        if query.exception():
            raise RuntimeError(f"the stream failed: {query.exception()}")
        progress = last_progress(query)
        if progress is not None and progress.batchId != seen and progress.numInputRows:
            seen = progress.batchId
            say(f"  batch {seen}: {progress.numInputRows} events in, {progress.durationMs.get('triggerExecution')} ms")
        read_all = progress is not None and reached(progress.sources[0].endOffset, until)
        if read_all and not query.status["isTriggerActive"]:
            query.stop()
            return
        if time.monotonic() > deadline:
            query.stop()
            raise TimeoutError(f"the stream did not reach offsets {until} within {timeout_s:.0f}s")
        time.sleep(0.2)


def run_pipeline(spark, config: Config, workdir: Path, topic: str, until: Offsets,
                 say: Callable[[str], None], max_per_batch: int = 400, keys: dict | None = None):
    """Run the traced demo pipeline until it has read ``until``; returns (sink path, query).

    ``keys``: the static tables' declared keys (``Tracer.trace``), customer_id by default;
    ``{}`` names customers rows by their whole content.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from headwater.capture import attach

    from . import orders as data
    from .pipeline import enriched_orders

    customers_path = workdir / "customers.parquet"
    if not customers_path.exists():
        pq.write_table(pa.Table.from_pylist(data.customers()), customers_path)
    tracer = attach(spark, config)
    df = enriched_orders(spark, config.bootstrap, topic, str(customers_path), max_per_batch)
    sink = str(workdir / f"enriched_orders-{topic}")
    query = (
        tracer.trace(df, name="enriched_orders", keys={"customers": "customer_id"} if keys is None else keys)
        .writeStream.format("parquet")
        .option("checkpointLocation", str(workdir / f"checkpoint-{topic}"))
        .trigger(processingTime="500 milliseconds")
        .start(sink)
    )
    try:
        run_until(query, until, say)
    finally:
        tracer.close()
    return sink, query


def run(home: Path, orders: int = 1000, keep_stack: bool = True, say: Callable[[str], None] = print,
        topic: str | None = None) -> DemoResult:
    """The demo on the local stack of ``home``: ``orders`` orders into ``topic`` (default: a new topic named by the
    time; a named one must not exist yet), the traced pipeline, the index, one row's lineage."""
    from headwater.deploy.stack import Stack
    from headwater.indexer.service import Indexer
    from headwater.query.api import LineageClient

    from . import orders as data

    t0 = time.monotonic()

    def step(text: str) -> None:
        say(f"[{time.monotonic() - t0:5.1f}s] {text}")

    stack = Stack(home, say=lambda s: step(f"  {s}"))
    step("starting the local stack (Apache Kafka + Bolt graph server)")
    started = [s.name for s in stack.status() if not s.running]
    stack.up()
    config = stack.config()
    workdir = home / "demo"
    workdir.mkdir(parents=True, exist_ok=True)
    topic = topic or f"orders-{time.strftime('%Y%m%d%H%M%S')}"
    try:
        from headwater.adapters.kafka import ensure_topics, list_topics

        if topic in list_topics(config):
            raise ValueError(f"the demo's topic {topic} exists already: name a new one")
        ensure_topics(config, [topic], 2)
        events = data.order_events(orders, malformed_every=97)
        coordinates = data.produce(config.bootstrap, topic, events)
        malformed = count_malformed(events)
        step(f"produced {len(events)} order events to Kafka topic {topic} ({malformed} malformed on purpose)")

        step("starting Spark (local[2]) and the traced pipeline")
        spark = spark_session("headwater-demo")
        sink, query = run_pipeline(spark, config, workdir, topic, end_offsets(topic, coordinates), say=step)
        batches = sum(1 for p in recent_progress(query) if p.numInputRows)
        output = spark.read.parquet(sink)
        output_rows = output.count()
        first = output.orderBy("order_id").first()
        step(f"pipeline done: {output_rows} enriched orders in {sink}; "
             f"{malformed} malformed events skipped by its filter")

        step("indexing lineage from Kafka into the graph")
        indexer = Indexer(config, say=lambda s: step(f"  {s}"))
        try:
            stats = indexer.run(drain=True, idle_s=2.0, max_seconds=120)
        finally:
            indexer.close()
        step(f"indexed {stats.edges} edges, {stats.rows} rows ({stats.dlq} messages to the dlq)")

        rid = first["_hw_rid"]
        step(f"lineage of output row order_id={first['order_id']} (_hw_rid {rid}):")
        say(f"$ headwater lineage backward --rid {rid} --payload")
        with LineageClient(config) as client:
            answer = client.backward(rid, payload=True)
        found = [row.to_dict() for row in answer]
        for row in found:
            say(json.dumps(row, default=str))
        say(json.dumps({"summary": answer.summary()}))
        step("done" + ("" if not keep_stack else "; the stack keeps running: `headwater stack down` stops it"))
        return DemoResult(topic, sink, len(events), malformed, output_rows, batches, stats.edges, rid, found)
    finally:
        if not keep_stack and started:
            stack.down()
