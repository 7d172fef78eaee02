"""Lineage of an output row whose batch published no edges, from the log alone.

The batch's plan (``indexer/plans.py``: the query's optimized plan as capture logged it),
the offsets the batch read (the batch log's progress) and the static tables the plan
names are all this needs: the Kafka records of exactly those offset ranges are read back
from the broker, the static tables from their files, and ``infer`` finds which of them
the row derives from. Every record found says ``via: inference`` and whether it is
``exact`` or part of a superset (``Inferred.reasons`` say why).

Sources the plan reads that this module cannot read back (a file stream, a rate source)
or a plan not kept make the question fail with a clear error, never a guess.
"""

from __future__ import annotations

import datetime
import re
import time
from pathlib import Path

import pandas as pd
import pyarrow.dataset as ds

from headwater.core import rid as rids
from headwater.core.config import Config
from headwater.indexer.batch_log import BatchLog
from headwater.indexer.plans import PlanStore

from .backend import Lineage, LineageError
from .infer.operators import Plan, Relation, build
from .infer.refine import Inferred, Prepared, infer, prepare

KAFKA_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType")
_BATCH_FILE = re.compile(r"^part-hw-(\d+)-")
FETCH_TIMEOUT_S = 60


class Fallback:
    """Infers lineage for one log topic's queries; plans are prepared once and kept."""

    def __init__(self, config: Config):
        self.config = config
        self.plans = PlanStore(config.store_path(), config.log_topic)
        self.log = BatchLog(config.store_path(), config.log_topic)
        self._prepared: dict[str, tuple[Plan, Prepared, dict]] = {}
        self._static: dict[tuple, pd.DataFrame] = {}

    def _plan(self, query: str, batch: int) -> tuple[Plan, Prepared, dict]:
        kept = self.plans.plan_for(query, batch)
        if kept is None:
            raise LineageError(f"no plan of query {query!r} is kept for batch {batch}: lineage cannot be "
                               f"inferred (capture logs it at start; is the indexer running?)")
        if kept["fingerprint"] not in self._prepared:
            plan = build(kept["optimized"])
            self._prepared[kept["fingerprint"]] = (plan, prepare(plan), kept)
        return self._prepared[kept["fingerprint"]]

    def locate(self, rid: int, deadline: float | None = None) -> tuple[str, int, dict] | None:
        """(query, batch, column values) of the sink row whose ``_hw_rid`` is ``rid``, or None.

        Capture names a file sink's files after their batch (``part-hw-<batch>-…``), so only
        the files of batches the batch log says were not fully captured are read: a rid
        of any other batch is in the stores or nowhere. Sinks of other kinds (tables,
        foreachBatch) cannot be read back here yet. Past ``deadline`` (monotonic), the
        search stops with an error: an unknown rid never costs an unbounded scan.
        """
        import pyarrow.compute as pc

        log = self.log.refresh()
        for query in self.plans.queries():
            kept = self.plans.latest(query)
            kind, _, path = (kept.get("sink") or "").partition(":")
            path = path.removeprefix("file:")
            if kind not in ("parquet", "orc", "json") or not path or not Path(path).exists():
                continue
            dataset = ds.dataset(path, format=kind)
            if "_hw_rid" not in dataset.schema.names:
                continue
            files = [(f, int(m.group(1))) for f in dataset.get_fragments()
                     if (m := _BATCH_FILE.search(Path(f.path).name))]
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
        entry = self.log.refresh().batch(query, batch)
        if entry is None or "sources" not in entry:
            raise LineageError(f"batch {batch} of {query!r} has no offsets in the batch log: lineage cannot be inferred")
        missing = [a.name for a in plan.root.output if a.name not in values]
        if missing:
            raise LineageError(f"the row lacks the plan's output columns {missing}")
        frames: dict[int, pd.DataFrame] = {}
        names: dict[int, tuple] = {}

        def table(relation: Relation) -> pd.DataFrame:
            if relation.id not in frames:
                frames[relation.id], names[relation.id] = self._read(relation, entry, kept)
            return frames[relation.id]

        inferred = infer(plan, [values[a.name] for a in plan.root.output], table, prepared=prepared)
        found: dict[int, Lineage] = {}
        for relation_id, positions in inferred.rows.items():
            frame, (kind, name, key) = frames[relation_id], names[relation_id]
            for position in positions.tolist():
                record = _record(kind, name, key, frame.iloc[position], of, inferred.exact)
                found.setdefault(record.rid, record)
        for record in found.values():
            record.batches = [batch]
        return sorted(found.values(), key=lambda r: r.rid), inferred

    def _read(self, relation: Relation, entry: dict, kept: dict) -> tuple[pd.DataFrame, tuple]:
        names = {a.name for a in relation.output}
        if relation.streaming and {"topic", "partition", "offset", "value"} <= names:
            return _kafka(self.config.bootstrap, entry["sources"]), ("kafka", None, ())
        if relation.location and not relation.streaming:
            source = next((s for s in kept.get("sources", []) if s.get("source") == "static"
                           and s.get("location") and s["location"].get("paths") == relation.location.get("paths")),
                          None)
            if source is None:
                raise LineageError(f"the plan reads {relation.location['paths']}, which capture did not log as a "
                                   f"static table")
            cache = (tuple(relation.location["paths"]),)
            if cache not in self._static:
                self._static[cache] = _files(relation.location)
            return self._static[cache], ("table", source["dataset"], tuple(source.get("key") or ()))
        raise LineageError(f"cannot read back the rows of {relation.spark_class} (columns {sorted(names)}): "
                           f"only Kafka topics and file-backed static tables")


def _files(location: dict) -> pd.DataFrame:
    paths = [p.removeprefix("file:") for p in location["paths"]]
    return ds.dataset(paths, format=location.get("format", "parquet")).to_table().to_pandas()


def _kafka(bootstrap: str, sources: list[dict]) -> pd.DataFrame:
    """The records of the batch's offset ranges (``start`` to ``end``, per ``topic:partition``)."""
    from kafka import KafkaConsumer, TopicPartition

    ranges: dict[TopicPartition, tuple[int, int]] = {}
    for source in sources:
        for name, end in (source.get("end") or {}).items():
            topic, partition = name.rsplit(":", 1)
            start = (source.get("start") or {}).get(name, 0)
            if end > start:
                ranges[TopicPartition(topic, int(partition))] = (int(start), int(end))
    rows: list[tuple] = []
    if not ranges:
        return pd.DataFrame(columns=KAFKA_COLUMNS)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    try:
        gone = {tp: first for tp, first in consumer.beginning_offsets(list(ranges)).items() if first > ranges[tp][0]}
        if gone:  # a seek there would silently skip to what is left: rows lost, not a superset
            raise LineageError("the batch's Kafka records are no longer retained: " + ", ".join(
                f"{tp.topic}:{tp.partition} starts at {first}, the batch read from {ranges[tp][0]}"
                for tp, first in sorted(gone.items())))
        consumer.assign(list(ranges))
        for tp, (start, _) in ranges.items():
            consumer.seek(tp, start)
        left = dict(ranges)
        deadline = time.monotonic() + FETCH_TIMEOUT_S
        while left:
            if time.monotonic() > deadline:
                raise LineageError(f"the batch's Kafka records were not all read back in {FETCH_TIMEOUT_S}s "
                                   f"(retention may have removed them): {sorted(str(t) for t in left)}")
            for tp, messages in consumer.poll(timeout_ms=500).items():
                for m in messages:
                    if tp in left and m.offset < left[tp][1]:
                        rows.append((m.key, m.value, m.topic, m.partition, m.offset,
                                     datetime.datetime.fromtimestamp(m.timestamp / 1000, datetime.timezone.utc),
                                     m.timestamp_type))
                if tp in left and consumer.position(tp) >= left[tp][1]:
                    del left[tp]
                    consumer.pause(tp)
    finally:
        consumer.close()
    return pd.DataFrame(rows, columns=KAFKA_COLUMNS)


def _record(kind: str, dataset: str | None, key: tuple, row: pd.Series, of: int, exact: bool) -> Lineage:
    common = {"of": of, "kind": "source", "exact": exact, "via": "inference", "cols": -1}
    if kind == "kafka":
        topic, partition, offset = row["topic"], int(row["partition"]), int(row["offset"])
        return Lineage(rid=rids.kafka_rid(topic, partition, offset), dataset=f"kafka:{topic}", topic=topic,
                       partition=partition, offset=offset, **common)
    if not key:
        raise LineageError(f"static table {dataset!r} has no declared key: its rows' rids hash their whole "
                           f"content, which inference does not reproduce yet (declare keys= in Tracer.trace)")
    text = rids.KEY_SEPARATOR.join(_key_text(row[k]) for k in key)
    return Lineage(rid=rids.table_rid(dataset, text), dataset=dataset, key=text, **common)


def _key_text(v) -> str:
    """A key value as Spark's ``cast(… as string)`` writes it."""
    if isinstance(v, float) and v.is_integer():
        return f"{v:.1f}"
    return str(v)

