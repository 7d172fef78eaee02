"""The plan IR: one typed tree for a query's analyzed logical plan.

Built from plain records, one per Spark plan node in pre-order (see ``RawNode``), which
the Spark adapter (``headwater.capture.spark_plan``) reads off the JVM plan. Attribute
identity is Spark's exprId, never a column name. The same tree drives rid threading,
attribute masks, the plan log and, later, the log-only fallback. Spark's classes are sorted
into the IR's kinds by ``headwater.spark.catalyst``; each record's plan JSON is read through
``headwater.spark.plan_json``.

A maximal subtree that reads no stream is one ``Source`` of kind ``static``: its rows
are dimension rows, whatever Spark does inside it.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence, TypedDict

from headwater.spark.catalyst import STATEFUL_BLACK_BOXES, join_type, kind_of
from headwater.spark.plan_json import (
    EXPR_ID,
    Attr,
    aliases,
    attribute_ids,
    expand_column,
    expr_id,
    is_a,
    named_expressions,
    plan_tree,
)


def state_dataset(spark_class: str, node_id: int) -> str:
    """The dataset of a stateful operator's or black box's state nodes: ``<Spark class>#<plan node id>``."""
    return f"{spark_class}#{node_id}"


def accumulates(dataset: str | None) -> bool:
    """Whether the state nodes of ``dataset`` gather rows across micro-batches (an aggregate's groups,
    a stateful black box), so an output they emit in batch b may derive from any earlier batch's rows."""
    return dataset is not None and dataset.split("#", 1)[0] in STATEFUL_BLACK_BOXES | {"Aggregate"}


# Source kinds, recognised by the columns a source produces.
KAFKA_COLUMNS = ("topic", "partition", "offset")
RATE_COLUMNS = ("timestamp", "value")


class RawAttr(TypedDict):
    name: str
    expr_id: int
    dtype: str


class RawNode(TypedDict):
    """One Spark plan node as read off the JVM: what the IR is built from and logged as."""

    spark_class: str  # simple class name, e.g. "Project"
    location: dict | None  # {"paths": [...], "format": "parquet"} for file-backed relations
    num_children: int
    streaming: bool
    output: list[RawAttr]
    fields: dict  # the node's own entry of Spark's plan.toJSON()


@dataclass
class PlanNode:
    id: int
    kind: str
    spark_class: str
    streaming: bool
    output: list[Attr]
    children: list["PlanNode"] = field(default_factory=list)
    detail: dict = field(default_factory=dict)

    def walk(self) -> Iterator["PlanNode"]:
        yield self
        for child in self.children:
            yield from child.walk()

    def sources(self) -> list["PlanNode"]:
        return [n for n in self.walk() if n.kind == "Source"]

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "kind": self.kind,
            "spark_class": self.spark_class,
            "streaming": self.streaming,
            "output": [[a.name, a.expr_id, a.dtype] for a in self.output],
            "detail": self.detail,
            "children": [c.to_dict() for c in self.children],
        }


def _alias_name(fields: dict) -> str | None:
    ident = fields.get("identifier")
    if isinstance(ident, dict):
        return ident.get("name")
    desc = fields.get("desc")
    if isinstance(desc, dict):
        return (desc.get("identifier") or {}).get("table")
    return None


def build(raw: list[RawNode]) -> PlanNode:
    """The IR of a plan given as its pre-order list of raw nodes."""
    return _fold_static(plan_tree(raw, _plan_node))


def _plan_node(node_id: int, node: RawNode, children: list[PlanNode]) -> PlanNode:
    """The IR node of one raw node, its children built; ``node_id``: its place in pre-order."""
    cls = node["spark_class"]
    kind = kind_of(cls)
    detail: dict = {}
    fields = node["fields"]
    if kind in ("Project", "Aggregate"):
        detail["derives"] = {
            str(expr_id(alias)): sorted(attribute_ids(named))
            for alias, named in aliases(named_expressions(fields))
        }
        detail["transforms"] = {str(expr_id(alias)): _transform(named)
                                for alias, named in aliases(named_expressions(fields))}
    elif kind == "Generate":
        reads = sorted(attribute_ids(fields.get("generator", [])))
        detail["derives"] = {str(expr_id(a)): reads for out in fields.get("generatorOutput", []) for a in out}
    elif kind == "Expand":
        projections = fields.get("projections", [])
        detail["derives"] = {
            str(a["expr_id"]): sorted(set().union(*map(attribute_ids, expand_column(projections, i))))
            for i, a in enumerate(node["output"])
        }
    elif kind == "Union":
        # Union is positional: output column i is, row by row, column i of one branch.
        detail["derives"] = {
            str(a["expr_id"]): sorted({c.output[i].expr_id for c in children if i < len(c.output)})
            for i, a in enumerate(node["output"])
        }
        detail["transforms"] = {str(a["expr_id"]): "IDENTITY" for a in node["output"]}  # rows passed on as they are
    elif kind in ("Join", "LateralJoin"):
        # "none" for a record without a join type: what the IR has always said of one.
        detail["join_type"] = join_type(fields, missing="none")
        if kind == "LateralJoin":  # the subquery's columns are computed from the outer row's it reads
            outer = sorted(attribute_ids(fields.get("right", [])))
            kept = {a.expr_id for a in children[0].output}
            detail["derives"] = {str(a["expr_id"]): outer for a in node["output"] if a["expr_id"] not in kept}
    elif kind == "Alias":
        detail["name"] = _alias_name(fields)
    elif kind == "Source":
        detail["location"] = node.get("location")
        if isinstance(fields.get("sourceName"), str):
            detail["provider"] = fields["sourceName"]
    elif kind == "Unknown" and fields.get("class"):
        detail["spark_class_name"] = fields["class"]
    # What an operator keeps rows by, groups or orders them by: lineage of every output column, not of one
    # (OpenLineage's indirect column lineage; ``column_transformations``).
    indirect: dict[str, set[int]] = {}
    for use, key in _INDIRECT.get(kind, ()):
        indirect.setdefault(use, set()).update(attribute_ids(_flattened(fields.get(key))))
    if any(indirect.values()):
        detail["indirect"] = {use: sorted(ids) for use, ids in indirect.items() if ids}
    output = [Attr(a["name"], a["expr_id"], a["dtype"]) for a in node["output"]]
    return PlanNode(node_id, kind, cls, node["streaming"], output, children, detail)


# Per IR kind: (OpenLineage's indirect transformation, the plan JSON field of the expressions it is done by).
_INDIRECT = {"Filter": (("FILTER", "condition"),), "Join": (("JOIN", "condition"),),
             "Aggregate": (("GROUP_BY", "groupingExpressions"),), "Sort": (("SORT", "order"),),
             "Window": (("WINDOW", "partitionSpec"), ("WINDOW", "orderSpec"))}
# How an attribute is made from those it reads, weakest first (OpenLineage's direct transformation subtypes).
TRANSFORMS = ("IDENTITY", "TRANSFORMATION", "AGGREGATION")


def _flattened(value) -> list:
    """A field's expressions as one flat run of nodes: one flat expression, or a list of them (Spark's JSON)."""
    if not value:
        return []
    return [node for item in value for node in (item if isinstance(item, list) else [item])]


def _transform(named: list) -> str:
    """How the flat expression an alias names makes its value: a column passed on as it is (IDENTITY), an
    aggregate function over rows (AGGREGATION), or anything else computed (TRANSFORMATION)."""
    if len(named) == 1 and is_a(named[0], "AttributeReference"):
        return "IDENTITY"
    if any(is_a(node, "AggregateExpression") for node in named):
        return "AGGREGATION"
    return "TRANSFORMATION"


def _fold_static(node: PlanNode) -> PlanNode:
    """Replace each maximal non-streaming subtree by one static ``Source`` node.

    The folded subtree is kept, as a dict, in ``detail["subtree"]``.
    """
    if not node.streaming:
        detail = {"source": "static", "name": static_name(node), "table": static_table(node),
                  "location": _first_location(node), "locations": static_locations(node)}
        if node.children:
            detail["subtree"] = node.to_dict()
        return PlanNode(node.id, "Source", node.spark_class, False, node.output, [], detail)
    node.children = [_fold_static(c) for c in node.children]
    if node.kind == "Source":
        names = {a.name for a in node.output}
        node.detail["source"] = _stream_source_kind(node, names)
    return node


def _stream_source_kind(node: PlanNode, names: set[str]) -> str:
    """kafka, rate or file, told apart by the rows a stream source produces; else stream."""
    if all(c in names for c in KAFKA_COLUMNS):
        return "kafka"
    if names == set(RATE_COLUMNS) and "rate" in node.detail.get("provider", ""):
        return "rate"
    if node.detail.get("location"):
        return "file"
    return "stream"


def _first_location(node: PlanNode) -> dict | None:
    return next((n.detail.get("location") for n in node.walk() if n.detail.get("location")), None)


def static_name(node: PlanNode) -> str:
    """A static subtree's short name, as people call it: its alias, else its file name, else its node id.

    Only a name: two tables may share it (``prod/customers``, ``staging/customers``);
    ``static_table`` tells them apart.
    """
    for n in node.walk():
        if n.kind == "Alias" and n.detail.get("name"):
            return n.detail["name"]
        location = n.detail.get("location") or {}
        if location.get("table"):
            return location["table"].rsplit(".", 1)[-1]
        if location.get("paths"):
            tail = location["paths"][0].rstrip("/").rsplit("/", 1)[-1]
            return tail.split(".", 1)[0] or f"static_{node.id}"
    return f"static_{node.id}"


def static_locations(node: PlanNode) -> list[dict]:
    """Every file-backed relation a static subtree reads: where a batch's versions of it are taken."""
    return [n.detail["location"] for n in node.walk() if (n.detail.get("location") or {}).get("paths")]


def location_key(location: dict) -> str:
    """A file-backed relation's name in a batch's table versions: its root paths."""
    return ",".join(location["paths"])


def static_table(node: PlanNode) -> str | None:
    """A static subtree's identity: where the rows of every relation it reads live.

    A file-backed relation is its root paths as Spark resolved them (``file:/data/v1/sites.parquet``),
    a catalog table its qualified name (``catalog:spark_catalog.prod.customers``); several are
    joined by commas, sorted. None when a relation has no such place (rows made in memory,
    ``range``): such a table is known only within its query.
    """
    found = set()
    for n in node.walk():
        if n.children:
            continue
        location = n.detail.get("location") or {}
        if location.get("table"):
            found.add(f"catalog:{location['table']}")
        elif location.get("paths"):
            found.update(location["paths"])
        else:
            return None
    return ",".join(sorted(found)) or None


def derivation(root: PlanNode) -> dict[int, set[int]]:
    """exprId → exprIds it is computed from, for every attribute an operator makes."""
    derives: dict[int, set[int]] = {}
    for node in root.walk():
        for out_id, inputs in node.detail.get("derives", {}).items():
            inputs = set(inputs) - {int(out_id)}
            if inputs:
                derives.setdefault(int(out_id), set()).update(inputs)
    return derives


def lineage_leaves(root: PlanNode) -> list[PlanNode]:
    """Sources and black boxes: the nodes lineage edges start from."""
    return [n for n in root.walk() if n.kind in ("Source", "BlackBox")]


def column_masks(root: PlanNode) -> dict[int, int]:
    """Per source or black-box node id: bitmask over the root's output columns derived from it.

    Bit i is set when output column i reads, through any chain of projections, an
    attribute the source produces (TensProv's attribute mask). Columns past 63 share
    bit 63, so a mask is never narrower than the truth.
    """
    masks = {}
    for source, columns in column_lineage(root).items():
        mask = 0
        for i, read in enumerate(columns):
            if read:
                mask |= 1 << min(i, 63)
        masks[source] = mask - (1 << 64) if mask >= 1 << 63 else mask
    return masks


def column_lineage(root: PlanNode) -> dict[int, list[list[str]]]:
    """Per source or black-box node id: for each of the root's output columns, the names
    of that source's columns it is computed from (empty: none of them)."""
    derives, transforms = derivation(root), _transforms(root)
    column_reads = [set(_reached(a.expr_id, derives, transforms)) for a in root.output]
    lineage = {}
    for source in lineage_leaves(root):
        name_of = {a.expr_id: a.name for a in source.output}
        lineage[source.id] = [sorted({name_of[i] for i in reads if i in name_of}) for reads in column_reads]
    return lineage


def _transforms(root: PlanNode) -> dict[int, str]:
    """exprId → how the operator making it makes it (``TRANSFORMS``), where the IR says."""
    return {int(out): kind for node in root.walk() for out, kind in node.detail.get("transforms", {}).items()}


def _reached(start: int, derives: dict[int, set[int]], transforms: dict[int, str]) -> dict[int, str]:
    """Every attribute ``start`` is computed from (``derivation``), itself included, with the strongest
    transformation on any way there."""
    best: dict[int, str] = {}
    stack = [(start, "IDENTITY")]
    while stack:
        expr_id, kind = stack.pop()
        if expr_id in best and TRANSFORMS.index(best[expr_id]) >= TRANSFORMS.index(kind):
            continue
        best[expr_id] = kind
        step = transforms.get(expr_id, "TRANSFORMATION" if expr_id in derives else "IDENTITY")
        onward = TRANSFORMS[max(TRANSFORMS.index(kind), TRANSFORMS.index(step))]
        stack.extend((i, onward) for i in derives.get(expr_id, ()))
    return best


def column_transformations(root: PlanNode) -> dict:
    """OpenLineage's column lineage of the root's output: ``{"direct": [per output column: {source or black box
    node id: {its column: transformation}}], "indirect": {node id: {its column: [indirect transformations]}}}``.

    A direct transformation is the strongest made on any way from the source's column to the output column
    (``TRANSFORMS``: a column renamed stays IDENTITY, one computed from is TRANSFORMATION, one aggregated
    AGGREGATION). An indirect one is a source column that decides which rows there are or where they go (a
    filter's condition, a join's, a grouping, an order, a window's), so every output column depends on it.
    """
    derives, transforms = derivation(root), _transforms(root)
    leaves = lineage_leaves(root)

    def by_leaf(found: dict[int, Any], through_box: Callable[[list], Any]) -> dict[int, dict[str, Any]]:
        """``found`` (exprId → how) by leaf and column name; a black box's columns found stand for every column of
        the sources under it (what the user's function read), each ``through_box(how its columns were found)``."""
        named: dict[int, dict[str, Any]] = {}
        for leaf in leaves:
            columns = {a.name: found[a.expr_id] for a in leaf.output if a.expr_id in found}
            if columns:
                named.setdefault(leaf.id, {}).update(columns)
            if columns and leaf.kind == "BlackBox":
                how = through_box(list(columns.values()))
                for source in leaf.sources():
                    named.setdefault(source.id, {}).update({a.name: how for a in source.output})
        return named

    def opaque(kinds: list) -> str:
        return max([*kinds, "TRANSFORMATION"], key=TRANSFORMS.index)

    direct = [by_leaf(_reached(a.expr_id, derives, transforms), opaque) for a in root.output]
    uses: dict[int, set[str]] = {}
    for node in root.walk():
        for use, ids in node.detail.get("indirect", {}).items():
            for read in ids:
                for found in _reached(read, derives, transforms):
                    uses.setdefault(found, set()).add(use)
    indirect = {leaf: {column: sorted(found) for column, found in columns.items()}
                for leaf, columns in by_leaf(uses, lambda found: set().union(*found)).items()}
    return {"direct": direct, "indirect": indirect}


def plan_fingerprint(analyzed_json: str, places: Sequence[str] = ()) -> str:
    """A digest of an analyzed plan (``toJSON()``) and of where its relations' rows live
    (``places``: Spark's JSON leaves file locations out) that is equal for equal plans across runs.

    Spark numbers attributes (exprIds) afresh in every session; here they are renumbered
    in order of first appearance, so only what the plan computes, and from where, counts.
    """
    numbers: dict[str, int] = {}

    def renumber(match: re.Match) -> str:
        return f'"exprId":{numbers.setdefault(match.group(1), len(numbers))}'

    text = EXPR_ID.sub(renumber, analyzed_json) + "\n".join(sorted(places))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def places(root: PlanNode) -> list[str]:
    """Where the rows of an IR's static tables (``static_table``) and file streams live, each once."""
    found = set()
    for node in root.walk():
        if node.detail.get("table"):
            found.update(node.detail["table"].split(","))
        elif node.kind == "Source":
            found.update((node.detail.get("location") or {}).get("paths") or [])
    return sorted(found)
