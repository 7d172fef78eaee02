"""Lineage over the graph store with portable Cypher."""

from __future__ import annotations

from headwater.adapters.graph import driver
from headwater.core.config import Config

from .backend import Lineage, LineageError, UnknownRow, check_depth, ordered

_ROW_FIELDS = "n.rid AS rid, n.kind AS kind, n.dataset AS dataset, n.topic AS topic, " \
              "n.partition AS partition, n.offset AS offset, n.key AS key, n.path AS path, n.position AS position"

_KINDS = ("source", "state", "output")


def _target_clause(to: str) -> tuple[str, dict]:
    """``source``/``output``/``state``: rows of that kind; anything else: a dataset name."""
    if to in _KINDS:
        return "n.kind = $to", {"to": to}
    return "n.dataset = $to", {"to": to}


class CypherBackend:
    def __init__(self, config: Config):
        self.config = config
        self._driver = driver(config)

    def close(self) -> None:
        self._driver.close()

    def _run(self, query: str, **params) -> list[dict]:
        with self._driver.session(database=self.config.graph_database) as s:
            return [r.data() for r in s.run(query, **params)]

    def _require(self, rid: int) -> None:
        if not isinstance(rid, int) or not -(1 << 63) <= rid < 1 << 63:
            raise LineageError(f"a rid is a signed 64-bit integer, not {rid!r}")
        if not self._run("MATCH (n:Row {rid: $rid}) RETURN n.rid AS rid", rid=rid):
            raise UnknownRow(f"rid {rid} is not in the lineage graph (not captured, or not indexed yet)")

    def _walk(self, rid: int, to: str, depth: int, backward: bool) -> list[Lineage]:
        check_depth(depth)
        self._require(rid)
        where, params = _target_clause(to)
        # The depth bound cannot be a Cypher parameter; check_depth made it a small int.
        pattern = f"(n:Row)-[es:DERIVED*1..{depth}]->(o:Row {{rid: $rid}})" if backward \
            else f"(o:Row {{rid: $rid}})-[es:DERIVED*1..{depth}]->(n:Row)"
        rows = self._run(
            f"MATCH {pattern} WHERE {where} "
            f"RETURN {_ROW_FIELDS}, [e IN es | e.op] AS ops, [e IN es | e.batch] AS batches, "
            f"[e IN es | e.exact] AS exact, es[size(es) - 1].cols AS cols",
            rid=rid, **params,
        )
        found: dict[int, Lineage] = {}
        for row in rows:
            exact = all(x is not False for x in row.pop("exact"))
            ops, batches = row.pop("ops"), row.pop("batches")
            item = found.get(row["rid"])
            if item is not None and item.cols != row["cols"]:
                item.cols = -1 if None in (item.cols, row["cols"]) else item.cols | row["cols"]
            if item is None:
                found[row["rid"]] = Lineage(of=rid, ops=sorted(set(ops)), batches=sorted(set(batches)),
                                            exact=exact, **row)
            else:  # another path to the same row: the answer is over every path (query/walk.py)
                item.exact = item.exact and exact
                item.ops = sorted(set(item.ops) | set(ops))
                item.batches = sorted(set(item.batches) | set(batches))
        return ordered(found.values())

    def backward(self, rid: int, to: str = "source", depth: int = 16) -> list[Lineage]:
        return self._walk(rid, to, depth, backward=True)

    def forward(self, rid: int, to: str = "output", depth: int = 16) -> list[Lineage]:
        return self._walk(rid, to, depth, backward=False)

    def dataset(self, name: str) -> dict | None:
        rows = self._run("MATCH (d:Dataset {name: $name}) RETURN properties(d) AS p", name=name)
        return rows[0]["p"] if rows else None
