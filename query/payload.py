"""Fetching the original source records behind lineage rows (``--payload``)."""

from __future__ import annotations

import base64
import datetime
import json

from headwater.adapters.kafka import Kafka, KafkaSourceError, record_at
from headwater.adapters.table_files import TableUnreadable, local_path, read_table, table_version
from headwater.core import rid as rids
from headwater.core.rid import KEY_SEPARATOR

from .backend import Lineage
from .fallback import key_text, logged_time


def _decode(raw: bytes | None):
    if raw is None:
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(raw).decode()}
    try:
        return json.loads(text)
    except ValueError:
        return text


# How far a producer's clock may run ahead of Spark's before a record looks written after the batch read it.
CLOCK_SKEW_S = 10.0


def kafka_record(kafka: Kafka, topic: str, partition: int, offset: int, read_at: str | None = None) -> dict:
    """The record at that offset; ``read_at``: when the last batch that read it ran (ISO 8601), for telling a
    recreated topic's record at the same offset (written after that) from the record the batch read."""
    try:
        record = record_at(kafka, topic, partition, offset)
    except KafkaSourceError as exc:
        return {"error": f"{topic}:{partition}:{offset} cannot be read: {exc}"}
    if read_at is not None and record.timestamp_type == 0:  # CreateTime: when its producer wrote it
        read = logged_time(read_at)
        written = datetime.datetime.fromtimestamp(record.timestamp / 1000, datetime.timezone.utc)
        if (written - read).total_seconds() > CLOCK_SKEW_S:
            return {"error": f"{topic}:{partition}:{offset} now holds a record written at {written.isoformat()}, "
                             f"after the batch that read this offset ran ({read.isoformat()}): the topic was "
                             f"recreated since, and the record it read is gone"}
    return {"key": _decode(record.key), "value": _decode(record.value), "timestamp": record.timestamp}


def table_location(described: dict) -> dict | None:
    """A static table's location as ``table_files`` reads it, from its description (``WalkingBackend.dataset``)."""
    if not described.get("location"):
        return None
    return {"paths": described["location"].split(","), "format": described.get("format") or "parquet",
            "options": json.loads(described.get("options") or "{}"),
            "columns": json.loads(described.get("columns") or "null")}


def static_row(described: dict | None, key: str | None, rid: int) -> dict:
    """The row ``rid`` of a file-backed static table, described as the indexer keeps it: by its
    declared key (``key``, as text), or, for a table without one, by the rid of each row's content."""
    location = table_location(described or {})
    if location is None:
        return {"error": "where this table's rows live was not logged (rows made in memory, or a table no "
                         "files back): they cannot be fetched"}
    table = read_table(location, location["columns"])
    if described.get("key"):
        columns = described["key"].split(",")
        wanted = (key or "").split(KEY_SEPARATOR)
        texts = [[None if v is None else key_text(v) for v in table.column(c).to_pylist()] for c in columns]
        hits = [i for i, values in enumerate(zip(*texts)) if list(values) == wanted]
    else:
        hashed = described.get("hashed", "").split(",") if described.get("hashed") else table.column_names
        types = dict(location["columns"] or [])
        missing = [c for c in hashed if c not in table.column_names or c not in types]
        if missing:
            return {"error": f"the table's rows are named by the content of columns {missing}, which its files "
                             f"do not hold as such: its rows cannot be told apart here"}
        named = rids.table_row_rids(described["table"], [table.column(c).to_pylist() for c in hashed],
                                    [types[c] for c in hashed])
        hits = [i for i, found in enumerate(named) if found == rid]
    if not hits:
        return {"error": f"no such row in {described['location']} now"}
    return _plain(table.slice(hits[0], 1).to_pylist()[0])


def _plain(row: dict) -> dict:
    return {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in row.items()}


def file_row(path: str, position: int | None, rid: int | None = None, stream: dict | None = None) -> dict:
    """Row ``position`` of a Parquet file; a row of another format (which Spark gives no position) by the rid
    of its content, read as the file stream (``stream``: its logged location) read it."""
    if position is None:
        if not stream or not stream.get("columns"):
            return {"error": f"the file stream that read {path} is not logged (or not with its columns): its rows, "
                             f"named by their content, cannot be told apart here"}
        columns = [tuple(c) for c in stream["columns"]]
        read = read_table({**stream, "paths": [path]}, columns)
        named = rids.file_row_rids(path, [read.column(name).to_pylist() for name, _ in columns],
                                   [dtype for _, dtype in columns])
        hits = [i for i, found in enumerate(named) if found == rid]
        return _plain(read.slice(hits[0], 1).to_pylist()[0]) if hits else {"error": f"no such row in {path} now"}
    import pyarrow.parquet as pq

    try:
        rows = pq.ParquetFile(local_path(path)).read().slice(position, 1).to_pylist()
    except OSError as exc:
        return {"error": f"cannot read {path}: {exc}"}
    if not rows:
        return {"error": f"{path} has no row {position}"}
    return _plain(rows[0])


def attach_payload(item: Lineage, kafka: Kafka, dataset: dict | None, versions: set[str] | None = None,
                   read_at: str | None = None, stream: dict | None = None) -> None:
    """``item`` with its original record as ``payload``: ``{"error": why}`` where it cannot be had, never
    an exception. A static table row whose table changed since the batches that read it (``versions``:
    the table's versions they logged) is its row now, ``changed_since`` true (a plain file keeps no
    earlier version to read). ``read_at``: when the last batch that read a Kafka record ran;
    ``stream``: the logged location of the file stream that read a file row."""
    try:
        if item.topic is not None:
            item.payload = kafka_record(kafka, item.topic, item.partition, item.offset, read_at)
        elif item.path is not None:
            item.payload = file_row(item.path, item.position, item.rid, stream)
        elif item.kind == "source" and item.dataset == "rate":
            item.payload = {"value": int(item.key)}
        elif item.kind == "source":
            location = table_location(dataset or {})
            if location is not None and versions:
                item.changed_since = table_version(location)["digest"] not in versions
            item.payload = static_row(dataset, item.key, item.rid)
    except (TableUnreadable, OSError, ValueError) as exc:
        item.payload = {"error": f"{type(exc).__name__}: {exc}"}
