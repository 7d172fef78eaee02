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

import logging
import threading
import time
from datetime import datetime

from kafka.errors import KafkaError
from neo4j.exceptions import ServiceUnavailable, SessionExpired

from headwater.adapters.graph import GraphUnavailable
from headwater.adapters.kafka import BrokerUnavailable, KafkaSourceError, record_at
from headwater.core import config as configuration
from headwater.core import openlineage, signing
from headwater.core import rid as rids
from headwater.core.config import Config
from headwater.core.offsets import offset_ranges
from headwater.core.plan import accumulates, location_key

from . import cypher, parquet  # noqa: F401 (their backends register themselves: cypher, csprov, rq)
from .address import kafka_place, parse_source
from .backend import (
    RESERVED,
    Answer,
    Gap,
    Lineage,
    StoreAccess,
    WalkingBackend,
    backends,
    lineage_of,
    ordered,
)
from .datasets import Tables, display_names, names_table
from .errors import LineageError, UnknownRow
from .explain import Explainer, rids_path
from .fallback import Fallback
from .forward_fallback import Forward
from .narrow.narrower import Narrower
from .payload import SINK_FORMATS, attach_payload, check_broker, kafka_record, sink_files, sink_row, table_location
from .question import Question, moment, time_window
from .sink_records import Placements, carried_rid
from .walk import KINDS, MAX_REACH, is_target

# The backends by name (``backend.register``, ``backend.backends``): cypher, the graph store
# (``cypher.CypherBackend``); csprov, the Parquet store, reading only the sets that matter; rq, the Parquet
# store scanned whole at every level (the baseline CSProv is measured against); then any another package registers.
# auto: the graph store when it answers and holds the row (the fastest, bench/query_latency.py),
# else the Parquet store, which the indexer fills faster, so it may hold rows the graph has not yet.
AUTO = ("cypher", "csprov")
TIMEOUT_S = 60.0  # a question still walking after this long is refused (checked at each level of a walk)
# The graph store not answering: auto then asks the Parquet store.
GRAPH_AWAY = (GraphUnavailable, ServiceUnavailable, SessionExpired, OSError)
TABLES_TTL_S = 5.0  # how long the static tables' names are kept before the store is asked again
BROKER_TTL_S = 10.0  # how long a broker that answered is taken to be up before payloads ask it again
MAX_NAMED = 20  # datasets an unknown target's error names, at most


class Window:
    """A time bound: only edges of batches that ran from ``since`` to ``until`` (either open) are walked.

    A batch's time is the batch log's ``at`` (Spark's trigger time); a batch the log has
    no time for yet is walked, since it cannot be placed outside the window.
    """

    def __init__(self, since=None, until=None):
        self.since, self.until = time_window(since, until)

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
    return [*backends(), *RESERVED]


class LineageClient:
    def __init__(self, config: Config | None = None, backend: str = "auto", max_reach: int = MAX_REACH,
                 timeout_s: float = TIMEOUT_S, narrow_wait_s: float = 0.0):
        """``narrow_wait_s``: how long a question that meets a black box's batch not narrowed yet waits for its
        narrowing (started then, in the background) before it answers with the flagged superset, the batch's
        ``narrowed`` entry saying ``kind: pending``. 0, the default: it answers at once."""
        self.config = config or configuration.load()
        self.narrow_wait_s = narrow_wait_s
        if backend not in choices():
            raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(choices())}")
        self.names = AUTO if backend == "auto" else (backend,)
        self.max_reach = max_reach
        self.timeout_s = timeout_s
        self._backends: dict[str, WalkingBackend] = {}
        self._making = threading.Lock()  # questions from several threads make each backend once
        # Inference keeps plans, tables and replays between questions, unlocked: one question at a time
        # (reentrant: an inferred answer's payloads read the same log).
        self._inferring = threading.RLock()
        self._fallback: Fallback | None = None
        self._forward: Forward | None = None
        self._tables: tuple[float, Tables] | None = None
        self._explainer: Explainer | None = None
        self._narrower: Narrower | None = None
        self._broker_answered = float("-inf")  # when the broker last answered (monotonic)
        self._placements = Placements(self.config)  # where Kafka sinks' output rows went

    def __enter__(self) -> "LineageClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._narrower is not None:
            self._narrower.close()
        for backend in self._backends.values():
            backend.close()

    def _backend(self, name: str) -> WalkingBackend:
        with self._making:
            if name not in self._backends:  # made when first needed: a Parquet view reads the recent ranges
                backend = backends()[name](self.config)
                backend.narrower = self.narrower()
                self._backends[name] = backend
            return self._backends[name]

    def narrower(self) -> Narrower | None:
        """The narrowing of black boxes by re-execution (``narrow/``), shared by every backend; None without a
        narrowing key (answers through black boxes stay supersets)."""
        if self._narrower is None and signing.key_of(self.config) is not None:
            self._narrower = Narrower(self.config, wait_s=self.narrow_wait_s)
        return self._narrower

    def narrow(self, query: str, op: int, batch: int) -> dict:
        """Narrow batch ``batch`` of black box ``op`` of ``query`` now (again, if it was), and say how it went."""
        narrower = self.narrower()
        if narrower is None:
            raise LineageError("no narrowing key is set (narrowing_key or narrowing_key_file, the same as capture's)")
        box = narrower.boxes(query).get(op)
        if box is None:
            raise LineageError(f"query {query!r} has no black box {op} in its kept plan")
        backend = self._backend(self.names[0])
        found = narrower.narrow(box, batch, backend)
        assert found is not None, "not exclusive: narrowed whoever else holds the batch"
        return found.summary()

    def _first_store_with(self, rid: int, backward: bool) -> tuple[WalkingBackend, StoreAccess]:
        """The first backend (of ``names``) whose store holds ``rid``, and a question walking from it there."""
        missed = []
        for name in self.names:
            backend = self._backend(name)
            try:
                return backend, backend.question_from(rid, backward)
            except UnknownRow as exc:
                missed.append(str(exc))
            except GRAPH_AWAY as exc:
                if len(self.names) == 1:
                    raise
                missed.append(f"the graph store did not answer ({type(exc).__name__})")
        raise UnknownRow(missed[0] if len(missed) == 1 else f"rid {rid}: " + "; ".join(missed))

    def tables(self) -> Tables:
        """The static tables the store describes, to find one by name (``datasets.Tables``)."""
        held = self._tables
        if held is None or time.monotonic() - held[0] > TABLES_TTL_S:
            described: dict[str, dict] = {}
            for name in self.names:
                try:
                    described = {**self._backend(name).datasets(), **described}
                except GRAPH_AWAY:
                    if len(self.names) == 1:
                        raise
            held = self._tables = (time.monotonic(), Tables(described))
        return held[1]

    def rid_of(self, row: int | str, made: bool = False) -> int:
        """The rid of ``row``: a rid as it is, or an address (``kafka:orders:0:17``, ``table:customers:7`` …).
        ``made``: asked about as a row a query made (backward), a record of a traced query's Kafka sink
        (``kafka:TOPIC:PARTITION:OFFSET`` of the sink's topic) is the output row whose rid it carries (read from the
        broker); else it is the record another query may read."""
        if not isinstance(row, str):
            return row
        rid = parse_source(row, self.tables())
        place = kafka_place(row) if made else None
        if place is not None and self.explainer().query_of(f"kafka:{place[0]}") is not None:
            return self._sink_record_rid(*place)
        return rid

    def _sink_record_rid(self, topic: str, partition: int, offset: int) -> int:
        try:
            record = record_at(self.config, topic, partition, offset)
        except (KafkaSourceError, BrokerUnavailable) as exc:
            raise LineageError(f"kafka:{topic}:{partition}:{offset}, a record of a traced query's sink, cannot be "
                               f"read: {exc}") from None
        rid = carried_rid(record)
        if rid is None:
            raise LineageError(f"kafka:{topic}:{partition}:{offset} carries no _hw_rid (a header, or its JSON "
                               f"value's): not written by a traced query")
        return rid

    def placed_in_kafka(self, found: list[Lineage]) -> None:
        """Each output row of a query with a Kafka sink, given the record it went to (``topic``, ``partition``,
        ``offset``: its address ``kafka:TOPIC:PARTITION:OFFSET``), from the batch log's ``sink_offsets`` and the
        broker (``sink_records``); a row whose record cannot be read is left as it is."""
        explainer = self.explainer()
        datasets = {item.dataset for item in found if item.kind == "output" and item.topic is None}
        to_kafka = {d for d in datasets if (explainer.sink_of(d) or "").startswith("kafka:")}
        outputs = [item for item in found if item.kind == "output" and item.topic is None and item.dataset in to_kafka]
        if not outputs:
            return
        with self._inferring:
            log = self._fallbacks()[0].log.refresh()
            try:
                for item in outputs:
                    query = explainer.query_of(item.dataset)
                    if query is None:  # its plan went since to_kafka was read
                        continue
                    for batch in item.batches:
                        offsets = (log.batch(query, batch) or {}).get("sink_offsets")
                        places = self._placements.of(query, batch, offsets).get(item.rid) if offsets else None
                        if places:
                            item.topic, item.partition, item.offset = places[0]
                            break
            except (KafkaError, BrokerUnavailable, OSError) as exc:
                logging.getLogger(__name__).warning("the Kafka sink's records cannot be read: %s", exc)

    def explainer(self) -> Explainer:
        """The kept plans, named (``explain.Explainer``): what answers' ``operators`` and ``columns`` come from."""
        with self._making:
            if self._explainer is None:
                self._explainer = Explainer(self.config.store_uri(), self.config.log_topic)
            return self._explainer

    def target(self, to: str, name: str = "to") -> str:
        """``to`` as a walk compares it with rows: a kind of row, or a dataset the kept plans have (a query's
        sink given as the sink, ``parquet:/out``, is its query's name, which its rows carry), by headwater's name or
        OpenLineage's (``kafka://broker:9092/orders``: ``Explainer.openlineage_names``).

        ``LineageError`` naming the datasets there are when no kept plan has it (a typo would
        otherwise be an empty, complete answer). With no plan kept, nothing tells, and ``to``
        is taken as it is.
        """
        if to in KINDS:
            return to
        explainer = self.explainer()
        as_named = openlineage.parse(to)
        if as_named is not None:  # an OpenLineage name: kafka://broker:9092/orders, file:/data/out, s3://bucket/out
            ours = explainer.openlineage_names()
            if as_named in ours:
                return self.target(ours[as_named], name)
        known = explainer.datasets()
        if not known or to in known["queries"] or to in known["state"] or to in known["other"]:
            return to
        if to in known["sinks"]:
            return known["sinks"][to]
        tables = [*known["tables"].items(),
                  *((dataset, held.get("short_name")) for dataset, held in self.tables().described.items())]
        if any(names_table(to, dataset, alias) for dataset, alias in tables):
            return to
        if to.startswith("file:") and any(rids_path(to[5:]).startswith(root) for root in known["files"]):
            return to
        if to.startswith("kafka:") and to[6:] in explainer.topics():
            return to
        shorts = sorted({short for short in known["tables"].values() if short is not None})
        named = sorted(known["queries"]) + shorts + \
            [f"kafka:{t}" for t in explainer.topics()] + sorted(known["state"]) + sorted(known["sinks"]) + \
            sorted(n.uri for n in explainer.openlineage_names())
        more = f" and {len(named) - MAX_NAMED} more" if len(named) > MAX_NAMED else ""
        raise LineageError(f"no kept plan has a dataset {to!r}: {name} is source, state or output, or one of "
                           f"{', '.join(named[:MAX_NAMED])}{more}")

    @staticmethod
    def _with_display_names(answer: Answer) -> Answer:
        """``answer`` with static tables named as people see them (``datasets.display_names``), each row's table
        kept."""
        names = display_names([x.dataset for x in answer] + [u.get("dataset") for u in answer.unexplained])
        if names:
            for item in answer:
                if item.dataset in names:
                    item.table, item.dataset = rids.dataset_table(item.dataset), names[item.dataset]
            for row in answer.unexplained:
                dataset = row.get("dataset")
                row["dataset"] = names.get(dataset, dataset) if dataset is not None else None
        return answer

    def with_payload(self, found: list[Lineage], backend: WalkingBackend | None = None) -> list[Lineage]:
        """``found`` with each row's original source record, or an output row's row in its file sink, added (what
        ``payload=True`` does). ``LineageError`` within seconds if Kafka records are wanted and the broker
        does not answer."""
        backend = backend or self._backend(self.names[0])
        self.placed_in_kafka(found)
        if any(item.topic is not None for item in found) and \
                time.monotonic() - self._broker_answered > BROKER_TTL_S:
            check_broker(self.config)
            self._broker_answered = time.monotonic()
        datasets: dict = {}
        for item in found:
            if item.kind == "output":
                self._sink_payload(item)
                continue
            dataset = rids.table_dataset(item.table) if item.table else item.dataset  # shown short, or not yet
            versions = None
            if dataset and item.topic is None and dataset not in datasets:
                datasets[dataset] = backend.dataset(dataset)
            location = table_location(datasets.get(dataset) or {})
            read_at = stream = None
            with self._inferring:  # the batch log and plans, as inference reads them
                fallback = self._fallbacks()[0]
                if location is not None:
                    versions = fallback.logged_versions(location_key(location), item.batches)
                elif item.topic is not None:
                    read_at = fallback.last_read(item.batches)
                elif item.path is not None and item.position is None:
                    stream = fallback.file_source(item.path)
            attach_payload(item, self.config, datasets.get(dataset), versions, read_at, stream)
        return found

    def _sink_payload(self, item: Lineage) -> None:
        """An output row's row, read from its query's file sink (only the files its batches wrote), or its
        record in its Kafka sink."""
        query = self.explainer().query_of(item.dataset)
        plan = self.explainer().plan(query) if query is not None else None
        sink = plan.sink if plan is not None else None
        if item.topic is not None:
            item.payload = kafka_record(self.config, item.topic, item.partition, item.offset)
            return
        if query is None or sink is None or sink.partition(":")[0] not in SINK_FORMATS:
            item.payload = {"error": f"the rows of {item.dataset} cannot be read here: its sink is "
                                     f"{sink or 'not in a kept plan'}, not a file sink "
                                     f"({', '.join(k + ':PATH' for k in SINK_FORMATS)})"}
            return
        with self._inferring:
            log = self._fallbacks()[0].log.refresh()
            logged = {batch: (log.batch(query, batch) or {}).get("sink_files") for batch in item.batches}
        try:
            files = sink_files(sink, logged)
        except (OSError, ValueError):  # a sink log this host cannot read: every file is read instead
            files = []
        item.payload = sink_row(sink, item.rid, files)

    def backward(self, rid: int | str, to: str = "source", depth: int = 16, payload: bool = False,
                 cols: int | None = None, paths: int = 0, since=None, until=None) -> Answer:
        """The rows (``to``: a kind of row or a dataset) ``rid`` (a rid or an address, ``rid_of``) was derived
        from, within ``depth`` edges."""
        return self._one_way(rid, to, depth, payload, cols, paths, since, until, backward=True)

    def forward(self, rid: int | str, to: str = "output", depth: int = 16, payload: bool = False,
                cols: int | None = None, paths: int = 0, since=None, until=None) -> Answer:
        """The rows (``to``) derived from ``rid``, within ``depth`` edges."""
        return self._one_way(rid, to, depth, payload, cols, paths, since, until, backward=False)

    def co_contributors(self, rid: int | str, to: str = "source", via: str = "output", depth: int = 16,
                        payload: bool = False, since=None, until=None) -> Answer:
        """The ``to`` rows used together with ``rid`` to make ``via`` rows (TensProv Q10)."""
        return self._two_ways(rid, to, via, depth, payload, since, until, first_backward=False)

    def co_dependents(self, rid: int | str, to: str = "output", via: str = "source", depth: int = 16,
                      payload: bool = False, since=None, until=None) -> Answer:
        """The ``to`` rows derived from the ``via`` rows ``rid`` was derived from (TensProv Q11)."""
        return self._two_ways(rid, to, via, depth, payload, since, until, first_backward=True)

    def _one_way(self, row, to, depth, payload, cols, paths, since, until, backward: bool) -> Answer:
        Question("backward" if backward else "forward", row,
                 {"to": to, "depth": depth, "cols": cols, "paths": paths, "since": since, "until": until})
        rid = self.rid_of(row, made=backward)
        answer, asked = self._asked_one_way(row, rid, self.target(to), depth, payload, cols, paths, since, until,
                                            backward)
        self.placed_in_kafka(answer.records)
        self._explain(answer, asked, backward)
        return self._with_display_names(answer)

    def _explain(self, answer: Answer, asked: dict | None, backward: bool) -> None:
        """Each record's ``operators`` and ``columns`` (``explain.py``), from the kept plans; a store whose plans
        cannot be read leaves them out, never failing the answer."""
        try:
            self.explainer().explain(answer.records, asked, backward)
        except OSError:
            pass

    def _asked_one_way(self, row, rid, to, depth, payload, cols, paths, since, until,
                       backward: bool) -> tuple[Answer, dict | None]:
        """The answer, and what the asked row is (``kind``, ``dataset``, ``topic``, ``path``) where known."""
        window = Window(since, until)
        deadline = time.monotonic() + self.timeout_s
        try:
            backend, question = self._first_store_with(rid, backward)
        except UnknownRow as unknown:
            with self._inferring:
                inferred = self._inferred(rid, to, payload, deadline) if backward else \
                    self._inferred_forward(rid, to, cols, payload, deadline)
                if not backward:  # fully captured batches that read it, and dropped it: nothing derives from it
                    read = self._fallbacks()[1].find(rid, deadline, captured=True)
                    if read is not None:
                        inferred = Answer(rid, [], [], []) if inferred is None else inferred
                        inferred.read_by = read.gaps
                if inferred is None:
                    raise UnknownRow(self._never_read(row, rid, unknown)) from None
                return inferred, self._inferred_row(rid, inferred, backward, deadline)
        if backend.narrower is not None:
            backend.narrower.pop_narrowings_met()  # what an earlier question left, had it failed half-way
        walked, records = backend.walk([rid], depth, backward, cols if backward else None, paths, self.max_reach,
                                       deadline, window.outside(backend), question=question)
        found = lineage_of(rid, walked.found, records, to, None if backward else cols, bool(paths))
        answer = self._answer(backend, rid, found, [(walked, records, backward)], payload)
        if not backward and not found and records.get(rid, {}).get("kind") == "source":
            # Into a group's state that has emitted nothing yet (a window not closed): read, and waiting.
            with self._inferring:
                read = self._fallbacks()[1].find(rid, deadline, captured=True)
            answer.read_by = read.gaps if read is not None else []
        return answer, records.get(rid)

    def _inferred_row(self, rid: int, answer: Answer, backward: bool, deadline: float) -> dict | None:
        """What the asked row of an inferred answer is: backward, an output row of the query of the batch it
        fills (its gap); forward, the source row the batches read (the log's offsets say which)."""
        if backward:
            return {"kind": "output", "dataset": answer.gaps[0].query} if answer.gaps else None
        read = self._fallbacks()[1].find(rid, deadline) if answer.records else None
        if read is None:
            return None
        if read.kind == "kafka":
            return {"kind": "source", "dataset": f"kafka:{read.at[0]}", "topic": read.at[0]}
        return {"kind": "source", "dataset": read.at[0]}

    def _never_read(self, row: int | str, rid: int, unknown: UnknownRow) -> str:
        """Why no store holds the row and no batch the log records read it, as precisely as ``row`` allows."""
        said = f"{unknown}; and no batch the batch log records read it"
        kind, _, rest = row.partition(":") if isinstance(row, str) else ("", "", "")
        if kind == "kafka":
            topic, partition, offset = rest.rsplit(":", 2)
            spans = [span for _, _, _, entry in self._fallbacks()[1].batches_read()
                     for (t, p), span in offset_ranges(entry["sources"]).items() if (t, p) == (topic, int(partition))]
            if not spans:
                return f"{said}: no batch read partition {partition} of topic {topic!r}"
            first, last = min(start for start, _ in spans), max(end for _, end in spans) - 1
            return f"{said}: batches read offsets {first} to {last} of {topic}:{partition}, not {offset}"
        if kind == "table":
            return f"{said}: no table row has that key, or no table of that name was read ({row})"
        return said

    def _inferred(self, rid: int, to: str, payload: bool, deadline: float) -> Answer | None:
        """The answer for a sink row no store holds because its batch published no edges:
        its sources inferred from the log (``fallback.py``); None if no sink holds ``rid``."""
        fallback = self._fallbacks()[0]
        located = fallback.locate(rid, deadline)
        if located is None:
            return None
        query, batch, values = located
        if to in ("state", "output"):
            raise LineageError(f"rid {rid} is from batch {batch} of {query!r}, which published no edges: its lineage "
                               f"is inferred, to sources only (to=source or a dataset), not to {to!r}")
        status = (fallback.log.refresh().batch(query, batch) or {}).get("status")
        found, _ = fallback.backward(query, batch, rid, values)
        found = [x for x in found if is_target(to, x.kind, x.dataset)]
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
                 if is_target(to, x.kind, x.dataset) and (cols is None or x.cols is None or x.cols & cols)]
        if payload:
            found = self.with_payload(found)
        return Answer(rid, ordered(found), read.gaps, [])

    def _fallbacks(self) -> tuple[Fallback, Forward]:
        with self._making:
            if self._fallback is None or self._forward is None:  # made together
                self._fallback = Fallback(self.config)
                self._forward = Forward(self._fallback)
            return self._fallback, self._forward

    def _two_ways(self, row, to, via, depth, payload, since, until, first_backward: bool) -> Answer:
        Question("co_dependents" if first_backward else "co_contributors", row,
                 {"to": to, "via": via, "depth": depth, "since": since, "until": until})
        rid = self.rid_of(row, made=first_backward)
        to, via = self.target(to), self.target(via, "via")
        window = Window(since, until)
        deadline = time.monotonic() + self.timeout_s
        backend, question = self._first_store_with(rid, first_backward)
        outside = window.outside(backend)
        first, first_records = backend.walk([rid], depth, first_backward, max_reach=self.max_reach,
                                            deadline=deadline, outside=outside, question=question)
        middle = [x.rid for x in lineage_of(rid, first.found, first_records, via)]
        legs = [(first, first_records, first_backward)]
        found = []
        if middle:
            second, records = backend.walk(middle, depth, not first_backward, max_reach=self.max_reach,
                                           deadline=deadline, outside=outside)
            legs.append((second, records, not first_backward))
            found = [x for x in lineage_of(rid, second.found, records, to) if x.rid != rid]
        answer = self._answer(backend, rid, ordered(found), legs, payload)
        # The second leg starts from the via rows: backward, the paths end at them, each of the query that made it.
        self._explain(answer, None, not first_backward)
        return self._with_display_names(answer)

    def _answer(self, backend: WalkingBackend, rid: int, found: list[Lineage], legs: list, payload: bool) -> Answer:
        crossed = set().union(*(walked.crossed for walked, _, _ in legs))
        statuses = backend.batch_statuses(sorted(crossed)) if crossed else {}
        statuses.update(_through_state(backend, legs))
        gaps = [Gap(query, batch, status) for (query, batch), status in sorted(statuses.items())
                if status != "full"]
        unexplained = {}
        # A pending black box's node the walk stopped at: its superset is described in ``narrowed``.
        held = backend.narrower.held_back if backend.narrower is not None else set()
        for walked, records, backward in legs:
            if backward:  # a row that is not a source but has no recorded inputs
                for row in walked.ends - held:
                    record = records.get(row, {})
                    if record.get("kind") != "source":
                        unexplained[row] = {"rid": row, "kind": record.get("kind"), "dataset": record.get("dataset")}
        if payload:
            found = self.with_payload(found, backend)
        narrowed = backend.narrower.pop_narrowings_met() if backend.narrower is not None else []
        return Answer(rid, found, gaps, [unexplained[r] for r in sorted(unexplained)], narrowed=narrowed)


FOREVER = (1 << 63) - 1  # the last batch of a range that has no end


def _through_state(backend: WalkingBackend, legs: list) -> dict[tuple[str, int], str | None]:
    """The batches not fully captured a walk went through by way of state nodes that gather rows across
    batches, each with its capture status: backward from a state node reached by an output of batch b, every batch up
    to b (a row may have entered its group in any of them: one not captured published no edge into it);
    forward from one reached by an input of batch b, every batch from b on (one not captured published no
    edge out of it)."""
    spans: dict[tuple[str, bool], int] = {}  # (query, backward) -> the widest bound
    for walked, records, backward in legs:
        for row, moments in walked.moments.items():
            record = records.get(row, {})
            if record.get("kind") != "state" or not accumulates(record.get("dataset")):
                continue
            for query, batch in moments:
                held = spans.get((query, backward))
                widest = max if backward else min
                spans[(query, backward)] = batch if held is None else widest(held, batch)
    statuses: dict[tuple[str, int], str | None] = {}
    for (query, backward), bound in spans.items():
        statuses.update(backend.gaps_between(query, 0, bound) if backward else
                        backend.gaps_between(query, bound, FOREVER))
    return statuses
