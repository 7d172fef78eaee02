"""A logged optimized plan as operators: the plan decoder's view for inference, whose pushdown
(``headwater.query.infer.pushdown``) reasons about them.

Read from the records ``capture/spark_plan.py`` takes off Spark (pre-order, each with
Spark's own JSON of the node) or from the JSON Spark embeds for a scalar subquery's plan,
through ``plan_json``; which classes are relations, and which pass their input on, is
``catalyst``'s. Every operator knows its output attributes; expressions are ``expr.Expr``
trees. A node this module does not model becomes ``Unknown``: pushdown sends ``true`` (its
whole input, a flagged superset) through it, never a guess.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

from . import catalyst, plan_json
from .expr import Expr, Subqueries, col, column, int_value, parse, type_name
from .plan_json import Attr, expr_id


# Subclasses' fields follow ``children``, which has a default: one with none to give is keyword-only (``kw_only``).
@dataclass
class Op:
    id: int
    kind: str
    output: list[Attr]
    children: list["Op"] = field(default_factory=list)

    def walk(self) -> Iterator["Op"]:
        yield self
        for c in self.children:
            yield from c.walk()

    def relations(self) -> list["Relation"]:
        return [o for o in self.walk() if isinstance(o, Relation)]


@dataclass
class Relation(Op):
    spark_class: str = ""
    location: dict | None = None
    streaming: bool = False


@dataclass
class Project(Op):
    items: list[tuple[Attr, Expr]] = field(default_factory=list)


@dataclass(kw_only=True)
class Filter(Op):
    condition: Expr


@dataclass
class Join(Op):
    join_type: str = "inner"
    condition: Expr | None = None


@dataclass
class Aggregate(Op):
    groups: list[Expr] = field(default_factory=list)
    items: list[tuple[Attr, Expr]] = field(default_factory=list)


@dataclass
class Sort(Op):
    order: list[Expr] = field(default_factory=list)


@dataclass
class Limit(Op):
    n: int = 0


@dataclass
class Union(Op):
    pass


@dataclass
class Deduplicate(Op):
    keys: list[int] = field(default_factory=list)


@dataclass
class Window(Op):
    """Its input's rows, each with window functions over its partition. One partition and
    order for all of them (Spark makes one Window per specification); frames may differ."""

    partition: list[Expr] = field(default_factory=list)
    order: list[Expr] = field(default_factory=list)
    items: list[tuple[Attr, Expr]] = field(default_factory=list)  # (attribute, ``window``(function, spec))


@dataclass(kw_only=True)
class WindowGroupLimit(Op):
    """The rows of each partition whose rank-like ``function`` is at most ``limit``: what the
    optimizer puts under a Window whose rank a filter above bounds."""

    partition: list[Expr] = field(default_factory=list)
    order: list[Expr] = field(default_factory=list)
    function: Expr
    limit: int = 0


@dataclass(kw_only=True)
class Generate(Op):
    """Each input row joined with the rows its ``generator`` (explode, posexplode, inline)
    yields; an ``outer`` one keeps a row that yields none, with NULLs."""

    generator: Expr
    outer: bool = False
    generated: list[Attr] = field(default_factory=list)


@dataclass
class Expand(Op):
    """One output row per input row and projection (ROLLUP, CUBE, GROUPING SETS, several
    distinct aggregates): ``projections[p][i]`` computes output column ``i``."""

    projections: list[list[Expr]] = field(default_factory=list)


@dataclass
class Unknown(Op):
    spark_class: str = ""


@dataclass
class Plan:
    """A query's optimized plan, with the plans of its uncorrelated scalar subqueries."""

    root: Op
    subqueries: dict[int, "Plan"] = field(default_factory=dict)

    def operators(self) -> Iterator[Op]:
        yield from self.root.walk()
        for sub in self.subqueries.values():
            yield from sub.operators()


def _attr(flat: list[dict]) -> Attr:
    node = flat[0]
    dtype = node.get("dataType")
    return Attr(node.get("name", ""), expr_id(node), dtype if isinstance(dtype, str) else "")


def _named(flat: list[dict], subqueries: Subqueries) -> tuple[Attr, Expr]:
    """An output column of a Project or Aggregate: its attribute and what computes it."""
    e = parse(flat, subqueries)
    if e.op == "alias":
        eid, name = column(e)
        return Attr(name, eid, e.dtype or ""), e.args[0]
    if e.op == "col":
        eid, name = column(e)
        return Attr(name, eid, e.dtype or ""), e
    raise ValueError(f"an output column that is neither an attribute nor an alias: {e}")


def build(nodes: list[dict], first_id: int = 0) -> Plan:
    """The operators of a plan given in pre-order: capture's records (with ``fields``) or Spark's JSON.

    Operator ids run in pre-order from ``first_id``, then on through the subqueries' plans,
    so they are unique in the whole plan.
    """
    subqueries = Subqueries()

    def operator(index: int, record: dict, children: list[Op]) -> Op:
        fields = plan_json.record_fields(record)
        cls = record.get("spark_class") or catalyst.simple_name(fields.get("class", ""))
        logged = None
        if "output" in record and isinstance(record["output"][:1] and record["output"][0], dict):
            logged = [Attr(a["name"], a["expr_id"], type_name(a["dtype"]) or "") for a in record["output"]]
        op = _operator(first_id + index, cls, fields, children, subqueries, record)
        if logged is not None:
            op.output = logged
        return op

    root = plan_json.plan_tree(nodes, operator)
    # Capture logs a subquery's plan as records of its own (with relations' locations);
    # Spark's JSON of the expression holds a bare copy, used when those are missing.
    logged = {int(k): v for record in nodes for k, v in record.get("subqueries", {}).items()}
    plan = Plan(root)
    next_id = first_id + len(nodes)
    for sid, spark_json in subqueries.plans.items():
        sub = build(logged.get(sid, spark_json), next_id)
        next_id = max(op.id for op in sub.operators()) + 1
        plan.subqueries[sid] = sub
    return plan


def _operator(node_id: int, cls: str, fields: dict, children: list[Op], subqueries: Subqueries,
              record: dict) -> Op:
    first = children[0].output if children else []
    if cls in catalyst.OPTIMIZED_RELATIONS:
        output = [_attr(a) for a in fields.get("output", []) if a]
        return Relation(node_id, "Relation", output, [], spark_class=cls, location=record.get("location"),
                        streaming=bool(record.get("streaming", fields.get("isStreaming", False))))
    if cls in catalyst.PASS_THROUGH and len(children) == 1:
        return Project(node_id, "Project", list(first), children, items=[(a, col(a.expr_id, a.name, a.dtype))
                                                                        for a in first])
    if cls == "Project":
        items = [_named(e, subqueries) for e in plan_json.named_expressions(fields)]
        return Project(node_id, "Project", [a for a, _ in items], children, items=items)
    if cls == "Filter":
        return Filter(node_id, "Filter", list(first), children, condition=parse(fields["condition"], subqueries))
    if cls == "Join":
        join_type = catalyst.join_type(fields)
        condition = parse(fields["condition"], subqueries) if fields.get("condition") else None
        if join_type in ("leftsemi", "leftanti"):
            output = list(first)
        else:
            output = list(first) + list(children[1].output)
        if join_type not in catalyst.JOIN_TYPES:
            return Unknown(node_id, "Unknown", output, children, spark_class=f"Join {join_type}")
        return Join(node_id, "Join", output, children, join_type=join_type, condition=condition)
    if cls == "Aggregate":
        items = [_named(e, subqueries) for e in plan_json.named_expressions(fields)]
        groups = [parse(g, subqueries) for g in fields.get("groupingExpressions", [])]
        return Aggregate(node_id, "Aggregate", [a for a, _ in items], children, groups=groups, items=items)
    if cls == "Sort":
        return Sort(node_id, "Sort", list(first), children, order=[parse(o, subqueries) for o in fields["order"]])
    if cls in ("GlobalLimit", "LocalLimit"):
        n = int_value(parse(fields["limitExpr"]))
        return Limit(node_id, "Limit", list(first), children, n=n)
    if cls == "Union":
        return Union(node_id, "Union", list(first), children)
    if cls in ("Deduplicate", "Distinct"):
        keys = [_attr(k).expr_id for k in fields.get("keys", [])] or [a.expr_id for a in first]
        return Deduplicate(node_id, "Deduplicate", list(first), children, keys=keys)
    if cls == "Window":
        return _window(node_id, fields, children, subqueries)
    if cls == "WindowGroupLimit":
        return WindowGroupLimit(node_id, "WindowGroupLimit", list(first), children,
                                partition=[parse(p, subqueries) for p in fields.get("partitionSpec", [])],
                                order=[parse(o, subqueries) for o in fields.get("orderSpec", [])],
                                function=parse(fields["rankLikeFunction"], subqueries), limit=int(fields["limit"]))
    if cls == "Generate":
        generated = [_attr(a) for a in fields.get("generatorOutput", [])]
        unrequired = set(fields.get("unrequiredChildIndex") or ())
        kept = [a for i, a in enumerate(first) if i not in unrequired]
        return Generate(node_id, "Generate", kept + generated, children,
                        generator=parse(fields["generator"], subqueries), outer=bool(fields.get("outer")),
                        generated=generated)
    if cls == "Expand":
        projections = [[parse(e, subqueries) for e in p] for p in fields.get("projections", [])]
        return Expand(node_id, "Expand", [_attr(a) for a in fields.get("output", [])], children,
                      projections=projections)
    return Unknown(node_id, "Unknown", list(first), children, spark_class=cls)


def _window(node_id: int, fields: dict, children: list[Op], subqueries: Subqueries) -> Op:
    """A Window, or an ``Unknown`` when an item is not one aliased window function."""
    first = children[0].output
    items = [_named(e, subqueries) for e in fields.get("windowExpressions", [])]
    output = list(first) + [a for a, _ in items]
    if any(e.op != "window" for _, e in items):
        return Unknown(node_id, "Unknown", output, children, spark_class="Window")
    return Window(node_id, "Window", output, children,
                  partition=[parse(p, subqueries) for p in fields.get("partitionSpec", [])],
                  order=[parse(o, subqueries) for o in fields.get("orderSpec", [])], items=items)
