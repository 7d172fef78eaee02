"""What a traced query journals besides its aggregates' entering rows (``state_nodes.entering_publisher``):
the rows it writes to its sink, the rows entering each black box, and the rows handed to the user's
foreachBatch code. Each is a ``journal.Publisher``: its rows' fields and the edges they make.
"""

from __future__ import annotations

from headwater.core import rid as rids

from .journal import Group, Publisher
from .lineage import BatchContext, SourceEdges
from .rewrite import RID_COLUMN, SOURCE_PREFIX, BlackBox, TracedSource

FOREACH_BATCH_COLUMN = f"{SOURCE_PREFIX}out"  # the sink's rows, as they go into the user's foreachBatch code


def source_edges(query: str, source: TracedSource, column: str, mask: int) -> SourceEdges:
    """How the rows of ``source``, in the journaled field ``column``, link to the rows of a batch.

    A black box's rows are its output rows (``SourceEdges.box``: the column holds their digests),
    under its state node: one for all batches if it keeps state, else one per batch (``SourceEdges.node``,
    named for each batch's lineage); the state node's edges to them are never exact.
    """
    blackbox = source.source == "blackbox"
    return SourceEdges(column, source.source, source.dataset, mask,
                       rid=rids.state_rid(query, source.node_id, None) if blackbox and source.stateful else None,
                       exact=not blackbox, node=source.node_id if blackbox and not source.stateful else None,
                       box=source.node_id if blackbox else None)


def edges_of(query: str, sources, masks: dict[int, int], mask: int | None = None) -> tuple[SourceEdges, ...]:
    """``source_edges`` of each source, in its own column; ``mask`` overrides the plan's masks."""
    return tuple(source_edges(query, s, s.column, masks.get(s.node_id, -1) if mask is None else mask)
                 for s in sources)


def outputs_publisher(query: str, op: int, sources: list[TracedSource], masks: dict[int, int]) -> Publisher:
    """The sink's rows: each row's rid (``_hw_rid``) and every source's rid column; sampled by the row's rid."""
    columns = tuple(s.column for s in sources)
    template = BatchContext(query, query, 0, op, edges_of(query, sources, masks))
    return Publisher("outputs", query, (RID_COLUMN, *columns), columns, (Group(template, dst=RID_COLUMN),))


def black_box_publisher(query: str, box: BlackBox, inputs: dict[str, TracedSource],
                        masks: dict[int, int]) -> Publisher:
    """The rows entering a black box: superset edges to its state node, from each input's rid column.
    What enters a black box reaches the sink's columns the black box feeds (its mask)."""
    sources = [inputs[c] for c in box.inputs]
    template = BatchContext(query, query, 0, box.node_id, edges_of(query, sources, masks, masks.get(box.node_id, -1)),
                            dst_kind="state", dst_dataset=box.dataset, exact=False)
    group = Group(template, node=box.node_id, stateful=box.stateful)
    return Publisher(f"box-{box.node_id}", query, box.inputs, box.inputs, (group,), mode="input")


def foreach_batch_publisher(query: str) -> Publisher:
    """The rows handed to the user's foreachBatch code: superset edges to the batch's node
    ``foreachBatch:QUERY:BATCH``, from each row's rid (a struct column of it)."""
    edges = (SourceEdges(FOREACH_BATCH_COLUMN, "output", query, -1, exact=False),)
    template = BatchContext(query, query, 0, rids.FOREACH_BATCH_OP, edges, dst_kind="state",
                            dst_dataset=f"foreachBatch#{query}", exact=False)
    group = Group(template, node=rids.FOREACH_BATCH_OP)
    return Publisher("foreachBatch", query, (FOREACH_BATCH_COLUMN,), (FOREACH_BATCH_COLUMN,), (group,), mode="input")
