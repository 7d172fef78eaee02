"""Lineage of an output row whose batch published no edges, from the log alone.

The batch's plan (``indexer/plans.py``: the query's optimized plan as capture logged it),
the offsets the batch read (the batch log's progress) and the static tables the plan
names are all this needs: the Kafka records of exactly those offset ranges are read back
from the broker, the static tables from their files, and ``infer`` finds which of them
the row derives from. Every record found says ``via: inference`` and whether it is
``exact`` or part of a superset (``Inferred.reasons`` say why).

Each row found gets the rid capture gives it: a Kafka record's from its coordinates, a
static table row's from its declared key, or, without one, from its whole content over
the columns capture logged it hashed (``hashed`` in the plan log's sources; the
relation's columns for plans logged before capture logged them), Spark's hash
reproduced (``rid.table_row_rids``).

Sources the plan reads that this module cannot read back (a file stream, a rate source)
or a plan not kept make the question fail with a clear error, never a guess.

Forward questions (the sink rows derived from a source row such batches read) replay the
same plan over the same rows: ``forward_fallback.py``.
"""

from __future__ import annotations

import datetime
import functools
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds

from headwater.core import rid as rids
from headwater.core.config import Config
from headwater.core.offsets import offset_ranges
from headwater.core.plan import location_key
from headwater.spark.operators import Plan, Relation, build
from headwater.spark.table_files import (
    TableUnreadable,
    local_path,
    read_table,
    sink_batch_files,
    table_version,
    uri_path,
)
from headwater.store.batch_log import BatchLog
from headwater.store.plans import PlanStore

from .backend import Lineage
from .errors import LineageError
from .infer.refine import Inferred, Prepared, infer, prepare

KAFKA_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType")
FETCH_TIMEOUT_S = 60
KEPT_BATCHES = 8  # the batches whose Kafka records a Fallback keeps


class Fallback:
    """Infers lineage for one log topic's queries; plans are prepared once and kept."""

    def __init__(self, config: Config):
        self.config = config
        self.plans = PlanStore(config.store_uri(), config.log_topic)
        self.log = BatchLog(config.store_uri(), config.log_topic)
        # By query and fingerprint: two queries may run one plan over other tables, topics and sinks.
        self._built: dict[tuple[str, str], tuple[Plan, dict]] = {}
        self._prepared: dict[tuple[str, str], Prepared] = {}
        self._static: dict[tuple, tuple[pa.Table, pd.DataFrame]] = {}
        self._table_rids: dict[tuple, np.ndarray] = {}
        self._records: OrderedDict[tuple, pd.DataFrame] = OrderedDict()  # by offset ranges, the last few
        self._records_lock = threading.Lock()

    def plan(self, query: str, batch: int) -> tuple[Plan, dict]:
        """The plan batch ``batch`` of ``query`` ran, and what capture logged beside it."""
        kept = self.plans.plan_for(query, batch)
        if kept is None:
            raise LineageError(f"no plan of query {query!r} is kept for batch {batch}: lineage cannot be "
                               f"inferred (capture logs it at start; is the indexer running?)")
        held = (query, kept["fingerprint"])
        if held not in self._built:
            self._built[held] = (build(kept["optimized"]), kept)
        return self._built[held]

    def _plan(self, query: str, batch: int) -> tuple[Plan, Prepared, dict]:
        plan, kept = self.plan(query, batch)
        held = (query, kept["fingerprint"])
        if held not in self._prepared:
            self._prepared[held] = prepare(plan)
        return plan, self._prepared[held], kept

    def logged_versions(self, key: str, batches) -> set[str]:
        """The versions of the static table ``key`` (``plan.location_key``) that batches numbered ``batches``
        of any query logged reading it."""
        log = self.log.refresh()
        return {version for query in self.plans.queries() for batch in batches
                if (version := (((log.batch(query, batch) or {}).get("tables")) or {}).get(key))}

    def last_read(self, batches) -> str | None:
        """When the last of the batches numbered ``batches`` (of any query) ran: the batch log's ``at``."""
        log = self.log.refresh()
        times = [at for query in self.plans.queries() for batch in batches
                 if (at := (log.batch(query, batch) or {}).get("at"))]
        return max(times, key=logged_time) if times else None

    def file_source(self, path: str) -> dict | None:
        """The logged location of the file stream that read the file ``path`` (as Spark names it), or None."""
        for query in self.plans.queries():
            for source in (self.plans.latest(query) or {}).get("sources", []):
                location = source.get("location") or {}
                if source.get("source") == "file" and any(
                        _inside(path, root) for root in location.get("paths") or []):
                    return location
        return None

    def changed_tables(self, plan: Plan, entry: dict) -> list[str]:
        """The static tables of ``plan`` whose files differ now from the versions the batch (its log
        ``entry``) logged: read now, they may not be the rows the batch read."""
        logged = entry.get("tables") or {}
        changed = []
        for relation in plan.operators():
            if isinstance(relation, Relation) and not relation.streaming and relation.location:
                key = location_key(relation.location)
                try:
                    now = table_version(relation.location)["digest"]
                except TableUnreadable:
                    now = None
                if key in logged and logged[key] != now:
                    changed.append(key)
        return changed

    def entry(self, query: str, batch: int) -> dict:
        """The batch log's entry of the batch, which must hold the offsets it read."""
        entry = self.log.refresh().batch(query, batch)
        if entry is None or "sources" not in entry:
            raise LineageError(f"batch {batch} of {query!r} has no offsets in the batch log: lineage cannot be "
                               f"inferred")
        return entry

    def tables(self, entry: dict, kept: dict) -> tuple[Callable[[Relation], pd.DataFrame], dict[int, tuple]]:
        """The rows of each relation of a batch's plan, read back on first use, and what was read:
        by relation id, its rows and what they are, ``(kind, dataset, key)``."""
        read: dict[int, tuple[pd.DataFrame, tuple]] = {}

        def table(relation: Relation) -> pd.DataFrame:
            if relation.id not in read:
                read[relation.id] = self.relation_rows(relation, entry, kept)
            return read[relation.id][0]
        return table, read

    def sink_files(self, query: str, kept: dict) -> list[tuple[ds.Fragment, int]] | None:
        """The files of the query's sink with the batch that wrote each, or None if the sink is not
        a file sink holding ``_hw_rid`` that can be read here. A batch's files are those its capture
        record lists (``sink_files``), else those the sink's own commit log lists for it: files in
        neither are an attempt's that Spark never committed, which no reader of the sink sees."""
        kind, _, path = (kept.get("sink") or "").partition(":")
        try:
            path = local_path(path)
            if kind not in ("parquet", "orc", "json") or not path or not Path(path).exists():
                return None
            log = self.log.refresh()
            has_log = Path(path, "_spark_metadata").is_dir()
            batch_of: dict[str, int] = {}  # file (resolved) → the batch that wrote it
            for batch in log.batches(query):
                listed = (log.batch(query, batch) or {}).get("sink_files") \
                    or (sink_batch_files(path, batch) if has_log else None) or []
                batch_of.update((str(Path(uri_path(f)).resolve()), batch) for f in listed)
        except TableUnreadable:  # a sink on a file system this host cannot read, or a log it cannot
            return None
        paths = [f for f in batch_of if Path(f).exists()]
        if not paths:
            return []
        dataset = ds.dataset(paths, format=kind, partitioning="hive", partition_base_dir=str(Path(path).resolve()))
        if "_hw_rid" not in dataset.schema.names:
            return None
        return [(f, batch_of[str(Path(f.path).resolve())]) for f in dataset.get_fragments()]

    def locate(self, rid: int, deadline: float | None = None) -> tuple[str, int, dict] | None:
        """(query, batch, column values) of the sink row whose ``_hw_rid`` is ``rid``, or None.

        The batch log says which batch wrote each file of a file sink (``sink_files``), so
        only the files of batches it says were not fully captured are read: a rid
        of any other batch is in the stores or nowhere. Sinks of other kinds (tables,
        foreachBatch) cannot be read back here yet. Past ``deadline`` (monotonic), the
        search stops with an error: an unknown rid never costs an unbounded scan.
        """
        import pyarrow.compute as pc

        log = self.log.refresh()
        for query in self.plans.queries():
            kept = self.plans.latest(query)
            files = self.sink_files(query, kept) if kept is not None else None
            if files is None:
                continue
            statuses = log.statuses({(query, batch) for _, batch in files})
            for fragment, batch in files:
                if statuses.get((query, batch)) in (None, "full"):
                    continue
                if deadline is not None and time.monotonic() > deadline:
                    raise LineageError(f"rid {rid}: not found in time among the sink rows of uncaptured batches")
                found = fragment.to_table(filter=pc.field("_hw_rid") == rid)
                if found.num_rows:
                    return query, batch, found.slice(0, 1).to_pylist()[0]
        return None

    def backward(self, query: str, batch: int, of: int, values: dict) -> tuple[list[Lineage], Inferred]:
        """The sources output row ``of`` of batch ``batch`` derives from; ``values`` its columns by name."""
        plan, prepared, kept = self._plan(query, batch)
        entry = self.entry(query, batch)
        missing = [a.name for a in plan.root.output if a.name not in values]
        if missing:
            raise LineageError(f"the row lacks the plan's output columns {missing}")
        table, read = self.tables(entry, kept)
        inferred = infer(plan, [values[a.name] for a in plan.root.output], table, prepared=prepared)
        changed = self.changed_tables(plan, entry)
        if changed:  # inferred from rows the batch may not have read: never claimed exact
            inferred.exact = False
            inferred.reasons.append(f"static tables changed since the batch read them: {', '.join(changed)}")
        relations = {op.id: op for op in plan.operators() if isinstance(op, Relation)}
        found: dict[int, Lineage] = {}
        for relation_id, positions in inferred.rows.items():
            frame, (kind, name, key) = read[relation_id]
            positions = positions.tolist()
            named = self.table_rids(relations[relation_id], kept, positions) if kind == "table" else None
            for i, position in enumerate(positions):
                record = _record(kind, name, key, frame.iloc[position], of, inferred.exact,
                                 None if named is None else int(named[i]))
                found.setdefault(record.rid, record)
        for record in found.values():
            record.batches = [batch]
        return sorted(found.values(), key=lambda r: r.rid), inferred

    def relation_rows(self, relation: Relation, entry: dict, kept: dict) -> tuple[pd.DataFrame, tuple]:
        """The rows a relation of the batch's plan read, and what they are: ``(kind, dataset, key)``."""
        names = {a.name for a in relation.output}
        if relation.streaming and {"topic", "partition", "offset", "value"} <= names:
            return self._kafka(entry["sources"]), ("kafka", None, ())
        if relation.location and not relation.streaming:
            source = static_source(relation, kept)
            return self._files(relation.location)[1], ("table", source["dataset"], tuple(source.get("key") or ()))
        raise LineageError(f"cannot read back the rows of {relation.spark_class} (columns {sorted(names)}): "
                           f"only Kafka topics and file-backed static tables")

    def _kafka(self, sources: list[dict]) -> pd.DataFrame:
        """A batch's Kafka records (``_kafka``), kept for the last ``KEPT_BATCHES`` batches asked about:
        the records at an offset never change, and each question about one of a batch's rows reads
        all of them back."""
        ranges = tuple(sorted(offset_ranges(sources).items()))
        with self._records_lock:  # the query service asks from more than one thread
            frame = self._records.get(ranges)
            if frame is not None:
                self._records.move_to_end(ranges)
                return frame
        frame = _kafka(self.config, sources)
        with self._records_lock:
            self._records[ranges] = frame
            while len(self._records) > KEPT_BATCHES:
                self._records.popitem(last=False)
        return frame

    def table_rids(self, relation: Relation, kept: dict, positions: list[int] | None = None) -> np.ndarray:
        """The rids capture gives the rows of the static table a relation of the plan ``kept``
        reads, in the order ``relation_rows`` reads them (all rows, or those at ``positions``):
        by the key declared for it, or else by their content (``content_rids``)."""
        source = static_source(relation, kept)
        table, key, hashed = source["table"], tuple(source.get("key") or ()), tuple(source.get("hashed") or ())
        if key and positions is not None:  # a few rows: their keys hashed, not the whole table's
            return _keyed_rids(table, key, self._files(_location(relation))[1].iloc[positions])
        files = self._files(_location(relation))
        cache = (id(files[0]), table, key, hashed)  # the files as read now: kept per version
        if cache not in self._table_rids:
            self._table_rids[cache] = (_keyed_rids(table, key, files[1]) if key
                                       else self.content_rids(relation, table, hashed))
        found = self._table_rids[cache]
        return found if positions is None else found[positions]

    def content_rids(self, relation: Relation, table: str, hashed: tuple[str, ...] = ()) -> np.ndarray:
        """The rids capture gives the rows of a static table without a declared key, in the order
        ``relation_rows`` reads them: each hashes its row's values over the columns capture hashed
        (``hashed``, as capture logged them; none logged: every column the relation reads).

        The values are read from the files anew with pyarrow, not from the rows inference uses:
        pandas reads NULLs of float columns as NaN, which hashes otherwise, and nullable longs
        as floats, which lose digits.
        """
        types = {a.name: a.dtype for a in relation.output}
        hashed = hashed or tuple(types)
        unknown = [name for name in hashed if name not in types]
        if unknown:
            raise LineageError(f"static table {table!r} has no declared key and its rows' rids hash the columns "
                               f"{unknown}, which the plan's relation does not read (declare keys= in Tracer.trace)")
        files = self._files(_location(relation))[0]
        missing = [name for name in hashed if name not in files.column_names]
        if missing:
            raise LineageError(f"static table {table!r} has no declared key and its files lack the columns "
                               f"{missing} its rows' rids hash (declare keys= in Tracer.trace)")
        try:
            found = rids.table_row_rids(table, [files.column(name).to_pylist() for name in hashed],
                                        [types[name] for name in hashed])
        except rids.UnhashableType as e:
            raise LineageError(f"static table {table!r} has no declared key, and its rows' rids hash a "
                               f"column whose hash is not reproduced here ({e}); declare keys= in "
                               f"Tracer.trace") from None
        return np.array(found, dtype=np.int64)

    def _files(self, location: dict) -> tuple[pa.Table, pd.DataFrame]:
        """A static table's rows, as Spark reads its files (``table_files``) and as pandas holds them, read
        once per version of its files."""
        try:
            cache = (location_key(location), table_version(location)["digest"])
            if cache not in self._static:
                table = read_table(location, location.get("columns"))
                self._static[cache] = (table, table.to_pandas())
        except TableUnreadable as exc:
            raise LineageError(f"the static table cannot be read back: {exc}") from None
        return self._static[cache]


def static_source(relation: Relation, kept: dict) -> dict:
    """What capture logged, beside the plan ``kept``, of the static table a relation reads."""
    paths = _location(relation).get("paths")
    for source in kept.get("sources", []):
        if source.get("source") == "static" and (source.get("location") or {}).get("paths") == paths:
            return source
    raise LineageError(f"the plan reads {paths}, which capture did not log as a static table")


def _location(relation: Relation) -> dict:
    """Where the static table a relation reads lives."""
    if relation.location is None:
        raise LineageError(f"the plan's {relation.spark_class} (op {relation.id}) reads no table's files")
    return relation.location


def _kafka(config: Config, sources: list[dict]) -> pd.DataFrame:
    """The records of the batch's offset ranges (``start`` to ``end``, per ``topic:partition``), all of them."""
    from headwater.adapters.kafka import RecordGone, records_between

    try:
        rows = [(m.key, m.value, m.topic, m.partition, m.offset,
                 datetime.datetime.fromtimestamp(m.timestamp / 1000, datetime.timezone.utc), m.timestamp_type)
                for m in records_between(config, offset_ranges(sources), FETCH_TIMEOUT_S, whole=True)]
    except RecordGone as exc:
        raise LineageError(f"the batch's Kafka records cannot be read back: {exc}") from None
    return pd.DataFrame(rows, columns=KAFKA_COLUMNS)


def _record(kind: str, dataset: str | None, key: tuple, row: pd.Series, of: int, exact: bool,
            table_rid: int | None = None) -> Lineage:
    """The answer record of a source row; ``table_rid``: a static table row's rid
    (``Fallback.table_rids``). A row of a table without a declared key has no key, as
    capture's records have none."""
    found = functools.partial(Lineage, of=of, kind="source", exact=exact, via="inference", cols=-1)
    if kind == "kafka":
        topic, partition, offset = row["topic"], int(row["partition"]), int(row["offset"])
        return found(rid=rids.kafka_rid(topic, partition, offset), dataset=f"kafka:{topic}", topic=topic,
                     partition=partition, offset=offset)
    if table_rid is None:
        raise ValueError("a static table row's record needs its rid (Fallback.table_rids)")
    text = rids.KEY_SEPARATOR.join(key_text(row[k]) for k in key) if key else None
    return found(rid=table_rid, dataset=dataset, key=text)


def _keyed_rids(table: str, key: tuple, frame: pd.DataFrame) -> np.ndarray:
    """The rids of static table ``table``'s rows (``frame``) by their declared key, as capture names them."""
    return np.array([rids.table_rid(table, rids.KEY_SEPARATOR.join(key_text(v) for v in values))
                     for values in zip(*(frame[k].tolist() for k in key))], dtype=np.int64)


def _inside(path: str, root: str) -> bool:
    try:
        path, root = local_path(path), local_path(root).rstrip("/")
    except TableUnreadable:
        return False
    return path == root or path.startswith(root + "/")


def logged_time(at: str) -> datetime.datetime:
    """A time the batch log holds (ISO 8601) as an aware datetime; without a zone, UTC."""
    found = datetime.datetime.fromisoformat(at.replace("Z", "+00:00"))
    return found if found.tzinfo else found.replace(tzinfo=datetime.timezone.utc)


def key_text(v) -> str:
    """A key value as Spark's ``cast(… as string)`` writes it."""
    if isinstance(v, float) and v.is_integer():
        return f"{v:.1f}"
    return str(v)

