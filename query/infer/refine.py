"""Lineage of one output row from the plan and the source data alone (PredTrace Algorithm 3).

1. Push the row-selection predicate of the traced row down to every relation.
2. Push row-value predicates up: each relation attribute lies in a value-set variable,
   and equi-joins make keys lie in each other's variables.
3. Push the row-selection predicate down again, with those facts at every operator, so
   each relation's predicate names the key values of the relations it joins.
4. Run: each relation's phase-1 predicate gives its first candidates and the variables'
   first values; then each relation's phase-3 predicate is run with the other relations'
   current values, until no candidate set shrinks (a fixpoint: sets only shrink).

Candidates always contain the exact lineage: every step only drops rows no derivation of
the traced row can use (an input z3 cannot prove sound is read whole). The answer is
``exact`` when z3 proved every operator's pushdown exact (``verify.py``; ``prepare`` does
that once per plan) and every conjunct that reached a relation could be evaluated there;
otherwise it is a ``superset`` and says why.

A superset is then narrowed by replaying the plan over the candidates, carrying lineage
(``run.py``, ``_replay``): where the replay reproduces the traced row, its lineage still
contains the exact one and is often smaller. It is kept only then, and still called a
superset.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from headwater.spark.expr import TRUE, Expr, cmp, col, conj, conjuncts, param, set_vars
from headwater.spark.operators import Join, Plan, Relation, Unknown

from .evaluate import Binding, NotEvaluable, distinct_values, holds, objects, value_key
from .pushdown import Pushed, parse_var, push_down, push_up
from .run import LINEAGE, Running, Tables, relation_frame
from .verify import key_facts, verify

MAX_ITERATIONS = 32


@dataclass
class Inferred:
    """The inferred lineage of one output row: row positions per relation of the plan."""

    rows: dict[int, np.ndarray]  # relation op id → positions in its table, sorted
    exact: bool
    reasons: list[str] = field(default_factory=list)  # why it may be a superset
    iterations: int = 0
    seconds: float = 0.0
    replayed: bool = False
    predicates: dict[int, str] = field(default_factory=dict)  # relation op id → the predicate run there


def row_selection(plan: Plan, values: list) -> tuple[Expr, dict[str, object]]:
    """The predicate selecting output rows equal to ``values`` (null-safe), and its parameters."""
    parts, bound = [], {}
    for i, (attr, value) in enumerate(zip(plan.root.output, values)):
        name = f"out{i}"
        parts.append(cmp("<=>", col(attr.expr_id, attr.name, attr.dtype), param(name, attr.dtype)))
        bound[name] = value
    return conj(parts), bound


def _runnable(predicate: Expr, frame: pd.DataFrame, bind: Binding, own: int) -> tuple[Expr, list[Expr]]:
    """The conjuncts of ``predicate`` that can run on ``frame`` (facts on the relation's own
    variables left out: its candidates satisfy them by construction), and those that cannot."""
    kept, dropped = [], []
    probe = frame.head(0)
    for c in conjuncts(predicate):
        if any(parse_var(v)[0] == own for v in set_vars(c)):
            continue
        try:
            holds(c, probe, Binding(bind.params, {v: frozenset() for v in set_vars(c)}, bind.scalars))
            kept.append(c)
        except NotEvaluable:
            dropped.append(c)
    return conj(kept), dropped


@dataclass
class Judged:
    """What z3 and the rules say of every operator's pushdown in one pushed plan."""

    reasons: list[str]  # why answers may be supersets, whatever the row
    unsound: set[int]  # relations under an operator whose pushdown z3 could not prove sound
    doubtful: list[int]  # operators not proven sound and exact, in pre-order


def judge(plan: Plan, pushed: Pushed, static: dict[int, str]) -> Judged:
    """Verify each operator's pushdown (``verify.py``); ``static`` holds the rules' own doubts."""
    judged = Judged([], set(), [])
    for op in plan.operators():
        if isinstance(op, Relation):
            continue
        facts_of = key_facts(op, pushed.sent[op.id]) if isinstance(op, Join) else None
        verdicts = verify(op, pushed.at[op.id], pushed.sent[op.id], facts_of)
        proven = all(v.sound and v.exact for v in verdicts)
        if not proven:
            judged.doubtful.append(op.id)
        if op.id in static and not proven:
            judged.reasons.append(f"op {op.id}: {static[op.id]}")  # z3 proving the operator exact settles the doubt
        for c, verdict in enumerate(verdicts):
            what = f"op {op.id} ({getattr(op, 'join_type', '') or op.kind}) input {c}"
            if verdict.sound is False:
                judged.unsound.update(r.id for r in op.children[c].relations())
                judged.reasons.append(f"{what}: pushdown not sound, its whole input taken")
            elif verdict.exact is not True:
                detail = verdict.detail or "a superset (z3: not equivalent to the row selection)"
                judged.reasons.append(f"{what}: {detail}")
    return judged


@dataclass
class Prepared:
    """What a plan's inference needs once, whatever row is traced: phases 1–3 and their verdicts."""

    plan: Plan
    first: Pushed
    again: Pushed
    reasons: list[str]  # why answers may be supersets, whatever the row
    unsound: set[int]  # relations under an operator whose pushdown z3 could not prove sound


def prepare(plan: Plan) -> Prepared:
    top, _ = row_selection(plan, [None] * len(plan.root.output))
    first = push_down(plan, top)
    facts = push_up(plan)
    again = push_down(plan, top, facts)
    judged = judge(plan, again, {**first.inexact, **again.inexact})
    return Prepared(plan, first, again, judged.reasons, judged.unsound)


def infer(plan: Plan, values: list, tables: Tables, replay: bool = True, prepared: Prepared | None = None,
          refine: bool = True) -> Inferred:
    """The lineage of the output row ``values`` (one value per root output column).

    Without ``refine`` and ``replay``: the phase-1 predicates alone (PredTrace's naive pushdown).
    """
    started = time.monotonic()
    prepared = prepared or prepare(plan)
    _, bound = row_selection(plan, values)
    relations = [op for op in plan.operators() if isinstance(op, Relation)]
    frames = {r.id: relation_frame(r, tables(r)) for r in relations}
    scalars = Running(plan, tables, frames=frames).bind.scalars if plan.subqueries else {}
    bind = Binding(dict(bound), {}, scalars)
    reasons = list(prepared.reasons)
    candidates: dict[int, np.ndarray] = {}
    refined: dict[int, Expr] = {}
    for r in relations:
        own = r.id
        if r.id in prepared.unsound:
            candidates[r.id], refined[r.id] = np.ones(len(frames[r.id]), dtype=bool), TRUE
            continue
        runnable, dropped = _runnable(prepared.first.at[r.id], frames[r.id], bind, own)
        reasons += [f"relation {r.id}: cannot evaluate {c}" for c in dropped]
        candidates[r.id] = holds(runnable, frames[r.id], bind)
        refined[r.id], _ = _runnable(prepared.again.at[r.id], frames[r.id], bind, own)
    wanted = set().union(*(set_vars(p) for p in refined.values())) if refined else set()

    def bind_values() -> None:
        for var in wanted:
            relation, attrs = parse_var(var)
            columns = [frames[relation][a].to_numpy(dtype=object)[candidates[relation]] for a in attrs]
            values = columns[0] if len(attrs) == 1 else objects(list(zip(*columns)))
            _, distinct = distinct_values(values)
            bind.sets[var] = frozenset(value_key(v) for v in distinct
                                       if v is not None and not (isinstance(v, tuple) and None in v))

    bind_values()
    iterations = 0
    changed = refine
    while changed and iterations < MAX_ITERATIONS:
        iterations += 1
        changed = False
        for r in relations:
            if refined[r.id] == TRUE:
                continue
            narrowed = candidates[r.id] & holds(refined[r.id], frames[r.id], bind)
            if narrowed.sum() != candidates[r.id].sum():
                candidates[r.id] = narrowed
                changed = True
        bind_values()
    rows = {r.id: np.flatnonzero(candidates[r.id]) for r in relations}
    exact = not reasons and refine
    replayed = False
    if replay and not exact:
        found = _replay(plan, values, frames, rows, scalars)
        if found is not None:
            rows, replayed = found, True
    return Inferred(rows, exact, reasons, iterations, time.monotonic() - started, replayed,
                    {r.id: repr(refined[r.id]) for r in relations})


def _replay(plan: Plan, values: list, frames: dict[int, pd.DataFrame], rows: dict[int, np.ndarray],
            scalars: dict) -> dict[int, np.ndarray] | None:
    """The traced row's lineage in the plan run over the candidates, or None when the plan
    cannot run here or the run does not reproduce the row.

    Every derivation of the row uses candidate rows only, and each operator decides on them
    as over the whole input: an anti join's inner side (no lineage of its own) is read whole,
    so it rejects what it rejects there; scalar subqueries keep their values over the whole
    input. So the replay finds every derivation, and fewer spurious ones than the candidates
    allow. An aggregate over candidates that hold more than the traced row's groups may give
    other values: then the row is not reproduced and nothing is claimed.
    """
    if any(isinstance(op, Unknown) for op in plan.operators()):
        return None
    whole = {r.id for op in plan.root.walk() if isinstance(op, Join) and op.join_type == "leftanti"
             for r in op.children[1].relations()}

    restricted = {r: frame if r in whole else frame.iloc[rows[r]].reset_index(drop=True) for r, frame in frames.items()}
    try:
        running = Running(Plan(plan.root, {}), _unread, lineage=True, frames=restricted)
        running.bind.scalars.update(scalars)
        out = running.run(plan.root)
    except NotEvaluable:
        return None
    top, bound = row_selection(plan, values)
    match = holds(top, out.drop(columns=[LINEAGE]), Binding(bound))
    if not match.any():
        return None
    found: dict[int, set[int]] = {r: set() for r in rows}
    for lineage in out[LINEAGE][match]:
        for relation_id, position in lineage:
            if relation_id not in whole:
                found[relation_id].add(int(rows[relation_id][position]))
    for sub in plan.subqueries.values():  # a scalar subquery's value derives from all its candidates
        for r in sub.root.relations():
            found[r.id] = set(rows[r.id].tolist())
    return {r: np.array(sorted(v), dtype=int) for r, v in found.items()}


def _unread(relation: Relation) -> pd.DataFrame:
    raise AssertionError(f"relation {relation.id}: the replay runs over the frames it is given")
