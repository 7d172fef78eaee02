"""Publishing the rows that enter a stateful aggregate, from the tasks that feed it.

``rewrite.state_nodes`` puts a filter right below each stateful aggregate whose condition
is ``entering_column``: an Arrow UDF that gets, per row, only the narrow lineage columns
(each input's rid struct and the state key of the group it enters, and the watermark
column) while the user's columns stay in the JVM, returns true for every row, and on the
way publishes one edge per row and input: input row → its group's state node, tagged with
the batch. It runs inside the batch's own job, so no source is read twice and no row waits
in Spark's state for a later batch.

What it cannot know from the plan, the per-batch hook tells the tasks through a Spark local
property (``PROPERTY``), set before the batch's jobs run: the batch, the run (Spark's query
id, kept by the checkpoint, ``rid.run_hash``), the capture level, and each aggregate's
watermark for late rows. A row whose group Spark drops as late in that batch (its window
end, or event-time key, at or before that watermark, as Spark's ``StateStoreSaveExec``
decides in append and update mode) gets no edge. Without the property (a job the hook did
not start, or a batch not captured) the filter publishes nothing.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column
from pyspark.sql.functions import arrow_udf

from headwater.core import rid as rids

from .jvm_listener import QUERY_ID_PROPERTY
from .lineage import BatchContext, SourceEdges
from .publish import STATS, PublishTarget, _Task, sampled
from .rewrite import StateOp

PROPERTY = "headwater.state_edges"  # the per-batch setting (``Setting``), as JSON

log = logging.getLogger("headwater.capture")


@dataclass(frozen=True)
class Setting:
    """What the tasks of one batch need to publish state edges."""

    batch: int
    run: int  # ``rid.run_hash`` of Spark's query id
    fraction: float | None  # sampled: the fraction of rows whose edges are published; None: every row
    late: dict[str, int | None]  # by aggregate node id: rows with a watermark column at or before this are late

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @staticmethod
    def from_json(text: str | None) -> "Setting | None":
        return Setting(**json.loads(text)) if text else None


@dataclass(frozen=True)
class Entering:
    """The rows entering one aggregate, as one query's tasks publish them."""

    query: str
    op: StateOp
    target: PublishTarget
    counts: object  # the query's ``publish.Counts`` accumulator

    def publish(self, batches: Iterator[pa.Array]) -> Iterator[pa.Array]:
        from pyspark import TaskContext

        context = TaskContext.get()
        setting = Setting.from_json(context.getLocalProperty(PROPERTY) if context is not None else None)
        task = None
        payloads: list = []
        spent, failed = 0.0, 0
        for rows in batches:
            started = time.perf_counter()
            if setting is not None and not failed:
                try:
                    task = task or _Task(self._context(setting, 0), self.target)
                    payloads.extend(self._messages(rows, setting, task))
                except Exception:  # lineage must never fail the user's batch: the batch is logged failed
                    log.exception("state edges of batch %s of %s failed in this task", setting.batch, self.query)
                    failed = 1
            spent += time.perf_counter() - started
            yield pa.repeat(pa.scalar(True), len(rows))
        if task is None and not failed:
            return
        started = time.perf_counter()
        try:
            if payloads:
                task.deliver(payloads)
        except Exception:
            log.exception("publishing the state edges of batch %s of %s failed in this task", setting.batch, self.query)
            failed = 1
        spent += time.perf_counter() - started
        counts = [0] * len(STATS) if task is None else [task.counts[name] for name in STATS]
        counts[STATS.index("rows")] = 0  # rows out are the sink's alone
        self.counts.add(counts + [round(spent * 1000), failed])

    def _context(self, setting: Setting, i: int) -> BatchContext:
        source = self.op.inputs[i]
        blackbox = source.source == "blackbox"
        rid = rids.state_rid(self.query, source.node_id, None if source.stateful else setting.batch) if blackbox \
            else None
        edges = SourceEdges(f"s{i}", source.source, source.dataset, self.op.masks[i], rid=rid, exact=not blackbox)
        return BatchContext(self.query, self.query, setting.batch, self.op.node_id, (edges,), dst_kind="state",
                            dst_dataset=self.op.dataset, run=setting.run, dst_in_batch=False)

    def _messages(self, rows: pa.StructArray, setting: Setting, task: _Task) -> Iterator[tuple]:
        keep = None
        if self.op.late_key is not None:
            if str(self.op.node_id) not in setting.late:
                raise ValueError(f"no watermark known for aggregate #{self.op.node_id}: its late rows cannot be told")
            watermark = setting.late[str(self.op.node_id)]
            if watermark is not None:
                late = pc.less_equal(pc.cast(rows.field("late"), pa.int64()), watermark)
                keep = pc.invert(pc.fill_null(late, False))
        for i in range(len(self.op.inputs)):
            struct = rows.field(f"s{i}")
            chosen = keep
            if setting.fraction is not None:  # by the entering row's own rid: a retried batch samples the same rows
                ids = pc.fill_null(pc.struct_field(struct, "rid"), 0).to_numpy(zero_copy_only=False)
                picked = pa.array(sampled(ids, setting.fraction))
                chosen = picked if chosen is None else pc.and_(chosen, picked)
            keys = rows.field(f"k{i}")
            batch = pa.RecordBatch.from_arrays(
                [pa.array(rids.state_node_rids(keys.to_numpy(zero_copy_only=False), setting.run), pa.int64()), struct],
                names=["_hw_rid", f"s{i}"])
            if chosen is not None:
                batch = batch.filter(chosen)
            if batch.num_rows:
                yield from task.messages(batch, self._context(setting, i))


def entering_column(op: StateOp, rows: Column, query: str, target: PublishTarget, counts) -> Column:
    """The filter condition below ``op``: true for every row, publishing its state edges on the way."""
    entering = Entering(query, op, target, counts)

    def publish(batches: Iterator[pa.Array]) -> Iterator[pa.Array]:
        return entering.publish(batches)

    return arrow_udf(publish, "boolean").asNondeterministic()(rows)


def late_watermarks(execution, ops: list[StateOp]) -> dict[str, int | None]:
    """Per aggregate (by node id) that drops late rows, the watermark (microseconds) this batch drops them
    by, as Spark's ``StateStoreSaveExec`` of that aggregate holds it in ``execution`` (the micro-batch's
    ``IncrementalExecution``, which the foreachBatch hook's DataFrame carries); None where it drops none
    (complete mode).

    An aggregate whose operator cannot be found is left out: its rows' edges are then not published
    (``Entering`` fails the task's lineage), rather than published without knowing which rows are late.
    """
    wanted = {op.late_key: op.node_id for op in ops if op.late_key is not None}
    if not wanted:
        return {}
    found: dict[str, int | None] = {}
    nodes = [execution.executedPlan()]
    while nodes:
        node = nodes.pop()
        if node.getClass().getSimpleName() == "StateStoreSaveExec":
            keys = node.keyExpressions()
            ids = {keys.apply(i).exprId().id() for i in range(keys.size())
                   if keys.apply(i).getClass().getSimpleName() == "AttributeReference"}
            mode = node.outputMode()
            complete = mode.isDefined() and mode.get().toString().lower() == "complete"
            expression = node.watermarkExpressionForLateEvents()  # <watermark column> <= <watermark>, in µs
            for expr_id in ids & set(wanted):
                late = None if complete or not expression.isDefined() else int(expression.get().right().value())
                found[str(wanted[expr_id])] = late
        children = node.children()
        nodes.extend(children.apply(i) for i in range(children.size()))
    return found


def run_of(spark) -> int | None:
    """The run (``rid.run_hash``) of the streaming query whose batch this thread runs."""
    query_id = spark.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
    return rids.run_hash(query_id) if query_id else None
