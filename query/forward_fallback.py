"""Forward lineage of a source row read by batches that published no edges, from the log alone.

The batches that read the row are found first, among those the batch log says were not
fully captured (a row of a captured batch is answered from its edges): for a Kafka
record, the batches whose offset ranges hold its offset, which its rid gives back
(``rid.kafka_offset``); for a row of a static table, every batch whose plan reads that
table, its rows named as capture names them (by their declared key, or by their whole
content: ``Fallback.table_rids``). Each such batch's plan is then replayed in memory over the
rows it read (read back as ``fallback.py`` does), every output row carrying the input
rows it derives from (``infer/run.py``), and the output rows that derive from the asked
row are matched by value to the rows the batch wrote to its sink (the batch log lists a
file sink's files by batch), which carry their rids.

Records say ``via: inference``. They are ``exact`` unless equal output rows of the
batch, only some of which derive from the asked row, make the match ambiguous (all of
them are answered), or the plan cannot be run here or its replay does not reproduce the
batch's sink rows (every row of the batch is answered, a superset). A plan that keeps
state across batches (a streaming aggregation, deduplication, limit or stream-stream
join) is refused with an error: rows of later batches may derive from the row, which
one batch's replay cannot show. So are sinks that cannot be read back (tables,
foreachBatch) and sources ``fallback.py`` cannot read.
"""

from __future__ import annotations

import datetime
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa

from headwater.core import rid as rids
from headwater.core.offsets import offset_ranges
from headwater.spark.catalyst import STATEFUL_BLACK_BOXES
from headwater.spark.operators import (
    Aggregate,
    Deduplicate,
    Join,
    Limit,
    Op,
    Plan,
    Relation,
    Unknown,
    Window,
    WindowGroupLimit,
)

from .backend import Gap, Lineage
from .errors import LineageError
from .fallback import Fallback, static_source
from .infer.evaluate import NotEvaluable, value_key
from .infer.run import LINEAGE, Running

REPLAYS_KEPT = 4  # batches whose replay is kept: questions about one batch's rows often come together


@dataclass
class Read:
    """The source row a rid names and the batches not fully captured that read it."""

    kind: str  # "kafka" or "table"
    at: tuple  # (topic, partition, offset), or (dataset,) for a static table's row
    batches: list[tuple[str, int, str | None]] = field(default_factory=list)  # (query, batch, status)

    @property
    def gaps(self) -> list[Gap]:
        return [Gap(query, batch, status) for query, batch, status in sorted(self.batches)]


@dataclass
class _Replay:
    """One batch's plan run over its rows with lineage, beside the rows the batch wrote to its sink."""

    kept: dict
    read: dict[int, tuple[pd.DataFrame, tuple]]  # relation id → its rows and (kind, dataset, key)
    keys: list[tuple] | None  # each output row's values as compared; None: the plan could not be replayed here
    lineage: list[frozenset]  # each output row's (relation id, position) pairs
    sink: list[tuple[tuple, int]]  # each sink row's values as compared, and its rid


class Forward:
    """Forward questions about rows of uncaptured batches, over one ``Fallback``'s log and plans."""

    def __init__(self, fallback: Fallback):
        self.fallback = fallback
        self._replays: OrderedDict[tuple[str, int], _Replay] = OrderedDict()

    def find(self, rid: int, deadline: float | None = None, captured: bool = False) -> Read | None:
        """The row ``rid`` names and the batches not fully captured (``captured``: the fully captured
        ones) that read it; None if no such batch read it."""
        uncaptured = self.batches_read(rid, deadline, captured)
        kafka = None
        for query, batch, status, entry in uncaptured:
            for (topic, partition), (start, end) in offset_ranges(entry["sources"]).items():
                offset = rids.kafka_offset(rid, topic, partition)
                if start <= offset < end:
                    kafka = kafka or Read("kafka", (topic, partition, offset))
                    kafka.batches.append((query, batch, status))
        if kafka is not None:
            return kafka
        table: Read | None = None
        unnamed: dict[str, LineageError] = {}  # dataset → why its rows cannot be named
        naming: dict[tuple[str, str], list[str]] = {}  # by query and plan: the tables of it that hold the row
        for query, batch, status, _ in uncaptured:
            _check(deadline, rid)
            plan, kept = self.fallback.plan(query, batch)
            held = (query, kept["fingerprint"])
            if held not in naming:  # once per plan, not per batch that ran it: a stream runs one plan for long
                naming[held] = self._tables_holding(rid, plan, kept, unnamed)
            for dataset in naming[held]:
                table = table or Read("table", (dataset,))
                if (query, batch, status) not in table.batches:
                    table.batches.append((query, batch, status))
        if table is None and unnamed:
            raise next(iter(unnamed.values()))
        return table

    def _tables_holding(self, rid: int, plan: Plan, kept: dict, unnamed: dict) -> list[str]:
        """The datasets of the static tables ``plan`` reads that hold the row ``rid``; a table whose rows
        cannot be named here goes into ``unnamed`` (the rid may still be another table's row)."""
        found = []
        for relation in (op for op in plan.operators() if isinstance(op, Relation)):
            if relation.streaming or not relation.location:
                continue
            dataset = static_source(relation, kept)["dataset"]
            try:
                if rid in self.fallback.table_rids(relation, kept):
                    found.append(dataset)
            except LineageError as e:
                unnamed.setdefault(dataset, e)
        return found

    def derived(self, rid: int, read: Read, deadline: float | None = None) -> list[Lineage]:
        """The sink rows derived from the row ``read`` describes, over every batch that read it."""
        found = []
        for query, batch, _ in sorted(read.batches):
            _check(deadline, rid)
            found += self._derived_in(rid, read, query, batch)
        return found

    def batches_read(self, rid: int | None = None, deadline: float | None = None,
                     captured: bool | None = None) -> list[tuple[str, int, str, dict]]:
        """``(query, batch, status, log entry)`` of every batch the log records with its offsets: those not
        fully captured (``captured=False``), the fully captured ones (``True``), or all (None)."""
        log = self.fallback.log.refresh()
        found = []
        for query in self.fallback.plans.queries():
            statuses = log.statuses((query, batch) for batch in log.batches(query))
            for (_, batch), status in sorted(statuses.items()):
                # As ``Fallback.locate``: an unlogged batch's rows are in the stores or nowhere.
                if status is None or captured is not None and (status == "full") != captured:
                    continue
                _check(deadline, rid)
                entry = log.batch(query, batch)
                if entry is not None and "sources" in entry:
                    found.append((query, batch, status, entry))
        return found

    def _derived_in(self, rid: int, read: Read, query: str, batch: int) -> list[Lineage]:
        replay = self._replay(query, batch)
        mask = _mask(replay.kept, read)
        plan = self.fallback.plan(query, batch)[0]
        if replay.keys is None:  # every row of the batch: a superset, flagged as one
            return [_output(rid, query, batch, out, mask, False) for _, out in replay.sink]
        # Replayed over static tables changed since the batch read them: never claimed exact.
        current = not self.fallback.changed_tables(plan, self.fallback.entry(query, batch))
        relations = {op.id: op for op in plan.operators() if isinstance(op, Relation)}
        targets: set[tuple[int, int]] = set()  # (relation id, position) of the asked row
        for relation_id, (frame, (kind, dataset, _)) in replay.read.items():
            if kind == "kafka" and read.kind == "kafka":
                topic, partition, offset = read.at
                hit = (frame["topic"] == topic) & (frame["partition"] == partition) & (frame["offset"] == offset)
            elif kind == "table" and read.kind == "table" and (dataset,) == read.at:
                hit = self.fallback.table_rids(relations[relation_id], replay.kept) == rid
            else:
                continue
            targets.update((relation_id, int(p)) for p in np.flatnonzero(np.asarray(hit)))
        derived = Counter(k for k, lineage in zip(replay.keys, replay.lineage) if lineage & targets)
        equal = Counter(replay.keys)
        # Equal output rows are told apart by nothing but their rids: a sink row equal to rows that
        # derive from the asked row and to rows that do not may be either.
        return [_output(rid, query, batch, out, mask, current and derived[k] == equal[k])
                for k, out in replay.sink if k in derived]

    def _replay(self, query: str, batch: int) -> _Replay:
        if (query, batch) in self._replays:
            self._replays.move_to_end((query, batch))
            return self._replays[query, batch]
        plan, kept = self.fallback.plan(query, batch)
        kept_state = _stateful(plan)
        if kept_state is not None:
            raise LineageError(f"the plan of {query!r} keeps state across batches ({_name(kept_state)}, op "
                               f"{kept_state.id}): rows of later batches may derive from the row, which inference "
                               f"from one batch cannot show")
        files = self.fallback.sink_files(query, kept)
        if files is None:
            raise LineageError(f"the sink of {query!r} ({kept.get('sink')}) cannot be read back here (only file sinks "
                               f"with _hw_rid): the rows derived from the row cannot be named")
        names = [a.name for a in plan.root.output]
        parts = [f.to_table(columns=[*names, "_hw_rid"]) for f, b in files if b == batch]
        missing = [n for n in names if parts and n not in parts[0].schema.names]
        if missing:
            raise LineageError(f"the sink of {query!r} lacks the plan's output columns {missing}")
        sink = pa.concat_tables(parts) if parts else None
        sink_rows = [] if sink is None else [
            (_key(values[:-1]), values[-1]) for values in zip(*(sink[n].to_pylist() for n in [*names, "_hw_rid"]))]
        table, read = self.fallback.tables(self.fallback.entry(query, batch), kept)
        keys: list[tuple] | None = None
        lineage: list[frozenset] = []
        try:
            output = Running(plan, table, lineage=True).output()
            keys = [_key(values) for values in zip(*(output[a.expr_id].tolist() for a in plan.root.output))] \
                if len(output) else []
            lineage = output[LINEAGE].tolist() if len(output) else []
        except NotEvaluable:  # an operator or function not modelled: no row told from another
            pass
        if keys is not None and Counter(keys) != Counter(k for k, _ in sink_rows):
            keys = None  # not the rows the batch wrote: its lineage is not theirs
        replay = self._replays[query, batch] = _Replay(kept, read, keys, lineage, sink_rows)
        while len(self._replays) > REPLAYS_KEPT:
            self._replays.popitem(last=False)
        return replay


def _check(deadline: float | None, rid: int | None) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise LineageError(f"rid {rid}: its forward lineage was not inferred in time from the log of the batches "
                           f"not fully captured (LineageClient(timeout_s=…) allows more)")


def _stateful(plan: Plan) -> Op | None:
    """An operator whose rows in a streaming query may derive from rows of earlier batches."""
    for op in plan.operators():
        streams = sum(any(r.streaming for r in child.relations()) for child in op.children)
        if not streams:
            continue
        if isinstance(op, (Aggregate, Deduplicate, Limit, Window, WindowGroupLimit)) or \
                isinstance(op, Join) and streams > 1 or \
                isinstance(op, Unknown) and op.spark_class in STATEFUL_BLACK_BOXES:
            return op
    return None


def _name(op: Op) -> str:
    return getattr(op, "spark_class", "") or type(op).__name__


def _key(values) -> tuple:
    """Output values as compared: numbers equal when Spark's are, times in UTC, lists and maps hashable."""
    return tuple(_comparable(v) for v in values)


def _comparable(v):
    if isinstance(v, datetime.datetime):  # pandas' Timestamps too, which ``value_key`` takes for dates
        v = pd.Timestamp(v)
        return (v.tz_convert("UTC").tz_localize(None) if v.tzinfo else v).to_datetime64()
    if isinstance(v, (list, tuple, np.ndarray)):
        return tuple(_comparable(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _comparable(x)) for k, x in v.items()))
    return value_key(v)


def _mask(kept: dict, read: Read) -> int:
    """The sink columns derived from the row's source, as capture's edges give them (-1: not known)."""
    mask, seen = 0, False
    for source in kept.get("sources", []):
        if read.kind == "kafka" and source.get("source") != "kafka" or read.kind == "table" and (
                source.get("source") != "static" or source.get("dataset") != read.at[0]):
            continue
        if source.get("columns_read") is None:
            return -1
        seen = True
        for i, columns in enumerate(source["columns_read"]):
            if columns:
                mask |= 1 << min(i, 63)
    if not seen:
        return -1
    return mask - (1 << 64) if mask >= 1 << 63 else mask


def _output(of: int, query: str, batch: int, rid: int, cols: int, exact: bool) -> Lineage:
    return Lineage(of=of, rid=rid, kind="output", dataset=query, cols=cols, batches=[batch], exact=exact,
                   via="inference")
