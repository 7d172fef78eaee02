"""``headwater store migrate``: a store of the folder layout before the lineage tables, into the tables.

Until issue 49 the store was a layout of our own on one POSIX disk (one reader of it is kept here, for this
only):

    <old>/<edges topic>/partition=<P>/            a shard: edges/bucket=B/<range>.parquet, rows/, aliases/,
                                                    dependencies/, cut/ (<range>.parquet each), commits/<range>.json
                                                    (only committed ranges count), compacted.json
    <old>/<edges topic>/set-aside/<name>/           a shard set aside, the same layout
    <old>/<edges topic>/compacted/CURRENT           {"generation": N}, and compacted/gen=N/: edges/bucket=B/,
                                                    rows/, exits/, dependencies/, manifest.json (its covers)
    <old>/<log topic>/partition=<P>/                the batch log: run-*.parquet and seg-*.log (or .claimed)
                                                    lines ``<crc32> <JSON>``
    <old>/<log topic>/plans/<query, hex>/<from_batch>-<fingerprint>.json

``migrate`` writes, into the store ``new``: the current generation as generation 1 (its files copied
as they are, its manifest as the generations table's row); each shard's committed ranges the generation
does not cover, as the shard's writes (set-aside shards first, as the partition's earlier epochs, then the
live one), each shard resuming where it did (its ranges, or where the generation's covers end); the batch
log's entries merged as the old reader merged them, their positions kept; the plans. A run again over a
store already migrated writes nothing twice (a range already committed is skipped; the batch log and the
plans merge as one). Progress goes to ``say``.
"""

from __future__ import annotations

import json
import os
import re
import zlib
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.parquet as pq

from .batch_log import RUN_SCHEMA, BatchLogWriter, _Entries
from .edges import RECORDS, STORE_SCHEMA, EdgeStore, LineageTables, with_src_sets
from .plans import PlanStore

_SEP = "~"
_LOG_FILE = re.compile(r"^(seg-(\d{6})-\d{12}-[0-9a-f]{12}\.(log|claimed)|run-\d{8}-(\d{6})-[0-9a-f]{12}\.parquet)$")
_PLAN = re.compile(r"^(\d{12})-([0-9a-f]+)\.json$")


def _ranges(shard: Path) -> list[tuple[int, int, str]]:
    """A shard's committed ranges: (first, last, file stem), in offset order."""
    commits = shard / "commits"
    names = [p.name[: -len(".json")] for p in commits.glob("*.json")] if commits.is_dir() else []
    return sorted((int(n.split(_SEP)[2]), int(n.split(_SEP)[3]), n) for n in names)


def _read_range(shard: Path, stem: str) -> tuple[pa.Table, dict[str, pa.Table]]:
    edges = [pq.read_table(p) for p in sorted(shard.glob(f"edges/bucket=*/{stem}.parquet"))]
    table = with_src_sets(pa.concat_tables(edges).select(STORE_SCHEMA.names) if edges
                          else STORE_SCHEMA.empty_table())
    records = {kind: pq.read_table(shard / kind / f"{stem}.parquet") for kind in RECORDS
               if (shard / kind / f"{stem}.parquet").exists()}
    return table, records


def _store_id(shard: Path) -> str | None:
    try:
        return json.loads((shard / "store.json").read_text())["id"]
    except FileNotFoundError:
        return None


def migrate_edges(old: Path, new: "str | os.PathLike", topic: str, say: Callable[[str], None]) -> dict:
    """The edges topic's generation and shards; returns what was migrated."""
    tables = LineageTables(new, topic)
    root = old / topic
    covers: dict = {}
    counts = {"generation_edges": 0, "shard_ranges": 0, "shard_edges": 0}
    current = root / "compacted" / "CURRENT"
    if current.exists() and tables.edges.version() is None:
        number = int(json.loads(current.read_text())["generation"])
        gen = root / "compacted" / f"gen={number}"
        manifest = json.loads((gen / "manifest.json").read_text())
        covers = manifest.get("covers", {})
        for name, table in (("exits", tables.exits), ("dependencies", tables.dependencies), ("rows", tables.rows)):
            table.commit([table.add_file(str(p), {"generation": 1}) for p in sorted((gen / name).glob("*.parquet"))])
        generations = tables.generations
        generations.commit([generations.write_file(pa.table({
            "generation": [1], "buckets": [int(manifest["buckets"])],
            "manifest": [json.dumps({**manifest, "generation": 1, "migrated_from": number, "took": []})]}))])
        added = [tables.edges.add_file(str(p), {"generation": 1, "bucket": int(p.parent.name.split("=", 1)[1])})
                 for p in sorted((gen / "edges").glob("bucket=*/*.parquet"))]
        tables.switch(added, [], 1, f"migrate generation {number}")
        counts["generation_edges"] = sum(w.rows for w in added)
        say(f"{topic}: generation {number} ({counts['generation_edges']} edges) is generation 1")
    # By the old shard's store id: the offset below which the generation holds its ranges.
    by_store = {c["store"]: int(c["next"]) for c in covers.values()}
    partitions = sorted(int(p.name.split("=", 1)[1]) for p in root.glob("partition=*"))
    aside = sorted(root.glob("set-aside/*")) if (root / "set-aside").is_dir() else []
    for partition in partitions:
        shards = [p for p in aside if p.name.startswith(f"partition={partition}-")] + [root / f"partition={partition}"]
        for epoch, shard in enumerate(shards):
            if epoch and tables.epoch(partition) < epoch:
                tables.set_aside(partition)
            store = EdgeStore(new, topic, partition)
            below = by_store.get(_store_id(shard), 0)
            for first, last, stem in _ranges(shard):
                if last < below:
                    continue  # the generation holds it
                edges, records = _read_range(shard, stem)
                if store.append(edges, first, last, records):
                    counts["shard_ranges"] += 1
                    counts["shard_edges"] += edges.num_rows
            resume = max([below] + [last + 1 for _, last, _ in _ranges(shard)])
            try:
                compacted = json.loads((shard / "compacted.json").read_text())
                resume = max([resume] + [int(b) for k, b in compacted.items() if k == f"{topic}{_SEP}{partition}"])
            except FileNotFoundError:
                pass
            if resume:
                tables.edges.commit(txn=(store.app_id, resume - 1))  # it resumes where it did
        say(f"{topic}: partition {partition} ({len(shards)} stores)")
    return counts


def _log_entries(folder: Path) -> _Entries:
    """One old batch log partition's entries, merged as its reader merged them."""
    entries = _Entries()
    for path in sorted(folder.iterdir()):
        if not _LOG_FILE.match(path.name):
            continue
        if path.suffix == ".parquet":
            entries.add_rows(pq.read_table(path, schema=RUN_SCHEMA))
            continue
        data = path.read_bytes()
        for line in data[: data.rfind(b"\n") + 1].split(b"\n")[:-1]:
            body = line[9:]
            try:
                if len(line) < 10 or line[8:9] != b" " or int(line[:8], 16) != zlib.crc32(body):
                    continue  # a damaged line: its reader skipped it too
                entries.add(json.loads(body))
            except ValueError:
                continue
    return entries


def migrate_log(old: Path, new: "str | os.PathLike", log_topic: str, say: Callable[[str], None]) -> dict:
    """The log topic's batch log and plans."""
    root = old / log_topic
    writer = BatchLogWriter(new, log_topic)
    counts = {"log_entries": 0, "plans": 0}
    for folder in sorted(root.glob("partition=*")):
        partition = int(folder.name.split("=", 1)[1])
        entries = _log_entries(folder)
        counts["log_entries"] += writer.import_entries(partition, entries)
    plans = PlanStore(new, log_topic)
    known = {(q, start) for q, start, _ in plans.kept()}
    for folder in sorted((root / "plans").glob("*")) if (root / "plans").is_dir() else []:
        for path in sorted(folder.glob("*.json")):
            found = _PLAN.match(path.name)
            if not found:
                continue
            kept = json.loads(path.read_text())
            query, start = kept.pop("query"), int(kept.pop("from_batch"))
            fingerprint = kept.pop("fingerprint")
            if (query, start) not in known:
                plans.write(query, start, fingerprint, kept)
                counts["plans"] += 1
    say(f"{log_topic}: {counts['log_entries']} batch log entries, {counts['plans']} plans")
    return counts


def migrate(old: "str | os.PathLike", new: "str | os.PathLike", edges_topic: str, log_topic: str,
            say: Callable[[str], None] = lambda _: None) -> dict:
    """Everything of ``edges_topic`` and ``log_topic`` in the old store folder ``old``, into the store ``new``."""
    old = Path(old)
    if not (old / edges_topic).is_dir() and not (old / log_topic).is_dir():
        raise ValueError(f"{old} holds neither {edges_topic}/ nor {log_topic}/: not a store of the folder layout")
    return {**migrate_edges(old, new, edges_topic, say), **migrate_log(old, new, log_topic, say)}
