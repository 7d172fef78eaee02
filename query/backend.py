"""The lineage query interface every backend implements, and the answer they all give.

To add a backend: one module with a class deriving from ``WalkingBackend`` that says how
to find the edges adjacent to a frontier of rows and the records of rows (``_question``,
or ``_step`` and ``_records``), and where the batch log is (``batch_statuses``), named by
``@register("NAME")``; a package of its own names the module in its entry points, group
``headwater.backends`` (``NAME = "package.module"``), and ``backends()`` imports it when a
backend is first looked up. The walk (``walk.walk``) and the answer built from it are
shared, so every backend gives the same answer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Callable

import pyarrow as pa
import pyarrow.compute as pc

from headwater.core.plugins import load_plugins, registrar
from headwater.store.edges import ROW_FIELDS as STORED_ROW_FIELDS

from .errors import UnknownRow
from .question import check_depth, check_rid
from .walk import MAX_REACH, is_target, walk

if TYPE_CHECKING:
    from headwater.core.config import Config

    from .narrow.narrower import Narrower

# What the stores record of a row (graph node properties, Parquet rows records): its rid and the store's fields.
ROW_FIELDS = ("rid", *STORED_ROW_FIELDS)
AT_COLUMNS = ("src", "dst", "batch", "op", "cols")  # ``edges_at``'s


class _Hops:
    """``Lineage.hops``: declared on a base that is no dataclass, so that it is no field of the record."""

    hops: set[tuple[str, int]] | None = None


@dataclass
class Lineage(_Hops):
    """One row found by a lineage query, relative to the row asked about.

    A record a walk found also has ``hops``, an attribute but no field of the record: the
    ``(query, op)`` of every edge on its paths, which ``explain.py`` names ``operators`` from.
    """

    of: int  # the rid the query started from
    rid: int
    kind: str
    dataset: str | None
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None
    key: str | None = None
    path: str | None = None
    position: int | None = None
    ops: list[int] = field(default_factory=list)  # operators on the paths to it (plan IR ids), sorted
    # The plan operators its rows flowed through, named, in data-flow order (``explain.py``):
    # {"query", "id", "kind", "name", "spark_class", "inputs"} each.
    operators: list[dict] | None = None
    # Attribute mask: bit i set when column i of the output row at the path's end
    # derives from this input (TensProv), over all paths; -1 (every column) when unknown.
    cols: int | None = None
    columns: list[str] | None = None  # the names of cols' columns, where the mask and the columns are known
    batches: list[int] = field(default_factory=list)
    exact: bool = True
    via: str = "edges"
    payload: object = None
    # How-provenance, when asked for: paths to it, each a list of [query, batch, op] steps in
    # data-flow order (the first ones in sorted order); paths_cut: there were more.
    paths: list[list] | None = None
    paths_cut: bool | None = None
    # A static table's row: where the table lives (its identity), which ``dataset`` names short.
    table: str | None = None
    # With a static table row's payload: the table changed since the batches that read the row,
    # so the payload is the row as it is now, not as they read it.
    changed_since: bool | None = None

    def to_dict(self) -> dict:
        """The record as JSON-like data of its own (``asdict`` would do, at five times the cost: every
        answer's records go through here, each with its operators)."""
        return {f.name: _copied(getattr(self, f.name)) for f in fields(self)
                if not (f.name in OPTIONAL_FIELDS and getattr(self, f.name) is None)}


def _copied(value):
    """``value`` with its dicts, lists and tuples copied, all the way down (not their subclasses)."""
    if type(value) is dict:
        return {k: _copied(v) for k, v in value.items()}
    if type(value) is list or type(value) is tuple:
        return type(value)(_copied(v) for v in value)
    return value


# In a record only when asked for, or where they apply (a static table's row, a known mask).
OPTIONAL_FIELDS = ("payload", "paths", "paths_cut", "table", "changed_since", "operators", "columns")


@dataclass
class Gap:
    """A batch on an answer's way that was not fully captured: the answer may miss rows through it."""

    query: str
    batch: int
    status: str | None  # its capture status in the batch log; None: not in the log (yet)


@dataclass
class Answer:
    """The rows a lineage question found, and what may be missing from them.

    ``gaps``: batches whose edges the walk crossed that the batch log does not record as
    fully captured. ``unexplained`` (backward): rows the walk reached that are not
    sources yet have no recorded inputs, so lineage stops there: the batch that made
    them was not captured (or is not indexed yet). An output row of an uncaptured batch
    gets its sources inferred (``fallback.py``), a source row only uncaptured batches read
    the output rows derived from it (``forward_fallback.py``): records ``via: inference``,
    the batches still in ``gaps``.
    """

    of: int
    records: list[Lineage]
    gaps: list[Gap] = field(default_factory=list)
    unexplained: list[dict] = field(default_factory=list)  # {"rid", "kind", "dataset"} of each
    # Forward from a source row no store holds: the fully captured batches that read it and derived
    # nothing from it (dropped by a filter, a join, a watermark…): an empty answer, and complete.
    read_by: list[Gap] = field(default_factory=list)
    # Black boxes' batches the walk crossed and how re-running them narrowed each (``Narrowing.summary``):
    # ``kind`` dispatcher, grouped, per key, or superset with its ``reason``.
    narrowed: list[dict] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.gaps and not self.unexplained

    def __iter__(self):
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index):
        return self.records[index]

    def summary(self) -> dict:
        """Everything but the records."""
        return {"of": self.of, "records": len(self.records), "complete": self.complete,
                "gaps": [asdict(g) for g in self.gaps], "unexplained": self.unexplained,
                "read_by": [asdict(b) for b in self.read_by], **({"narrowed": self.narrowed} if self.narrowed else {})}


def ordered(found) -> list[Lineage]:
    """An answer's records in the order every backend gives them: by dataset, then source coordinates."""
    return sorted(found, key=lambda x: (x.dataset or "", x.topic or "", x.partition or 0, x.offset or 0,
                                        x.key or "", x.rid))


def lineage_of(rid: int, found: dict, records: dict[int, dict], to: str, cols: int | None = None,
               paths: bool = False) -> list[Lineage]:
    """The targets among the rows a walk found (``walk.Reach`` by rid), as ``Lineage`` records in answer order.

    ``cols`` (forward): only rows some of whose paths end in one of those columns.
    """

    answer = []
    for row, reach in found.items():
        record = records.get(row, {})
        if not is_target(to, record.get("kind"), record.get("dataset")):
            continue
        if cols is not None and not reach.cols & cols:
            continue
        # The fields as the store holds them (a row it does not hold has no kind or dataset: no target).
        stored: dict[str, Any] = {k: record.get(k) for k in ROW_FIELDS[1:]}
        item = Lineage(
            of=rid, rid=row, **stored, ops=sorted(reach.ops), cols=reach.cols,
            batches=sorted(reach.batches), exact=reach.exact, via="reexecution" if reach.reexecuted else "edges",
            paths=[[list(hop) for hop in p] for p in sorted(reach.paths)] if paths else None,
            paths_cut=reach.paths_cut if paths else None)
        item.hops = reach.hops
        answer.append(item)
    return ordered(answer)


class StoreAccess:
    """One question's access to a store: the edges adjacent to a frontier, and rows' records (``known``:
    records read already, not read again)."""

    def __init__(self, step: Callable[[list[int]], pa.Table], records: Callable[[list[int]], dict[int, dict]],
                 known: dict[int, dict] | None = None):
        self.step = step
        self._records = records
        self.known = {} if known is None else known

    def records(self, rids) -> dict[int, dict]:
        rids = list(rids)
        found = {r: self.known[r] for r in rids if r in self.known}
        return {**self._records([r for r in rids if r not in found]), **found}


# The backends by name, in the order they were registered: the query tier's own (cypher, csprov, rq) as
# ``headwater.query.api`` imports them, then those of other packages' entry points.
BACKENDS: dict[str, type[WalkingBackend]] = {}
ENTRY_POINTS = "headwater.backends"
RESERVED = ("auto",)  # the graph when it holds the row, else the Parquet store (``LineageClient``)


def register(name: str) -> Callable[[type[WalkingBackend]], type[WalkingBackend]]:
    """A class decorator: the backend ``backend=name`` picks. A name taken already is refused."""
    return registrar(BACKENDS, name, f"a backend named {name!r}", RESERVED)


def backends() -> dict[str, type[WalkingBackend]]:
    """Every registered backend by name, once the modules other packages name in their entry points are imported
    (``plugins.load_plugins``: one that fails to import is skipped with a warning)."""
    load_plugins(ENTRY_POINTS, BACKENDS)
    return BACKENDS


class WalkingBackend:
    """A backend answers by ``walk.walk`` over its store's edges; subclasses say how to reach them."""

    store = "store"  # what the errors call it
    narrower: Narrower | None = None  # black boxes' narrowed batches put in every walk, where set

    def __init__(self, config: Config):
        """``backends()[name](config)`` makes each backend: from headwater's config."""

    def _question(self, backward: bool) -> StoreAccess:
        return StoreAccess(self._step(backward), self._records)

    def _step(self, backward: bool) -> Callable[[list[int]], pa.Table]:
        raise NotImplementedError

    def _records(self, rids) -> dict[int, dict]:
        """``ROW_FIELDS`` of those of ``rids`` the store holds, by rid."""
        raise NotImplementedError

    def batch_statuses(self, pairs) -> dict[tuple[str, int], str | None]:
        """The batch log's capture status of each ``(query, batch)``; None where it has none."""
        raise NotImplementedError

    def gaps_between(self, query: str, first: int, last: int) -> dict[tuple[str, int], str | None]:
        """The capture status of every batch of ``query`` from ``first`` to ``last`` the batch log holds
        that is not fully captured."""
        raise NotImplementedError

    def edges_into(self, rid: int) -> int:
        """How many edges the store holds into the row ``rid``."""
        return self.edges_at(rid, backward=True).num_rows

    def edges_at(self, rid: int, backward: bool) -> pa.Table:
        """Every edge into (``backward``) or out of the row ``rid`` the store holds: ``src``, ``dst``, ``batch``,
        ``op``, ``cols`` (a black box's node of a batch: all its rows in or out, as narrowing checks them)."""
        edges = self._question(backward).step([rid])
        edges = edges.filter(pc.equal(edges["dst" if backward else "src"], rid))
        return edges.select(list(AT_COLUMNS))

    def datasets(self) -> dict[str, dict]:
        """Every static dataset's description (``dataset``), by name."""
        return {}

    def dataset(self, name: str) -> dict | None:
        """A static dataset's description, as the indexer keeps it from the plan log: ``short_name``,
        ``table`` (its identity), ``location``, ``format``, ``options``, ``key``…; None if none is kept."""
        return None

    def close(self) -> None:
        pass

    def require(self, rid: int) -> dict:
        """The record (``ROW_FIELDS``) of the row ``rid``; ``UnknownRow`` unless the store holds it."""
        found = self._records([check_rid(rid)])
        if rid not in found:
            raise self._unknown(rid)
        return found[rid]

    def _unknown(self, rid: int) -> UnknownRow:
        return UnknownRow(f"rid {rid} is not in the lineage {self.store} (not captured, or not indexed yet)")

    def question_from(self, rid: int, backward: bool) -> StoreAccess:
        """A question that walks from ``rid`` (``walk``'s ``question``), the row's record read;
        ``UnknownRow`` unless the store holds it."""
        question = self._question(backward)
        question.known[rid] = self.require(rid)
        return question

    def batch_times(self, pairs) -> dict[tuple[str, int], str | None]:
        """When each ``(query, batch)`` ran (the batch log's ``at``, ISO 8601); None where it has no time."""
        raise NotImplementedError

    def walk(self, starts: list[int], depth: int, backward: bool, cols: int | None = None, paths: int = 0,
             max_reach: int | None = None, deadline: float | None = None, outside=None,
             question: StoreAccess | None = None):
        """``walk.walk`` from ``starts``, and the records of every row it started from, found or ended on
        (``question``: one begun already, as ``question_from`` begins it)."""

        check_depth(depth)
        question = question or self._question(backward)
        step = question.step if self.narrower is None else self.narrower.overlay(question.step, backward, self)
        found = walk(starts, depth, backward, step, cols if backward else None, paths,
                     max_reach or MAX_REACH, deadline, outside)
        return found, question.records(sorted(set(found.found) | found.ends | set(starts)))

    def backward(self, rid: int, to: str = "source", depth: int = 16, cols: int | None = None,
                 paths: int = 0) -> list[Lineage]:
        found, records = self.walk([rid], depth, True, cols, paths, question=self.question_from(rid, True))
        return lineage_of(rid, found.found, records, to, paths=bool(paths))

    def forward(self, rid: int, to: str = "output", depth: int = 16, cols: int | None = None,
                paths: int = 0) -> list[Lineage]:
        found, records = self.walk([rid], depth, False, None, paths, question=self.question_from(rid, False))
        return lineage_of(rid, found.found, records, to, cols, bool(paths))
