"""The Python API of the query tier.

    from headwater.query.api import LineageClient
    with LineageClient() as lineage:
        answer = lineage.backward(rid)
        for row in answer:
            print(row.dataset, row.topic, row.partition, row.offset, row.key)
        if not answer.complete:
            print("batches not fully captured on the way:", answer.gaps)

Questions (TensProv's query classes, §IV):

- ``backward`` / ``forward``: the rows a row was derived from / that were derived from
  it, record level; with ``cols`` (a mask of the asked row's columns, backward; of the
  answer rows' columns, forward), attribute level; with ``paths``, how-provenance (the
  ``(query, batch, op)`` steps of each path).
- ``co_contributors`` (Q10): the rows (``to``) that were used together with a row to make
  rows of ``via``: forward to ``via``, then backward from there.
- ``co_dependents`` (Q11): the rows (``to``) derived from the ``via`` rows a row was
  derived from: backward to ``via``, then forward from there.

Every answer (``backward.Answer``) says whether every batch on its way was fully
captured (``complete``), and if not, which (``gaps``, from the batch log) and where
lineage stops short (``unexplained``). A row no store holds because its batch published
no edges is answered by inference from the log, records ``via: inference``: backward
from a sink row to its sources (``fallback.py``), forward from a source row to the sink
rows derived from it (``forward_fallback.py``).
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone

from neo4j.exceptions import ServiceUnavailable, SessionExpired

from headwater.adapters.graph import GraphUnavailable
from headwater.core import config as configuration
from headwater.core.config import Config

from .backend import Answer, Gap, Lineage, LineageError, UnknownRow, WalkingBackend, check_depth, lineage_of, ordered
from .cypher import CypherBackend
from .fallback import Fallback
from .forward_fallback import Forward
from .parquet import CSProvBackend, RecursiveBackend
from .payload import attach_payload
from .walk import MAX_REACH

# cypher: the graph store; csprov: the Parquet store, reading only the sets that matter;
# rq: the Parquet store scanned whole at every level (the baseline CSProv is measured against).
BACKENDS = {"cypher": CypherBackend, "csprov": CSProvBackend, "rq": RecursiveBackend}
# auto: the graph store when it answers and holds the row (the fastest, bench/query_latency.py),
# else the Parquet store, which the indexer fills faster, so it may hold rows the graph has not yet.
AUTO = ("cypher", "csprov")
MAX_PATHS = 100  # paths kept per answer row, at most, for how-provenance
TIMEOUT_S = 60.0  # a question still walking after this long is refused (checked at each level of a walk)
# The graph store not answering: auto then asks the Parquet store.
GRAPH_AWAY = (GraphUnavailable, ServiceUnavailable, SessionExpired, OSError)


def moment(value, name: str) -> datetime | None:
    """A time bound or a batch's logged time as an aware datetime (naive ones are UTC); None stays None."""
    if value is None or isinstance(value, datetime):
        found = value
    else:
        try:
            found = datetime.fromisoformat(str(value).strip().replace("Z", "+00:00"))
        except ValueError:
            raise LineageError(f"{name} is an ISO 8601 time (e.g. 2026-11-23T18:00:00Z), not {value!r}") from None
    return found.replace(tzinfo=timezone.utc) if found is not None and found.tzinfo is None else found


class Window:
    """A time bound: only edges of batches that ran from ``since`` to ``until`` (either open) are walked.

    A batch's time is the batch log's ``at`` (Spark's trigger time); a batch the log has
    no time for yet is walked, since it cannot be placed outside the window.
    """

    def __init__(self, since=None, until=None):
        self.since, self.until = moment(since, "since"), moment(until, "until")
        if self.since and self.until and self.since > self.until:
            raise LineageError(f"since ({self.since.isoformat()}) is after until ({self.until.isoformat()})")

    def outside(self, backend: WalkingBackend):
        if self.since is None and self.until is None:
            return None
        times: dict[tuple[str, int], datetime | None] = {}

        def outside(pairs: set[tuple[str, int]]) -> set[tuple[str, int]]:
            unknown = [p for p in pairs if p not in times]
            if unknown:
                for pair, at in backend.batch_times(unknown).items():
                    try:
                        times[pair] = moment(at, "at")
                    except LineageError:  # a time the log holds in another form: not placed
                        times[pair] = None
            return {p for p in pairs if times[p] is not None and not (
                (self.since is None or self.since <= times[p]) and (self.until is None or times[p] <= self.until))}
        return outside


def choices() -> list[str]:
    """The names ``backend`` takes."""
    return [*BACKENDS, "auto"]


class LineageClient:
    def __init__(self, config: Config | None = None, backend: str = "auto", max_reach: int = MAX_REACH,
                 timeout_s: float = TIMEOUT_S):
        self.config = config or configuration.load()
        if backend not in choices():
            raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(choices())}")
        self.names = AUTO if backend == "auto" else (backend,)
        self.max_reach = max_reach
        self.timeout_s = timeout_s
        self._backends: dict[str, WalkingBackend] = {}
        self._making = threading.Lock()  # questions from several threads make each backend once
        # Inference keeps plans, tables and replays between questions, unlocked: one question at a time.
        self._inferring = threading.Lock()
        self._fallback: Fallback | None = None
        self._forward: Forward | None = None

    def __enter__(self) -> "LineageClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for backend in self._backends.values():
            backend.close()

    def _backend(self, name: str) -> WalkingBackend:
        with self._making:
            if name not in self._backends:  # made when first needed: a Parquet view reads the recent ranges
                self._backends[name] = BACKENDS[name](self.config)
            return self._backends[name]

    def _holding(self, rid: int) -> WalkingBackend:
        """The first backend (of ``names``) whose store holds ``rid``."""
        missed = []
        for name in self.names:
            backend = self._backend(name)
            try:
                backend.require(rid)
                return backend
            except UnknownRow as exc:
                missed.append(str(exc))
            except GRAPH_AWAY as exc:
                if len(self.names) == 1:
                    raise
                missed.append(f"the graph store did not answer ({type(exc).__name__})")
        raise UnknownRow(missed[0] if len(missed) == 1 else f"rid {rid}: " + "; ".join(missed))

    def with_payload(self, found: list[Lineage], backend: WalkingBackend | None = None) -> list[Lineage]:
        """``found`` with each row's original source record added (what ``payload=True`` does)."""
        backend = backend or self._backend(self.names[0])
        datasets: dict = {}
        for item in found:
            if item.dataset and item.topic is None and item.dataset not in datasets:
                datasets[item.dataset] = backend.dataset(item.dataset)
            attach_payload(item, self.config.bootstrap, datasets.get(item.dataset))
        return found

    def backward(self, rid: int, to: str = "source", depth: int = 16, payload: bool = False,
                 cols: int | None = None, paths: int = 0, since=None, until=None) -> Answer:
        """The rows (``to``: a kind of row or a dataset) ``rid`` was derived from, within ``depth`` edges."""
        return self._one_way(rid, to, depth, payload, cols, paths, since, until, backward=True)

    def forward(self, rid: int, to: str = "output", depth: int = 16, payload: bool = False,
                cols: int | None = None, paths: int = 0, since=None, until=None) -> Answer:
        """The rows (``to``) derived from ``rid``, within ``depth`` edges."""
        return self._one_way(rid, to, depth, payload, cols, paths, since, until, backward=False)

    def co_contributors(self, rid: int, to: str = "source", via: str = "output", depth: int = 16,
                        payload: bool = False, since=None, until=None) -> Answer:
        """The ``to`` rows used together with ``rid`` to make ``via`` rows (TensProv Q10)."""
        return self._two_ways(rid, to, via, depth, payload, since, until, first_backward=False)

    def co_dependents(self, rid: int, to: str = "output", via: str = "source", depth: int = 16,
                      payload: bool = False, since=None, until=None) -> Answer:
        """The ``to`` rows derived from the ``via`` rows ``rid`` was derived from (TensProv Q11)."""
        return self._two_ways(rid, to, via, depth, payload, since, until, first_backward=True)

    def _one_way(self, rid, to, depth, payload, cols, paths, since, until, backward: bool) -> Answer:
        if cols is not None and (not isinstance(cols, int) or isinstance(cols, bool) or cols == 0):
            raise LineageError(f"cols is a non-zero bit mask of columns, not {cols!r}")
        if not isinstance(paths, int) or isinstance(paths, bool) or not 0 <= paths <= MAX_PATHS:
            raise LineageError(f"paths is how many paths to keep per row, 0 to {MAX_PATHS}, not {paths!r}")
        check_depth(depth)
        window = Window(since, until)
        deadline = time.monotonic() + self.timeout_s
        try:
            backend = self._holding(rid)
        except UnknownRow:
            with self._inferring:
                inferred = self._inferred(rid, to, payload, deadline) if backward else \
                    self._inferred_forward(rid, to, cols, payload, deadline)
            if inferred is None:
                raise
            return inferred
        walked, records = backend.walk([rid], depth, backward, cols if backward else None, paths, self.max_reach,
                                       deadline, window.outside(backend))
        found = lineage_of(rid, walked.found, records, to, None if backward else cols, bool(paths))
        return self._answer(backend, rid, found, [(walked, records, backward)], payload)

    def _inferred(self, rid: int, to: str, payload: bool, deadline: float) -> Answer | None:
        """The answer for a sink row no store holds because its batch published no edges:
        its sources inferred from the log (``fallback.py``); None if no sink holds ``rid``."""
        located = self._fallbacks()[0].locate(rid, deadline)
        if located is None:
            return None
        query, batch, values = located
        if to in ("state", "output"):
            raise LineageError(f"rid {rid} is from batch {batch} of {query!r}, which published no edges: its lineage "
                               f"is inferred, to sources only (to=source or a dataset), not to {to!r}")
        status = (self._fallback.log.refresh().batch(query, batch) or {}).get("status")
        found, _ = self._fallback.backward(query, batch, rid, values)
        found = [x for x in found if to == "source" or x.dataset == to]
        if payload:
            found = self.with_payload(found)
        return Answer(rid, ordered(found), [Gap(query, batch, status)], [])

    def _inferred_forward(self, rid: int, to: str, cols: int | None, payload: bool, deadline: float) -> Answer | None:
        """The answer for a source row no store holds because the batches that read it published no
        edges: the sink rows derived from it, inferred (``forward_fallback.py``); None if no such batch read it."""
        forward = self._fallbacks()[1]
        read = forward.find(rid, deadline)
        if read is None:
            return None
        queries = sorted({query for query, _, _ in read.batches})
        if to != "output" and to not in queries:
            batches = ", ".join(f"{g.batch} of {g.query!r}" for g in read.gaps)
            raise LineageError(f"rid {rid} was read by batches that published no edges ({batches}): its lineage is "
                               f"inferred, to their output rows only (to=output or {' or '.join(queries)}), not to "
                               f"{to!r}")
        found = [x for x in forward.derived(rid, read, deadline)
                 if (to == "output" or x.dataset == to) and (cols is None or x.cols & cols)]
        if payload:
            found = self.with_payload(found)
        return Answer(rid, ordered(found), read.gaps, [])

    def _fallbacks(self) -> tuple[Fallback, Forward]:
        with self._making:
            if self._fallback is None:
                self._fallback = Fallback(self.config)
                self._forward = Forward(self._fallback)
            return self._fallback, self._forward

    def _two_ways(self, rid, to, via, depth, payload, since, until, first_backward: bool) -> Answer:
        check_depth(depth)
        window = Window(since, until)
        deadline = time.monotonic() + self.timeout_s
        backend = self._holding(rid)
        outside = window.outside(backend)
        first, first_records = backend.walk([rid], depth, first_backward, max_reach=self.max_reach,
                                            deadline=deadline, outside=outside)
        middle = [x.rid for x in lineage_of(rid, first.found, first_records, via)]
        legs = [(first, first_records, first_backward)]
        found = []
        if middle:
            second, records = backend.walk(middle, depth, not first_backward, max_reach=self.max_reach,
                                           deadline=deadline, outside=outside)
            legs.append((second, records, not first_backward))
            found = [x for x in lineage_of(rid, second.found, records, to) if x.rid != rid]
        return self._answer(backend, rid, ordered(found), legs, payload)

    def _answer(self, backend: WalkingBackend, rid: int, found: list[Lineage], legs: list, payload: bool) -> Answer:
        crossed = set().union(*(walked.crossed for walked, _, _ in legs))
        statuses = backend.batch_statuses(sorted(crossed)) if crossed else {}
        gaps = [Gap(query, batch, status) for (query, batch), status in sorted(statuses.items())
                if status != "full"]
        unexplained = {}
        for walked, records, backward in legs:
            if backward:  # a row that is not a source but has no recorded inputs
                for row in walked.ends:
                    record = records.get(row, {})
                    if record.get("kind") != "source":
                        unexplained[row] = {"rid": row, "kind": record.get("kind"), "dataset": record.get("dataset")}
        if payload:
            found = self.with_payload(found, backend)
        return Answer(rid, found, gaps, [unexplained[r] for r in sorted(unexplained)])
