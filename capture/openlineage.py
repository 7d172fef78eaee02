"""OpenLineage events of traced queries: headwater in the catalogs that read them (Marquez, DataHub, …).

Sent through ``openlineage-python``'s client, configured the way that client is (``openlineage.yml``,
``OPENLINEAGE_URL``, ``OPENLINEAGE__TRANSPORT__…``: HTTP, Kafka, file, console), when the ``openlineage`` setting
asks for them (``wanted``). Per traced query, one OpenLineage run per plan:

- START when the query starts; RUNNING at most every ``openlineage_interval_s`` (5 minutes), and only after
  batches ran, with what they did since the last event; COMPLETE when it stops, FAIL (with Spark's error) when
  it fails. Not one pair per micro-batch, as OpenLineage's own Spark agent sends.
- The run is named by the query's Spark id (kept in its checkpoint), its plan's fingerprint and the batch the
  plan first ran (``checkpoint.Recorded.since``): a restart from the checkpoint with the same plan continues the
  run; with changed code it is a new run whose ``parent`` facet names the run of the plan it replaces.
- Datasets by OpenLineage's naming (``headwater.core.openlineage``), with their ``schema``; the output's
  ``columnLineage`` from the plan (``plan.column_transformations``: each column's direct transformation, and the
  columns that filter, join, group or order its rows as indirect ones); the job's ``jobType`` (``STREAMING``), the
  run's ``processing_engine``; rows read per input since the last event (``inputStatistics`` and
  ``dataQualityMetrics``, as Spark's progress counts them; a Kafka source reading several topics split among them
  by the offsets read), rows written (``outputStatistics``).
- ``headwater_rowLineage``, a run facet of headwater's own (its JSON schema ships beside this module,
  ``RowLineageRunFacet.json``): the capture level, the batches since the last event by capture status, and how to
  ask the row level (the query service's URL, the explorer's pages, the address forms).

The tracer's threads only queue what they see (``observe``: the log records as they are sent; ``lifecycle``: a
query's start and end, from the progress listener); a thread of this module's builds and sends the events, so a
slow or absent catalog never slows a stream. An event that cannot be sent (after the client transport's own
retries) is logged and counted (``headwater_capture_openlineage_events{outcome="failed"}``), not queued again: the
next one carries the state.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path
from typing import Any, Callable
from urllib.parse import quote

import attr
from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent, RunState
from openlineage.client.facet_v2 import (
    RunFacet,
    column_lineage_dataset,
    data_quality_metrics_input_dataset,
    datasource_dataset,
    error_message_run,
    input_statistics_input_dataset,
    job_type_job,
    output_statistics_output_dataset,
    parent_run,
    processing_engine_run,
    schema_dataset,
    symlinks_dataset,
)

from headwater import __version__
from headwater.core import openlineage as names
from headwater.core.config import Config, stack_ports
from headwater.core.offsets import partition_offsets
from headwater.core.openlineage import DatasetName
from headwater.core.schema import LOG_BATCH, LOG_PLAN, LOG_PROGRESS

from . import metrics
from .batch_errors import first_line

log = logging.getLogger("headwater.capture")

PRODUCER = f"https://github.com/headwater-lineage/headwater/tree/v{__version__}"
ROW_LINEAGE = "headwater_rowLineage"
ROW_LINEAGE_SCHEMA = Path(__file__).with_name("RowLineageRunFacet.json")
ROW_LINEAGE_SCHEMA_URL = ("https://github.com/headwater-lineage/headwater/blob/main/capture/RowLineageRunFacet.json"
                          "#/$defs/RowLineageRunFacet")
# The run ids: UUIDs named by the query's Spark id, plan and the batch it first ran, under this namespace.
RUN_NAMESPACE = uuid.UUID("6f1c2b9e-4f57-4d43-9a38-2f0e8d3c1a55")
# How a row is named to the query service (query/README.md): what the facet tells a catalog's reader.
ADDRESS_FORMS = ("kafka:TOPIC:PARTITION:OFFSET", "file:PATH:POSITION", "table:NAME:KEY", "rate:VALUE", "RID")
STATUSES = ("full", "sampled", "log-only", "failed")
CONFIG_ENVIRONMENT = ("OPENLINEAGE_URL", "OPENLINEAGE_CONFIG")


def wanted(config: Config) -> bool:
    """Whether traced queries send OpenLineage events: ``openlineage`` on, or auto with the client configured
    (``OPENLINEAGE_URL``, ``OPENLINEAGE_CONFIG``, ``OPENLINEAGE__TRANSPORT…``, or ``openlineage.yml`` where the
    client looks for it: the working folder, ``~/.openlineage``), and not ``OPENLINEAGE_DISABLED=true``."""
    if config.openlineage == "off" or os.environ.get("OPENLINEAGE_DISABLED", "").strip().lower() == "true":
        return False
    if config.openlineage == "on":
        return True
    return any(os.environ.get(name) for name in CONFIG_ENVIRONMENT) \
        or any(name.startswith("OPENLINEAGE__TRANSPORT") for name in os.environ) \
        or Path("openlineage.yml").is_file() or (Path.home() / ".openlineage" / "openlineage.yml").is_file()


@attr.define
class RowLineageRunFacet(RunFacet):
    """``headwater_rowLineage``: the row level a catalog page can link to (``RowLineageRunFacet.json``)."""

    query: str
    captureLevel: str  # noqa: N815 (OpenLineage's fields are camelCase)
    batches: dict[str, Any]  # since the last event: count by capture status, first and last
    rowsOut: int  # noqa: N815
    edges: int
    ask: dict[str, Any]

    @staticmethod
    def _get_schema() -> str:
        return ROW_LINEAGE_SCHEMA_URL


@dataclass
class Coverage:
    """What a run's batches did since its last event."""

    statuses: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STATUSES, 0))
    first: int | None = None
    last: int | None = None
    rows_out: int = 0
    edges: int = 0
    rows_in: dict[DatasetName, int] = field(default_factory=dict)  # Kafka topics and file streams read

    def batch(self, record: dict) -> None:
        status = record.get("status")
        self.statuses[status if status in self.statuses else "failed"] += 1
        batch = int(record["batch"])
        self.first = batch if self.first is None else min(self.first, batch)
        self.last = batch if self.last is None else max(self.last, batch)
        self.rows_out += int(record.get("rows_out") or 0)
        self.edges += int(record.get("edges") or 0)

    @property
    def batches(self) -> int:
        return sum(self.statuses.values())


@dataclass
class QueryRun:
    """The OpenLineage run of one traced query's plan: its events, built from the plan record (``LOG_PLAN``), the
    batch and progress records, and the query's start and end. Pure: no client, no Spark."""

    plan: dict  # the plan record
    spark_id: str  # the streaming query's id, which its checkpoint keeps across restarts
    namespace: str  # the jobs'
    capture: str  # the capture level
    query_url: str | None
    metastore: str | None = None  # Spark's hive.metastore.uris, where catalog tables live in one
    coverage: Coverage = field(default_factory=Coverage)
    topics: dict[int, set[str]] = field(default_factory=dict)  # Kafka source node → topics seen in its offsets
    last_event_at: float = 0.0

    @property
    def query(self) -> str:
        return self.plan["query"]

    @property
    def run_id(self) -> str:
        return run_id(self.spark_id, self.plan.get("fingerprint"), self.plan.get("plan_since"))

    def start(self, now: float) -> RunEvent:
        facets: dict[str, RunFacet] = {"processing_engine": processing_engine_run.ProcessingEngineRunFacet(
            version=self.plan.get("spark_version") or "unknown", name="spark",
            openlineageAdapterVersion=__version__, producer=PRODUCER)}
        if self.plan.get("changed") and self.plan.get("previous_plan_since") is not None:
            previous = run_id(self.spark_id, self.plan.get("previous_fingerprint"), self.plan["previous_plan_since"])
            facets["parent"] = parent_run.ParentRunFacet(
                run=parent_run.Run(runId=previous), job=parent_run.Job(namespace=self.namespace, name=self.query),
                producer=PRODUCER)
        return self._event(RunState.START, now, facets)

    def due(self, now: float, interval_s: float) -> bool:
        """Whether a RUNNING event is due: batches ran since the last event, ``interval_s`` or more ago."""
        return self.coverage.batches > 0 and now - self.last_event_at >= interval_s

    def running(self, now: float) -> RunEvent:
        return self._event(RunState.RUNNING, now, {})

    def end(self, now: float, exception: str | None) -> RunEvent:
        facets: dict[str, RunFacet] = {}
        if exception:
            facets["errorMessage"] = error_message_run.ErrorMessageRunFacet(
                message=first_line(exception) or exception,
                programmingLanguage="PYTHON" if "Traceback (most recent call last)" in exception else "JAVA",
                stackTrace=exception, producer=PRODUCER)
        return self._event(RunState.FAIL if exception else RunState.COMPLETE, now, facets)

    def batch(self, record: dict) -> None:
        """A batch's capture record."""
        self.coverage.batch(record)

    def progress(self, record: dict) -> None:
        """Rows read since the last event, from a batch's progress record: each source's as Spark counts them, a
        Kafka source reading several topics split among them by the offsets it read."""
        kafka = [n for n in self.source_nodes if n["detail"].get("source") == "kafka"]
        files = [path for n in self.source_nodes if n["detail"].get("source") == "file"
                 for path in (n["detail"].get("location") or {}).get("paths") or []]
        for source in record.get("sources") or []:
            end, rows = source.get("end"), int(source.get("rows_in") or 0)
            if isinstance(end, dict) and end and all(isinstance(v, dict) for v in end.values()):  # Kafka's offsets
                topics = sorted(end)
                node = next((n for n in kafka if set(topics) & set(self.kafka_topics(n))
                             or not names.declared_topics(n)), None)
                if node is None:
                    continue
                self.topics.setdefault(node["id"], set()).update(topics)
                counts = {topics[0]: rows} if len(topics) == 1 else _offsets_read(source.get("start"), end)
                for topic, count in counts.items():
                    self._read(names.kafka(names.kafka_bootstrap(node), topic), count)
            else:
                described = str(source.get("description") or "")
                for path in files:
                    if path in described:
                        self._read(names.location(path), rows)

    def _read(self, name: DatasetName, rows: int) -> None:
        self.coverage.rows_in[name] = self.coverage.rows_in.get(name, 0) + rows

    def _event(self, state: RunState, now: float, facets: dict[str, RunFacet]) -> RunEvent:
        coverage = self.coverage
        facets[ROW_LINEAGE] = RowLineageRunFacet(
            query=self.query, captureLevel=self.capture,
            batches={**{_camel(s): n for s, n in coverage.statuses.items()}, "first": coverage.first,
                     "last": coverage.last},
            rowsOut=coverage.rows_out, edges=coverage.edges, ask=self.ask(), producer=PRODUCER)
        inputs = self.inputs()
        if state != RunState.START:
            for dataset in inputs:
                rows = coverage.rows_in.get(DatasetName(dataset.namespace, dataset.name))
                if rows is not None:
                    dataset.inputFacets = {
                        "inputStatistics": input_statistics_input_dataset.InputStatisticsInputDatasetFacet(
                            rowCount=rows, producer=PRODUCER),
                        "dataQualityMetrics": data_quality_metrics_input_dataset.DataQualityMetricsInputDatasetFacet(
                            rowCount=rows, columnMetrics={}, producer=PRODUCER)}
        outputs = self.outputs()
        if state != RunState.START:
            for output in outputs:
                output.outputFacets = {
                    "outputStatistics": output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
                        rowCount=coverage.rows_out, producer=PRODUCER)}
        job = Job(namespace=self.namespace, name=self.query, facets={
            "jobType": job_type_job.JobTypeJobFacet(processingType="STREAMING", integration="SPARK",
                                                    jobType="STREAMING_QUERY", producer=PRODUCER)})
        event = RunEvent(eventType=state, eventTime=_iso(now), run=Run(runId=self.run_id, facets=facets), job=job,
                         inputs=inputs, outputs=outputs, producer=PRODUCER)
        self.coverage = Coverage()
        self.last_event_at = now
        return event

    # -- datasets -----------------------------------------------------------------------------------------

    @cached_property
    def source_nodes(self) -> list[dict]:
        """The plan's source nodes: a run's plan does not change."""
        return [n for n in names.plan_nodes(self.plan["ir"]).values() if n["kind"] == "Source"]

    def kafka_topics(self, node: dict) -> list[str]:
        return sorted(set(names.declared_topics(node)) | self.topics.get(node["id"], set()))

    def leaf_datasets(self, node: dict) -> list[tuple[DatasetName, dict]]:
        """The datasets a source node reads, each with its facets."""
        found = []
        for read in names.reads(node, self.topics.get(node["id"], ()), self.metastore):
            facets: dict[str, Any] = {"schema": self.schema(read.columns)}
            if read.table:
                table = names.catalog_table(read.table, self.metastore)
                facets["symlinks"] = symlinks_dataset.SymlinksDatasetFacet(identifiers=[symlinks_dataset.Identifier(
                    namespace=table.namespace, name=table.name, type="TABLE")], producer=PRODUCER)
            found.append((read.name, facets))
        return found

    def inputs(self) -> list[InputDataset]:
        seen: dict[DatasetName, InputDataset] = {}
        for node in self.source_nodes:
            for name, facets in self.leaf_datasets(node):
                if name not in seen:
                    seen[name] = InputDataset(namespace=name.namespace, name=name.name,
                                              facets={**facets, "dataSource": _source(name)})
        return list(seen.values())

    def output_name(self) -> DatasetName | None:
        return names.written(self.plan, self.metastore)

    def outputs(self) -> list[OutputDataset]:
        name = self.output_name()
        if name is None:
            return []
        columns = self.plan.get("sink_schema") or [[c, None] for c in self.plan.get("output_columns") or []]
        facets: dict[str, Any] = {"schema": self.schema(columns), "dataSource": _source(name)}
        lineage = self.column_lineage()
        if lineage is not None:
            facets["columnLineage"] = lineage
        return [OutputDataset(namespace=name.namespace, name=name.name, facets=facets)]

    def column_lineage(self) -> column_lineage_dataset.ColumnLineageDatasetFacet | None:
        """The output's columns from the inputs' (``plan.column_transformations``, in the plan record)."""
        found = self.plan.get("column_lineage")
        if not found:
            return None
        sources = {n["id"]: n for n in self.source_nodes}
        by_leaf = {leaf: [name for name, _ in self.leaf_datasets(sources[leaf])] for leaf in sources}

        def fields(columns: dict[str, dict[str, Any]], make: Callable[[Any], list]) -> list:
            return [column_lineage_dataset.InputField(namespace=name.namespace, name=name.name, field=column,
                                                      transformations=make(how))
                    for leaf, read in columns.items() for name in by_leaf.get(int(leaf), [])
                    for column, how in sorted(read.items())]

        indirect = fields(found.get("indirect") or {}, lambda uses: [
            column_lineage_dataset.Transformation(type="INDIRECT", subtype=use) for use in uses])
        outputs = self.plan.get("output_columns") or []
        facet_fields = {}
        for column, direct in zip(outputs, found.get("direct") or []):
            inputs = fields(direct, lambda how: [column_lineage_dataset.Transformation(type="DIRECT", subtype=how)])
            if inputs:
                facet_fields[column] = column_lineage_dataset.Fields(inputFields=inputs)
        return column_lineage_dataset.ColumnLineageDatasetFacet(fields=facet_fields, dataset=indirect,
                                                                producer=PRODUCER)

    @staticmethod
    def schema(columns) -> schema_dataset.SchemaDatasetFacet:
        return schema_dataset.SchemaDatasetFacet(fields=[
            schema_dataset.SchemaDatasetFacetFields(name=name, type=dtype) for name, dtype in columns],
            producer=PRODUCER)

    def ask(self) -> dict[str, Any]:
        """How to ask the query service of this query's rows."""
        ask: dict[str, Any] = {"url": self.query_url, "addressForms": list(ADDRESS_FORMS)}
        if self.query_url:
            base = self.query_url.rstrip("/")
            ask["explorer"] = f"{base}/#/query?name={quote(self.query, safe='')}"
            ask["backward"] = f"{base}/v1/lineage/backward?rid={{rid}}"
            ask["forward"] = f"{base}/v1/lineage/forward?source={{address}}"
            output = self.output_name()
            if output is not None:
                ask["sinkRows"] = f"{base}/#/where?dataset={quote(output.uri, safe='')}"
        return ask


def run_id(spark_id: str, fingerprint: str | None, since: int | None) -> str:
    """The OpenLineage run of a query's plan: the same for every start from its checkpoint with that plan."""
    return str(uuid.uuid5(RUN_NAMESPACE, f"{spark_id}/{fingerprint}/{since}"))


class OpenLineageEvents:
    """Sends the events of the traced queries of one tracer, from a thread of its own; ``close()`` after the
    queries have stopped sends their last events. ``client``: an ``OpenLineageClient`` (made from its own
    configuration by ``start``)."""

    def __init__(self, client, config: Config, spark_version: str, metastore: str | None = None,
                 home: Path | None = None):
        self.client = client
        self.interval_s = config.openlineage_interval_s
        self.namespace = config.openlineage_namespace or os.environ.get("OPENLINEAGE_NAMESPACE") or "headwater"
        self.capture = config.capture
        self.spark_version = spark_version
        self.metastore = metastore
        ports = stack_ports(home)
        self.query_url = config.query_url or (f"http://127.0.0.1:{ports['query']}" if ports.get("query") else None)
        self._plans: dict[str, dict] = {}  # traced query → its latest plan record, until its start is heard
        self._started: dict[str, dict] = {}  # traced query → its start, heard before its plan record
        self._runs: dict[str, QueryRun] = {}  # traced query → its run, from its start until its end
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="headwater-openlineage", daemon=True)
        self._thread.start()

    @classmethod
    def start(cls, spark, config: Config) -> "OpenLineageEvents | None":
        """The events of ``spark``'s traced queries, if ``config`` wants them (``wanted``); else None."""
        if not wanted(config):
            return None
        from openlineage.client import OpenLineageClient

        try:
            client = OpenLineageClient()
        except Exception:  # a configuration the client refuses: the streams run, and the log says why no events
            log.exception("OpenLineage events are off: openlineage-python's client refused its configuration")
            return None
        conf = spark.sparkContext.getConf()
        metastore = conf.get("spark.hadoop.hive.metastore.uris", None) or conf.get("hive.metastore.uris", None)
        return cls(client, config, spark.version, metastore)

    def observe(self, schema: str, record: dict) -> None:
        """A log record the tracer sent (the shipper's thread): plans, batches and progress."""
        if schema in (LOG_PLAN, LOG_BATCH, LOG_PROGRESS):
            self._queue.put((schema, record))

    def lifecycle(self, event: dict) -> None:
        """A traced query started or ended (the progress listener's thread; ``Progress.java``'s record)."""
        self._queue.put(("lifecycle", event))

    def close(self, timeout_s: float = 10.0) -> None:
        """Send what is queued (the last queries' ends), then stop; the client is closed too."""
        self._queue.put(None)
        self._thread.join(timeout=timeout_s + 5)
        try:
            self.client.close(timeout_s)
        except Exception:
            log.warning("the OpenLineage client did not close cleanly", exc_info=True)

    # -- this module's thread -----------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=self._wait())
            except queue.Empty:
                item = ()
            if item is None:
                break
            try:
                if item:
                    self._handle(*item)
                now = time.time()
                for run in list(self._runs.values()):
                    if run.due(now, self.interval_s):
                        self._emit(run.query, run.running(now))
            except Exception:  # this thread must outlive a record it cannot read
                log.exception("an OpenLineage event could not be made")

    def _wait(self) -> float:
        """Until the next RUNNING event may be due."""
        now = time.time()
        due = [run.last_event_at + self.interval_s - now for run in self._runs.values() if run.coverage.batches]
        return max(min(due, default=self.interval_s), 0.05)

    def _handle(self, kind: str, record: dict) -> None:
        query = str(record.get("query"))
        if kind == LOG_PLAN:
            self._plans[query] = {**record, "spark_version": self.spark_version}
            if query in self._started:
                self._begin(query, self._started.pop(query))
        elif kind == "lifecycle" and record.get("headwater") == "started":
            if query in self._plans:
                self._begin(query, record)
            else:
                self._started[query] = record
        elif kind == "lifecycle" and record.get("headwater") == "terminated":
            run = self._runs.get(query)
            if run is not None and run.spark_id == record.get("id"):
                del self._runs[query]
                self._emit(query, run.end(time.time(), record.get("exception")))
        elif query in self._runs:
            (self._runs[query].batch if kind == LOG_BATCH else self._runs[query].progress)(record)

    def _begin(self, query: str, started: dict) -> None:
        run = QueryRun(self._plans.pop(query), started["id"], self.namespace, self.capture, self.query_url,
                       self.metastore)
        self._runs[query] = run
        self._emit(query, run.start(time.time()))

    def _emit(self, query: str, event: RunEvent) -> None:
        state = event.eventType.value if event.eventType is not None else "OTHER"
        try:
            self.client.emit(event)
        except Exception:
            log.warning("the OpenLineage %s event of %s was not sent", state, query, exc_info=True)
            metrics.OPENLINEAGE_EVENTS.labels(query, state, "failed").inc()
            return
        metrics.OPENLINEAGE_EVENTS.labels(query, state, "sent").inc()


def _offsets_read(start, end) -> dict[str, int]:
    """Records read per topic between two of a Kafka source's offsets (``offsets.partition_offsets`` reads them); a
    partition with no start (the query's first batch) counts none."""
    begun = partition_offsets(start)
    counts: dict[str, int] = {}
    for (topic, partition), offset in partition_offsets(end).items():
        counts[topic] = counts.get(topic, 0) + max(offset - begun.get((topic, partition), offset), 0)
    return counts


def _source(name: DatasetName) -> datasource_dataset.DatasourceDatasetFacet:
    return datasource_dataset.DatasourceDatasetFacet(name=name.namespace, uri=name.namespace, producer=PRODUCER)


def _camel(status: str) -> str:
    head, *rest = status.split("-")
    return head + "".join(part.title() for part in rest)


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat()
