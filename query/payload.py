"""Fetching the original source records behind lineage rows (``--payload``)."""

from __future__ import annotations

import base64
import json
import re

from headwater.adapters.kafka import read_records
from headwater.core.rid import KEY_SEPARATOR

from .backend import Lineage


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


def kafka_record(bootstrap: str, topic: str, partition: int, offset: int) -> dict:
    for record in read_records(bootstrap, topic, partition, offset, offset + 1):
        return {"key": _decode(record.key), "value": _decode(record.value), "timestamp": record.timestamp}
    return {"error": f"no record at {topic}:{partition}:{offset} (expired or never written)"}


def static_row(location: str | None, file_format: str | None, key_columns: list[str], key: str | None) -> dict:
    """The row of a file-backed static table whose key (as text) is ``key``."""
    if not location or not key_columns or key is None:
        return {"error": "this table was traced without a declared key or file location; its rows cannot be fetched"}
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    paths = [re.sub(r"^file:", "", p) for p in location.split(",")]
    table = ds.dataset(paths, format=file_format or "parquet").to_table()
    mask = None
    for column, value in zip(key_columns, key.split(KEY_SEPARATOR)):
        match = pc.equal(pc.cast(table.column(column), "string"), value)
        mask = match if mask is None else pc.and_(mask, match)
    rows = table.filter(mask).to_pylist()
    if not rows:
        return {"error": f"no row with key {key!r} in {location}"}
    return {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in rows[0].items()}


def file_row(path: str, position: int | None) -> dict:
    """Row ``position`` of a Parquet file; other formats give Spark no row positions."""
    if position is None:
        return {"error": f"{path} is not a Parquet file: its rows have no position, only their content's hash"}
    import pyarrow.parquet as pq

    local = re.sub(r"^file:(//)?", "", path)
    try:
        rows = pq.ParquetFile(local).read().slice(position, 1).to_pylist()
    except OSError as exc:
        return {"error": f"cannot read {path}: {exc}"}
    if not rows:
        return {"error": f"{path} has no row {position}"}
    return {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in rows[0].items()}


def attach_payload(item: Lineage, bootstrap: str, dataset: dict | None) -> None:
    if item.topic is not None:
        item.payload = kafka_record(bootstrap, item.topic, item.partition, item.offset)
    elif item.path is not None:
        item.payload = file_row(item.path, item.position)
    elif item.kind == "source" and item.dataset == "rate":
        item.payload = {"value": int(item.key)}
    elif item.kind == "source":
        props = dataset or {}
        key_columns = props["key"].split(",") if props.get("key") else []
        item.payload = static_row(props.get("location"), props.get("format"), key_columns, item.key)
