"""Session fixtures: a local stack on free ports and a local SparkSession, both real."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest

from headwater.adapters.kafka import list_topics
from headwater.adapters.spark_lines import recent_progress
from headwater.deploy.kafka_server import KafkaServer
from headwater.deploy.stack import Stack, free_port

# Fixtures that start a server or a Spark session, or fetch a tool: a module whose tests use none is fast.
_SLOW_FIXTURES = {"stack", "spark", "broker", "demo_home", "tools", "s3"}


def pytest_collection_modifyitems(config, items):
    """A fast tier first: the modules none of whose tests starts a server or Spark run before the rest, each
    module's tests kept together and in their order, so a plain mistake fails in a minute, not in the hour.

    A test of an API that the installed Spark's line lacks (``@pytest.mark.since("4.2")``: PySpark's
    ``transformWithStateInPandas``, ``DataFrame.lateralJoin``) is deselected on that line, as pytest's ``-m``
    deselects: it is counted in pytest's summary, not skipped."""
    from headwater.adapters import spark_lines

    line = spark_lines.installed()
    lacking = {item for item in items if not all(line.has(mark.args[0]) for mark in item.iter_markers("since"))}
    if lacking:
        config.hook.pytest_deselected(items=list(lacking))
        items[:] = [item for item in items if item not in lacking]
    for item in items:  # so that ``-m "not spark and not stack"`` selects the fast tier alone
        uses = set(item.fixturenames)
        if "spark" in uses:
            item.add_marker("spark")
        if uses & (_SLOW_FIXTURES - {"spark"}):
            item.add_marker("stack")
    slow = {item.module for item in items if item.get_closest_marker("spark") or item.get_closest_marker("stack")}
    items.sort(key=lambda item: item.module in slow)


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    """The embedded broker and graph server, started once for the session, stopped at its end."""
    home = tmp_path_factory.mktemp("stack")
    local = Stack(home, ports={"broker": free_port(), "bolt": free_port(), "graph_http": free_port()})
    try:
        local.up()
        yield local
    finally:
        local.down()


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    """A real S3 server (SeaweedFS) on 127.0.0.1, its endpoint and credentials in this process's environment
    (what the store's S3 clients read), started once for the session, stopped at its end."""
    from headwater.deploy.s3_server import S3Server

    server = S3Server(tmp_path_factory.mktemp("s3"))
    before = {name: os.environ.get(name) for name in server.environment()}
    try:
        server.start()
        os.environ.update(server.environment())
        yield server
    finally:
        server.stop()
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture(scope="session")
def stack_config(stack):
    """The stack's config; capture's spill and the indexer's store are in the stack's folder, not the user's home."""
    return stack.config().with_overrides(spill_dir=str(stack.home / "spill"), store_dir=str(stack.home / "store"))


def own_topics(stack_config, prefix: str = "t"):
    """``(config, tag)``: the stack's config with edges, log and dlq topics of a fresh tag."""
    tag = uuid.uuid4().hex[:8]
    config = stack_config.with_overrides(
        edges_topic=f"{prefix}{tag}.edges", log_topic=f"{prefix}{tag}.log", dlq_topic=f"{prefix}{tag}.dlq"
    )
    return config, tag


def topic_records(config, topic: str) -> list:
    """Every record on ``topic`` when called, partition by partition, read with the config's security settings:
    up to each partition's end offset of that moment (``records_between``), so it returns as soon as it has them."""
    from kafka import TopicPartition

    from headwater.adapters.kafka import consumer, records_between

    client = consumer(config)
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(client.partitions_for_topic(topic) or [])]
        firsts, ends = client.beginning_offsets(partitions), client.end_offsets(partitions)
    finally:
        client.close()
    ranges = {(topic, tp.partition): (firsts[tp], ends[tp]) for tp in partitions}
    return sorted(records_between(config, ranges, timeout_s=60, whole=True), key=lambda m: (m.partition, m.offset))


def read_log(config) -> list[dict]:
    """Every record on the config's log topic, decoded."""
    from headwater.core.schema import decode_log

    return [decode_log(m.value) for m in topic_records(config, config.log_topic)]


def edges_published(config) -> list[tuple[bytes, dict]]:
    """Every edge on the config's edges topic, with the key of the message that held it."""
    from headwater.core.schema import decode_lineage

    return [(m.key, edge) for m in topic_records(config, config.edges_topic)
            for edge in decode_lineage(m.value)[1].to_pylist()]


def local_file(path: str) -> str:
    """A file's local path, resolved, whether Spark names it as a URI (escaped) or not."""

    from headwater.spark.table_files import uri_path

    return str(Path(uri_path(path)).resolve())


def sink_file_batches(config, query: str) -> dict[str, int]:
    """The batch that wrote each file of a traced query's file sink (``local_file``), as capture
    logged it in the batch's record (``sink_files``)."""
    from headwater.core.schema import LOG_BATCH

    return {local_file(f): r["batch"] for r in read_log(config) if r["schema"] == LOG_BATCH and r["query"] == query
            for f in r.get("sink_files") or []}


def index(config, group: str | None = None, idle_s: float = 1.5, max_seconds: float = 180):
    """Index everything on the config's topics into the graph and the store, until caught up;
    the indexer's stats. An indexer that could not catch up in ``max_seconds`` fails the test
    here, with what it did and what it said, rather than as a row missing later."""
    from headwater.indexer.service import Indexer

    said = []
    indexer = Indexer(config, group=group, say=said.append)
    try:
        stats = indexer.run(drain=True, idle_s=idle_s, max_seconds=max_seconds)
    finally:
        indexer.close()
    assert stats.caught_up, f"the indexer did not catch up in {max_seconds}s: {stats.to_dict()}; it said: {said[-20:]}"
    return stats


def records_read(query) -> dict[tuple[str, int, int], int]:
    """The batch of ``query`` that read each Kafka record ``(topic, partition, offset)``, from Spark's
    progress (each source's start and end offsets)."""
    from headwater.core.offsets import read_ranges

    read = {}
    for progress in recent_progress(query):
        for source in progress.sources:
            for (topic, partition), (start, end) in read_ranges(source.startOffset, source.endOffset).items():
                read.update({(topic, partition, offset): progress.batchId for offset in range(start, end)})
    return read


def stored_edges(config) -> Counter:
    """Every committed edge of the store's edges table (shards and generations alike), counted."""
    from headwater.store.edges import LineageTables

    edges = LineageTables(config.store_dir, config.edges_topic).edges
    table = edges.read(edges.files()["path"].to_pylist(), ["src", "dst", "query"])
    return Counter(zip(table["src"].to_pylist(), table["dst"].to_pylist(), table["query"].to_pylist()))


def graph_edge_counts(config, queries: list[str]) -> Counter:
    """Every DERIVED relationship of ``queries`` in the graph, counted."""
    from headwater.adapters.graph import driver

    with driver(config) as d, d.session(database=config.graph_database) as s:
        result = s.run("MATCH (a:Row)-[e:DERIVED]->(b:Row) WHERE e.query IN $queries "
                       "RETURN a.rid AS src, b.rid AS dst, e.query AS query", queries=queries)
        return Counter((r["src"], r["dst"], r["query"]) for r in result)


def wait_batches(query, count: int, timeout_s: float = 120) -> None:
    """Wait until ``query`` has run ``count`` batches that read rows."""
    import time

    deadline = time.monotonic() + timeout_s
    while sum(1 for p in recent_progress(query) if p.numInputRows) < count:
        assert query.exception() is None, query.exception()
        assert time.monotonic() < deadline, f"the stream did not finish {count} batches"
        time.sleep(0.2)


def while_initializing(queries, at_most: int = 2, timeout_s: float = 120) -> None:
    """Wait until at most ``at_most`` of ``queries`` are still initializing their sources.

    A dozen queries started at once on two busy cores each start their Kafka consumers and Python
    workers together; call this before each start to keep them from crowding one another out.
    """
    import time

    deadline = time.monotonic() + timeout_s
    while sum(1 for q in queries if q.isActive and q.status["message"] == "Initializing sources") > at_most:
        assert time.monotonic() < deadline, "queries still initializing their sources"
        time.sleep(0.05)


def stop_when_idle(query, timeout_s: float = 60) -> None:
    """Stop a streaming query between triggers (a foreachBatch query stopped mid-trigger may fail).

    A stream that has fallen behind its trigger is never idle for long: after
    ``timeout_s`` it is stopped anyway, and the test's checks say what that cost.
    """
    import time

    deadline = time.monotonic() + timeout_s
    while query.status["isTriggerActive"] and time.monotonic() < deadline:
        time.sleep(0.01)
    query.stop()


@pytest.fixture
def config(stack_config):
    """The stack's config with topics of this test's own."""
    return own_topics(stack_config)[0]


@pytest.fixture(scope="session")
def spark(stack, tmp_path_factory):
    """A local SparkSession; it asks for the stack only so that the stack outlives it."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # Spark's Python workers unpickle the tests' UDFs by module name: let them import tests.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    from headwater.adapters.spark import spark_session

    warehouse = tmp_path_factory.mktemp("warehouse")
    session = spark_session("headwater-tests", **{"spark.sql.warehouse.dir": str(warehouse)})
    yield session
    session.stop()


def stop_process(proc: subprocess.Popen | None, first: int = signal.SIGTERM, timeout_s: float = 30) -> None:
    """Stop a process a test started, by its PID: ``first`` (SIGINT lets the indexer close its consumer), then
    SIGKILL if it has not gone in ``timeout_s``."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(first)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout_s)


class Broker:
    """An Apache Kafka broker of a test's own on fixed ports, killed and started again by its PID. Its data
    outlives a kill, as a real broker's does; ``start(empty=True)`` starts it with none (a replaced broker)."""

    def __init__(self, folder, logfile):
        from headwater.deploy.tools import kafka

        self.server = KafkaServer(folder, free_port(), free_port())
        self.logfile, self.proc, self.jars = logfile, None, kafka()

    @property
    def port(self) -> int:
        return self.server.port

    def start(self, empty: bool = False) -> None:
        if empty:
            self.server.wipe()
        self.proc = self.server.start(self.jars, self.logfile)
        list_topics(self.server.bootstrap, timeout_s=60)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


@pytest.fixture
def broker(tmp_path):
    """A broker of the test's own, which the test may kill and start again (it loses what it held)."""
    broker = Broker(tmp_path / "broker", tmp_path / "broker.log")
    broker.start()
    try:
        yield broker
    finally:
        broker.kill()


@pytest.fixture(scope="session")
def tools():
    """The path of an external tool the tests run, by name: ``tools("promtool")``. Fetched on first
    use into the tools cache by ``headwater.deploy.tools``, so a fresh machine needs nothing by hand."""
    from headwater.deploy.tools import path

    return path


@pytest.fixture(scope="session")
def demo_run(stack):
    """The demo (300 orders) run into the session's stack once (``bench.cli_latency.demo_stack``), shared by
    the CLI's tests in-process and through the stack's query service."""
    from bench.cli_latency import demo_stack

    with demo_stack(stack.home, orders=300) as run:
        yield run


@pytest.fixture(scope="session")
def demo_home(tmp_path_factory):
    """``(home, run)``: a stack of its own on free ports with ``headwater demo`` run on it once, as a user
    runs it (``run``: its stdout and seconds, ``bench.http_load.DemoRun``), shared by the demo's, the
    explorer's and the HTTP load tests; stopped at the session's end."""
    from bench.http_load import demo_stack

    home = tmp_path_factory.mktemp("demo") / "home"
    with demo_stack(home) as run:
        yield home, run
