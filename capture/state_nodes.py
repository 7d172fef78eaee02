"""Journaling the rows that enter a stateful aggregate, from the tasks that feed it.

``rewrite.state_nodes`` puts right below each stateful aggregate a column that is the aggregate's journal
filter (``entering_column``, a ``jar.Journals`` column; a filter on it keeps the rows): it gets, per row, only
the narrow lineage columns (each input's state key ``k<i>`` and rid struct ``s<i>``, and the watermark
column ``late``) while the user's columns stay where they are, keeps every row, and journals one edge
per row and input: input row -> its group's state node, tagged with the batch. It runs inside the
batch's own job, so no source is read twice and no row waits in Spark's state for a later batch.

What it cannot know from the plan, the per-batch hook tells the tasks through a Spark local property
(``journal.PROPERTY``, a ``journal.Setting``), set before the batch's jobs run: the batch, the run
(Spark's query id, kept by the checkpoint, ``rid.run_hash``), the sampled fraction, and each
aggregate's watermark for late rows. A row whose group Spark drops as late in that batch (its window
end, or event-time key, at or before that watermark, as Spark's ``StateStoreSaveExec`` decides in
append and update mode) gets no edge. Without the property (a job the hook did not start, or a batch
not captured) the filter journals nothing.
"""

from __future__ import annotations

from pyspark.sql import Column

from .journal import Group, Publisher
from .lineage import BatchContext
from .publishers import source_edges
from .rewrite import StateOp


def entering_publisher(op: StateOp, query: str) -> Publisher:
    """What the rows entering ``op`` journal: per input, an edge from its rid to its group's state node."""
    groups = []
    for i, source in enumerate(op.inputs):
        template = BatchContext(query, query, 0, op.node_id, (source_edges(query, source, f"s{i}", op.masks[i]),),
                                dst_kind="state", dst_dataset=op.dataset, dst_in_batch=False)
        groups.append(Group(template, dst=f"k{i}", state_key=True))
    n = len(op.inputs)
    fields = tuple([f"k{i}" for i in range(n)] + [f"s{i}" for i in range(n)] + (["late"] if op.late_key is not None
                                                                                 else []))
    return Publisher(f"enter-{op.node_id}", query, fields, tuple(f"s{i}" for i in range(n)), tuple(groups),
                     mode="input", late="late" if op.late_key is not None else None, op=op.node_id)


def entering_column(op: StateOp, frame, columns: list[Column], query: str, journals, counts) -> Column:
    """The filter condition below ``op`` over ``frame``: true for every row, journaling its state edges on
    the way. ``columns`` are the publisher's fields, in order (``entering_publisher``)."""
    return journals.column(entering_publisher(op, query), counts, frame, columns)


def late_watermarks(saves: list[dict], ops: list[StateOp]) -> dict[str, int | None]:
    """Per aggregate (by node id) that drops late rows, the watermark (microseconds) this batch drops them
    by, as Spark's ``StateStoreSaveExec`` of that aggregate holds it; None where it drops none (complete
    mode). ``saves`` are the micro-batch's ``StateStoreSaveExec``s as ``Hook.late`` reads them.

    An aggregate whose operator cannot be found is left out: its rows' edges are then not published
    (the journal filter counts the task failed), rather than published without knowing which rows are late.
    """
    wanted = {op.late_key: op.node_id for op in ops if op.late_key is not None}
    return {str(wanted[key]): save["late"] for save in saves for key in save["keys"] if key in wanted}

