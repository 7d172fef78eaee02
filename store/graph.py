"""Idempotent writes of lineage rows and edges into the graph store, Neo4j 5.

Plain Cypher: parameters always, no APOC. A write's rows go first, then its edges, each
in ``Config.graph_write_sessions`` transactions at once (Neo4j runs a transaction on one
worker thread, so one at a time left this machine's second core idle: indexer/README.md,
Measured). Rows are split by rid, so no two transactions merge the same row; edges by
their dst, so all the edges into one row commit together, which the replay check below
relies on. Edges MATCH both ends by ``rid`` in transactions that start once the rows'
have committed (an edge's ends must be visible to it). Rows are idempotent by MERGE;
edges as below; a write cut short (a crash, a graph gone away) is written again whole,
and what it had committed is then skipped or merged.
"""

from __future__ import annotations

import json
import logging
import random
import time
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, Callable, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from neo4j.exceptions import ClientError, Neo4jError, ResultFailedError, TransientError

from headwater.adapters.graph import driver
from headwater.core.config import Config
from headwater.core.offsets import read_ranges
from headwater.core.rid import table_dataset

log = logging.getLogger("headwater.store")

SCHEMA_STATEMENTS = (
    "CREATE CONSTRAINT row_rid IF NOT EXISTS FOR (n:Row) REQUIRE n.rid IS UNIQUE",
    "CREATE CONSTRAINT dataset_name IF NOT EXISTS FOR (d:Dataset) REQUIRE d.name IS UNIQUE",
    # a batch's node is found by its query and number (MERGE_BATCH, BATCH_FIELDS) and a query's by its query
    # alone (GAPS_BETWEEN): one composite range index serves both, its first property leading
    "CREATE INDEX batch_key IF NOT EXISTS FOR (b:Batch) ON (b.query, b.batch)",
    # Where the Cypher guide's questions start (indexer/README.md): a Kafka record, a query's sink rows (by query
    # alone too), a static table's row. A composite index holds only the rows with all its properties, each
    # written once, when its row is created.
    "CREATE INDEX row_kafka IF NOT EXISTS FOR (n:Row) ON (n.topic, n.partition, n.offset)",
    "CREATE INDEX row_batch IF NOT EXISTS FOR (n:Row) ON (n.query, n.batch)",
    "CREATE INDEX row_key IF NOT EXISTS FOR (n:Row) ON (n.dataset, n.key)",
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
# One parameter map per output row (``_per_output``): its rid is looked up once, not once per edge
# (an aggregate's row has up to thousands), and its edges' columns travel as lists.
CREATE_EDGES = (
    "UNWIND $rows AS g MATCH (b:Row {rid: g.dst}) "
    "UNWIND range(0, size(g.src) - 1) AS i MATCH (a:Row {rid: g.src[i]}) "
    "CREATE (a)-[:DERIVED {query: g.query, batch: g.batch, op: g.op[i], exact: g.exact[i], cols: g.cols[i]}]->(b)"
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


def _batch_links(relationship: str, which: str) -> str:
    """A statement replacing a batch's ``relationship`` links that ``which`` (a condition on ``old``) selects by
    ``$links`` (``batch_graph``'s): the later record of a field wins, as in the batch log."""
    return ("MATCH (b:Batch {query: $query, batch: $batch}) "
            f"OPTIONAL MATCH (b)-[old:{relationship}]->() WHERE {which} DELETE old "
            "WITH DISTINCT b UNWIND $links AS l "
            "MERGE (d:Dataset {name: l.dataset}) ON CREATE SET d.source = l.source "
            f"CREATE (b)-[e:{relationship}]->(d) SET e = l.props")


# Per field of the log record that carries them; a static table's READs are those with a ``version``.
BATCH_LINKS = {
    "sources": _batch_links("READ", "old.version IS NULL"),
    "tables": _batch_links("READ", "old.version IS NOT NULL"),
    "sink_offsets": _batch_links("WROTE", "true"),
}
# A question's statements are planned once and their plans kept (``CYPHER replan=skip``). Each starts at an index
# (a row's rid, a batch's key), so its best plan does not change with the graph's counts; but Neo4j plans a
# statement again once the counts have moved enough (``dbms.cypher.statistics_divergence_threshold``), as a
# 100,000-row batch indexed moves them, and the first question after that paid 100-156 ms a statement, two or
# three a question (against 3-6 ms with the plan kept; Neo4j 5, 2k rows then 200k more). A plan is still made
# anew when the schema changes: a rows' lookup planned before the rid constraint existed scanned 300,000 rows
# (300 ms), and once it existed, sought them (12 ms), the statement unchanged.
PLANNED_ONCE = "CYPHER replan=skip "
# A kept plan must be the index's seek whatever the counts were when it was made, so each statement names its
# index's seek (``USING INDEX SEEK``). Planned while the rid index had rows but no sample yet, as just after a
# first batch is indexed, Neo4j scanned the whole index instead for a step's edges (``IndexSelectivity`` 0.0 in
# its log); kept, that scan cost each step 84-188 ms once the graph held 300,000 more rows, against 7-24 ms
# hinted (a fresh Neo4j 5; in the narrowing bench the first question of a 100,000-row batch took 0.29 s). A hint
# naming an index not made yet plans without it, and making the index plans anew.
SEEK_ROW = "USING INDEX SEEK {}:Row(rid) "
SEEK_BATCH = "USING INDEX SEEK b:Batch(query, batch) "
BATCH_FIELDS = (
    PLANNED_ONCE + "UNWIND $pairs AS p "
    "MATCH (b:Batch {query: p.query, batch: p.batch}) " + SEEK_BATCH
    + "RETURN b.query AS query, b.batch AS batch, b.status AS status, b.at AS at"
)
GAPS_BETWEEN = (
    PLANNED_ONCE + "MATCH (b:Batch {query: $query}) " + SEEK_BATCH + "WHERE b.batch >= $first AND b.batch <= $last "
    "AND (b.status IS NULL OR b.status <> 'full') "
    "RETURN b.batch AS batch, b.status AS status"
)

CHUNK = 5000  # rows per statement
# A write's transaction is tried again this many times in all when the graph failed it for now (a deadlock between
# the write's own sessions, on a hub's relationship groups). The driver tries a transaction again itself, but not
# when the failure came back at a statement's start (neo4j 6.4): its rollback then reads the failed result, which
# raises ``ResultFailedError``, not retryable, the deadlock its cause (a 1,000,000-row grouped batch, 2026-12-06).
WRITE_ATTEMPTS = 5


def _rows(table: pa.Table) -> list[dict]:
    """Table rows as property maps, nulls left out (graph properties cannot be null)."""
    return [{k: v for k, v in row.items() if v is not None} for row in table.to_pylist()]


def exact_as_written(exact: pa.ChunkedArray) -> pa.ChunkedArray:
    """Edges' ``exact`` as the graph holds it: null (no property) on an exact edge, one property fewer on nearly
    every edge (15% more edges/s measured); ``false`` on an edge of a superset."""
    return pc.if_else(exact, pa.scalar(None, pa.bool_()), False)


def _flat(table: pa.Table) -> list[list[dict]]:
    """A statement's parameters: ``table``'s rows, ``CHUNK`` at a time."""
    rows = _rows(table)
    return [rows[i: i + CHUNK] for i in range(0, len(rows), CHUNK)]


def _per_output(edges: pa.Table) -> pa.Table:
    """Edges into output rows, one row per output row: its rid, query and batch, and its edges' ``src``, ``op``,
    ``exact``, ``cols`` as lists (``CREATE_EDGES``' shape)."""
    columns = ("src", "op", "exact", "cols")
    grouped = edges.group_by(["dst", "query", "batch"], use_threads=False).aggregate([(c, "list") for c in columns])
    return grouped.rename_columns([c.removesuffix("_list") for c in grouped.column_names])


def _in_chunks(outputs: pa.Table) -> list[list[dict]]:
    """``CREATE_EDGES``' parameters: ``_per_output``'s rows as maps, about ``CHUNK`` edges at a time."""
    chunks: list[list[dict]] = []
    chunk: list[dict] = []
    size = 0
    for row in outputs.to_pylist():
        if chunk and size + len(row["src"]) > CHUNK:
            chunks.append(chunk)
            chunk, size = [], 0
        chunk.append(row)
        size += len(row["src"])
    return chunks + ([chunk] if chunk else [])


class GraphWriter:
    def __init__(self, config: Config):
        self.config = config
        self._driver = driver(config)
        self._pool = ThreadPoolExecutor(config.graph_write_sessions, thread_name_prefix="headwater-graph-write")

    def close(self) -> None:
        self._pool.shutdown()
        self._driver.close()

    def _session(self):
        return self._driver.session(database=self.config.graph_database)

    def ensure_schema(self, attempts: int = 10) -> None:
        """The constraints and indexes made (each statement is a no-op once they exist). Replicas that start at
        once make them at once: Neo4j may end one's transaction as a deadlock, or refuse a rule another made
        meanwhile (``IF NOT EXISTS`` looked before it was there); it is tried again."""
        for attempt in range(attempts):
            try:
                with self._session() as s:
                    for statement in SCHEMA_STATEMENTS:
                        s.run(statement).consume()
                return
            except (TransientError, ClientError) as exc:
                raced = isinstance(exc, TransientError) or (exc.code or "").startswith("Neo.ClientError.Schema.")
                if not raced or attempt == attempts - 1:
                    raise
                time.sleep(0.2 * (attempt + 1))

    def write_lineage(self, nodes: pa.Table, edges: pa.Table) -> int:
        """Write rows, then edges, each in concurrent transactions; returns the edges written (not skipped
        as written before)."""
        edges = edges.set_column(edges.schema.get_field_index("exact"), "exact", exact_as_written(edges["exact"]))
        outputs = nodes.filter(pc.equal(nodes["kind"], "output"))["rid"]
        into_output = pc.is_in(edges["dst"], outputs)
        fresh, others = edges.filter(into_output), edges.filter(pc.invert(into_output))
        from_state = pc.is_in(others["src"], nodes.filter(pc.equal(nodes["kind"], "state"))["rid"])
        todo = self._not_written(_per_output(fresh))
        self._concurrently([[(MERGE_ROWS, _flat, part)] for part in self._split(nodes, "rid")])
        by_dst = zip(*(self._split(table, "dst") for table in (todo, others.filter(from_state),
                                                              others.filter(pc.invert(from_state)))))
        self._concurrently([[(CREATE_EDGES, _in_chunks, into_outputs), (MERGE_EDGES_FROM_DST, _flat, from_states),
                             (MERGE_EDGES_FROM_SRC, _flat, from_rows)]
                            for into_outputs, from_states, from_rows in by_dst])
        return len(pc.list_flatten(todo["src"])) + others.num_rows

    def _not_written(self, outputs: pa.Table) -> pa.Table:
        """``_per_output``'s rows but those of output rows that already have edges of the same query and batch."""
        keys = outputs.select(["dst", "query", "batch"])

        def read(tx) -> set:
            return {(r["dst"], r["query"], r["batch"]) for i in range(0, keys.num_rows, CHUNK)
                    for r in tx.run(WRITTEN_OUTPUTS, rows=keys.slice(i, CHUNK).to_pylist())}

        with self._session() as s:  # on a cluster, from the leader: a follower may not hold the last writes yet
            written = s.execute_write(read) if keys.num_rows else set()
        if not written:
            return outputs
        mine = zip(*(keys[c].to_pylist() for c in keys.column_names))
        return outputs.filter(pa.array([key not in written for key in mine], pa.bool_()))

    def _split(self, table: pa.Table, column: str) -> list[pa.Table]:
        """``table`` in ``graph_write_sessions`` parts by ``column``'s rid (rids are hashes: even parts)."""
        sessions = self.config.graph_write_sessions
        part = np.asarray(table[column].to_numpy() % sessions)
        return [table.filter(pa.array(part == i)) for i in range(sessions)]

    def _concurrently(self, transactions: list[list[tuple[str, Callable, pa.Table]]]) -> None:
        """Each transaction's statements, ``(statement, parameters, table)`` (``parameters(table)``: the
        ``$rows`` of each run of the statement), in a session of its own, all at once; returns when all have
        ended, raising the first failure (none is left running behind it)."""
        def run(statements) -> None:
            params = [(statement, parameters(table)) for statement, parameters, table in statements if table.num_rows]
            if not params:
                return

            def work(tx) -> None:
                for statement, chunks in params:
                    for rows in chunks:
                        tx.run(statement, rows=rows).consume()

            for attempt in range(WRITE_ATTEMPTS):
                try:
                    with self._session() as s:
                        s.execute_write(work)
                    return
                except ResultFailedError as exc:
                    cause = exc.__cause__
                    if not isinstance(cause, Neo4jError) or not cause.is_retryable():
                        raise
                    if attempt == WRITE_ATTEMPTS - 1:
                        raise cause from exc  # a store away for now, to the indexer: it writes the range again
                    log.warning("graph write failed for now (%s), trying it again (%d of %d)", cause.code,
                                attempt + 2, WRITE_ATTEMPTS)
                    time.sleep(random.uniform(0.5, 1.5) * (attempt + 1))

        done, _ = wait([self._pool.submit(run, statements) for statements in transactions])
        for future in done:
            future.result()

    def write_dataset(self, name: str, props: dict) -> None:
        with self._session() as s:
            s.execute_write(lambda tx: tx.run(MERGE_DATASET, {"name": name, "props": props}).consume())

    def write_batch(self, query: str, batch: int, fields: dict) -> None:
        """One log record's fields of a batch (nested, as logged) onto its ``(:Batch)`` node and links
        (``batch_graph``), in one transaction."""
        props, links = batch_graph(fields)

        def work(tx) -> None:  # parameters as a map: ``run``'s first argument is called ``query``
            tx.run(MERGE_BATCH, {"query": query, "batch": batch, "props": props}).consume()
            for field, found in links.items():
                tx.run(BATCH_LINKS[field], {"query": query, "batch": batch, "links": found}).consume()

        with self._session() as s:
            s.execute_write(work)


def batch_graph(fields: dict) -> tuple[dict, dict[str, list[dict]]]:
    """A batch's log fields (``capture/listener.py``'s progress record, ``capture/tracer.py``'s batch record) as
    the graph holds them (indexer/README.md, Cypher guide): ``(properties of the Batch node, {field: links})``.

    Scalars stay as they are; ``durations_ms`` becomes one ``<Spark's key>_ms`` property each; a list of
    scalars (``sink_files``) a list. ``sources`` becomes a ``READ`` link per Kafka topic-partition read (its
    offsets ``[start_offset, end_offset)``, as ``offsets.read_ranges``) into ``(:Dataset {name: 'kafka:TOPIC'})``,
    the name rows of the topic carry, and per other source one into the dataset of its Spark description, its
    offsets' fields as ``start_<field>``/``end_<field>``; ``tables`` a ``READ {version}`` into the table's
    dataset; ``sink_offsets`` a ``WROTE`` link per topic-partition. Anything else nested is JSON text.
    """
    props, links = {}, {}
    for name, value in fields.items():
        if name in BATCH_LINKS:
            links[name] = _LINKS_OF[name](value or {})
        elif name == "durations_ms":
            props.update({f"{key}_ms": ms for key, ms in (value or {}).items() if ms is not None})
        elif isinstance(value, (int, float, str, bool)) or _scalars(value):
            props[name] = value
        else:
            props[name] = json.dumps(value, sort_keys=True)
    return props, links


def _scalars(value) -> bool:
    """A list of scalars of one type, which a property holds as it is."""
    return isinstance(value, list) and bool(value) and len({type(v) for v in value}) == 1 \
        and isinstance(value[0], (int, float, str, bool))


def _source_reads(sources: list[dict]) -> list[dict]:
    reads = []
    for source in sources:
        described = {"source": source["description"]} if source.get("description") else {}
        if _kafka_offsets(source.get("end")):
            reads += [{"dataset": f"kafka:{topic}", "source": "kafka",
                       "props": {**described, "topic": topic, "partition": partition,
                                 "start_offset": start, "end_offset": end}}
                      for (topic, partition), (start, end) in sorted(read_ranges(source.get("start"),
                                                                                 source.get("end")).items())]
        else:
            name = source.get("description") or "stream"
            props = {"source": name, **_offset_fields("start", source.get("start")),
                     **_offset_fields("end", source.get("end"))}
            if source.get("rows_in") is not None:
                props["rows_in"] = source["rows_in"]
            reads.append({"dataset": name, "source": "stream", "props": props})
    return reads


def _kafka_offsets(value) -> bool:
    """Whether a source's offsets are a Kafka source's (``offsets.partition_offsets``' two forms)."""
    if not isinstance(value, dict) or not value:
        return False
    return all(isinstance(v, dict) for v in value.values()) or all(":" in k and isinstance(v, int)
                                                                  for k, v in value.items())


def _offset_fields(end: str, value) -> dict:
    """A non-Kafka source's ``start`` or ``end`` offsets as properties: ``end_logOffset`` of a file source's."""
    if value is None:
        return {}
    if isinstance(value, (int, float, str, bool)):
        return {f"{end}_offset": value}
    if isinstance(value, dict) and all(isinstance(v, (int, float, str, bool)) for v in value.values()):
        return {f"{end}_{key}": v for key, v in value.items()}
    return {end: json.dumps(value, sort_keys=True)}


def _table_reads(tables: dict) -> list[dict]:
    # no ``source``: the table's node is the plan record's to describe (``service._dataset_props``)
    return [{"dataset": table_dataset(location), "source": None, "props": {"version": version}}
            for location, version in sorted(tables.items())]


def _sink_writes(offsets: dict) -> list[dict]:
    return [{"dataset": f"kafka:{topic}", "source": "kafka",
             "props": {"topic": topic, "partition": int(partition), "start_offset": span[0], "end_offset": span[1]}}
            for topic, partitions in sorted(offsets.items())
            for partition, span in sorted(partitions.items(), key=lambda kv: int(kv[0]))]


_LINKS_OF: dict[str, Callable[[Any], list]] = {
    "sources": _source_reads, "tables": _table_reads, "sink_offsets": _sink_writes}


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
