"""Idempotent writes of lineage rows and edges into a Bolt graph store.

Portable Cypher only (Neo4j 5 and ArcadeDB): parameters always, no APOC. Rows are
MERGEd before edges, and edges MATCH both ends by ``rid``: merging both ends and the
relationship in one statement deadlocks on ArcadeDB for chained rows.
"""

from __future__ import annotations

import pyarrow as pa

from headwater.adapters.graph import driver
from headwater.core.config import Config

SCHEMA_STATEMENTS = (
    "CREATE CONSTRAINT row_rid IF NOT EXISTS FOR (n:Row) REQUIRE n.rid IS UNIQUE",
    "CREATE CONSTRAINT dataset_name IF NOT EXISTS FOR (d:Dataset) REQUIRE d.name IS UNIQUE",
)

MERGE_ROWS = "UNWIND $rows AS r MERGE (n:Row {rid: r.rid}) SET n += r"
MERGE_EDGES = (
    "UNWIND $rows AS r "
    "MATCH (a:Row {rid: r.src}) MATCH (b:Row {rid: r.dst}) "
    "MERGE (a)-[e:DERIVED {query: r.query, batch: r.batch, op: r.op}]->(b) "
    "SET e.exact = r.exact, e.cols = r.cols"
)
MERGE_DATASET = "MERGE (d:Dataset {name: $name}) SET d += $props"
MERGE_BATCH = "MERGE (b:Batch {query: $query, batch: $batch}) SET b += $props"

CHUNK = 2000


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

    def write_lineage(self, nodes: pa.Table, edges: pa.Table) -> None:
        node_rows, edge_rows = _rows(nodes), _rows(edges)
        with self._session() as s:
            for i in range(0, len(node_rows), CHUNK):
                s.execute_write(lambda tx, rows: tx.run(MERGE_ROWS, rows=rows).consume(), node_rows[i : i + CHUNK])
            for i in range(0, len(edge_rows), CHUNK):
                s.execute_write(lambda tx, rows: tx.run(MERGE_EDGES, rows=rows).consume(), edge_rows[i : i + CHUNK])

    def write_dataset(self, name: str, props: dict) -> None:
        with self._session() as s:
            s.execute_write(lambda tx: tx.run(MERGE_DATASET, {"name": name, "props": props}).consume())

    def write_batch(self, query: str, batch: int, props: dict) -> None:
        with self._session() as s:
            params = {"query": query, "batch": batch, "props": props}
            s.execute_write(lambda tx: tx.run(MERGE_BATCH, params).consume())
