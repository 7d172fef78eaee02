"""Fetching the rows behind lineage records (``--payload``): a source row's original record, an
output row's row in its file sink."""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import time
from pathlib import Path

from kafka.errors import KafkaError

from headwater.adapters.kafka import BrokerUnavailable, Kafka, KafkaSourceError, config_of, consumer, record_at
from headwater.core import rid as rids
from headwater.core.rid import KEY_SEPARATOR
from headwater.spark.table_files import TableUnreadable, local_path, read_table, table_version, uri_path
from headwater.spark.table_files.listing import data_files

from .backend import Lineage
from .errors import LineageError
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


def kafka_record(kafka: Kafka, topic: str, partition: int | None, offset: int | None,
                 read_at: str | None = None) -> dict:
    """The record at that offset; ``read_at``: when the last batch that read it ran (ISO 8601), for telling a
    recreated topic's record at the same offset (written after that) from the record the batch read."""
    if partition is None or offset is None:
        return {"error": f"the store holds no partition and offset of this row of {topic}: its record cannot be read"}
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
    described = described or {}
    location = table_location(described)
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
    """A row as JSON holds it: times in ISO 8601, decimals as text (exact), bytes as base64, structs, maps and
    arrays likewise."""
    return {k: _value(v) for k, v in row.items()}


def _value(v):
    if hasattr(v, "isoformat"):
        return v.isoformat()
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, bytes):
        return {"base64": base64.b64encode(v).decode()}
    if isinstance(v, dict):
        return _plain(v)
    if isinstance(v, (list, tuple)):
        return [_value(x) for x in v]
    return v


RID_COLUMN = "_hw_rid"
SINK_FORMATS = ("parquet", "orc", "json")  # file sinks read back here, as ``query/sink.py`` names them
BROKER_TIMEOUT_S = 3.0  # how long payloads wait for the broker to answer before the answer fails


def check_broker(kafka: Kafka, timeout_s: float = BROKER_TIMEOUT_S) -> None:
    """``LineageError`` (naming the broker) unless the broker answers a metadata request within about
    ``timeout_s``: kafka-python would otherwise wait its request timeout (30 s) for each record."""
    config = config_of(kafka)
    started = time.monotonic()
    client = None
    try:
        client = consumer(config, bootstrap_timeout_ms=int(timeout_s * 1000), request_timeout_ms=int(timeout_s * 1000))
        client.topics()
    except (KafkaError, OSError, BrokerUnavailable) as exc:
        why = exc.reason if isinstance(exc, BrokerUnavailable) else type(exc).__name__
        raise LineageError(f"the Kafka broker at {config.bootstrap} did not answer within "
                           f"{time.monotonic() - started:.1f} s ({why}), so Kafka records' payloads "
                           f"cannot be read. Ask again without payload for the lineage alone") from None
    finally:
        if client is not None:
            client.close()


def sink_files(sink: str, batches: dict[int, list[str] | None]) -> list[str]:
    """The files of file sink ``sink`` (``parquet:PATH``…) the batches wrote: each batch's as its log entry
    lists them (``batches``: batch → ``sink_files``, None if not logged), else as the sink's own
    ``_spark_metadata`` log does."""
    from headwater.spark.table_files import sink_batch_files

    root = local_path(sink.partition(":")[2])
    found: set[str] = set()
    for batch, listed in sorted(batches.items()):
        if listed is None and Path(root, "_spark_metadata").is_dir():
            listed = sink_batch_files(root, batch)
        found.update(str(Path(uri_path(f))) for f in listed or [])
    return sorted(f for f in found if Path(f).is_file())


def sink_row(sink: str, rid: int, files: list[str]) -> dict:
    """The row whose ``_hw_rid`` is ``rid`` of the file sink ``sink`` (``parquet:PATH``, ``orc:PATH``,
    ``json:PATH``), read with pyarrow from ``files`` (those of the batches that wrote it), else from every
    file the sink holds; its columns but ``_hw_rid`` (the record's rid), partition columns included."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    kind, _, path = sink.partition(":")
    if kind not in SINK_FORMATS or not path:
        return {"error": f"the rows of the sink {sink} cannot be read here (only file sinks: "
                         f"{', '.join(k + ':PATH' for k in SINK_FORMATS)})"}

    def row_in(candidates: list[str]) -> dict | None:
        dataset = ds.dataset(candidates, format=kind, partitioning="hive", partition_base_dir=root)
        if RID_COLUMN not in dataset.schema.names:
            raise ValueError(f"it has no {RID_COLUMN} column: its query was traced with emit_rid=False")
        found = dataset.to_table(filter=pc.field(RID_COLUMN) == rid)
        return found.slice(0, 1).to_pylist()[0] if found.num_rows else None

    try:
        root = local_path(path)
        row = row_in(files) if files else None
        if row is None:  # not in the batches' files: every file the sink committed
            every = [f.path for f in data_files({"paths": [root]}, {})]
            row = row_in(every) if every and set(every) != set(files) else None
    except (TableUnreadable, OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        return {"error": f"{sink} cannot be read: {exc}"}
    if row is None:
        return {"error": f"no row of {sink} has {RID_COLUMN} {rid} now (deleted, or the sink rewritten)"}
    row.pop(RID_COLUMN, None)
    return _plain(row)


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
            item.payload = {"value": int(item.key)} if item.key is not None else \
                {"error": "the store holds no value of this rate row"}
        elif item.kind == "source":
            location = table_location(dataset or {})
            if location is not None and versions:
                item.changed_since = table_version(location)["digest"] not in versions
            item.payload = static_row(dataset, item.key, item.rid)
    except (TableUnreadable, OSError, ValueError, KafkaError) as exc:
        item.payload = {"error": f"{type(exc).__name__}: {exc}"}
