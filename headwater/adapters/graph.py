"""Connecting to the Bolt graph store: Neo4j 5 (the local stack's, or the user's own)."""

from __future__ import annotations

import time

from neo4j import Driver, GraphDatabase
from neo4j.exceptions import Neo4jError, ServiceUnavailable

from headwater.core.config import Config


class GraphUnavailable(RuntimeError):
    """The graph store did not answer a query; is the stack up (``headwater stack status``)?"""


def driver(config: Config, **options) -> Driver:
    """A driver of the configured graph store; ``options``: the neo4j driver's (timeouts, pool size).

    The server's notifications are off: headwater's statements name properties a new graph has not seen yet
    (Neo4j's "property key does not exist" warning), which the driver would log on stderr, where the CLI's
    errors go as JSON."""
    options.setdefault("notifications_min_severity", "OFF")
    return GraphDatabase.driver(config.graph_uri, auth=(config.graph_user, config.graph_password), **options)


def wait_ready(config: Config, timeout_s: float = 60.0) -> None:
    """Wait until a query on the configured database succeeds, not just until the port opens.

    The local server opens its Bolt port before it has created the database.
    """
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    with driver(config) as d:
        while time.monotonic() < deadline:
            try:
                with d.session(database=config.graph_database) as s:
                    s.run("RETURN 1 AS ok").consume()
                return
            except (ServiceUnavailable, Neo4jError, OSError) as exc:
                last = exc
                time.sleep(0.3)
    raise GraphUnavailable(f"graph store at {config.graph_uri} (database {config.graph_database}) did not answer: "
                           f"{last}")


# Every row with its properties, every edge with its properties, and the rid index questions start from, each read
# once: the pages a question may touch are then in Neo4j's page cache, where it holds the store (Neo4j Community has
# no warm-up of its own; its knowledge base advises reading every node and relationship). At 10M edges 5 s, and a
# hub's forward question then p99 141 ms against 706 ms cold (query/README.md, "Latency").
WARM_UP = ("MATCH (n:Row) RETURN count(n.kind)", "MATCH ()-[e:DERIVED]->() RETURN count(e.op)",
           "MATCH (n:Row) WHERE n.rid >= -9223372036854775808 RETURN count(n.rid)")


def warm_up(config: Config) -> float:
    """``WARM_UP`` read on the configured graph; its seconds."""
    started = time.monotonic()
    with driver(config) as d, d.session(database=config.graph_database) as session:
        for statement in WARM_UP:
            session.run(statement).consume()
    return time.monotonic() - started
