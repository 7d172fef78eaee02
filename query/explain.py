"""Answers that explain themselves: plan operators by name, attribute masks as column names.

Capture logs each query's plan (LOG_PLAN: the plan IR, ``headwater.core.plan``, its output
columns, its sources and Spark's optimized plan); the indexer keeps them in the Parquet store
(``indexer/plans.py``). A lineage record names the operators on its paths by plan IR node id
(``ops``) and the columns it feeds by a bit mask over the output row's columns (``cols``);
this module turns both into what a person reads:

    operators(plan) -> list[dict]
        Every operator of one plan (a plan file's dict, or a bare IR dict), in data-flow order
        (each after its inputs): ``{"id": 7, "kind": "join", "name": "join customers",
        "spark_class": "Join", "inputs": [5, 6]}``. ``kind`` is one of ``KINDS``; ``inputs``
        are the ids of the operators feeding it (naming-only nodes, Spark's SubqueryAlias, are
        left out and looked through).
    columns(output_columns, mask) -> list[str] | None
        The names of the columns bit i of ``mask`` stands for (columns past 63 share bit 63);
        None when the mask is unknown (-1 or None).
    Explainer(store_dir, log_topic)
        The kept plans of one log topic, read once and again only when the plans table
        changes (``PlanStore.stamp``: its version, one look at its log per call):
        ``.queries() -> list[dict]``: ``{"name", "sink", "sources", "output_columns"}`` of each
        query with a plan, by name; ``sources`` each ``{"id", "kind", "name", "dataset"}``.
        ``.operators_of(query, batch=None) -> list[dict] | None``: ``operators`` of the plan that
        batch (default: the latest) ran, Kafka sources named by the topics the batch log
        shows the query reading; None for a query with no plan kept.
        ``.columns(dataset_or_query, mask) -> list[str] | None``: ``columns`` over the output
        columns of the query of that name, or of the query whose sink that dataset is
        (``parquet:/data/out``); None if no plan says which columns it has.
        ``.sink_of(dataset_or_query)``, ``.query_of(dataset_or_query)``: a query's sink, a sink's query.
        ``.plan(query, batch=None) -> Plan | None``: the kept plan, named (``Plan.operators()``,
        ``.output_columns``, ``.sink``, ``.sources``).
        ``.datasets() -> dict``: the datasets the kept plans' rows may carry (what a target is checked
        against); ``.topics(query=None) -> list[str]``: the Kafka topics the batch log shows read.
        ``.explain(records, of_record, backward)``: sets each answer record's ``operators`` and
        ``columns`` (what ``LineageClient`` does to every answer; ``LineageClient.explainer()`` is
        its instance).

A record's ``operators`` are the plan operators its rows flowed through, for each
``(query, op)`` its paths crossed: those between the rows an edge of ``op`` starts from (a
source, a black box, an aggregate's state) and ``op`` (the query's root for its sink rows,
the aggregate or black box for rows entering their state). Where the record or the asked row
is that start (a Kafka record, a customers row), only the operators on its branch. Plans
logged before the indexer kept the IR have no operators to name: records then carry
``{"id", "kind": "unknown", "name": "operator <id>"}``.

Pure logic: imports neither Spark nor Kafka (the batch log is read, for Kafka topics' names,
only when a query's page asks for them).
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from headwater.core import openlineage
from headwater.core import rid as rids
from headwater.core.offsets import partition_offsets
from headwater.core.openlineage import DatasetName
from headwater.core.plan import state_dataset
from headwater.spark.catalyst import simple_name
from headwater.spark.plan_json import expand_column, expr_id_or_none, flat_tree_or_none, named_expressions
from headwater.store.plans import PlanStore

if TYPE_CHECKING:
    from headwater.store.batch_log import BatchLog

# Operator kinds, one for each of the IR's (``headwater.spark.catalyst.KINDS``): what ``operators`` gives as
# ``kind``.
KINDS = {
    "Source": "source", "Project": "project", "Filter": "filter", "Join": "join", "Aggregate": "aggregate",
    "Window": "window function", "Generate": "generate", "Union": "union", "Deduplicate": "deduplicate",
    "Expand": "expand", "EventTimeWatermark": "watermark", "Repartition": "repartition", "BlackBox": "black box",
    "Alias": "alias", "Sort": "sort", "Limit": "limit", "Sample": "sample", "Observe": "observe", "Hint": "hint",
    "Sequence": "sequence", "LateralJoin": "lateral join", "Distinct": "distinct", "SetOperation": "set operation",
    "Unknown": "unknown",
}
FOREACH_BATCH = {"id": rids.FOREACH_BATCH_OP, "kind": "black box", "name": "foreachBatch",
                 "spark_class": "foreachBatch", "inputs": []}
_WINDOW_TYPE = "struct<start:timestamp,end:timestamp>"


def columns(output_columns: list[str] | None, mask: int | None) -> list[str] | None:
    """The names of the columns of ``output_columns`` set in ``mask`` (bit i: column i; bit 63: columns 63 on);
    None when the mask says nothing (None, or -1: every column, unknown) or the columns are not known."""
    if mask is None or mask == -1 or output_columns is None:
        return None
    bits = mask & ((1 << 64) - 1)
    return [name for i, name in enumerate(output_columns) if bits >> min(i, 63) & 1]


def duration(micros: int) -> str:
    """``5 s``, ``10 min``, ``1 h``, ``250 ms``: the largest unit that divides it."""
    for unit, size in (("d", 86_400_000_000), ("h", 3_600_000_000), ("min", 60_000_000), ("s", 1_000_000),
                       ("ms", 1_000)):
        if micros and micros % size == 0:
            return f"{micros // size} {unit}"
    return f"{micros} µs"


def _interval(text: str) -> str:
    """A Spark interval literal (``7 seconds``, ``1 minutes 30 seconds``) shortened: ``7 s``."""
    short = {"seconds": "s", "second": "s", "minutes": "min", "minute": "min", "hours": "h", "hour": "h",
             "days": "d", "day": "d", "milliseconds": "ms", "microseconds": "µs"}
    return re.sub(r"\b([a-z]+)\b", lambda m: short.get(m.group(1), m.group(1)), text.strip())


def _tree(flat: list | None) -> dict | None:
    """One of Spark's flattened expressions as nested ``{"node", "children"}``; None where it cannot be read."""
    return flat_tree_or_none(flat, lambda node, children: {"node": node, "children": children})


def _walk(tree: dict | None):
    if tree is None:
        return
    todo = [tree]
    while todo:
        item = todo.pop()
        yield item
        todo.extend(reversed(item["children"]))


def _cls(item: dict) -> str:
    node = item["node"]
    return simple_name(node.get("class", "")) if isinstance(node, dict) else ""


def _window_size(expressions: list[dict]) -> str | None:
    """The size of the time window a window column's expressions compute: ``5 s`` (tumbling), ``10 s every
    5 s`` (sliding), ``session 7 s``; None if they are not Spark's window arithmetic."""
    sizes: set[int] = set()
    slides: set[int] = set()
    gaps: set[str] = set()
    for tree in expressions:
        for item in _walk(tree):
            cls = _cls(item)
            if cls == "Literal" and item["node"].get("dataType") == "interval" and item["node"].get("value"):
                gaps.add(_interval(str(item["node"]["value"])))
            if cls not in ("Remainder", "Add") or len(item["children"]) != 2:
                continue
            right = item["children"][1]
            node = right["node"]
            if _cls(right) == "Literal" and node.get("dataType") == "long" and str(node.get("value", "")).isdigit():
                value = int(node["value"])
                if value > 0:
                    (slides if cls == "Remainder" else sizes).add(value)
    if gaps:
        return f"session {sorted(gaps)[0]}"
    if not slides:
        return None
    size, slide = max(sizes | slides), min(slides)
    return duration(size) if size == slide else f"{duration(size)} every {duration(slide)}"


class _Optimized:
    """Spark's optimized plan records, searched by the exprIds of nodes' outputs (which optimizing keeps)."""

    def __init__(self, records: list[dict] | None):
        self.records = records or []

    def node(self, spark_class: str | None, output_ids: set[int]) -> dict | None:
        """The optimized node of that class with those output exprIds."""
        for record in self.records:
            if record.get("spark_class") == spark_class and \
                    {a.get("expr_id") for a in record.get("output", [])} == output_ids:
                return record.get("fields") or {}
        return None

    def defining(self, expr_id: int | None) -> list[dict]:
        """The expressions that compute attribute ``expr_id``: an alias in a projection, or an Expand's column."""
        found = []
        for record in self.records:
            fields = record.get("fields") or {}
            for named in named_expressions(fields):
                tree = _tree(named)
                if tree and _cls(tree) == "Alias" and expr_id_or_none(tree["node"]) == expr_id and tree["children"]:
                    found.append(tree["children"][0])
            if record.get("spark_class") == "Expand":
                ids = [a.get("expr_id") for a in record.get("output", [])]
                if expr_id in ids:
                    found += [tree for e in expand_column(fields.get("projections", []), ids.index(expr_id))
                              if (tree := _tree(e))]
        return found


def _ir_of(plan: dict) -> dict | None:
    if "ir" in plan:
        return plan.get("ir")
    return plan if "kind" in plan and "children" in plan else None


class Plan:
    """One kept plan, its operators named (``operators``), and the plan segments its records' paths cross."""

    def __init__(self, plan: dict, topics: dict[int, str] | None = None):
        self.plan = plan
        self.query = plan.get("query")
        self.sink = plan.get("sink")
        self.output_columns = plan.get("output_columns")
        ir = _ir_of(plan)
        self.sources = {s["node_id"]: s for s in plan.get("sources") or [] if s.get("node_id") is not None}
        self.state = {s["node_id"] for s in plan.get("state") or [] if s.get("node_id") is not None}
        if self.output_columns is None and ir is not None:
            self.output_columns = [a[0] for a in ir.get("output", [])]
        if self.output_columns is None and plan.get("optimized"):  # a plan kept before the IR was
            self.output_columns = [a.get("name") for a in plan["optimized"][0].get("output", [])]
        self._optimized = _Optimized(plan.get("optimized"))
        self.nodes: dict[int, dict] = {}
        self.parent: dict[int, int] = {}
        self.order: list[int] = []  # data-flow order (post-order), naming-only nodes left out
        self.inputs: dict[int, list[int]] = {}
        if ir is not None:
            self._index(ir, None)
        self.topics = dict(topics or {})
        self.names = {node_id: self._name(node_id) for node_id in self.order}
        self._segments: dict[tuple, list[int]] = {}

    def _index(self, node: dict, parent: int | None) -> list[int]:
        """Index ``node``'s subtree; the ids of the operators it hands its rows to its parent from."""
        self.nodes[node["id"]] = node
        if parent is not None:
            self.parent[node["id"]] = parent
        feeding = []
        for child in node.get("children", []):
            feeding += self._index(child, node["id"])
        if node.get("kind") == "Alias":
            return feeding
        self.inputs[node["id"]] = feeding
        self.order.append(node["id"])
        return [node["id"]]

    def kafka_sources(self) -> list[int]:
        return [i for i, n in self.nodes.items() if (n.get("detail") or {}).get("source") == "kafka"]

    def rename(self, topics: dict[int, str]) -> None:
        """Name Kafka sources (node id → topics) from what the rows or the batch log show them reading."""
        changed = {k: v for k, v in topics.items() if self.topics.get(k) != v}
        if changed:
            self.topics.update(changed)
            self.names = {node_id: self._name(node_id) for node_id in self.order}

    def operator(self, node_id: int) -> dict:
        if node_id == rids.FOREACH_BATCH_OP:
            return dict(FOREACH_BATCH)
        node = self.nodes.get(node_id)
        if node is None:
            return {"id": node_id, "kind": "unknown", "name": f"operator {node_id}", "spark_class": None, "inputs": []}
        name = self.names.get(node_id) or self._name(node_id)  # a naming-only node only when a query's root
        return {"id": node_id, "kind": KINDS.get(node.get("kind", ""), "unknown"), "name": name,
                "spark_class": node.get("spark_class"), "inputs": list(self.inputs.get(node_id, []))}

    def operators(self) -> list[dict]:
        return [self.operator(i) for i in self.order]

    # Names.

    def _name(self, node_id: int) -> str:
        node = self.nodes[node_id]
        kind = node.get("kind", "")
        if kind == "Source":
            return "source " + self.source_name(node_id, long=True)
        if kind == "Join":
            return self._join_name(node)
        if kind == "Aggregate":
            return self._aggregate_name(node)
        if kind == "BlackBox":
            cls = node.get("spark_class") or "black box"
            return cls[:1].lower() + cls[1:]
        if kind == "EventTimeWatermark":
            found = self._optimized.node("EventTimeWatermark", {a[1] for a in node.get("output", [])}) or {}
            event = next((e.get("name") for e in found.get("eventTime", []) if isinstance(e, dict) and e.get("name")),
                         None)
            return f"watermark on {event}" if event else "watermark"
        if kind == "Deduplicate":
            found = self._optimized.node(node.get("spark_class"), {a[1] for a in node.get("output", [])}) or {}
            keys = [k[0].get("name") for k in found.get("keys", []) if k and isinstance(k[0], dict)]
            return f"deduplicate by {', '.join(k for k in keys if k)}" if any(keys) else "deduplicate"
        if kind == "Window":
            return "window function"
        if kind == "Alias":
            return f"alias {(node.get('detail') or {}).get('name') or ''}".strip()
        if kind == "Unknown":
            return node.get("spark_class") or "unknown operator"
        return KINDS.get(kind, "unknown")

    def source_name(self, node_id: int, long: bool = False) -> str:
        """A source node as people call it: ``customers``, ``kafka orders`` (long) or ``orders``, ``rate``."""
        node = self.nodes[node_id]
        detail = node.get("detail") or {}
        described = self.sources.get(node_id) or {}
        source = detail.get("source") or described.get("source")
        alias = self._alias_above(node_id)
        if source == "static":
            return detail.get("name") or described.get("name") or alias or f"table {node_id}"
        if source == "kafka":
            topic = self.topics.get(node_id) or alias
            return (f"kafka {topic}" if long else topic) if topic else "kafka"
        if source == "file":
            location = detail.get("location") or {}
            paths = location.get("paths") or []
            where = paths[0].rstrip("/").rsplit("/", 1)[-1] if paths else ""
            shown = alias or where or "files"
            return f"{location.get('format') or 'file'} {shown}" if long else shown
        if source == "blackbox":
            return described.get("dataset") or node.get("spark_class") or "black box"
        provider = detail.get("provider") or node.get("spark_class") or "stream"
        return f"{provider} {alias}" if long and alias else alias or provider

    def _alias_above(self, node_id: int) -> str | None:
        """The name a query gave a source (``.alias("o")``, a temp view): the SubqueryAlias right above it."""
        parent = self.parent.get(node_id)
        while parent is not None and self.nodes[parent].get("kind") == "Alias":
            name = (self.nodes[parent].get("detail") or {}).get("name")
            if name:
                return name
            parent = self.parent.get(parent)
        return None

    def _leaves(self, node_id: int) -> list[int]:
        """The sources and black boxes at or under ``node_id`` its rows come from, not looking below a black box."""
        found, todo = [], [node_id]
        while todo:
            current = self.nodes[todo.pop()]
            if current.get("kind") in ("Source", "BlackBox"):
                found.append(current["id"])
                continue
            todo.extend(c["id"] for c in reversed(current.get("children", [])))
        return found

    def _side_name(self, node_id: int) -> str:
        """One side of a join as people call it: a table by its name, a stream by the alias the query gave it, else
        by its sources' names."""
        leaves = self._leaves(node_id)
        if leaves and all((self.nodes[leaf].get("detail") or {}).get("source") == "static" for leaf in leaves):
            return " + ".join(self.source_name(leaf) for leaf in leaves)
        current = self.nodes[node_id]
        while True:
            name = (current.get("detail") or {}).get("name") if current.get("kind") == "Alias" else None
            if name:
                return name
            if current.get("kind") == "Source":
                return self.source_name(current["id"])
            children = current.get("children", [])
            if len(children) != 1 or current.get("kind") in ("Join", "Union", "BlackBox"):
                break
            current = children[0]
        return " + ".join(self.source_name(leaf) for leaf in leaves) or "rows"

    def _join_name(self, node: dict) -> str:
        """``join customers`` (a stream with a table, named by the table), ``join orders with payments``
        (two streams); the join type where it is not inner: ``join customers (left outer)``."""
        join_type = (node.get("detail") or {}).get("join_type") or "inner"
        spaced = re.sub(r"(?<=[a-z])(outer|semi|anti)$", r" \1", join_type)
        suffix = "" if join_type == "inner" else f" ({spaced})"
        children = node.get("children", [])
        if len(children) != 2:
            return "join" + suffix
        streaming = [any((self.nodes[leaf].get("detail") or {}).get("source") != "static"
                         for leaf in self._leaves(child["id"])) for child in children]
        names = [self._side_name(child["id"]) for child in children]
        if streaming[0] and streaming[1]:
            return f"join {names[0]} with {names[1]}{suffix}"
        if streaming[0] or streaming[1]:
            return f"join {names[1] if streaming[0] else names[0]}{suffix}"
        return f"join {names[0]} with {names[1]}{suffix}"

    def _aggregate_name(self, node: dict) -> str:
        output = node.get("output", [])
        derived = set((node.get("detail") or {}).get("derives", {}))
        found = self._optimized.node("Aggregate", {a[1] for a in output})
        keys: list[tuple[str | None, int | None, str]] = []  # name, exprId, type, as the plan has them
        if found is not None:
            grouping = set()
            for listed in found.get("groupingExpressions", []):
                tree = _tree(listed)
                grouping |= {expr_id_or_none(i["node"]) for i in _walk(tree)} - {None}
            for listed in found.get("aggregateExpressions", []):
                tree = _tree(listed)
                if tree is None:
                    continue
                if _cls(tree) == "AttributeReference" and expr_id_or_none(tree["node"]) in grouping:
                    keys.append((tree["node"].get("name"), expr_id_or_none(tree["node"]), _type(tree["node"])))
                elif _cls(tree) == "Alias" and tree["children"] and not any(
                        _cls(i).endswith("AggregateExpression") for i in _walk(tree)):
                    child = tree["children"][0]
                    if _cls(child) == "AttributeReference":  # a grouping column renamed: ``window(…).alias("w")``
                        keys.append((tree["node"].get("name"), expr_id_or_none(child["node"]), _type(child["node"])))
                    else:
                        keys.append((tree["node"].get("name"), expr_id_or_none(tree["node"]), ""))
        else:  # no optimized plan: the columns an aggregate passes through are its grouping columns
            keys = [(a[0], a[1], a[2]) for a in output if str(a[1]) not in derived]
        by = []
        window = None
        for name, expr_id, dtype in keys:
            if dtype.replace(" ", "") == _WINDOW_TYPE or name in ("window", "session_window") and not dtype:
                size = _window_size(self._optimized.defining(expr_id))
                window = f"{'session ' if size and size.startswith('session') else ''}window " \
                         f"{size.removeprefix('session ') if size else ''}".strip()
            elif name:
                by.append(name)
        if window:
            return window + (f" by {', '.join(by)}" if by else "")
        return f"aggregate by {', '.join(by)}" if by else "aggregate"

    # Segments: the operators between an edge's start and its op.

    def stops(self) -> set[int]:
        """The nodes edges start from: sources, black boxes and stateful aggregates."""
        return {i for i, n in self.nodes.items() if n.get("kind") in ("Source", "BlackBox")} | self.state

    def segment(self, op: int, entries: frozenset[int] | None = None) -> list[int]:
        """The operators rows flow through from the edges' starts below ``op`` (``entries`` where known) to
        ``op``, in data-flow order, naming-only nodes left out."""
        key = (op, entries)
        if key in self._segments:
            return self._segments[key]
        if op not in self.nodes:
            found = [op]
        else:
            stops = self.stops()
            starts = set()
            todo = [op]
            while todo:  # the starts under op, not below another start
                current = todo.pop()
                if current != op and current in stops:
                    starts.add(current)
                    continue
                todo.extend(c["id"] for c in self.nodes[current].get("children", []))
            if entries is not None and op in entries:  # rows leaving op's own state: op alone
                starts = set()
            elif entries is not None and starts & entries:
                starts &= entries
            on = {op}
            for start in starts:  # each start's way up to op
                up: int | None = start
                while up is not None and up not in on:
                    on.add(up)
                    up = self.parent.get(up)
            found = [i for i in self.order if i in on]
        self._segments[key] = found
        return found

    def entries_of(self, record: dict | None) -> set[int]:
        """The plan nodes a row of ``record`` (``kind``, ``dataset``, ``topic``, ``path``) starts edges from."""
        if not record:
            return set()
        kind, dataset = record.get("kind"), record.get("dataset") or ""
        found = set()
        for node_id, described in self.sources.items():
            source = described.get("source")
            if kind == "state" and described.get("dataset") == dataset:
                found.add(node_id)
            elif kind != "source":
                continue
            elif source == "static" and dataset and described.get("dataset") == dataset:
                found.add(node_id)
            elif source == "kafka" and record.get("topic") is not None:
                found.add(node_id)
            elif source in ("file", "stream") and record.get("path") is not None:
                found.add(node_id)
            elif source == "rate" and dataset == "rate":
                found.add(node_id)
        if kind == "state" and "#" in dataset:
            _, _, number = dataset.rpartition("#")
            if number.isdigit() and int(number) in self.nodes:
                found.add(int(number))
        return found


def rids_path(path: str) -> str:
    """A file stream's root as its rows' datasets (``file:<path>``) hold it: without a ``file:`` scheme's slashes."""
    return re.sub(r"^file:/*", "/", path)


def _type(node: dict) -> str:
    dtype = node.get("dataType")
    if isinstance(dtype, dict) and dtype.get("type") == "struct":
        return "struct<" + ",".join(f"{f.get('name')}:{f.get('type')}" for f in dtype.get("fields", [])) + ">"
    return str(dtype or "")


def operators(plan: dict, topics: dict[int, str] | None = None) -> list[dict]:
    """Every operator of ``plan`` (a kept plan's dict, or a bare IR dict) in data-flow order, named
    (module docstring); ``topics``: the topics Kafka source nodes read, by node id, where known."""
    return Plan(plan, topics).operators()


class Datasets(TypedDict, total=False):
    """``Explainer.datasets()``: empty when no plan is kept, else each of these."""

    queries: set[str]  # the queries' names, which their output rows carry
    sinks: dict[str, str]  # a sink written by one query only -> that query
    state: set[str]  # state nodes' datasets
    tables: dict[str, str | None]  # a static table's dataset -> its short name, where the plan gives one
    files: list[str]  # file streams' roots
    other: set[str]  # rate sources


class Explainer:
    """The kept plans of one log topic's queries, named (module docstring).

    :param store_dir: the store (``Config.store_uri()``).
    :param log_topic: the log topic's name.
    """

    def __init__(self, store_dir: str | Path, log_topic: str):
        self._store = PlanStore(store_dir, log_topic)
        self.store_dir, self.log_topic = store_dir, log_topic
        self._seen: int | None = None
        self._plans: dict[str, list[tuple[int, Plan]]] = {}  # by query: (from_batch, plan), in order
        self._made: dict[tuple[str, int], Plan] = {}  # each plan made once
        self._sinks: dict[str, str] = {}
        self._log: BatchLog | None = None
        # One LineageClient's questions share it (the HTTP server's threads too): one reads or names at a time.
        self._lock = threading.RLock()
        self._datasets: tuple[int | None, Datasets] | None = None  # datasets(), and the plans it was made of

    def refresh(self) -> "Explainer":
        """Read the plans written since the last call; when none was, this is a look at the table's version."""
        with self._lock:
            return self._refresh()

    def _refresh(self) -> "Explainer":
        stamp = self._store.stamp()
        if self._seen is not None and stamp == self._seen:
            return self
        plans: dict[str, list[tuple[int, Plan]]] = {}
        for query, from_batch, kept in self._store.kept(stamp):
            plan = self._made.get((query, from_batch))
            if plan is None or plan.plan is not kept:
                plan = self._made[(query, from_batch)] = Plan(kept)
            plans.setdefault(plan.query or query, []).append((from_batch, plan))
        self._plans, self._seen = plans, stamp
        # A sink named by where it writes (``parquet:/out``, ``table:NAME``) and written by one query only.
        written: dict[str, list[str]] = {}
        for query, versions in plans.items():
            sink = versions[-1][1].sink
            if sink and ":" in sink:
                written.setdefault(sink, []).append(query)
        self._sinks = {sink: queries[0] for sink, queries in written.items() if len(queries) == 1}
        return self

    def plan(self, query: str, batch: int | None = None) -> Plan | None:
        """The plan ``batch`` of ``query`` ran (the latest where ``batch`` is None or precedes them all)."""
        versions = self.refresh()._plans.get(query)
        if not versions:
            return None
        if batch is None:
            return versions[-1][1]
        ran = [plan for first, plan in versions if first <= batch]
        return ran[-1] if ran else versions[0][1]

    def queries(self) -> list[dict]:
        """Each query with a plan kept: ``name``, ``sink``, ``sources`` (``{"id", "kind", "name", "dataset"}``),
        ``output_columns``, ``from_batch`` of its latest plan."""
        found = []
        for query, versions in sorted(self.refresh()._plans.items()):
            first, plan = versions[-1]
            self._name_topics(query, plan)
            topics = None
            sources = []
            for node_id, described in sorted(plan.sources.items()):
                kind = (plan.nodes.get(node_id, {}).get("detail") or {}).get("source") or described.get("source")
                if node_id in plan.nodes:
                    name = plan.source_name(node_id)
                elif kind == "kafka":  # a plan kept before the IR was: the topics the query read
                    topics = self.topics(query) if topics is None else topics
                    name = "+".join(topics) or "kafka"
                else:
                    name = described.get("name") or kind
                sources.append({"id": node_id, "kind": kind, "name": name, "dataset": described.get("dataset")})
            found.append({"name": query, "sink": plan.sink, "sources": sources,
                          "output_columns": plan.output_columns, "from_batch": first})
        return found

    def operators_of(self, query: str, batch: int | None = None) -> list[dict] | None:
        """``operators`` of the plan ``batch`` of ``query`` ran (default its latest); None if none is kept."""
        plan = self.plan(query, batch)
        if plan is None:
            return None
        self._name_topics(query, plan)
        return plan.operators()

    def _name_topics(self, query: str, plan: Plan) -> None:
        """Kafka sources named by the topics the batch log shows ``query`` reading (only where one Kafka
        source reads them all: the log does not say which source read which topic)."""
        kafka = plan.kafka_sources()
        if len(kafka) != 1 or kafka[0] in plan.topics:
            return
        topics = self.topics(query)
        if topics:
            plan.rename({kafka[0]: "+".join(topics)})

    def topics(self, query: str | None = None) -> list[str]:
        """The Kafka topics the latest logged batch of ``query`` (default: of each query) read, from the batch log."""
        from headwater.store.batch_log import BatchLog

        with self._lock:
            try:
                log = self._log = (self._log or BatchLog(self.store_dir, self.log_topic)).refresh()
                found = set()
                for name in [query] if query else list(self.refresh()._plans):
                    batches = log.batches(name)
                    entry = log.batch(name, batches[-1]) if batches else None
                    found |= {topic for source in (entry or {}).get("sources") or []
                              for topic, _ in partition_offsets(source.get("end"))}
            except OSError:
                return []
        return sorted(found)

    def query_of(self, dataset_or_query: str | None) -> str | None:
        """The query of that name, or whose sink that dataset is; None if no kept plan says."""
        with self._lock:
            self.refresh()
            if dataset_or_query is None or dataset_or_query in self._plans:
                return dataset_or_query
            return self._sinks.get(dataset_or_query)

    def sink_of(self, dataset_or_query: str | None) -> str | None:
        """The sink (``parquet:/out``…) of the query of that name (an output row's dataset), or that dataset if it
        is a kept plan's sink; None if no kept plan says."""
        query = self.query_of(dataset_or_query)
        plan = self.plan(query) if query else None
        return plan.sink if plan is not None else None

    def datasets(self) -> Datasets:
        """The datasets the kept plans' rows may carry, as ``LineageClient.target`` checks a target against them:
        ``queries`` (output rows), ``sinks`` (sink → query), ``state`` (state nodes), ``tables`` (static
        table dataset → short name), ``files`` (file streams' roots), ``other`` (``rate``); empty if no plan is
        kept."""
        with self._lock:
            plans = self.refresh()._plans
            if self._datasets is not None and self._datasets[0] == self._seen:
                return self._datasets[1]
            if not plans:
                return {}
            found: Datasets = {"queries": set(plans), "sinks": dict(self._sinks), "state": set(), "tables": {},
                               "files": [], "other": set()}
            for query, versions in plans.items():
                for _, plan in versions:
                    if plan.sink == "foreachBatch":  # the user's code: a black box whose state rows are the batch's
                        found["state"].add(f"foreachBatch#{query}")
                    found["state"] |= {s.get("dataset") for s in plan.plan.get("state") or [] if s.get("dataset")}
                    found["state"] |= {state_dataset(n["spark_class"], i) for i, n in plan.nodes.items()
                                       if n.get("kind") in ("BlackBox", "Aggregate")}
                    for described in plan.sources.values():
                        source = described.get("source")
                        if source == "static" and described.get("dataset"):
                            found["tables"][described["dataset"]] = described.get("name")
                        elif source == "file":
                            paths = (described.get("location") or {}).get("paths") or []
                            found["files"] += [rids_path(p) for p in paths]
                        elif source in ("rate", "blackbox", "state") and described.get("dataset"):
                            (found["other"] if source == "rate" else found["state"]).add(described["dataset"])
            self._datasets = (self._seen, found)
            return found

    def openlineage_names(self) -> dict[DatasetName, str]:
        """Each dataset the kept plans read or write, by its OpenLineage name (``headwater.core.openlineage``), as
        headwater names it where ``LineageClient.target`` takes it: a Kafka topic ``kafka:TOPIC``, a file stream's
        folder ``file:PATH``, a static table its dataset (``table:<identity>``), a sink the sink (``parquet:/out``).
        A Kafka pattern's topics are those its latest batch read."""
        found: dict[DatasetName, str] = {}
        with self._lock:
            plans = dict(self.refresh()._plans)
        for query, versions in plans.items():
            for _, plan in versions:
                nodes = openlineage.plan_nodes(plan.plan["ir"]) if plan.plan.get("ir") else {}
                for node_id, described in plan.sources.items():
                    node = nodes.get(node_id)
                    if node is None:
                        continue
                    kind = described.get("source")
                    topics = self.topics(query) if kind == "kafka" and not openlineage.declared_topics(node) else ()
                    if kind == "file":  # a file stream's rows are named by their files, under its folders
                        for path in (node["detail"].get("location") or {}).get("paths") or []:
                            found[openlineage.location(path)] = f"file:{rids_path(path)}"
                        continue
                    for read in openlineage.reads(node, topics):
                        if kind == "kafka":
                            found[read.name] = f"kafka:{read.name.name}"
                        elif described.get("dataset"):
                            found[read.name] = described["dataset"]
                sink = openlineage.written(plan.plan)
                if sink is not None and plan.sink:
                    found[sink] = plan.sink
        return found

    def output_columns(self, dataset_or_query: str) -> list[str] | None:
        """The output columns of the query of that name, or whose sink that dataset is."""
        self.refresh()
        query = dataset_or_query if dataset_or_query in self._plans else self._sinks.get(dataset_or_query)
        plan = self.plan(query) if query else None
        return plan.output_columns if plan is not None else None

    def columns(self, dataset_or_query: str, mask: int | None) -> list[str] | None:
        """``columns`` of ``mask`` over the output columns of that query (by name, or by its sink's dataset)."""
        return columns(self.output_columns(dataset_or_query), mask)

    def explain(self, records, of_record: dict | None, backward: bool) -> None:
        """Set ``operators`` and ``columns`` on each of ``records`` (``backend.Lineage``) of one answer.

        ``of_record``: the asked row's ``kind``, ``dataset``, ``topic``, ``path`` where known. A record's
        ``hops`` are the ``(query, op)`` its paths crossed; an inferred record (which has none) crossed
        its query's root. ``columns`` is over the output row at the paths' end: backward the asked
        row, forward the record.
        """
        with self._lock:
            self._explain(records, of_record, backward)

    def _explain(self, records, of_record: dict | None, backward: bool) -> None:
        self.refresh()
        # Records of one answer mostly cross the same operators from the same kind of row: named once.
        named: dict[tuple, tuple[list[dict], list[str] | None]] = {}
        for record in records:
            row = {"kind": record.kind, "dataset": record.dataset, "topic": record.topic, "path": record.path}
            upstream, end = (row, of_record or {}) if backward else (of_record or {}, row)
            hops = frozenset(getattr(record, "hops", None) or ())
            if not hops and record.via == "inference" and end.get("kind") == "output" and end.get("dataset"):
                hops = frozenset({(end["dataset"], None)})
            batch = max(record.batches) if record.batches else None
            key = (hops, batch, *(upstream.get(k) for k in ("kind", "dataset", "topic")), upstream.get("path") is None,
                   end.get("kind"), end.get("dataset"))
            if key not in named:
                named[key] = self._named(hops, upstream, end, batch)
            record.operators, output_columns = named[key]
            record.columns = columns(output_columns, record.cols)

    def _named(self, hops: frozenset, upstream: dict, end: dict,
               batch: int | None) -> tuple[list[dict], list[str] | None]:
        """The operators on paths of ``hops`` from ``upstream`` rows, and the output columns of the row at their
        ``end``."""
        queries = sorted({q for q, _ in hops}, key=lambda q: (q == end.get("dataset"), q))
        found = []
        for query in queries:
            plan = self.plan(query, batch)
            ops = sorted((op for q, op in hops if q == query), key=lambda op: (op is None, op))
            if plan is None or not plan.order:
                found += [{"query": query, "id": op, "kind": "unknown", "name": f"operator {op}",
                           "spark_class": None, "inputs": []} for op in ops if op is not None]
                continue
            # Named from the batch log first, as every client names it, whatever it answered before; a record
            # read from one topic names it for itself only (the cached plan is shared by every answer).
            self._name_topics(query, plan)
            entries = plan.entries_of(upstream)
            kafka = [i for i in entries if (plan.nodes.get(i, {}).get("detail") or {}).get("source") == "kafka"]
            own = {}
            if upstream.get("topic") is not None and len(kafka) == 1 == len(plan.kafka_sources()):
                own[kafka[0]] = f"source kafka {upstream['topic']}"
            on: set[int] = set()
            for op in ops:
                on.update(plan.segment(plan.order[-1] if op is None else op, frozenset(entries) if entries else None))
            position = {node_id: i for i, node_id in enumerate(plan.order)}
            for i in sorted(on, key=lambda i: position.get(i, len(position))):
                operator = plan.operator(i)
                found.append({"query": query, **operator, "name": own.get(i, operator["name"])})
        end_query = end.get("dataset") if end.get("kind") == "output" else (queries[-1] if queries else None)
        plan = self.plan(end_query, batch) if end_query else None
        return found, plan.output_columns if plan is not None else self.output_columns(end_query or "")
