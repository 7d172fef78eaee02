"""From a batch of threaded sink rows to lineage rows and edges (pure pyarrow).

Input columns: ``_hw_rid`` (the output row's rid) and one ``_hw_src_<id>`` column per
source: a struct (``rid`` plus coordinates: ``topic, partition, offset`` for Kafka,
``key`` for static tables; null where an outer join found no row), or, above an
aggregation, a list of such structs: every row of the group.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headwater.core.schema import EDGE_SCHEMA, NODE_SCHEMA


@dataclass(frozen=True)
class SourceEdges:
    column: str
    source: str  # kafka | static
    dataset: str | None
    mask: int  # which sink columns derive from this source


@dataclass(frozen=True)
class BatchContext:
    query: str
    sink: str
    batch: int
    op: int  # IR id of the node the edges end at (the sink's root for end-to-end edges)
    sources: tuple[SourceEdges, ...]


def _const(value, n: int, type_: pa.DataType) -> pa.Array:
    return pa.repeat(pa.scalar(value, type=type_), n)


def _nulls(n: int, type_: pa.DataType) -> pa.Array:
    return pa.nulls(n, type=type_)


def lineage_tables(batch: pa.RecordBatch, ctx: BatchContext) -> tuple[pa.Table, pa.Table]:
    out = batch.column("_hw_rid")
    n = len(out)
    node_parts = [
        pa.table(
            [out, _const("output", n, pa.string()), _const(ctx.sink, n, pa.string()),
             _const(ctx.query, n, pa.string()), _const(ctx.batch, n, pa.int64()),
             _nulls(n, pa.string()), _nulls(n, pa.int32()), _nulls(n, pa.int64()), _nulls(n, pa.string())],
            schema=NODE_SCHEMA,
        )
    ]
    edge_parts = []
    for src in ctx.sources:
        struct = batch.column(src.column)
        dst = out
        if pa.types.is_list(struct.type) or pa.types.is_large_list(struct.type):
            dst = out.take(pc.list_parent_indices(struct))
            struct = pc.list_flatten(struct)
        present = pc.is_valid(struct)
        rows = pc.filter(struct, present)
        dst = pc.filter(dst, present)
        k = len(rows)
        rid = pc.struct_field(rows, "rid")
        edge_parts.append(
            pa.table(
                [rid, dst, _const(ctx.query, k, pa.string()), _const(ctx.batch, k, pa.int64()),
                 _const(ctx.op, k, pa.int32()), _const(True, k, pa.bool_()), _const(src.mask, k, pa.int64())],
                schema=EDGE_SCHEMA,
            )
        )
        if src.source == "kafka":
            topic = pc.struct_field(rows, "topic")
            coords = [pc.binary_join_element_wise("kafka", topic, ":"), topic,
                      pc.struct_field(rows, "partition"), pc.struct_field(rows, "offset"), _nulls(k, pa.string())]
        else:
            coords = [_const(src.dataset, k, pa.string()), _nulls(k, pa.string()), _nulls(k, pa.int32()),
                      _nulls(k, pa.int64()), pc.struct_field(rows, "key")]
        node_parts.append(
            pa.table(
                [rid, _const("source", k, pa.string()), coords[0], _nulls(k, pa.string()), _nulls(k, pa.int64()),
                 *coords[1:]],
                schema=NODE_SCHEMA,
            )
        )
    nodes = pa.concat_tables(node_parts)
    _, first = np.unique(nodes.column("rid").to_numpy(), return_index=True)
    nodes = nodes.take(pa.array(np.sort(first)))
    edges = pa.concat_tables(edge_parts) if edge_parts else EDGE_SCHEMA.empty_table()
    return nodes, edges
