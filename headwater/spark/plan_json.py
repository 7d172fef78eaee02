"""The plan decoder: reading Spark's plan JSON (``TreeNode.toJSON()``) and capture's records of a plan.

Spark writes a plan, and each expression in it, as one flat list of nodes in pre-order: each node
has its class (in full) and ``num-children``, and its children's subtrees follow it, in order.
Capture logs a plan as records (``headwater.core.plan.RawNode``), one per node in pre-order, each
with ``num_children``, its simple ``spark_class`` and its node's own entry of that JSON as ``fields``;
a scalar subquery's plan inside an expression stays Spark's bare list. An attribute is known by its
exprId (``"exprId": {"product-class": …, "id": 7, "jvmId": …}``), never by its name.

Three readers share this reading: the plan IR (``headwater.core.plan``, built in capture's driver),
inference's expressions and operators (``headwater.spark.expr``, ``headwater.spark.operators``),
which raise on JSON they cannot read, and explain (``headwater.query.explain``), which names what
it can of a kept plan and never raises: it reads with ``expr_id_or_none`` and ``flat_tree_or_none``.

Standard library only: capture's driver and the CLI import it through the plan IR.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence, TypeVar

from .catalyst import simple_name

T = TypeVar("T")

# An exprId as it stands in the text of Spark's JSON, its number the group: what a plan's fingerprint renumbers.
EXPR_ID = re.compile(r'"exprId":\{"product-class":"[^"]*","id":(\d+),"jvmId":"[^"]*"\}')


@dataclass(frozen=True)
class Attr:
    """An attribute of a plan node's output: its name, its exprId (what it is) and its type's name."""

    name: str
    expr_id: int
    dtype: str


def expr_id(node: dict) -> int:
    """The exprId of an expression node: the attribute it reads, or makes (an alias, a scalar subquery)."""
    return int(node["exprId"]["id"])


def expr_id_or_none(node: object) -> int | None:
    """``expr_id`` of anything read from a kept plan: None where it is not a node with an exprId."""
    if isinstance(node, dict) and isinstance(node.get("exprId"), dict):
        return node["exprId"].get("id")
    return None


def is_a(node: object, spark_class: str) -> bool:
    """Whether ``node`` is a node of Spark's JSON of that class (its simple name: ``Alias``)."""
    return isinstance(node, dict) and simple_name(node.get("class", "")) == spark_class


def attribute_ids(flat: list | None) -> set[int]:
    """The exprIds of the attributes a flat expression (or any run of its nodes) reads."""
    # Spark's JSON gives null for an expression it cannot write (unpivot's).
    return {expr_id(node) for node in flat or () if is_a(node, "AttributeReference")}


# What computes an attribute ---------------------------------------------------------------

def named_expressions(fields: dict) -> list:
    """The flat expressions a Project (``projectList``) or an Aggregate (``aggregateExpressions``) computes its
    output columns with, each an attribute passed on or an alias; none for another node."""
    return fields.get("projectList", []) + fields.get("aggregateExpressions", [])


def aliases(named: list) -> Iterator[tuple[dict, list]]:
    """The aliases among ``named`` (``named_expressions``): each alias's node, whose exprId is the attribute it
    makes, and the flat expression it names."""
    for flat in named:
        if flat and is_a(flat[0], "Alias"):
            yield flat[0], flat[1:]


def expand_column(projections: list, i: int) -> list:
    """What computes an Expand's output column ``i``, row by row: column ``i`` of each of its ``projections``."""
    return [projection[i] for projection in projections if i < len(projection)]


# Flat pre-order lists as trees -------------------------------------------------------------

def flat_tree(items: Sequence, make: Callable[[Any, list[T]], T]) -> T:
    """The tree of one expression given as Spark's flat pre-order list: ``make(node, children)`` builds each
    node once its children are built. ValueError unless the list is exactly one tree."""
    return _whole(items, _expression_children, lambda _, node, children: make(node, children), "expression nodes")


def flat_tree_or_none(items: Sequence | None, make: Callable[[Any, list[T]], T]) -> T | None:
    """``flat_tree`` for a reader that must not raise: None for no items or a list that ends inside a node, a
    node that is not a dict taken as a leaf, and what follows the root's subtree left unread."""
    if not items:
        return None
    try:
        return _subtree(items, 0, _expression_children, lambda _, node, children: make(node, children),
                        "expression nodes")[0]
    except ValueError:
        return None


def plan_tree(records: Sequence[Any], make: Callable[[int, Any, list[T]], T]) -> T:
    """The tree of a plan given as its nodes in pre-order: capture's records, or Spark's own JSON of a plan.
    ``make(index, node, children)`` builds each node once its children are built; ``index``, its place in
    the list, numbers the nodes in pre-order. ValueError unless the nodes form exactly one tree."""
    return _whole(records, record_children, make, "plan records")


def record_fields(record: dict) -> dict:
    """A plan node's own entry of Spark's JSON: a capture record's ``fields``, or the node itself."""
    return record.get("fields", record)


def record_children(record: dict) -> int:
    """How many children a plan node has: a capture record's ``num_children``, else its JSON's ``num-children``."""
    return int(record.get("num_children", record_fields(record).get("num-children", 0)))


def _expression_children(node: Any) -> int:
    return int(node.get("num-children", 0)) if isinstance(node, dict) else 0


def _whole(items: Sequence, count: Callable[[Any], int], make: Callable[[int, Any, list[T]], T], what: str) -> T:
    root, end = _subtree(items, 0, count, make, what)
    if end != len(items):
        raise ValueError(f"{what} do not form one tree ({len(items) - end} left over)")
    return root


def _subtree(items: Sequence, start: int, count: Callable[[Any], int], make: Callable[[int, Any, list[T]], T],
             what: str) -> tuple[T, int]:
    """The subtree whose root is ``items[start]``, and the position of the item after it."""
    if start >= len(items):
        raise ValueError(f"{what} end inside the tree (a node has fewer children than it says)")
    node = items[start]
    children = []
    end = start + 1
    for _ in range(count(node)):
        child, end = _subtree(items, end, count, make, what)
        children.append(child)
    return make(start, node, children), end
