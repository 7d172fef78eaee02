"""The batch log in the Parquet store: the gap map, readable without the graph.

For every LOG_BATCH and LOG_PROGRESS record of the log topic (the two halves of a
batch's entry: its capture status from the per-batch hook; its source offsets, rows
and durations from Spark's progress) and for the static datasets of every LOG_PLAN
record, the indexer appends an entry here beside its graph write, durable before the
record's offset is committed:

    <store_dir>/<log topic>/partition=<P>/
        seg-<epoch>-<offset>-<id>.log       entries one writer appended, one line each
        run-<seq>-<epoch>-<id>.parquet      entries merged: one row per batch or dataset

Each log partition has a folder of its own, written by the replica that owns the
partition. ``BatchLog`` reads them with pyarrow and json alone (no Kafka, no graph).

An entry's position is its Kafka offset within an epoch. A partition starts a new
epoch when the consumer group has no offset for it but its folder holds entries (a new
group reads the topic again, or a broker that lost its data counts offsets from 0
again), so what is written then comes after everything before. Entries merge field by
field, the later position winning: the graph's ``SET b += $props`` in offset order.
Two entries at one position are one record read twice. So the merge is the same in any
order and however often an entry is written: a replay after a crash, a former owner
still writing after a rebalance, and compactions in any order leave the same batch
log. Across partitions (capture keys a query's records to one), a later partition's
fields win.

A segment line is ``<crc32 of the JSON, 8 hex digits> <JSON>\\n``, written with one
``write`` and fsync'd before ``append_*`` returns. A crash mid-append leaves a torn last
line; the reader skips a line without its newline or whose checksum fails. A writer
never appends to a segment it did not open, nor after a failed write, so nothing
follows a torn line.

Once ``RUN_RECORDS`` entries wait in segments, the owner merges them into a run. It
claims the segments first (renamed to ``.claimed``: a writer still appending to one
sees its file gone and writes its entry again into a new segment), writes the run
(temporary name, fsync, rename), then deletes them. A run is merged with the run
before it while that one is no bigger (a binary counter), so a partition holds about
log2(batches / RUN_RECORDS) runs and each entry is rewritten as many times. A reader
loads each run once (runs never change) and re-reads only what segments gained; a
partition whose listing changed while it read (a compaction) is read again.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
import zlib
from pathlib import Path
from typing import Iterable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

# A position is (epoch, offset) in one int64: offsets stay far below 2**48.
OFFSET_BITS = 48
# Entries left in segments before they are merged into a run: a reader parses at most
# about this many JSON lines per partition beyond the runs' rows.
RUN_RECORDS = 512
# How long a reader keeps reading a partition whose listing changed while it read
# (compactions under it) before giving up, and its first pause between attempts.
READ_SECONDS = 30.0
READ_PAUSE = 0.001

# ``fields``: JSON ``{field: [position, value]}``, every field the batch's (or dataset's)
# records set; ``status`` and ``status_at`` repeat the status so statuses need no JSON.
RUN_SCHEMA = pa.schema([
    pa.field("query", pa.string()),
    pa.field("batch", pa.int64()),
    pa.field("dataset", pa.string()),
    pa.field("status", pa.string()),
    pa.field("status_at", pa.int64()),
    pa.field("fields", pa.string()),
])

_SEGMENT = re.compile(r"^seg-(\d{6})-(\d{12})-[0-9a-f]{12}\.(log|claimed)$")
_RUN = re.compile(r"^run-(\d{8})-(\d{6})-[0-9a-f]{12}\.parquet$")


def partition_root(store_dir: str | Path, log_topic: str, partition: int) -> Path:
    return Path(store_dir) / log_topic / f"partition={partition}"


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


def _line(entry: dict) -> bytes:
    body = json.dumps(entry, sort_keys=True, separators=(",", ":")).encode()
    return b"%08x %s\n" % (zlib.crc32(body), body)


def _valid(entry) -> bool:
    if not isinstance(entry, dict) or not isinstance(entry.get("at"), int):
        return False
    if "datasets" in entry:
        return isinstance(entry["datasets"], dict) and all(isinstance(p, dict) for p in entry["datasets"].values())
    return isinstance(entry.get("query"), str) and isinstance(entry.get("batch"), int) \
        and isinstance(entry.get("fields"), dict)


def _parse(data: bytes) -> tuple[list[dict], int]:
    """The entries of whole lines in ``data``, and the bytes up to the last newline.

    A line whose checksum or JSON is wrong is skipped; a last line without its newline
    (torn, or still being written) is left for the next read.
    """
    entries = []
    end = data.rfind(b"\n") + 1
    for line in data[:end].split(b"\n")[:-1]:
        if len(line) < 10 or line[8:9] != b" ":
            continue
        body = line[9:]
        try:
            if int(line[:8], 16) != zlib.crc32(body):
                continue
            entry = json.loads(body)
        except ValueError:
            continue
        if _valid(entry):
            entries.append(entry)
    return entries, end


def _read_segment(path: Path) -> list[dict]:
    return _parse(path.read_bytes())[0]


def _listing(root: Path) -> list[str]:
    try:
        return sorted(n for n in os.listdir(root) if _SEGMENT.match(n) or _RUN.match(n))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _matched(pattern: re.Pattern, name: str) -> re.Match:
    """The match of a file name listed as one of ``pattern``'s."""
    found = pattern.match(name)
    if found is None:
        raise ValueError(f"{name!r} is not a batch log file of the form {pattern.pattern}")
    return found


def _epoch_of(name: str) -> int:
    found = _SEGMENT.match(name)
    return int(found.group(1)) if found else int(_matched(_RUN, name).group(2))


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
            rows.append({"query": query, "batch": batch, "status": _status_text(status), "status_at": at,
                         "fields": json.dumps(fields, sort_keys=True)})
        for name, fields in sorted(self.datasets.items()):
            rows.append({"dataset": name, "fields": json.dumps(fields, sort_keys=True)})
        return pa.Table.from_pylist(rows, schema=RUN_SCHEMA)


def _merge_runs(paths: list[Path]) -> pa.Table:
    """Runs as one; only the rows of keys in more than one of them are parsed and merged."""
    table = pa.concat_tables(pq.read_table(p, schema=RUN_SCHEMA) for p in paths)
    key = pc.if_else(pc.is_null(table["dataset"]),
                     pc.binary_join_element_wise(table["query"], pc.cast(table["batch"], pa.string()), "\x00"),
                     pc.binary_join_element_wise("\x01", table["dataset"], ""))
    counts = pa.table({"key": key}).group_by("key", use_threads=False).aggregate([("key", "count")])
    shared = pc.is_in(key, counts.filter(pc.greater(counts["key_count"], 1))["key"])
    merged = _Entries()
    merged.add_rows(table.filter(shared))
    return pa.concat_tables([table.filter(pc.invert(shared)), merged.table()]).sort_by(
        [("dataset", "ascending"), ("query", "ascending"), ("batch", "ascending")])


def _status_text(status) -> str | None:
    return status if status is None or isinstance(status, str) else json.dumps(status, sort_keys=True)


class _Writing:
    """One log partition's folder, as its owner writes it."""

    def __init__(self, root: Path, run_records: int):
        self.root = root
        self.run_records = run_records
        root.mkdir(parents=True, exist_ok=True)
        for path in root.glob(".*.tmp"):  # a run cut short by a crash
            path.unlink(missing_ok=True)
        names = _listing(root)
        self.epoch = max((_epoch_of(n) for n in names), default=0)
        self.pending = sum(len(_read_segment(root / n)) for n in names if _SEGMENT.match(n))
        self.fd: int | None = None
        self.path: Path | None = None

    def append(self, entry: dict, offset: int) -> None:
        line = _line({"at": _position(self.epoch, offset), **entry})
        while True:
            if self.fd is None:
                self.path = self.root / f"seg-{self.epoch:06d}-{offset:012d}-{uuid.uuid4().hex[:12]}.log"
                self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
                fsync_dir(self.root)
            try:
                if os.write(self.fd, line) != len(line):
                    raise OSError(f"short write to {self.path}")
                os.fsync(self.fd)
                claimed = self.path is None or not self.path.exists()
            except OSError:
                self.close()  # a torn line ends its segment
                raise
            if not claimed:
                break
            # A compaction took the segment, maybe before this line reached it: write it again.
            self.close()
        self.pending += 1
        if self.pending >= self.run_records:
            self.compact()

    def new_epoch(self) -> int:
        self.close()
        self.epoch = max([self.epoch, *(_epoch_of(n) for n in _listing(self.root))]) + 1
        return self.epoch

    def compact(self) -> None:
        """Segments into a run; then each run into the one before it while that one is no bigger."""
        self.close()
        claimed = []
        for name in _listing(self.root):
            if _SEGMENT.match(name):
                path = self.root / name
                if name.endswith(".log"):
                    target = path.with_suffix(".claimed")
                    try:
                        os.replace(path, target)
                    except FileNotFoundError:  # claimed by another writer's compaction meanwhile
                        continue
                    path = target
                claimed.append(path)
        merged = _Entries()
        for path in claimed:
            try:
                entries = _read_segment(path)
            except FileNotFoundError:  # a former owner's compaction took it too, and its run holds it
                continue
            for entry in entries:
                merged.add(entry)
        runs = sorted((self.root / n for n in _listing(self.root) if _RUN.match(n)), key=lambda p: p.name)
        if merged.batches or merged.datasets:
            runs.append(self._write_run(merged.table(), merged.last >> OFFSET_BITS, runs))
        for path in claimed:
            path.unlink(missing_ok=True)
        self.pending = 0
        while len(runs) >= 2:
            try:
                if pq.read_metadata(runs[-2]).num_rows > pq.read_metadata(runs[-1]).num_rows:
                    break
                table = _merge_runs(runs[-2:])
            except FileNotFoundError:  # a former owner merged them meanwhile
                break
            run = self._write_run(table, max(_epoch_of(p.name) for p in runs[-2:]), runs)
            for path in runs[-2:]:
                path.unlink(missing_ok=True)
            runs[-2:] = [run]

    def _write_run(self, table: pa.Table, epoch: int, runs: list[Path]) -> Path:
        seq = max((int(_matched(_RUN, p.name).group(1)) for p in runs), default=0) + 1
        path = self.root / f"run-{seq:08d}-{epoch:06d}-{uuid.uuid4().hex[:12]}.parquet"
        tmp = self.root / f".{path.name}.{uuid.uuid4().hex[:8]}.tmp"
        pq.write_table(table, tmp, compression="zstd")
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(self.root)
        return path

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class BatchLogWriter:
    """Appends the entries of the log partitions this indexer owns, and compacts them.

    A partition's folder is opened on its first entry and let go of (``release``) when
    the partition moves to another replica, whose writer opens it afresh.

    :param store_dir: the Parquet store's folder (``Config.store_path()``).
    :param log_topic: the log topic's name; its folder under ``store_dir``.
    :param run_records: entries left in segments before they are merged into a run.
    """

    def __init__(self, store_dir: str | Path, log_topic: str, run_records: int = RUN_RECORDS):
        self.store_dir = Path(store_dir)
        self.log_topic = log_topic
        self.run_records = run_records
        self._partitions: dict[int, _Writing] = {}

    def _partition(self, partition: int) -> _Writing:
        if partition not in self._partitions:
            root = partition_root(self.store_dir, self.log_topic, partition)
            self._partitions[partition] = _Writing(root, self.run_records)
        return self._partitions[partition]

    def append_batch(self, partition: int, offset: int, query: str, batch: int, fields: dict) -> None:
        """Fields of batch ``(query, batch)`` logged at ``offset`` of ``partition``; durable on return."""
        self._partition(partition).append({"query": str(query), "batch": int(batch), "fields": fields}, offset)

    def append_datasets(self, partition: int, offset: int, datasets: dict[str, dict]) -> None:
        """Static datasets' descriptions (``{name: props}``) logged at ``offset``; durable on return."""
        self._partition(partition).append({"datasets": datasets}, offset)

    def holds(self, partition: int) -> bool:
        """Whether the partition's folder holds entries."""
        return bool(_listing(partition_root(self.store_dir, self.log_topic, partition)))

    def new_epoch(self, partition: int) -> int:
        """Entries appended from now on come after every entry the partition holds; returns the epoch."""
        return self._partition(partition).new_epoch()

    def release(self, partitions: Iterable[int]) -> None:
        for partition in partitions:
            writing = self._partitions.pop(partition, None)
            if writing is not None:
                writing.close()

    def close(self) -> None:
        self.release(list(self._partitions))


class _Run:
    """A run file, loaded once: its rows by key, and its statuses."""

    def __init__(self, path: Path):
        table = pq.read_table(path, schema=RUN_SCHEMA)
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
    """What one partition's folder held at the last refresh."""

    def __init__(self, runs: list[_Run], statuses: dict, tail: _Entries):
        self.runs = runs
        self.statuses = statuses  # the runs' statuses merged: (query, batch) -> (position, status)
        self.tail = tail  # the segments' entries

    def status(self, key: tuple[str, int]) -> tuple[int, str | None] | None:
        held = self.statuses.get(key)
        tail = self.tail.batches.get(key, {}).get("status")
        if tail is not None and (held is None or _later(tail[0], _status_text(tail[1]), held)):
            return tail[0], _status_text(tail[1])
        return held

    def batches(self) -> set[tuple[str, int]]:
        return {key for run in self.runs for key in run.rows} | set(self.tail.batches)

    def fields(self, key, dataset: bool = False) -> dict | None:
        found: dict[str, list] = {}
        hit = False
        for run in self.runs:
            row = (run.datasets if dataset else run.rows).get(key)
            if row is not None:
                hit = True
                for field, (at, value) in run.fields_of(row).items():
                    _put(found, field, at, value)
        tail = (self.tail.datasets if dataset else self.tail.batches).get(key)
        if tail is not None:
            hit = True
            for field, (at, value) in tail.items():
                _put(found, field, at, value)
        return {field: value for field, (_, value) in found.items()} if hit else None


class BatchLog:
    """The batch log of one log topic as the indexer wrote it into the store; ``refresh`` to see new entries.

    :param store_dir: the Parquet store's folder (``Config.store_path()``).
    :param log_topic: the log topic's name.
    """

    def __init__(self, store_dir: str | Path, log_topic: str):
        self.root = Path(store_dir) / log_topic
        self._partitions: list[_Partition] = []
        self._runs: dict[Path, _Run] = {}  # runs never change once written
        self._segments: dict[Path, tuple[int, list[dict]]] = {}  # bytes parsed, entries
        self._merged: dict[int, tuple[tuple[str, ...], dict]] = {}  # per partition: its runs, their statuses
        self.refresh()

    def refresh(self) -> "BatchLog":
        """Read what was written since the last refresh."""
        try:
            folders = [n for n in os.listdir(self.root) if n.startswith("partition=")]
        except FileNotFoundError:
            folders = []
        listed = {}
        partitions = []
        for partition in sorted(int(n.split("=", 1)[1]) for n in folders):
            names, read = self._read_partition(partition)
            listed[partition] = names
            partitions.append(read)
        self._partitions = partitions
        kept = {self.root / f"partition={p}" / n for p, names in listed.items() for n in names}
        self._runs = {p: r for p, r in self._runs.items() if p in kept}
        self._segments = {p: s for p, s in self._segments.items() if p in kept}
        return self

    def _read_partition(self, partition: int) -> tuple[tuple[str, ...], "_Partition"]:
        """One partition read whole: its listing the same before and after (each partition
        is checked on its own, so writers of other partitions never make a reader start over)."""
        root = self.root / f"partition={partition}"
        deadline = time.monotonic() + READ_SECONDS
        pause = READ_PAUSE
        while True:
            before = tuple(_listing(root))
            try:
                read = self._partition(partition, before)
                if tuple(_listing(root)) == before:
                    return before, read
            except FileNotFoundError:  # a compaction took a file after the listing
                pass
            if time.monotonic() > deadline:
                raise OSError(f"the batch log in {root} kept changing for {READ_SECONDS:.0f} s while it was "
                              "read; refresh again")
            time.sleep(pause)  # let the compaction under us finish
            pause = min(pause * 2, 0.05)

    def _partition(self, partition: int, names: tuple[str, ...]) -> _Partition:
        root = self.root / f"partition={partition}"
        run_names = tuple(n for n in names if _RUN.match(n))
        runs = []
        for name in run_names:
            if root / name not in self._runs:
                self._runs[root / name] = _Run(root / name)
            runs.append(self._runs[root / name])
        merged = self._merged.get(partition)
        if merged is None or merged[0] != run_names:
            statuses: dict[tuple[str, int], tuple[int, str]] = {}
            for run in runs:
                for key, held in run.statuses.items():
                    mine = statuses.get(key)
                    if mine is None or _later(held[0], held[1], mine):
                        statuses[key] = held
            merged = self._merged[partition] = (run_names, statuses)
        tail = _Entries()
        for name in names:
            if _SEGMENT.match(name):
                for entry in self._segment(root / name):
                    tail.add(entry)
        return _Partition(runs, merged[1], tail)

    def _segment(self, path: Path) -> list[dict]:
        parsed, entries = self._segments.get(path, (0, []))
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size < parsed:  # not one of ours: segments only grow
                parsed, entries = 0, []
            f.seek(parsed)
            more, used = _parse(f.read())
        if used:
            entries = entries + more
            self._segments[path] = (parsed + used, entries)
        return entries

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

    def batches(self, query: str) -> list[int]:
        """Every batch of ``query`` the log holds an entry of, in order."""
        return sorted({batch for partition in self._partitions for q, batch in partition.batches() if q == query})

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
                 for name in [*p.tail.datasets, *(n for run in p.runs for n in run.datasets)]}
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
