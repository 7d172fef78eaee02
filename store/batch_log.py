"""The batch log in the store: the gap map, readable without the graph.

For every LOG_BATCH and LOG_PROGRESS record of the log topic (the two halves of a
batch's entry: its capture status from the per-batch hook; its source offsets, rows
and durations from Spark's progress) and for the static datasets of every LOG_PLAN
record, the indexer appends an entry here beside its graph write, durable before the
record's offset is committed. The entries are a Delta table (``tables.py``), locally or
in S3, partitioned by the log partition:

    <store>/<log topic>/batch_log/partition=<P>/…   one row per batch or dataset: ``query``, ``batch``,
                                                      ``dataset``, ``status``, ``status_at``, ``tables``
                                                      (static table → version read), ``tables_at``, and
                                                      ``fields`` as JSON ``{field: [position, value]}``

An append is one commit of one file, of one record or of many (``append_many``). ``BatchLog`` reads
it with pyarrow and json alone (no Kafka, no graph, no Spark).

An entry's position is its Kafka offset within an epoch. A partition starts a new
epoch when the consumer group has no offset for it but the table holds entries of it (a new
group reads the topic again, or a broker that lost its data counts offsets from 0
again), so what is written then comes after everything before; the epoch is an application
transaction of the table. Entries merge field by field, the later position winning: the graph's
``SET b += $props`` in offset order. Two entries at one position are one record read twice. So the
merge is the same in any order and however often an entry is written: a replay after a crash, a
former owner still writing after a rebalance, and merges in any order leave the same batch
log. Across partitions (capture keys a query's records to one), a later partition's fields win.

Once ``RUN_RECORDS`` appends' files wait, the owner merges them into one file (a run): one
commit adds it and removes them, so a reader sees the entries or the run, never both or neither;
a former owner's merge of the same files fails (they are gone) and changes nothing. A run is merged
with the run before it while that one is no bigger (a binary counter), so a partition holds about
log2(batches / RUN_RECORDS) runs and each entry is rewritten as many times. A reader loads each file
once (files never change) and reads only the files the table gained since its last refresh.
"""

from __future__ import annotations

import json
import os
from typing import Iterable

import pyarrow as pa

from .tables import FilesGone, Location, Table

# A position is (epoch, offset) in one int64: offsets stay far below 2**48.
OFFSET_BITS = 48
# Appends' files left before they are merged into a run: a reader opens at most about this many small
# files per partition beyond the runs.
RUN_RECORDS = 64

# ``fields``: JSON ``{field: [position, value]}``, every field the batch's (or dataset's)
# records set; ``status`` and ``status_at`` repeat the status so statuses need no JSON, and ``tables`` and
# ``tables_at`` the versions of the static tables the batch read (its ``tables`` field: table → version)
# so that a person's SQL asks which batches read a version without JSON (query/README.md).
RUN_SCHEMA = pa.schema([
    pa.field("query", pa.string()),
    pa.field("batch", pa.int64()),
    pa.field("dataset", pa.string()),
    pa.field("status", pa.string()),
    pa.field("status_at", pa.int64()),
    pa.field("fields", pa.string()),
    pa.field("tables", pa.map_(pa.string(), pa.string())),
    pa.field("tables_at", pa.int64()),
])
TABLE_SCHEMA = pa.schema(list(RUN_SCHEMA) + [pa.field("partition", pa.int64())])
# What headwater reads: ``tables`` and ``tables_at`` are for SQL, and ``fields`` has them.
READ_COLUMNS = [name for name in RUN_SCHEMA.names if name not in ("tables", "tables_at")]
RUN = "run"  # what a merged file's name starts with


def batch_log_table(store: "str | os.PathLike | Location", log_topic: str) -> Table:
    if "/" in log_topic:
        raise ValueError(f"topic name {log_topic!r} cannot name a store folder (no '/')")
    return Table(Location.of(store).child(log_topic, "batch_log"), TABLE_SCHEMA, ["partition"])


def _epoch_app(log_topic: str, partition: int) -> str:
    return f"{log_topic}/epoch/p{partition}"


def _position(epoch: int, offset: int) -> int:
    if not 0 <= offset < 1 << OFFSET_BITS:
        raise ValueError(f"offset {offset} is outside 0..2**{OFFSET_BITS}")
    return epoch << OFFSET_BITS | offset


def _later(at: int, value, held: list | tuple) -> bool:
    """Whether ``value`` at position ``at`` replaces ``held`` ([position, value]).

    Equal positions hold the same record, unless a topic was recreated under a group
    that kept its offsets: the larger JSON text wins then, so the merge still does not
    depend on the order entries are read in.
    """
    if at != held[0]:
        return at > held[0]
    return value != held[1] and json.dumps(value, sort_keys=True) > json.dumps(held[1], sort_keys=True)


def _put(fields: dict, name: str, at: int, value) -> None:
    held = fields.get(name)
    if held is None or _later(at, value, held):
        fields[name] = [at, value]


class _Entries:
    """Entries merged field by field: per batch ``(query, batch)`` and per dataset name,
    ``{field: [position, value]}``."""

    def __init__(self):
        self.batches: dict[tuple[str, int], dict[str, list]] = {}
        self.datasets: dict[str, dict[str, list]] = {}
        self.last = 0  # the latest position merged

    def add(self, entry: dict) -> None:
        """One segment entry."""
        at = entry["at"]
        self.last = max(self.last, at)
        if "datasets" in entry:
            for name, props in entry["datasets"].items():
                held = self.datasets.setdefault(name, {})
                for field, value in props.items():
                    _put(held, field, at, value)
        else:
            held = self.batches.setdefault((entry["query"], entry["batch"]), {})
            for field, value in entry["fields"].items():
                _put(held, field, at, value)

    def add_rows(self, table: pa.Table) -> None:
        """Rows of runs (``RUN_SCHEMA``)."""
        for row in table.to_pylist():
            held = self.batches.setdefault((row["query"], row["batch"]), {}) if row["dataset"] is None \
                else self.datasets.setdefault(row["dataset"], {})
            for field, (at, value) in json.loads(row["fields"]).items():
                self.last = max(self.last, at)
                _put(held, field, at, value)

    def table(self) -> pa.Table:
        rows = []
        for (query, batch), fields in sorted(self.batches.items()):
            at, status = fields.get("status", (None, None))
            tables_at, tables = fields.get("tables", (None, None))
            rows.append({"query": query, "batch": batch, "status": _status_text(status), "status_at": at,
                         "fields": json.dumps(fields, sort_keys=True),
                         **({"tables": sorted((str(k), str(v)) for k, v in tables.items()), "tables_at": tables_at}
                            if isinstance(tables, dict) else {})})
        for name, fields in sorted(self.datasets.items()):
            rows.append({"dataset": name, "fields": json.dumps(fields, sort_keys=True)})
        return pa.Table.from_pylist(rows, schema=RUN_SCHEMA)


def _status_text(status) -> str | None:
    return status if status is None or isinstance(status, str) else json.dumps(status, sort_keys=True)




def _is_run(file: dict) -> bool:
    return file["path"].rsplit("/", 1)[-1].startswith(RUN)


def _runs_to_merge(files: list[dict], run_records: int) -> list[str]:
    """The files to merge into one, by the binary counter: the appends' files (fewer than ``run_records`` rows)
    once ``run_records`` of them wait, with each run, newest first, no bigger than what is merged so far."""
    entries = [f for f in files if not _is_run(f)]
    if len(entries) < run_records:
        return []
    merged = [f["path"] for f in entries]
    size = sum(f["num_records"] for f in entries)
    for run in sorted((f for f in files if _is_run(f)), key=lambda f: f["modification_time"], reverse=True):
        if run["num_records"] > size:
            break
        merged.append(run["path"])
        size += run["num_records"]
    return merged


class BatchLogWriter:
    """Appends the entries of the log partitions this indexer owns, and merges them.

    :param store: the store (``Config.store_uri()``): a folder or ``s3://bucket/prefix``.
    :param log_topic: the log topic's name; its folder under the store.
    :param run_records: appends' files left before they are merged into a run.
    """

    def __init__(self, store: "str | os.PathLike | Location", log_topic: str, run_records: int = RUN_RECORDS):
        self.table = batch_log_table(store, log_topic)
        self.log_topic = log_topic
        self.run_records = run_records
        self._epochs: dict[int, int] = {}
        self._appended: dict[int, int] = {}  # entries appended since the partition's last merge, by partition

    def _epoch(self, partition: int) -> int:
        if partition not in self._epochs:
            self._epochs[partition] = self.table.applied(_epoch_app(self.log_topic, partition)) or 0
        return self._epochs[partition]

    def append_many(self, partition: int, records: Iterable[tuple[int, str | None, int | None, dict]]) -> None:
        """Records of ``partition`` in one commit: ``(offset, query, batch, fields)`` of a batch, or
        ``(offset, None, None, {name: props})`` of static datasets; durable on return."""
        epoch = self._epoch(partition)
        entries = _Entries()
        for offset, query, batch, fields in records:
            at = _position(epoch, offset)
            if query is None:
                entries.add({"at": at, "datasets": fields})
            else:
                entries.add({"at": at, "query": str(query), "batch": int(batch or 0), "fields": fields})
        self.table.commit([self.table.write_file(entries.table(), {"partition": partition})])
        self._appended[partition] = self._appended.get(partition, 0) + 1
        if self._appended[partition] >= self.run_records:  # no listing of the table before that
            self._merge(partition)
            self._appended[partition] = 0

    def append_batch(self, partition: int, offset: int, query: str, batch: int, fields: dict) -> None:
        """Fields of batch ``(query, batch)`` logged at ``offset`` of ``partition``; durable on return."""
        self.append_many(partition, [(offset, query, batch, fields)])

    def append_datasets(self, partition: int, offset: int, datasets: dict[str, dict]) -> None:
        """Static datasets' descriptions (``{name: props}``) logged at ``offset``; durable on return."""
        self.append_many(partition, [(offset, None, None, datasets)])

    def import_entries(self, partition: int, entries: _Entries) -> int:
        """Entries merged elsewhere (``migrate``), their positions kept, as one run of the partition; the epoch
        past theirs. Returns the rows written."""
        table = entries.table()
        if table.num_rows:
            self.table.commit([self.table.write_file(table, {"partition": partition}, name=RUN)])
        epoch = entries.last >> OFFSET_BITS
        if epoch > self._epoch(partition):
            self._start_epoch(partition, epoch)
        return table.num_rows

    def _merge(self, partition: int) -> None:
        files = [f for f in self.table.files().to_pylist() if f["partition.partition"] == partition]
        merged = _runs_to_merge(files, self.run_records)
        if not merged:
            return
        entries = _Entries()
        entries.add_rows(self.table.read(merged, READ_COLUMNS))
        run = self.table.write_file(entries.table(), {"partition": partition}, name=RUN)
        try:
            self.table.commit([run], removed=merged)
        except FilesGone:  # a former owner merged some of them first: its run holds them
            pass

    def holds(self, partition: int) -> bool:
        """Whether the table holds entries of the partition."""
        return any(f["partition.partition"] == partition for f in self.table.files().to_pylist())

    def new_epoch(self, partition: int) -> int:
        """Entries appended from now on come after every entry the partition holds; returns the epoch."""
        epoch = self._epoch(partition) + 1
        self._start_epoch(partition, epoch)
        return epoch

    def _start_epoch(self, partition: int, epoch: int) -> None:
        self.table.commit(txn=(_epoch_app(self.log_topic, partition), epoch))
        self._epochs[partition] = epoch

    def release(self, partitions: Iterable[int]) -> None:
        for partition in partitions:
            self._epochs.pop(partition, None)
            self._appended.pop(partition, None)

    def close(self) -> None:
        self.release(list(self._epochs))


class _Run:
    """A file of the table, loaded once: its rows by key, and its statuses."""

    def __init__(self, table: pa.Table):
        self.fields = table["fields"].combine_chunks()
        self.rows: dict[tuple[str, int], int] = {}
        self.datasets: dict[str, int] = {}
        self.statuses: dict[tuple[str, int], tuple[int, str]] = {}
        columns = (table[name].to_pylist() for name in ("query", "batch", "dataset", "status", "status_at"))
        for i, (query, batch, dataset, status, at) in enumerate(zip(*columns)):
            if dataset is not None:
                self.datasets[dataset] = i
                continue
            self.rows[(query, batch)] = i
            if status is not None:
                self.statuses[(query, batch)] = (at, status)

    def fields_of(self, row: int) -> dict:
        return json.loads(self.fields[row].as_py())


class _Partition:
    """The files of one partition at the last refresh."""

    def __init__(self, runs: list[_Run]):
        self.runs = runs
        self.statuses: dict[tuple[str, int], tuple[int, str]] = {}  # merged: (query, batch) -> (position, status)
        for run in runs:
            for key, held in run.statuses.items():
                mine = self.statuses.get(key)
                if mine is None or _later(held[0], held[1], mine):
                    self.statuses[key] = held

    def status(self, key: tuple[str, int]) -> tuple[int, str | None] | None:
        return self.statuses.get(key)

    def batches(self) -> set[tuple[str, int]]:
        return {key for run in self.runs for key in run.rows}

    def fields(self, key, dataset: bool = False) -> dict | None:
        found: dict[str, list] = {}
        hit = False
        for run in self.runs:
            row = (run.datasets if dataset else run.rows).get(key)
            if row is not None:
                hit = True
                for field, (at, value) in run.fields_of(row).items():
                    _put(found, field, at, value)
        return {field: value for field, (_, value) in found.items()} if hit else None


class BatchLog:
    """The batch log of one log topic as the indexer wrote it into the store; ``refresh`` to see new entries.

    :param store: the store (``Config.store_uri()``).
    :param log_topic: the log topic's name.
    """

    def __init__(self, store: "str | os.PathLike | Location", log_topic: str):
        self.table = batch_log_table(store, log_topic)
        self._partitions: list[_Partition] = []
        self._runs: dict[str, _Run] = {}  # by path: files never change once written
        self._version: int | None = None
        self._by_query: dict[str, list[int]] | None = None  # each query's batches, in order, at this version
        self.refresh()

    def refresh(self) -> "BatchLog":
        """Read the files the table gained since the last refresh."""
        version = self.table.version()
        if version is None or version == self._version:
            return self
        files = self.table.files(version).to_pylist()
        new = [f["path"] for f in files if f["path"] not in self._runs]
        if new:
            read = self.table.read_each(new, READ_COLUMNS)
            for path, rows in read.items():
                self._runs[path] = _Run(rows)
        by_partition: dict[int, list[_Run]] = {}
        for f in sorted(files, key=lambda f: f["partition.partition"]):
            by_partition.setdefault(f["partition.partition"], []).append(self._runs[f["path"]])
        self._partitions = [_Partition(runs) for _, runs in sorted(by_partition.items())]
        kept = {f["path"] for f in files}
        self._runs = {p: r for p, r in self._runs.items() if p in kept}
        self._version = version
        self._by_query = None
        return self

    def batch(self, query: str, batch: int) -> dict | None:
        """Batch ``(query, batch)``'s fields as its log records set them (later values win), or None if not logged."""
        key = (query, int(batch))
        found = [f for f in (p.fields(key) for p in self._partitions) if f is not None]
        if not found:
            return None
        merged = {"query": query, "batch": int(batch)}
        for fields in found:
            merged.update(fields)
        return merged

    def queries(self) -> list[str]:
        """Every query the log holds a batch of."""
        return sorted(self._batches_by_query())

    def batches(self, query: str) -> list[int]:
        """Every batch of ``query`` the log holds an entry of, in order."""
        return list(self._batches_by_query().get(query, ()))

    def _batches_by_query(self) -> dict[str, list[int]]:
        """Each query's batches, gathered once a version (``narrow --follow`` asks every second, and a stream
        of months has hundreds of thousands)."""
        if self._by_query is None:
            found: dict[str, set[int]] = {}
            for partition in self._partitions:
                for query, batch in partition.batches():
                    found.setdefault(query, set()).add(batch)
            self._by_query = {query: sorted(batches) for query, batches in found.items()}
        return self._by_query

    def statuses(self, pairs: Iterable[tuple[str, int]]) -> dict[tuple[str, int], str | None]:
        """Each batch's capture status (``CAPTURE_STATUSES``); None where no status is logged (yet)."""
        found = {}
        for query, batch in pairs:
            key = (query, int(batch))
            status = None
            for partition in self._partitions:
                held = partition.status(key)
                if held is not None:
                    status = held[1]
            found[key] = status
        return found

    def datasets(self) -> dict[str, dict]:
        """Every static dataset's description, by name (``dataset``)."""
        names = {name for p in self._partitions
                 for name in (n for run in p.runs for n in run.datasets)}
        return {name: found for name in sorted(names) if (found := self.dataset(name)) is not None}

    def dataset(self, name: str) -> dict | None:
        """A static dataset's description as the graph's ``(:Dataset)`` node has it, or None."""
        found = [f for f in (p.fields(name, dataset=True) for p in self._partitions) if f is not None]
        if not found:
            return None
        merged = {"name": name}
        for fields in found:
            merged.update(fields)
        return merged
