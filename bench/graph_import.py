"""Bulk import of a bench's lineage into Neo4j with Neo4j's own ``neo4j-admin database import full``.

For the benches only, where the indexer would take too long (100M edges at its ~15,000
edges/s is about two hours): the lineage is written to CSV files as the indexer would
write it to the graph (``headwater.store.graph``: ``(:Row {rid, kind, dataset, …})``,
``-[:DERIVED {query, batch, op, cols, exact: false only on a superset's edge}]->``, every
integer a long, a null no property), the server's database is loaded from them before its
first start (``Neo4jServer.import_full``), and the indexer's own ``ensure_schema`` then
makes the constraints and indexes on the running server. A row is written once, as the
indexer's ``MERGE … ON CREATE`` keeps the first message's properties of a row many
messages name (a customers row, an order two queries read).

``messages`` is a function returning the lineage's ``(nodes, edges)`` messages afresh
(it is read twice: once for the rows' first occurrences, once to write).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as csv

from headwater.core.schema import EDGE_SCHEMA, NODE_SCHEMA
from headwater.store.graph import exact_as_written

LABEL, TYPE = "Row", "DERIVED"
_TYPES = {pa.int64(): "long", pa.int32(): "long", pa.bool_(): "boolean", pa.string(): "string"}
# A node's import id is its rid's digits (ids of type integer must not be negative, and rids are signed), and
# its rid also a property of its own, a long, as the indexer writes it.
NODE_HEADER = [f":ID({LABEL})"] + [f"{f.name}:{_TYPES[f.type]}" for f in NODE_SCHEMA]
EDGE_HEADER = [f":START_ID({LABEL})", f":END_ID({LABEL})"] + [f"{f.name}:{_TYPES[f.type]}" for f in EDGE_SCHEMA
                                                              if f.name not in ("src", "dst")]
_EXACT = EDGE_SCHEMA.get_field_index("exact")
_EDGE_CSV = EDGE_SCHEMA.set(_EXACT, EDGE_SCHEMA.field("exact").with_nullable(True))  # null: an exact edge

_NODE_CSV = pa.schema([pa.field("id", pa.int64(), nullable=False), *NODE_SCHEMA])

Messages = Callable[[], Iterable[tuple[pa.Table, pa.Table]]]


def first_rows(messages: Messages) -> np.ndarray:
    """For every node of every message in order, whether it is its rid's first occurrence."""
    rids = np.concatenate([nodes["rid"].to_numpy() for nodes, _ in messages()])
    first = np.zeros(len(rids), bool)
    first[np.unique(rids, return_index=True)[1]] = True
    return first


def _with_id(nodes: pa.Table) -> pa.Table:
    return nodes.add_column(0, _NODE_CSV.field("id"), nodes["rid"])


def write_csv(messages: Messages, folder: Path, say: Callable[[str], None] = lambda _: None) -> dict:
    """The lineage as the import's CSV files in ``folder``: ``{"nodes": {label: files}, "relationships": {type:
    files}, "rows": n, "edges": n}``, each list a header file then one data file."""
    folder.mkdir(parents=True, exist_ok=True)
    first = first_rows(messages)
    (folder / "rows-header.csv").write_text(",".join(NODE_HEADER) + "\n")
    (folder / "edges-header.csv").write_text(",".join(EDGE_HEADER) + "\n")
    options = csv.WriteOptions(include_header=False)
    at = rows = edges = 0
    with csv.CSVWriter(folder / "rows.csv", _NODE_CSV, write_options=options) as row_file, \
            csv.CSVWriter(folder / "edges.csv", _EDGE_CSV, write_options=options) as edge_file:
        for i, (nodes, message_edges) in enumerate(messages()):
            kept = nodes.filter(pa.array(first[at: at + nodes.num_rows]))
            at += nodes.num_rows
            row_file.write_table(_with_id(kept.cast(NODE_SCHEMA)))
            exact = exact_as_written(message_edges["exact"])
            edge_file.write_table(message_edges.cast(EDGE_SCHEMA).set_column(_EXACT, _EDGE_CSV.field("exact"), exact))
            rows, edges = rows + kept.num_rows, edges + message_edges.num_rows
            if i % 2000 == 0:
                say(f"import CSV: {edges:,} edges, {rows:,} rows written")
    return {"nodes": {LABEL: [folder / "rows-header.csv", folder / "rows.csv"]},
            "relationships": {TYPE: [folder / "edges-header.csv", folder / "edges.csv"]},
            "rows": rows, "edges": edges}
