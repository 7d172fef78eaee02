"""Session fixtures: a local stack on free ports and a local SparkSession, both real."""

from __future__ import annotations

import os
import sys
import uuid

import pytest

from headwater.deploy.stack import Stack, free_port


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
def stack_config(stack):
    return stack.config()


def own_topics(stack_config, prefix: str = "t"):
    """``(config, tag)``: the stack's config with edges, log and dlq topics of a fresh tag."""
    tag = uuid.uuid4().hex[:8]
    config = stack_config.with_overrides(
        edges_topic=f"{prefix}{tag}.edges", log_topic=f"{prefix}{tag}.log", dlq_topic=f"{prefix}{tag}.dlq"
    )
    return config, tag


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
    from headwater.demo.run import spark_session

    warehouse = tmp_path_factory.mktemp("warehouse")
    session = spark_session("headwater-tests", **{"spark.sql.warehouse.dir": str(warehouse)})
    yield session
    session.stop()
