"""Idempotent writes of lineage rows and edges into the graph store, Neo4j 5.

Plain Cypher: parameters always, no APOC (written first for ArcadeDB, the Bolt server the
graph was before Neo4j could be fetched, whose measurements some notes below still quote).
Rows are MERGEd before edges, and edges MATCH both ends by ``rid``: merging both ends and
the relationship in one statement deadlocked on ArcadeDB for chained rows. Rows are
idempotent by MERGE; edges as below.
"""

from __future__ import annotations

from typing import Iterable

import pyarrow as pa
import pyarrow.compute as pc

from headwater.adapters.graph import driver
from headwater.core.config import Config

SCHEMA_STATEMENTS = (
    "CREATE CONSTRAINT row_rid IF NOT EXISTS FOR (n:Row) REQUIRE n.rid IS UNIQUE",
    "CREATE CONSTRAINT dataset_name IF NOT EXISTS FOR (d:Dataset) REQUIRE d.name IS UNIQUE",
    # a batch's node is found by its query and number (MERGE_BATCH, BATCH_FIELDS) and a query's by its query
    # alone (GAPS_BETWEEN): one composite range index serves both, its first property leading
    "CREATE INDEX batch_key IF NOT EXISTS FOR (b:Batch) ON (b.query, b.batch)",
)

# A row's properties never change (its rid is derived from them), so only a new row gets
# them: rows seen before (dimension rows every batch joins) are read, not written again.
MERGE_ROWS = "UNWIND $rows AS r MERGE (n:Row {rid: r.rid}) ON CREATE SET n += r"
# Edges into output rows are CREATEd, not MERGEd: a relationship MERGE checks the edges
# of the pattern's first node, and either end of a lineage edge can be a hub (a dimension
# row every order joins gains edges as long as the stream runs; an aggregate has up to
# thousands of inputs): on ArcadeDB, MERGE from the src fell to 20 edges/s at a degree of
# 40,000. They stay idempotent because an output row's lineage for a batch always
# travels in one payload (capture slices payloads by output rows): an output row that
# already has edges of that query and batch was written before (a replay, or a retried
# batch), and its edges are skipped, checked once per row, not per edge.
# Edges into other rows are MERGEd, from the end that stays small. A state node (an
# aggregate's group, a black box's node, a foreachBatch call's node) gains an edge from
# every row entering it, in the batch and, for most, for as long as the stream runs, so
# edges from a row that is not a state node (a Kafka record, a file row: a few edges
# each) are merged from their src; merged from the state node, each edge scanned all the
# node's edges so far (a 10,000-row black box batch took 70 s to index, the next 10,000
# rows 270 s). Edges from a state node (a black box's node into its output rows of a
# batch) are merged from their dst. Neo4j picks the smaller end itself; ArcadeDB checks
# the pattern's first node.
WRITTEN_OUTPUTS = (
    "UNWIND $rows AS r "
    "MATCH (b:Row {rid: r.dst})<-[e:DERIVED]-() WHERE e.query = r.query AND e.batch = r.batch "
    "RETURN DISTINCT r.dst AS dst, r.query AS query, r.batch AS batch"
)
CREATE_EDGES = (
    "UNWIND $rows AS r "
    "MATCH (b:Row {rid: r.dst}) MATCH (a:Row {rid: r.src}) "
    "CREATE (a)-[:DERIVED {query: r.query, batch: r.batch, op: r.op, exact: r.exact, cols: r.cols}]->(b)"
)
MERGE_EDGES_FROM_DST = (
    "UNWIND $rows AS r "
    "MATCH (b:Row {rid: r.dst}) MATCH (a:Row {rid: r.src}) "
    "MERGE (b)<-[e:DERIVED {query: r.query, batch: r.batch, op: r.op}]-(a) "
    "SET e.exact = r.exact, e.cols = r.cols"
)
MERGE_EDGES_FROM_SRC = (
    "UNWIND $rows AS r "
    "MATCH (a:Row {rid: r.src}) MATCH (b:Row {rid: r.dst}) "
    "MERGE (a)-[e:DERIVED {query: r.query, batch: r.batch, op: r.op}]->(b) "
    "SET e.exact = r.exact, e.cols = r.cols"
)
MERGE_DATASET = "MERGE (d:Dataset {name: $name}) SET d += $props"
MERGE_BATCH = "MERGE (b:Batch {query: $query, batch: $batch}) SET b += $props"
BATCH_FIELDS = (
    "UNWIND $pairs AS p "
    "MATCH (b:Batch {query: p.query, batch: p.batch}) "
    "RETURN b.query AS query, b.batch AS batch, b.status AS status, b.at AS at"
)
GAPS_BETWEEN = (
    "MATCH (b:Batch {query: $query}) WHERE b.batch >= $first AND b.batch <= $last "
    "AND (b.status IS NULL OR b.status <> 'full') "
    "RETURN b.batch AS batch, b.status AS status"
)

CHUNK = 5000  # rows per statement


def _rows(table: pa.Table) -> list[dict]:
    """Table rows as property maps, nulls left out (graph properties cannot be null)."""
    return [{k: v for k, v in row.items() if v is not None} for row in table.to_pylist()]


class GraphWriter:
    def __init__(self, config: Config):
        self.config = config
        self._driver = driver(config)

    def close(self) -> None:
        self._driver.close()

    def _session(self):
        return self._driver.session(database=self.config.graph_database)

    def ensure_schema(self) -> None:
        with self._session() as s:
            for statement in SCHEMA_STATEMENTS:
                s.run(statement).consume()

    def write_lineage(self, nodes: pa.Table, edges: pa.Table) -> int:
        """Write rows and edges in one transaction; returns the edges written (not skipped as written before)."""
        outputs = nodes.filter(pc.equal(nodes["kind"], "output"))["rid"]
        into_output = pc.is_in(edges["dst"], outputs)
        fresh, others = edges.filter(into_output), edges.filter(pc.invert(into_output))
        from_state = pc.is_in(others["src"], nodes.filter(pc.equal(nodes["kind"], "state"))["rid"])
        from_states, from_rows = others.filter(from_state), others.filter(pc.invert(from_state))
        groups = fresh.group_by(["dst", "query", "batch"], use_threads=False).aggregate([])
        node_rows = _rows(nodes)

        def work(tx) -> int:
            written = set()
            for i in range(0, groups.num_rows, CHUNK):
                rows = groups.slice(i, CHUNK).to_pylist()
                written.update((r["dst"], r["query"], r["batch"]) for r in tx.run(WRITTEN_OUTPUTS, rows=rows))
            todo = fresh
            if written:
                keys = [f"{d}|{q}|{b}" for d, q, b in written]
                mine = pc.binary_join_element_wise(pc.cast(fresh["dst"], pa.string()), fresh["query"],
                                                   pc.cast(fresh["batch"], pa.string()), "|")
                todo = fresh.filter(pc.invert(pc.is_in(mine, pa.array(keys))))
            for i in range(0, len(node_rows), CHUNK):
                tx.run(MERGE_ROWS, rows=node_rows[i: i + CHUNK]).consume()
            for statement, table in ((CREATE_EDGES, todo), (MERGE_EDGES_FROM_DST, from_states),
                                     (MERGE_EDGES_FROM_SRC, from_rows)):
                edge_rows = _rows(table)
                for i in range(0, len(edge_rows), CHUNK):
                    tx.run(statement, rows=edge_rows[i: i + CHUNK]).consume()
            return todo.num_rows + others.num_rows

        with self._session() as s:
            return s.execute_write(work)

    def write_dataset(self, name: str, props: dict) -> None:
        with self._session() as s:
            s.execute_write(lambda tx: tx.run(MERGE_DATASET, {"name": name, "props": props}).consume())

    def write_batch(self, query: str, batch: int, props: dict) -> None:
        with self._session() as s:
            params = {"query": query, "batch": batch, "props": props}
            s.execute_write(lambda tx: tx.run(MERGE_BATCH, params).consume())


def batch_statuses(graph, pairs: Iterable[tuple[str, int]], database: str | None = None) -> dict:
    """Each batch's capture status from its ``(:Batch)`` node: ``{(query, batch): status | None}``.

    ``graph`` is a driver (a session of ``database`` is opened) or an open session. None
    where the batch has no node or no status (only its progress was logged).
    """
    return {pair: fields["status"] for pair, fields in batch_fields(graph, pairs, database).items()}


def gaps_between(graph, query: str, first: int, last: int, database: str | None = None) -> dict:
    """The capture status of every batch of ``query`` from ``first`` to ``last`` that has a ``(:Batch)``
    node and is not fully captured: ``{(query, batch): status | None}`` (a stream's full batches, which a
    long stream has by the hundred thousand, are not read)."""
    with graph.session(database=database) as session:
        return {(query, row["batch"]): row["status"]
                for row in session.run(GAPS_BETWEEN, {"query": query, "first": first, "last": last})}


def batch_fields(graph, pairs: Iterable[tuple[str, int]], database: str | None = None) -> dict:
    """Each batch's ``status`` and ``at`` (when it ran) from its ``(:Batch)`` node, None where not logged:
    ``{(query, batch): {"status": …, "at": …}}``; ``graph`` as for ``batch_statuses``."""
    found = {(query, int(batch)): {"status": None, "at": None} for query, batch in pairs}
    keys = [{"query": query, "batch": batch} for query, batch in found]

    def read(session) -> None:
        for i in range(0, len(keys), CHUNK):
            for row in session.run(BATCH_FIELDS, pairs=keys[i: i + CHUNK]):
                found[(row["query"], row["batch"])] = {"status": row["status"], "at": row["at"]}

    if hasattr(graph, "session"):
        with graph.session(database=database) as session:
            read(session)
    else:
        read(graph)
    return found
