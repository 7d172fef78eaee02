"""Precise mode (PredTrace §3–§5, Algorithm 1): save the intermediate results the pushdown
needs, and trace exactly.

Where z3 cannot prove an operator's pushdown exact, what reached the operator is too weak
a predicate: TPC-H Q4's semi join sees only ``o_orderpriority = v`` and can tell nothing
of which line items matched. Precise mode saves that operator's output while the pipeline
runs (``save``). A question then selects, among the saved rows, those the weak predicate
picks (they are the traced row's lineage at that point), and pushes on, below the
operator, the row-selection predicate of those rows (``o_orderkey = v₀ ∧ …``), which
Lemma 3.1 makes exact. ``plan_saves`` chooses the operators top-down, as Algorithm 1
does: saving one changes what reaches those below it, so each round verifies again.

A plan is cut at the saved operators into segments; every predicate in a segment has, as
parameters, the columns of its top (the traced row for the root's segment, the selected
saved rows below). Running a predicate whose parameters range over several rows is a
join of the table with those rows on the predicate (``select``): a hash join on its
equalities, the rest checked pair by pair.

An operator that stays doubtful with a row selection above it (one this package cannot
verify, an unmodelled one) keeps its reasons: such answers are flagged supersets.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from headwater.spark.expr import TRUE, Expr, cmp, col, col_id, column, conj, conjuncts, param, refs, str_value
from headwater.spark.operators import Aggregate, Op, Plan, Relation, Unknown
from headwater.spark.plan_json import Attr

from .evaluate import Binding, NotEvaluable, evaluate, holds, value_key
from .pushdown import Pushed, push_down
from .refine import Inferred, judge
from .run import CROSS_LIMIT, Running, Tables, relation_frame


def row_selection(op: Op) -> Expr:
    """The predicate selecting ``op``'s output rows equal to one of the rows its parameters range over."""
    return conj(cmp("<=>", col(a.expr_id, a.name, a.dtype), param(_name(op, a.expr_id), a.dtype)) for a in op.output)


def _name(op: Op, expr_id: int) -> str:
    return f"s{op.id}.{expr_id}"


@dataclass
class Precise:
    """A plan's precise mode: which operators to save, and the pushdown with those saved."""

    plan: Plan
    saves: list[int]  # op ids, in pre-order
    pushed: Pushed
    reasons: list[str]  # why answers may still be supersets
    unsound: set[int]
    segment: dict[int, int]  # op id → the op whose row selection its predicates are parameterised by


def plan_saves(plan: Plan) -> Precise:
    """Algorithm 1: push the row selection down; where an operator's pushdown is not proven
    exact, save its output and push its row selection instead; verify again, until no
    operator that saving can help is left doubtful."""
    plan = copy.deepcopy(plan)  # saved aggregates gain columns
    roots = [plan.root] + [sub.root for sub in plan.subqueries.values()]
    saves: list[int] = []
    top = {plan.root.id: row_selection(plan.root)}
    while True:
        selections = {**top, **{s: row_selection(_op(plan, s)) for s in saves}}
        pushed = push_down(plan, TRUE, saved=selections)
        judged = judge(plan, pushed, pushed.inexact)
        # Saving a root's output, or an unmodelled operator's, would change nothing.
        doubtful = set(judged.doubtful) - set(saves) - {r.id for r in roots}
        new = [op_id for r in roots for op_id in _topmost(r, doubtful) if not isinstance(_op(plan, op_id), Unknown)]
        if not new:
            break
        for op_id in new:
            _keep_keys(_op(plan, op_id))
        saves = [op.id for op in plan.operators() if op.id in saves or op.id in new]
    segment: dict[int, int] = {}

    def visit(op: Op, current: int) -> None:
        segment[op.id] = current
        below = op.id if op.id in saves or op.id == plan.root.id else current
        for child in op.children:
            visit(child, below)

    visit(plan.root, plan.root.id)
    for sub in plan.subqueries.values():  # no parameters: a scalar subquery's lineage is its whole input
        visit(sub.root, -1)
    return Precise(plan, saves, pushed, judged.reasons, judged.unsound, segment)


def _keep_keys(op: Op) -> None:
    """A saved aggregate keeps its grouping columns (PredTrace §5): its row selection must
    name each row's group, which its output may have projected away (Q13's inner count)."""
    if not isinstance(op, Aggregate):
        return
    have = {a.expr_id for a in op.output}
    for g in op.groups:
        if g.op == "col" and col_id(g) not in have:
            expr_id, name = column(g)
            attr = Attr(name, expr_id, g.dtype or "")
            op.items.append((attr, g))
            op.output.append(attr)
            have.add(attr.expr_id)


def _op(plan: Plan, op_id: int) -> Op:
    return next(op for op in plan.operators() if op.id == op_id)


def _topmost(root: Op, doubtful: set[int]) -> list[int]:
    """The doubtful operators with no doubtful operator above them (none are saved yet)."""
    found: list[int] = []

    def visit(op: Op) -> None:
        if op.id in doubtful:
            found.append(op.id)
            return
        for child in op.children:
            visit(child)

    visit(root)
    return found


@dataclass
class Saved:
    """The intermediate results one run of the pipeline saved for precise mode."""

    frames: dict[int, pd.DataFrame]  # saved op id → its output rows, columns by exprId
    scalars: dict[int, object] = field(default_factory=dict)  # scalar subqueries' values in that run
    seconds: float = 0.0

    @property
    def rows(self) -> int:
        return sum(len(f) for f in self.frames.values())


class _Memo(Running):
    """A run that computes each operator once, so nested saved operators cost one pass."""

    def __init__(self, plan: Plan, tables: Tables):
        self.memo: dict[int, pd.DataFrame] = {}
        super().__init__(plan, tables)

    def run(self, op: Op) -> pd.DataFrame:
        if op.id not in self.memo:
            self.memo[op.id] = super().run(op)
        return self.memo[op.id]


def save(precise: Precise, tables: Tables) -> Saved:
    """The pipeline's run with the saves inserted: the saved operators' outputs."""
    started = time.monotonic()
    running = _Memo(precise.plan, tables)
    frames = {s: running.run(_op(precise.plan, s)) for s in precise.saves}
    return Saved(frames, dict(running.bind.scalars), time.monotonic() - started)


def trace(precise: Precise, saved: Saved, values: list, tables: Tables) -> Inferred:
    """The lineage of the output row ``values``, from the saved results and the source tables."""
    started = time.monotonic()
    plan = precise.plan
    bind = Binding({}, {}, dict(saved.scalars))
    reasons = list(precise.reasons)
    names = [_name(plan.root, a.expr_id) for a in plan.root.output]
    tops: dict[int, pd.DataFrame] = {
        plan.root.id: pd.DataFrame({n: [v] for n, v in zip(names, values)}),
        -1: pd.DataFrame(index=range(1)),
    }
    rows: dict[int, np.ndarray] = {}
    for op in plan.operators():
        top = tops[precise.segment[op.id]]
        if op.id in precise.saves:
            frame = saved.frames[op.id]
            chosen, dropped = select(frame, precise.pushed.selects[op.id], top, bind)
            tops[op.id] = pd.DataFrame({_name(op, a.expr_id): frame[a.expr_id].to_numpy(dtype=object)[chosen]
                                        for a in op.output})
        elif isinstance(op, Relation):
            frame = relation_frame(op, tables(op))
            if op.id in precise.unsound:
                rows[op.id], dropped = np.arange(len(frame)), []
            else:
                rows[op.id], dropped = select(frame, precise.pushed.at[op.id], top, bind)
        else:
            continue
        reasons += [f"op {op.id}: cannot evaluate {c}" for c in dropped]
    return Inferred(rows, not reasons, reasons, 0, time.monotonic() - started,
                    predicates={op.id: repr(precise.pushed.at[op.id]) for op in plan.operators()
                                if isinstance(op, Relation)})


def select(frame: pd.DataFrame, predicate: Expr, tops: pd.DataFrame, bind: Binding) -> tuple[np.ndarray, list[Expr]]:
    """Positions of ``frame``'s rows ``predicate`` holds for with its parameters bound to
    some row of ``tops`` (one column per parameter), and the conjuncts that could not run."""
    names = sorted({str_value(n) for n in predicate.walk() if n.op == "param"})
    ids = {name: -1 - k for k, name in enumerate(names)}  # parameters become columns no exprId uses
    bound = _columns(predicate, ids)
    keys = _equalities(bound, set(ids.values()), set(frame.columns))
    outer = pd.DataFrame({ids[n]: tops[n].to_numpy(dtype=object) for n in names}, index=range(len(tops)))
    try:
        left, right = _pairs(frame, outer, keys, bind)
    except NotEvaluable:
        return np.arange(len(frame)), [predicate]
    joined = frame.iloc[left].reset_index(drop=True)
    for param_id in outer.columns:
        joined[param_id] = outer[param_id].to_numpy(dtype=object)[right]
    passing = np.ones(len(joined), dtype=bool)
    dropped = []
    for c in conjuncts(bound):
        try:
            passing &= holds(c, joined, bind)
        except NotEvaluable:
            dropped.append(c)
    return np.unique(left[passing]), dropped


def _columns(e: Expr, ids: dict[str, int]) -> Expr:
    if e.op == "param":
        name = str_value(e)
        return col(ids[name], name, e.dtype)
    if not e.args:
        return e
    return Expr(e.op, tuple(_columns(a, ids) for a in e.args), e.value, e.dtype)


def _equalities(e: Expr, params: set[int], own: set) -> list[tuple[Expr, int]]:
    """(expression over the table, parameter column) of each conjunct equating them."""
    found = []
    for c in conjuncts(e):
        if c.op not in ("=", "<=>"):
            continue
        for a, b in (c.args, c.args[::-1]):
            if b.op == "col" and col_id(b) in params and refs(a) and refs(a) <= own:
                found.append((a, col_id(b)))
                break
    return found


def _pairs(frame: pd.DataFrame, outer: pd.DataFrame, keys: list[tuple[Expr, int]], bind: Binding) \
        -> tuple[np.ndarray, np.ndarray]:
    """(frame position, outer position) of the pairs that agree on ``keys`` (all pairs if none)."""
    if not keys:
        if len(frame) * len(outer) > CROSS_LIMIT:
            raise NotEvaluable(f"a parameterised predicate with no equality over {len(frame)} × {len(outer)} rows")
        return np.repeat(np.arange(len(frame)), len(outer)), np.tile(np.arange(len(outer)), len(frame))
    try:
        mine = list(zip(*[evaluate(own, frame, bind).to_numpy(dtype=object) for own, _ in keys]))
    except NotEvaluable:
        return _pairs(frame, outer, [], bind)
    theirs = zip(*[outer[column].to_numpy(dtype=object) for _, column in keys])
    where: dict[tuple, list[int]] = {}
    for j, key in enumerate(theirs):
        where.setdefault(tuple(value_key(v) for v in key), []).append(j)
    left, right = [], []
    for i, key in enumerate(mine):
        for j in where.get(tuple(value_key(v) for v in key), ()):
            left.append(i)
            right.append(j)
    return np.array(left, dtype=int), np.array(right, dtype=int)
