"""Lineage over the graph store with portable Cypher: one indexed lookup of a frontier's edges per level.

The walk itself is ``walk.walk``'s, as for every backend: a variable-length ``MATCH``
would enumerate every path, and a lineage DAG with hubs has exponentially many.
"""

from __future__ import annotations

import time
from typing import Any

import pyarrow as pa

from headwater.adapters.graph import driver
from headwater.core.config import Config
from headwater.core.schema import EDGE_SCHEMA
from headwater.store.graph import (
    BATCH_FIELDS,
    GAPS_BETWEEN,
    PLANNED_ONCE,
    SEEK_ROW,
    batch_fields,
    batch_statuses,
    gaps_between,
)

from .backend import ROW_FIELDS, StoreAccess, WalkingBackend, register
from .question import check_rid

# A frontier's edges, each with the properties of the row at its far end and how many edges lead on from that
# row: a walk needs the records of the rows it reached, and reading them with the edges saves a round trip a
# question. Each edge's and far row's properties are read at once, as maps (``properties``), not a column per
# property: on 1M edges, the step from a hub's 300 output rows took 7.3 ms against 9.6, and a question's start
# (below) half the time. A row no edge leads on from is not stepped from (``onward``, 0): a hub's forward
# question then ends in one round trip, not two (12.8 ms against 28.2 at 1M edges).
_ONWARD = {"b": "COUNT { (b)-[:DERIVED]->() }", "a": "COUNT { ()-[:DERIVED]->(a) }"}  # by the far end
# Each statement's plan is kept as the graph grows (``PLANNED_ONCE``), each the rid index's seek (``SEEK_ROW``). A
# step's edges come back one record each, streamed: a hub's million edges collected into one record passed Neo4j's
# memory for a transaction (``dbms.memory.transaction.total.max``).
_EDGES = (PLANNED_ONCE + "MATCH (a:Row)-[e:DERIVED]->(b:Row) " + SEEK_ROW.format("{near}")
          + "WHERE {near}.rid IN $frontier "
          "RETURN {near}.rid AS rid, properties(e) AS e, properties({far}) AS far, {onward} AS onward")
# A question's start: the row's record and its edges in one round trip, one record (a hub's forward question,
# 300 rows at 1M edges: median 11.4 ms, against 22.5 ms for a record an edge).
_FROM = (PLANNED_ONCE + "MATCH ({near}:Row {{rid: $rid}}) " + SEEK_ROW.format("{near}")
         + "RETURN properties({near}) AS row, "
         "[(a:Row)-[e:DERIVED]->(b:Row) | [properties(e), properties({far}), {onward}]] AS edges")
# A row's edges in counted from its degree, no edge read (a black box's node of 1,000,000 rows: its edges, with
# their far rows, took seconds to read).
_INTO = PLANNED_ONCE + "MATCH (b:Row {rid: $rid}) " + SEEK_ROW.format("b") + "RETURN COUNT { ()-[:DERIVED]->(b) } AS n"
# A row's every edge in or out, lean (a black box's node: its 1,000,000 rows in or out, which narrowing checks; no
# far row's properties, no onward count): most of a 1,000,000-row batch's narrowing went to reading them as a
# walk's step. Four lists of numbers in one record: not a record an edge (20-35 µs each in the driver), nor a
# list an edge (more of Neo4j's memory for a transaction, which a step's edges collected so went past).
_AT = {backward: PLANNED_ONCE + f"MATCH {pattern} {SEEK_ROW.format(near)}RETURN collect({far}.rid) AS far, "
                 "collect(e.batch) AS batch, collect(e.op) AS op, collect(coalesce(e.cols, -1)) AS cols"
       for backward, pattern, near, far in ((True, "(a:Row)-[e:DERIVED]->(b:Row {rid: $rid})", "b", "a"),
                                            (False, "(a:Row {rid: $rid})-[e:DERIVED]->(b:Row)", "a", "b"))}
# A chunk's rows' records come back in one record (``collect``, at most ``_CHUNK`` rows): the driver's cost a record
# is most of it (1,000 rows: 16-29 ms against 50-83 ms a record each, Neo4j 5 beside a bench).
_ROWS = PLANNED_ONCE + "MATCH (n:Row) " + SEEK_ROW.format("n") + "WHERE n.rid IN $rids RETURN collect([" \
    + ", ".join(f"n.{f}" for f in ROW_FIELDS) + "]) AS rows"
_CHUNK = 5000  # rids per statement
# Neo4j plans a statement taking a list once for each of these sizes' buckets (1, 2-10, 11-100, 101-1,000 and
# 1,001-10,000 items; Neo4j 5.26): a plan made again cost the first question with a new size of frontier or of
# rows 100-150 ms (the first narrowed question of a 100,000-row grouped batch, 1,000 rows: 0.35 s against 0.07).
PLANNED_SIZES = (1, 10, 100, 1000, _CHUNK)
# A static table's description: the graph's other datasets (the Kafka topics and streams batches read) are not.
_STATIC_DATASETS = PLANNED_ONCE + "MATCH (d:Dataset) WHERE d.source = 'static'"
_EVERY_STATIC_DATASET = _STATIC_DATASETS + " RETURN properties(d) AS p"
# How long a batch's logged capture status is taken as read before the graph is asked again: questions about
# the rows of the same few batches (an explorer's page asks three of each) then cost one round trip fewer,
# and a status logged anew (a batch run again after a restart) shows within this. Batches with no status yet
# are asked every time: their status is what an indexer writes next.
STATUS_TTL_S = 2.0


@register("cypher")
class CypherBackend(WalkingBackend):
    store = "graph"

    def __init__(self, config: Config):
        self.config = config
        self._driver = driver(config)
        self._statuses: dict[tuple[str, int], tuple[float, str]] = {}  # (query, batch) -> (when read, status)

    def close(self) -> None:
        self._driver.close()

    def _run(self, statement: str, /, **params) -> list[dict]:
        """The records as dicts (``params`` may name any parameter, ``query`` too). Every statement here returns
        scalars, lists and maps only, so a record's values are its data as they are: ``Record.data()`` walks each
        value again (a third of a hub's forward question, 300 rows at 1M edges, went there)."""
        with self._driver.session(database=self.config.graph_database) as s:
            result = s.run(statement, params)
            keys = result.keys()
            return [dict(zip(keys, values)) for values in result]

    def _chunked(self, query: str, name: str, rids) -> list[dict]:
        rids = list(rids)
        return [row for i in range(0, len(rids), _CHUNK) for row in self._run(query, **{name: rids[i: i + _CHUNK]})]

    def question_from(self, rid: int, backward: bool) -> StoreAccess:
        near, far = ("b", "a") if backward else ("a", "b")
        rows = self._run(_FROM.format(near=near, far=far, onward=_ONWARD[far]), rid=check_rid(rid))
        if not rows:
            raise self._unknown(rid)
        record = {f: rows[0]["row"].get(f) for f in ROW_FIELDS}
        return self._question(backward, {rid: record}, {rid: rows[0]["edges"]})

    @staticmethod
    def question_statements() -> list[tuple[str, dict[str, Any]]]:
        """Each statement a question runs, with parameters about rids and a batch the graph does not hold; a
        statement taking a list once for each size of list Neo4j plans apart (``PLANNED_SIZES``)."""
        ends = (("b", "a"), ("a", "b"))
        statements: list[tuple[str, dict[str, Any]]] = [
            (_FROM.format(near=near, far=far, onward=_ONWARD[far]), {"rid": 0}) for near, far in ends]
        statements += [(_INTO, {"rid": 0}), (_AT[True], {"rid": 0}), (_AT[False], {"rid": 0})]
        for size in PLANNED_SIZES:
            rids = list(range(1, size + 1))
            statements += [(_EDGES.format(near=near, far=far, onward=_ONWARD[far]), {"frontier": rids})
                           for near, far in ends]
            statements += [(_ROWS, {"rids": rids}),
                           (BATCH_FIELDS, {"pairs": [{"query": "", "batch": -r} for r in rids]})]
        statements += [(_EVERY_STATIC_DATASET, {}),
                       (GAPS_BETWEEN, {"query": "", "first": 0, "last": 0})]
        return statements

    def plan_questions(self) -> int:
        """Have the graph plan each statement a question runs (``question_statements``): a new server's first
        question then finds the plans made (the first question on a fresh Neo4j spent 0.5 s in the planner). The
        statements it ran."""
        statements = self.question_statements()
        for statement, params in statements:
            self._run(statement, **params)
        return len(statements)

    def _question(self, backward: bool, known: dict[int, dict] | None = None,
                  read: dict[int, list] | None = None) -> StoreAccess:
        """``read``: a row's edges read already (``question_from``), for the step from it alone."""
        near, far = ("b", "a") if backward else ("a", "b")
        query = _EDGES.format(near=near, far=far, onward=_ONWARD[far])
        near_end, far_end = ("dst", "src") if backward else ("src", "dst")
        known = dict(known or {})  # with the records of the rows at the far ends of the edges stepped
        ends: set[int] = set()  # rows reached that no edge leads on from

        def step(frontier: list[int]) -> pa.Table:
            if read and len(frontier) == 1 and frontier[0] in read:
                found = [(frontier[0], e, row, onward) for e, row, onward in read.pop(frontier[0])]
            else:
                asked = [rid for rid in frontier if rid not in ends]
                found = [(row["rid"], row["e"], row["far"], row["onward"])
                         for row in (self._chunked(query, "frontier", asked) if asked else ())]
            edges = []
            for rid, properties, far_row, onward in found:
                known.setdefault(far_row["rid"], {f: far_row.get(f) for f in ROW_FIELDS})
                if not onward:
                    ends.add(far_row["rid"])
                # edges written before masks or flags were recorded: exact, all columns
                edges.append({near_end: rid, far_end: far_row["rid"], "query": properties["query"],
                              "batch": properties["batch"], "op": properties["op"],
                              "exact": properties.get("exact") is not False, "cols": properties.get("cols", -1)})
            return pa.Table.from_pylist(edges, EDGE_SCHEMA)
        return StoreAccess(step, self._records, known)

    def _records(self, rids) -> dict[int, dict]:
        return {row[0]: dict(zip(ROW_FIELDS, row)) for chunk in self._chunked(_ROWS, "rids", rids)
                for row in chunk["rows"]}

    def edges_into(self, rid: int) -> int:
        rows = self._run(_INTO, rid=check_rid(rid))
        return int(rows[0]["n"]) if rows else 0

    def edges_at(self, rid: int, backward: bool) -> pa.Table:
        rows = self._run(_AT[backward], rid=check_rid(rid))
        far, batch, op, cols = (rows[0][name] for name in ("far", "batch", "op", "cols")) if rows else ([],) * 4
        near = [rid] * len(far)
        src, dst = (far, near) if backward else (near, far)
        return pa.table({"src": pa.array(src, pa.int64()), "dst": pa.array(dst, pa.int64()),
                         "batch": pa.array(batch, pa.int64()), "op": pa.array(op, pa.int32()),
                         "cols": pa.array(cols, pa.int64())})

    def batch_statuses(self, pairs) -> dict[tuple[str, int], str | None]:
        now = time.monotonic()
        held = {pair: self._statuses.get(pair) for pair in pairs}
        found: dict[tuple[str, int], str | None] = {
            pair: kept[1] for pair, kept in held.items() if kept is not None and now - kept[0] <= STATUS_TTL_S}
        asked = [pair for pair in held if pair not in found]
        if asked:
            read = batch_statuses(self._driver, asked, self.config.graph_database)
            if len(self._statuses) > 100_000:  # a long-running server's: the expired go
                self._statuses = {k: v for k, v in self._statuses.items() if now - v[0] <= STATUS_TTL_S}
            self._statuses.update({pair: (now, status) for pair, status in read.items() if status is not None})
            found.update(read)
        return found

    def gaps_between(self, query: str, first: int, last: int) -> dict[tuple[str, int], str | None]:
        return gaps_between(self._driver, query, first, last, self.config.graph_database)

    def batch_times(self, pairs) -> dict[tuple[str, int], str | None]:
        found = batch_fields(self._driver, pairs, self.config.graph_database)
        return {pair: fields["at"] for pair, fields in found.items()}

    def datasets(self) -> dict[str, dict]:
        return {row["p"]["name"]: row["p"] for row in self._run(_EVERY_STATIC_DATASET)}

    def dataset(self, name: str) -> dict | None:
        rows = self._run(_STATIC_DATASETS + " AND d.name = $name RETURN properties(d) AS p", name=name)
        return rows[0]["p"] if rows else None
