"""From a batch of threaded rows to lineage rows and edges (pure pyarrow).

Input columns: ``_hw_rid`` (the rid of the row the edges end at: an output row, or a
black box's state node) and one ``_hw_src_<id>`` column per source: a struct (``rid``
plus coordinates: ``topic, partition, offset`` for Kafka, ``path, position`` for files,
``key`` for static tables and the rate source; null where an outer join found no row),
above an aggregation, its group's state key (``state``: the rid is the state node's once
tied to the run, ``rid.state_node_rids``), or, above an aggregation that keeps rid lists,
a list of such structs: every row of the group.

A black box's column holds a placeholder struct whose ``rid`` is the digest of the black
box's output row. That row is a node of its own (``rid.box_output_rids``: the digest tied
to the black box's node of the batch), between the black box's state node (``SourceEdges.rid``)
and the row above: ``state node -> output row`` is a superset edge, ``output row -> row`` an
exact one. The query tier narrows the first by re-running the black box (``query/narrow``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headwater.core import rid as rids
from headwater.core.schema import EDGE_SCHEMA, NODE_SCHEMA

# Source kinds and the coordinates their structs carry, as NODE_SCHEMA fields.
COORDINATES = {
    "kafka": ("topic", "partition", "offset"),
    "file": ("path", "position"),
    "static": ("key",),
    "rate": ("key",),
    "blackbox": (),
    "state": (),  # a stateful operator's group: its state key
    "output": (),  # the sink's own rows, going into the user's foreachBatch code
}
_NODE_KIND = {"blackbox": "state", "state": "state", "output": "output"}


@dataclass(frozen=True)
class SourceEdges:
    column: str
    source: str  # a key of COORDINATES
    dataset: str | None
    mask: int  # which sink columns derive from this source
    rid: int | None = None  # the state node's rid, for a black box
    exact: bool = True
    node: int | None = None  # a black box whose state node is one per batch: ``rid`` is set for each batch
    box: int | None = None  # a black box's node id: its column holds its output rows' digests

    def in_batch(self, query: str, batch: int) -> "SourceEdges":
        """As a batch's lineage reads it: a black box's state node of that batch named."""
        return self if self.node is None else replace(self, rid=rids.state_rid(query, self.node, batch), node=None)


@dataclass(frozen=True)
class BatchContext:
    query: str
    sink: str
    batch: int
    op: int  # IR id of the node the edges end at (the sink's root for end-to-end edges)
    sources: tuple[SourceEdges, ...]
    dst_kind: str = "output"  # or "state": the edges end at a black box's state node
    dst_dataset: str | None = None  # the dataset of the rows edges end at; the sink by default
    exact: bool = True  # False: every edge is a superset edge (into a black box)
    run: int | None = None  # the run state keys are tied to (``rid.run_hash``), where sources hold state keys
    dst_in_batch: bool = True  # the rows edges end at belong to the batch; False: state nodes living across batches


def _const(value, n: int, type_: pa.DataType) -> pa.Array:
    return pa.repeat(pa.scalar(value, type=type_), n)


def _node_table(rid: pa.Array, kind: str, dataset, values: dict, query=None, batch=None) -> pa.Table:
    n = len(rid)
    columns = {"rid": rid, "kind": _const(kind, n, pa.string()), "dataset": dataset,
               "query": _const(query, n, pa.string()), "batch": _const(batch, n, pa.int64()), **values}
    return pa.table([columns[f.name] if f.name in columns else pa.nulls(n, f.type) for f in NODE_SCHEMA],
                    schema=NODE_SCHEMA)


def _source_nodes(rows: pa.Array, rid: pa.Array, src: SourceEdges, query: str) -> pa.Table:
    n = len(rid)
    values = {name: pc.struct_field(rows, name) for name in COORDINATES[src.source]}
    if src.source == "kafka":
        dataset = pc.binary_join_element_wise("kafka", values["topic"], ":")
    elif src.source == "file":
        dataset = pc.binary_join_element_wise("file", values["path"], ":")
    else:
        dataset = _const(src.dataset, n, pa.string())
    return _node_table(rid, _NODE_KIND.get(src.source, "source"), dataset, values,
                       query if src.source == "state" else None)


def state_rids(keys: pa.Array, run: int | None) -> pa.Array:
    """The state nodes' rids of state keys, in run ``run``."""
    if run is None:
        raise ValueError("state keys need the run they belong to (BatchContext.run)")
    return pa.array(rids.state_node_rids(keys.to_numpy(zero_copy_only=False), run), pa.int64())


def _edges(src: pa.Array, dst: pa.Array, ctx: BatchContext, op: int, exact: bool, mask: int) -> pa.Table:
    k = len(src)
    return pa.table([src, dst, _const(ctx.query, k, pa.string()), _const(ctx.batch, k, pa.int64()),
                     _const(op, k, pa.int32()), _const(exact, k, pa.bool_()), _const(mask, k, pa.int64())],
                    schema=EDGE_SCHEMA)


def _box_outputs(digests: pa.Array, dst: pa.Array, src: SourceEdges, box_id: int,
                 ctx: BatchContext) -> tuple[pa.Table, pa.Table]:
    """Black box ``box_id``'s (``src.box``) output rows of the batch (named by ``digests``) between its state node
    and ``dst``: their nodes and the black box's own node, superset edges from that node to them, exact edges
    from them to ``dst``."""
    outs = rids.box_output_rids(digests.to_numpy(zero_copy_only=False), ctx.query, box_id, ctx.batch)
    unique = np.unique(outs)
    box = np.full(len(unique), src.rid, dtype=np.int64)
    k = len(unique)
    nodes = pa.concat_tables([
        _node_table(pa.array(unique, pa.int64()), "state", _const(src.dataset, k, pa.string()), {}, ctx.query,
                    ctx.batch),
        _node_table(pa.array(box[:1], pa.int64()), "state", _const(src.dataset, min(k, 1), pa.string()), {}),
    ])
    edges = pa.concat_tables([
        _edges(pa.array(box, pa.int64()), pa.array(unique, pa.int64()), ctx, box_id, False, src.mask),
        _edges(pa.array(outs, pa.int64()), dst, ctx, ctx.op, ctx.exact, src.mask),
    ])
    return nodes, edges


def lineage_tables(batch: pa.RecordBatch, ctx: BatchContext) -> tuple[pa.Table, pa.Table]:
    out = batch.column("_hw_rid")
    n = len(out)
    dst_dataset = ctx.dst_dataset or ctx.sink
    node_parts = [_node_table(out, ctx.dst_kind, _const(dst_dataset, n, pa.string()), {}, ctx.query,
                              ctx.batch if ctx.dst_in_batch else None)]
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
        if src.box is not None:
            box_nodes, box_edges = _box_outputs(pc.struct_field(rows, "rid"), dst, src, src.box, ctx)
            node_parts.append(box_nodes)
            edge_parts.append(box_edges)
            continue
        if src.rid is not None:
            rid = _const(src.rid, k, pa.int64())
        elif src.source == "state":
            rid = state_rids(pc.struct_field(rows, "rid"), ctx.run)
        else:
            rid = pc.struct_field(rows, "rid")
        edge_parts.append(
            pa.table(
                [rid, dst, _const(ctx.query, k, pa.string()), _const(ctx.batch, k, pa.int64()),
                 _const(ctx.op, k, pa.int32()), _const(src.exact and ctx.exact, k, pa.bool_()),
                 _const(src.mask, k, pa.int64())],
                schema=EDGE_SCHEMA,
            )
        )
        node_parts.append(_source_nodes(rows, rid, src, ctx.query))
    nodes = pa.concat_tables(node_parts)
    _, first = np.unique(nodes.column("rid").to_numpy(), return_index=True)
    nodes = nodes.take(pa.array(np.sort(first)))
    edges = pa.concat_tables(edge_parts) if edge_parts else EDGE_SCHEMA.empty_table()
    return nodes, edges
