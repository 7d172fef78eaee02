"""The contracts on the wire: lineage payloads on the edges topic, records on the log topic.

A lineage payload carries the rows (nodes) and edges one capture task produced, so the
indexer always has both ends of an edge in the same message:

    b"HWL" | version (1 byte) | len(nodes) (4 bytes, big endian) | nodes | edges

where ``nodes`` and ``edges`` are Arrow IPC streams (zstd-compressed buffers) with
``NODE_SCHEMA`` and ``EDGE_SCHEMA``. Log records are small and rare, so they are JSON objects with a
``schema`` header naming their type and version.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

LINEAGE_MAGIC = b"HWL"
LINEAGE_VERSION = 3  # 3: static tables' rows named by where the table lives (rid.table_dataset)

NODE_SCHEMA = pa.schema(
    [
        pa.field("rid", pa.int64(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),  # source | state | output
        pa.field("dataset", pa.string()),
        pa.field("query", pa.string()),
        pa.field("batch", pa.int64()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("key", pa.string()),
        pa.field("path", pa.string()),
        pa.field("position", pa.int64()),
    ]
)

EDGE_SCHEMA = pa.schema(
    [
        pa.field("src", pa.int64(), nullable=False),
        pa.field("dst", pa.int64(), nullable=False),
        pa.field("query", pa.string(), nullable=False),
        pa.field("batch", pa.int64(), nullable=False),
        pa.field("op", pa.int32(), nullable=False),
        pa.field("exact", pa.bool_(), nullable=False),
        pa.field("cols", pa.int64(), nullable=False),
    ]
)

LOG_PLAN = "headwater.log.plan/1"
LOG_BATCH = "headwater.log.batch/1"  # a batch's capture status, from the per-batch hook
LOG_PROGRESS = "headwater.log.progress/1"  # a batch's source offsets and durations, from Spark's progress
LOG_SCHEMAS = (LOG_PLAN, LOG_BATCH, LOG_PROGRESS)

CAPTURE_STATUSES = ("full", "sampled", "log-only", "failed")


class PayloadError(ValueError):
    """A message on a headwater topic could not be decoded; the reason says why."""


# Columns constant within a payload (query, batch, op, dataset…) shrink to nearly nothing;
# what stays is mostly the rids themselves (~46 instead of ~180 bytes per edge).
_IPC_OPTIONS = pa.ipc.IpcWriteOptions(compression="zstd")


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=_IPC_OPTIONS) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def encode_lineage(nodes: pa.Table, edges: pa.Table) -> bytes:
    nodes_ipc = _ipc(nodes.cast(NODE_SCHEMA))
    edges_ipc = _ipc(edges.cast(EDGE_SCHEMA))
    header = LINEAGE_MAGIC + bytes([LINEAGE_VERSION]) + struct.pack(">I", len(nodes_ipc))
    return header + nodes_ipc + edges_ipc


def _read_ipc(data: bytes, schema: pa.Schema, part: str) -> pa.Table:
    try:
        table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        raise PayloadError(f"{part}: not an Arrow IPC stream ({exc})") from exc
    if not table.schema.equals(schema):
        raise PayloadError(f"{part}: schema {table.schema.names} is not {schema.names}")
    required = [f.name for f in schema if not f.nullable and table.column(f.name).null_count]
    if required:
        raise PayloadError(f"{part}: nulls in required columns {required}")
    return table


def decode_lineage(message: bytes) -> tuple[pa.Table, pa.Table]:
    """``(nodes, edges)`` of a lineage payload; raises ``PayloadError`` on anything else."""
    if message is None or len(message) < 8 or message[:3] != LINEAGE_MAGIC:
        raise PayloadError("not a headwater lineage payload (bad magic)")
    if message[3] != LINEAGE_VERSION:
        raise PayloadError(f"lineage payload version {message[3]} is not {LINEAGE_VERSION}")
    (nodes_len,) = struct.unpack(">I", message[4:8])
    if 8 + nodes_len > len(message):
        raise PayloadError("lineage payload is truncated")
    nodes = _read_ipc(message[8 : 8 + nodes_len], NODE_SCHEMA, "nodes")
    edges = _read_ipc(message[8 + nodes_len :], EDGE_SCHEMA, "edges")
    described = nodes.column("rid")
    for end in ("src", "dst"):
        unknown = pc.filter(edges.column(end), pc.invert(pc.is_in(edges.column(end), described)))
        if len(unknown):
            raise PayloadError(f"edges: {len(unknown)} {end} rids name no row of the payload's nodes, "
                               f"e.g. {unknown[0].as_py()}")
    return nodes, edges


def concat_lineage(parts: list[tuple[pa.Table, pa.Table]]) -> tuple[pa.Table, pa.Table]:
    """Several payloads' ``(nodes, edges)`` as one: each rid once (as first described; then the rows are in
    rid order), each edge once."""
    if not parts:
        return NODE_SCHEMA.empty_table(), EDGE_SCHEMA.empty_table()
    nodes = pa.concat_tables([n for n, _ in parts])
    edges = pa.concat_tables([e for _, e in parts])
    _, first = np.unique(nodes.column("rid").to_numpy(), return_index=True)
    if len(first) < nodes.num_rows:
        nodes = nodes.take(pa.array(first))
    if _pairs_repeat(edges):  # a batch published twice (a retry) repeats its edges
        unique = edges.group_by(EDGE_SCHEMA.names, use_threads=False).aggregate([])
        if unique.num_rows < edges.num_rows:
            edges = unique.select(EDGE_SCHEMA.names).cast(EDGE_SCHEMA)
    return nodes, edges


def _pairs_repeat(edges: pa.Table) -> bool:
    """Whether two edges join the same two rows: only then can an edge repeat (this check is a third of
    grouping by every column, which it spares the usual write)."""
    src, dst = edges.column("src").to_numpy(), edges.column("dst").to_numpy()
    order = np.lexsort((dst, src))
    src, dst = src[order], dst[order]
    return bool(np.any((src[1:] == src[:-1]) & (dst[1:] == dst[:-1])))


def encode_log(schema: str, **fields) -> bytes:
    return json.dumps({"schema": schema, **fields}, sort_keys=True, default=str).encode()


def decode_log(message: bytes) -> dict:
    try:
        record = json.loads(message)
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"log record is not JSON ({exc})") from exc
    if not isinstance(record, dict) or record.get("schema") not in LOG_SCHEMAS:
        raise PayloadError("log record has no known 'schema' header")
    return record
