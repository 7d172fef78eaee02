"""The per-batch hook of a traced query (``BatchHook``): Spark calls it with each micro-batch, as the
``foreachBatch`` function ``TracedWriter.start`` gives the query it starts. It writes the user's rows to the user's
sink (``sinks``) and has the batch's lineage journaled by the executors that write them (``jar``'s ``Hook``),
within the overhead budget (``budget``), and logs the batch's capture status.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from typing import TYPE_CHECKING, Sequence

from py4j.protocol import Py4JJavaError
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, MapType, StructType

from headwater.core import rid as rids
from headwater.core.plan import column_masks, location_key
from headwater.core.schema import LOG_BATCH
from headwater.spark.table_files import TableUnreadable, table_version

from . import metrics
from .batch_errors import for_the_stream
from .budget import FULL, LOG_ONLY, SAMPLED, OverheadBudget, Plan
from .journal import NOT_CAPTURED, PROPERTY, Setting
from .jvm_listener import CAPTURE_PROPERTY, QUERY_ID_PROPERTY
from .publishers import black_box_publisher, foreach_batch_publisher, outputs_publisher
from .rewrite import BLACK_BOX_MARKER, RID_COLUMN
from .sinks import Sink, SinkSpec
from .state_nodes import late_watermarks

if TYPE_CHECKING:
    from .tracer import Traced

log = logging.getLogger("headwater.capture")

ROW_HASH = "_hw_row"  # an output row's rid but for its batch (BatchHook.row_hash)


def _holds_map(dtype) -> bool:
    """Whether a Spark type is or contains a map, which ``xxhash64`` refuses."""
    if isinstance(dtype, MapType):
        return True
    if isinstance(dtype, ArrayType):
        return _holds_map(dtype.elementType)
    if isinstance(dtype, StructType):
        return any(_holds_map(f.dataType) for f in dtype.fields)
    return False


class BatchHook:
    """The per-batch hook: user's rows to the user's sink, lineage to the journal."""

    def __init__(self, traced: Traced, spec: SinkSpec, sink: Sink):
        self.traced = traced
        self.spec = spec
        self.sink = sink  # opened from the spec at start() (``sinks.open_sink``)
        threaded = traced.threaded
        self.masks = column_masks(threaded.ir)
        config = traced.config
        self.budget = OverheadBudget(config.overhead_budget)
        self.log_only = config.capture == LOG_ONLY  # the operator turned edges off, the log stays
        context = traced.spark.sparkContext
        self.counts = traced.counts
        self._counted = self.counts.value()  # the accumulators as the last batch left them
        self.parallelism = max(1, context.defaultParallelism)
        # Everything below is the same for every batch: built once, so a batch costs
        # the driver few calls into the JVM.
        fields = threaded.df.schema.fields
        n_user = threaded.user_columns
        # Positional names: the user's output may repeat a column name.
        self.positional = [f"_hw_c{i}" for i in range(n_user)] + [f.name for f in fields[n_user:]]
        self.user = [(p, f.name) for p, f in zip(self.positional, fields[:n_user])]
        self.hashable = [p for p, f in zip(self.positional, fields[:n_user]) if not _holds_map(f.dataType)]
        self._named = [*[F.col(p).alias(n) for p, n in self.user], *([F.col(RID_COLUMN)] if traced.emit_rid else [])]
        self.tables = {location_key(location): location for node in threaded.ir.walk()
                       if node.detail.get("source") == "static" for location in node.detail.get("locations", [])}
        # The journal filters of what this query publishes from the hook (``publishers.py``), built once:
        # a batch only puts them in its plan. Their fields' types are those of the batch's frame.
        journals, name = traced.journals, traced.name
        self.frame = frame = self.streaming_frame(threaded.df)  # what the writer streams into this hook
        # What the hook asks of Spark every batch, one call into the JVM each (``Hook.java``).
        self.jvm = journals.hook(ROW_HASH, RID_COLUMN, self._named)
        out = self.with_rid(frame, 0)
        self.outputs = journals.column(outputs_publisher(name, threaded.ir.id, threaded.sources, self.masks),
                                       self.counts, out,
                                       [F.col(RID_COLUMN), *[F.col(s.column) for s in threaded.sources]])
        inputs = {s.column: s for s in threaded.inputs}
        self.boxes = [(box, journals.column(black_box_publisher(name, box, inputs, self.masks), self.counts, frame,
                                            [F.col(c) for c in box.inputs])) for box in threaded.black_boxes]
        self.foreach_batch = journals.column(foreach_batch_publisher(name), self.counts, out,
                                             [F.struct(F.col(RID_COLUMN).alias("rid"))]) \
            if spec.foreach_batch is not None else None

    def table_versions(self) -> dict[str, str]:
        """The version of each file-backed static table the batch reads (``table_files.table_version``),
        by its root paths; a table whose files cannot be listed from here has none."""
        versions = {}
        for key, location in self.tables.items():
            try:
                versions[key] = table_version(location)["digest"]
            except TableUnreadable as exc:
                log.debug("no version of static table %s: %s", key, exc)
        return versions

    @property
    def streamed(self) -> bool:
        """Whether the hook gets the sink's rows, journaled in the streaming plan (``hooked_frame``); the
        ``sink`` is opened first."""
        return not self.traced.threaded.black_boxes and self.sink.reads_every_row

    def hooked_frame(self) -> DataFrame:
        """The streaming frame the writer hands this hook each batch (``sink`` opened first).

        Where every row goes to a sink that reads every row and no black box needs rows of its own,
        it is the sink's rows: each with its output rid, computed from the id of the micro-batch
        computing it, through the sink's journal filter, in the streaming plan
        (``Hook.streamingSinkRows``), so that a batch's hook builds no Dataset of its own; the filter
        journals only in batches the hook set a ``Setting`` for. Otherwise the traced rows
        (``streaming_frame``), which the hook splits and journals itself.
        """
        if not self.streamed:
            return self.frame
        journal = None if self.log_only else self.outputs._jc
        return DataFrame(self.jvm.streamingSinkRows(self.frame._jdf, journal), self.frame.sparkSession)

    def streaming_frame(self, df: DataFrame) -> DataFrame:
        """The traced rows as the hook gets them: the user's columns by position, plus ``_hw_row``.

        ``_hw_row`` hashes all of an output row's rid but its batch: its query, sink,
        input rids and content. Computed in the streaming plan, it leaves the hook one
        small expression per batch.
        """
        return df.toDF(*self.positional).withColumn(ROW_HASH, self.row_hash())

    def row_hash(self):
        """An output row's rid before its batch: its query, sink, input rids and content.

        The content tells apart the rows one input yields (explode); rows alike in
        content and inputs share a rid, which is their true lineage either way.
        """
        parts = [F.col(f"{s.column}.rid") for s in self.traced.threaded.sources]
        return F.xxhash64(F.lit(rids.OUTPUT), F.lit(self.traced.name), F.lit(self.spec.describe()),
                          *parts, *[F.col(c) for c in self.hashable])

    def with_rid(self, rows: DataFrame, batch_id: int) -> DataFrame:
        """``rows`` with each one's rid, ``_hw_rid``: its ``_hw_row`` hash and the batch,
        ``xxhash64(_hw_row, '<batch id>')``.

        The batch is hashed as text: Spark's generated code holds a string literal by reference but
        writes a number into the code, so a numeric batch id made every batch compile its stages
        anew (two Janino compilations, 12-30 ms each, a batch of the demo shape)."""
        return DataFrame(self.jvm.withRid(rows._jdf, str(batch_id)), rows.sparkSession)

    def sink_rows(self, rows: DataFrame) -> DataFrame:
        """What the sink gets of ``rows`` (``with_rid``'s): the user's columns and ``_hw_rid``."""
        return DataFrame(self.jvm.sinkRows(rows._jdf, None), rows.sparkSession)

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        try:
            self.run_batch(batch_df, batch_id)
        except Py4JJavaError as error:  # never its Java trace to Spark's stream thread: ``batch_errors``
            try:
                job_group = batch_df.sparkSession.sparkContext.getLocalProperty("spark.jobGroup.id")
            except Exception:  # the JVM does not answer an interrupted thread
                job_group = None
            raise for_the_stream(error, job_group) from None

    def run_batch(self, batch_df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        self.traced.shipper.batch_started(self.traced.name, batch_id)
        versions = self.table_versions()  # as the batch reads them: a table may change before the next
        plan = Plan(LOG_ONLY, 0.0) if self.log_only else self.budget.plan()
        capture = plan.level != LOG_ONLY
        latest = self.sink.latest_batch()
        if latest > batch_id:
            self.refuse(batch_id, versions, round(time.monotonic() - started, 3))
            return
        # An earlier attempt wrote the batch and Spark's commit did not follow: the sink keeps
        # what it holds, and the lineage is journaled again (rids and edges are idempotent).
        written = latest == batch_id
        context = batch_df.sparkSession.sparkContext
        # What the journal filters of this batch's tasks need; a batch not captured says so (``NOT_CAPTURED``),
        # since a filter with no setting at all takes Spark's (``Journal.sparkSetting``).
        setting = self._setting(batch_id, context.getLocalProperty(QUERY_ID_PROPERTY), plan) if capture else None
        context.setLocalProperty(PROPERTY, setting.to_json() if setting else NOT_CAPTURED)
        try:
            write = self._write_streamed if self.streamed else self._write_split
            apart, written_nanos, errors = write(batch_df, batch_id, capture, written)
        finally:
            context.setLocalProperty(PROPERTY, None)  # type: ignore[arg-type]  # None unsets it; PySpark's hint omits it
        stats = self._stats(capture, errors)
        nanos = stats.pop("nanos", 0) if written_nanos is None else written_nanos
        metrics.TASK_SECONDS.labels(self.traced.name).inc(nanos / 1e9)
        # Capture's time: its own jobs, and its time inside the user's tasks, spread over the cores.
        publishing = apart + nanos / 1e9 / self.parallelism
        status = self._status(plan, stats)
        rest = time.monotonic() - started - publishing
        if not self.log_only:
            self.budget.observe(plan, publishing, rest)
        metrics.record_batch(self.traced.name, status, stats, publishing)
        metrics.OVERHEAD_RATIO.labels(self.traced.name).set(metrics.overhead_ratio(publishing, rest))
        extra = {"sampled_fraction": plan.fraction} if plan.level == SAMPLED else {}
        if written:
            extra["sink_written_before"] = True
        self.traced.shipper.publish_log(
            LOG_BATCH, later=functools.partial(self.files, batch_id), query=self.traced.name, batch=batch_id,
            status=status, seconds=round(time.monotonic() - started, 3), capture_seconds=round(publishing, 3),
            **extra, **stats, tables=versions,
        )

    def _write_streamed(self, batch_df: DataFrame, batch_id: int, capture: bool, written: bool) \
            -> tuple[float, int | None, list[str]]:
        """Write a batch of the sink's rows (``hooked_frame``), journaled by the tasks writing them; a batch the
        sink holds is not written again, and its lineage is journaled by a job of capture's own. Returns the
        seconds of capture's own jobs, capture's nanoseconds in the user's tasks where its own jobs followed
        them (else None), and what failed."""
        if not written:
            self.sink.write(batch_df, batch_id)
            return 0.0, None, []
        if not capture:
            return 0.0, None, []
        return self._run_journal_jobs([(batch_df, None)])

    def _write_split(self, batch_df: DataFrame, batch_id: int, capture: bool, written: bool) \
            -> tuple[float, int | None, list[str]]:
        """Write a batch of the traced rows (``streaming_frame``): the sink's rows, each with its output rid, to
        the sink; then their lineage, the rows handed to the user's own code and those entering each black box,
        by jobs of capture's own over the rows kept. Returns as ``_write_streamed``."""
        boxes = self.traced.threaded.black_boxes
        frame = batch_df.persist() if boxes and capture else batch_df
        out = frame.where(F.col(BLACK_BOX_MARKER).isNull()) if boxes else frame
        out = self.with_rid(out, batch_id)
        if capture:
            out = out.persist()
        try:
            if not written:
                self.sink.write(self.sink_rows(out), batch_id)
            if not capture:
                return 0.0, None, []
            jobs = [(out, self.outputs)]
            if self.foreach_batch is not None:
                jobs.append((out, self.foreach_batch))
            jobs.extend((frame.where(F.col(BLACK_BOX_MARKER) == box.node_id), journal) for box, journal in self.boxes)
            return self._run_journal_jobs(jobs)
        finally:
            if capture:
                out.unpersist()
            if capture and boxes:
                frame.unpersist()

    def _run_journal_jobs(self, jobs: Sequence[tuple[DataFrame, Column | None]]) -> tuple[float, int, list[str]]:
        """Journal lineage by jobs of capture's own, one for each ``(rows, journal)`` of ``jobs``: the rows
        through that journal filter, or (None) rows whose plan journals them already. Returns their seconds,
        capture's nanoseconds inside the user's tasks before them, and what failed."""
        in_tasks = self.counts.nanos() - self._counted["nanos"]
        context = self.traced.spark.sparkContext
        started = time.monotonic()
        errors = []
        context.setLocalProperty(CAPTURE_PROPERTY, "publish")
        try:
            for rows, journal in jobs:
                try:  # lineage must never stop the user's stream
                    (rows if journal is None else rows.where(journal)).count()
                except Exception as exc:
                    log.exception("journaling lineage of %s failed", self.traced.name)
                    errors.append(str(exc)[:500])
        finally:
            context.setLocalProperty(CAPTURE_PROPERTY, None)  # type: ignore[arg-type]  # None unsets it, as above
        return time.monotonic() - started, in_tasks, errors

    def _stats(self, capture: bool, errors: list[str]) -> dict:
        """What this batch's journal filters did (the accumulators since the last batch), as the batch
        log reports it; ``nanos`` is taken out by the caller."""
        if self.log_only:  # no journal filter in its plan: nothing to read
            return {}
        now = self.counts.value()
        previous, self._counted = self._counted, now
        if not capture:
            return {}
        delta = {name: now[name] - previous[name] for name in now}
        stats: dict[str, int | str] = {"rows_out": delta.pop("rows"), **delta}
        failed = stats.pop("failed")
        if failed:
            errors = [*errors, f"lineage failed in {failed} task(s); see the executors' logs"]
        if errors:
            stats["error"] = "; ".join(errors)[:500]
        return stats

    def files(self, batch_id: int) -> dict:
        """The files the batch added to the sink (read by the tracer's thread once the sink has
        committed the batch; a failure to read its log costs the batch's log entry that list), or
        where a Kafka sink's records of the batch went."""
        offsets = self.sink.offsets(batch_id)
        if offsets is not None:
            return {"sink_offsets": offsets}
        try:
            files = self.sink.files(batch_id)
        except Exception:
            log.warning("the files batch %s of %s wrote to its sink are not known", batch_id, self.traced.name,
                        exc_info=True)
            return {}
        return {} if files is None else {"sink_files": files}

    def refuse(self, batch_id: int, versions: dict, seconds: float) -> None:
        """A sink whose own log holds batches after this one belongs to another run (a new
        checkpoint over an old sink path): Spark's sink skips the batch, untraced too, so
        nothing is written and no lineage published; the batch is logged ``failed``, saying so."""
        error = (f"the sink's commit log already holds batches after {batch_id}: it was written by another run "
                 f"(a new checkpoint over the same sink?), and skips this batch, as Spark's sink does untraced")
        log.error("%s, batch %s: %s", self.traced.name, batch_id, error)
        metrics.record_batch(self.traced.name, "failed", {}, 0.0)
        self.traced.shipper.publish_log(
            LOG_BATCH, query=self.traced.name, batch=batch_id, status="failed",
            seconds=seconds, capture_seconds=0.0, error=error, tables=versions)

    def _setting(self, batch_id: int, query_id: str | None, plan: Plan) -> Setting:
        """The batch's setting for the journal filters of its tasks (``journal.Setting``). ``query_id``: the
        Spark id of the streaming query running the batch (the run is its ``rid.run_hash``); None outside one."""
        ops = self.traced.threaded.state_ops
        run = rids.run_hash(query_id) if query_id else None
        late = {}
        if ops and run is not None:
            try:  # Spark's plan of this micro-batch, with its watermarks (the hook's DataFrame only scans its rows)
                # The query is the traced session's: the batch's own session is the stream's clone of it.
                late = late_watermarks(json.loads(self.jvm.late(self.traced.spark._jsparkSession, query_id)),
                                       ops)
            except Exception:  # the tasks then journal no state edges of aggregates that drop late rows
                log.exception("the watermarks of %s's aggregates are not known for batch %s", self.traced.name,
                              batch_id)
        return Setting(batch_id, run, plan.fraction if plan.level == SAMPLED else None, late)

    @staticmethod
    def _status(plan: Plan, stats: dict) -> str:
        """The batch's capture status: what the gap map says of it."""
        if plan.level == LOG_ONLY:
            return LOG_ONLY
        if stats.get("dropped_edges") or stats.get("error") is not None:
            return "failed"
        return FULL if plan.level == FULL else SAMPLED
