"""Lineage over the graph store with portable Cypher: one indexed lookup of a frontier's edges per level.

The walk itself is ``walk.walk``'s, as for every backend: a variable-length ``MATCH``
would enumerate every path, and a lineage DAG with hubs has exponentially many.
"""

from __future__ import annotations

import time

import pyarrow as pa

from headwater.adapters.graph import driver
from headwater.core.config import Config
from headwater.core.schema import EDGE_SCHEMA
from headwater.indexer.graph import batch_fields, batch_statuses, gaps_between

from .backend import ROW_FIELDS, Question, WalkingBackend, check_rid

# A frontier's edges, each with the record of the row at its far end: a walk needs the records of the
# rows it reached, and reading them with the edges saves a round trip a question.
_EDGE_FIELDS = ("a.rid AS src, b.rid AS dst, e.query AS query, e.batch AS batch, e.op AS op, e.exact AS exact, "
                "e.cols AS cols, " + ", ".join(f"{{far}}.{f} AS far_{f}" for f in ROW_FIELDS[1:]))
_EDGES = "MATCH (a:Row)-[e:DERIVED]->(b:Row) WHERE {near}.rid IN $frontier RETURN " + _EDGE_FIELDS
# A question's start: the row's record and its edges in one round trip (none where it has none).
_FROM = ("MATCH ({near}:Row) WHERE {near}.rid = $rid OPTIONAL MATCH (a:Row)-[e:DERIVED]->(b:Row) RETURN "
         + ", ".join(f"{{near}}.{f} AS row_{f}" for f in ROW_FIELDS[1:])
         + ", " + _EDGE_FIELDS)
_ROWS = "MATCH (n:Row) WHERE n.rid IN $rids RETURN " + ", ".join(f"n.{f} AS {f}" for f in ROW_FIELDS)
_CHUNK = 5000  # rids per statement
# A static table's description: the graph's other datasets (the Kafka topics and streams batches read) are not.
_STATIC_DATASETS = "MATCH (d:Dataset) WHERE d.source = 'static'"
# How long a batch's logged capture status is taken as read before the graph is asked again: questions about
# the rows of the same few batches (an explorer's page asks three of each) then cost one round trip fewer,
# and a status logged anew (a batch run again after a restart) shows within this. Batches with no status yet
# are asked every time: their status is what an indexer writes next.
STATUS_TTL_S = 2.0


class CypherBackend(WalkingBackend):
    store = "graph"

    def __init__(self, config: Config):
        self.config = config
        self._driver = driver(config)
        self._statuses: dict[tuple[str, int], tuple[float, str]] = {}  # (query, batch) -> (when read, status)

    def close(self) -> None:
        self._driver.close()

    def _run(self, query: str, **params) -> list[dict]:
        with self._driver.session(database=self.config.graph_database) as s:
            return [r.data() for r in s.run(query, **params)]

    def _chunked(self, query: str, name: str, rids) -> list[dict]:
        rids = list(rids)
        return [row for i in range(0, len(rids), _CHUNK) for row in self._run(query, **{name: rids[i: i + _CHUNK]})]

    def question_from(self, rid: int, backward: bool) -> Question:
        near, far = ("b", "a") if backward else ("a", "b")
        rows = self._run(_FROM.format(near=near, far=far), rid=check_rid(rid))
        if not rows:
            raise self._unknown(rid)
        record = {"rid": rid, **{f: rows[0][f"row_{f}"] for f in ROW_FIELDS[1:]}}
        edges = [{k: v for k, v in row.items() if not k.startswith("row_")} for row in rows if row["query"] is not None]
        return self._question(backward, {rid: record}, {rid: edges})

    def _question(self, backward: bool, known: dict[int, dict] | None = None,
                  read: dict[int, list[dict]] | None = None) -> Question:
        """``read``: a row's edges read already (``question_from``), for the step from it alone."""
        query = _EDGES.format(near="b" if backward else "a", far="a" if backward else "b")
        far = "src" if backward else "dst"
        known = dict(known or {})  # with the records of the rows at the far ends of the edges stepped

        def step(frontier: list[int]) -> pa.Table:
            rows = read.pop(frontier[0]) if read and len(frontier) == 1 and frontier[0] in read else \
                self._chunked(query, "frontier", frontier)
            for row in rows:
                record = {f: row.pop(f"far_{f}") for f in ROW_FIELDS[1:]}
                known.setdefault(row[far], {"rid": row[far], **record})
                # edges written before masks or flags were recorded
                row["exact"] = row["exact"] is not False
                row["cols"] = -1 if row["cols"] is None else row["cols"]
            return pa.Table.from_pylist(rows, EDGE_SCHEMA)
        return Question(step, self._records, known)

    def _records(self, rids) -> dict[int, dict]:
        return {row["rid"]: row for row in self._chunked(_ROWS, "rids", rids)}

    def batch_statuses(self, pairs) -> dict[tuple[str, int], str | None]:
        now = time.monotonic()
        held = {pair: self._statuses.get(pair) for pair in pairs}
        found = {pair: kept[1] for pair, kept in held.items() if kept is not None and now - kept[0] <= STATUS_TTL_S}
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
        return {row["p"]["name"]: row["p"] for row in self._run(_STATIC_DATASETS + " RETURN properties(d) AS p")}

    def dataset(self, name: str) -> dict | None:
        rows = self._run(_STATIC_DATASETS + " AND d.name = $name RETURN properties(d) AS p", name=name)
        return rows[0]["p"] if rows else None
