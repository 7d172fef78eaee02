"""Predicate pushdown through a plan, operator by operator (PredTrace §3–§4, §6.1).

``through(op, F)`` turns a predicate on an operator's output into one predicate per
input: the most selective one this module can justify, allowing a superset (PredTrace
Algorithm 3, line 4). Where a conjunct cannot be pushed (it reads both sides of a join,
or an aggregate's result) it is dropped and the operator's doubt recorded (``inexact``):
the answer is flagged a superset unless z3 proves the operator exact after all
(``verify.py``; a dropped conjunct the traced row's values already imply costs nothing).
Table 2's defaults are the rules here: a group's
whole input, an anti join's inner side empty, a semi join's inner rows by the correlated
value.

``push_up`` derives PredTrace's row-value predicates (§6.1): for each output attribute,
the value-set variables it is known to lie in. A relation's attribute lies in its own
variable; an equi-join makes its two keys lie in each other's. Pushing those down again
(phase 3) hands each side of a join the other side's key values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from headwater.spark.expr import (
    COMPARISONS,
    FALSE,
    TRUE,
    Expr,
    cmp,
    col,
    col_id,
    conj,
    conjuncts,
    disj,
    evaluable,
    in_set,
    refs,
    str_value,
    substitute,
)
from headwater.spark.operators import (
    Aggregate,
    Deduplicate,
    Expand,
    Filter,
    Generate,
    Join,
    Limit,
    Op,
    Plan,
    Project,
    Relation,
    Sort,
    Union,
    Window,
    WindowGroupLimit,
)

Key = int | tuple[int, ...]  # an attribute's exprId, or several's for a composite join key
SetFacts = dict[Key, frozenset[str]]  # attribute(s) → names of the value sets they lie in


def set_var(relation: Relation, expr_id: int) -> str:
    return f"r{relation.id}.{expr_id}"


@dataclass
class Pushed:
    """Predicates at every operator's output, and where pushing lost precision."""

    at: dict[int, Expr] = field(default_factory=dict)
    sent: dict[int, list[Expr]] = field(default_factory=dict)  # op id → what it pushed to each input
    inexact: dict[int, str] = field(default_factory=dict)  # op id → why its pushdown is only a superset
    selects: dict[int, Expr] = field(default_factory=dict)  # saved op id → what selects among its saved rows


def push_down(plan: Plan, top: Expr, facts: dict[int, SetFacts] | None = None,
              subquery_top: Expr = TRUE, saved: dict[int, Expr] | None = None) -> Pushed:
    """``top`` pushed from the root to every relation; with ``facts`` (phase 3), each
    operator's output predicate also asserts its row-value facts.

    ``saved`` (precise mode) maps operators whose output is saved to the row-selection
    predicate over it: what arrives there selects among the saved rows (``selects``), and
    the row selection is pushed on instead."""
    pushed = Pushed()

    def visit(op: Op, predicate: Expr) -> None:
        if facts is not None:
            predicate = conj([predicate, *_facts_predicate(op, facts.get(op.id, {}))])
        if saved and op.id in saved:
            pushed.selects[op.id] = predicate
            predicate = saved[op.id]
        pushed.at[op.id] = predicate
        parts, why = through(op, predicate)
        pushed.sent[op.id] = parts
        if why:
            pushed.inexact[op.id] = why
        for child, part in zip(op.children, parts):
            visit(child, part)

    visit(plan.root, top)
    for sub in plan.subqueries.values():
        inner = push_down(sub, subquery_top, facts, saved=saved)
        pushed.at.update(inner.at)
        pushed.selects.update(inner.selects)
        pushed.sent.update(inner.sent)
        pushed.inexact.update(inner.inexact)
    return pushed


def _facts_predicate(op: Op, facts: SetFacts) -> list[Expr]:
    by_id = {a.expr_id: col(a.expr_id, a.name, a.dtype) for a in op.output}
    found = []
    for key, names in sorted(facts.items(), key=lambda kv: str(kv[0])):
        ids = key if isinstance(key, tuple) else (key,)
        if all(i in by_id for i in ids):
            target = Expr("tuple", tuple(by_id[i] for i in ids)) if isinstance(key, tuple) else by_id[key]
            found += [in_set(target, var) for var in sorted(names)]
    return found


def through(op: Op, predicate: Expr) -> tuple[list[Expr], str | None]:
    """Predicates on each child of ``op`` such that ``op`` over the selected inputs still
    yields every output row ``predicate`` selects; and why they select more, if they may."""
    if isinstance(op, Relation):
        return [], None
    if isinstance(op, Project):
        mapping = {a.expr_id: e for a, e in op.items}
        return [substitute(predicate, mapping)], None
    if isinstance(op, Filter):
        return [conj([predicate, op.condition])], None
    if isinstance(op, (Sort, Limit, Deduplicate)):
        return [predicate], None
    if isinstance(op, Aggregate):
        return _through_aggregate(op, predicate)
    if isinstance(op, Join):
        return _through_join(op, predicate)
    if isinstance(op, Union):
        parts = []
        for child in op.children:
            mapping = {a.expr_id: col(c.expr_id, c.name, c.dtype) for a, c in zip(op.output, child.output)}
            parts.append(substitute(predicate, mapping))
        return parts, None
    if isinstance(op, (Window, WindowGroupLimit)):
        return _through_window(op, predicate)
    if isinstance(op, Generate):
        return _through_generate(op, predicate)
    if isinstance(op, Expand):
        return _through_expand(op, predicate)
    return [TRUE] * len(op.children), f"{getattr(op, 'spark_class', op.kind)} is not modelled: its whole input"


def _through_aggregate(op: Aggregate, predicate: Expr) -> tuple[list[Expr], str | None]:
    """Table 2's GroupBy: the whole group. Conjuncts on grouping columns go down, rewritten
    over the grouping expressions; conjuncts on aggregate results cannot."""
    groups = {}
    for attr, e in op.items:
        if not any(n.op == "agg" for n in e.walk()) and e in op.groups:
            groups[attr.expr_id] = e
    group_ids = {col_id(g) for g in op.groups if g.op == "col"}
    kept: list[Expr] = []
    dropped: list[Expr] = []
    for c in conjuncts(predicate):
        ids = refs(c)
        if ids <= set(groups) or ids <= group_ids:
            kept.append(substitute(c, groups))
        else:
            dropped.append(c)
    # Filtering by aggregate results keeps whole groups or none: what is dropped costs
    # precision only when more than one group can pass what is kept.
    pinned = all(any(_pins(c, g) for c in kept) for g in op.groups)
    why = f"conjuncts on aggregate results not pushed: {dropped}" if dropped and not pinned else None
    return [conj(kept)], why


def _pins(c: Expr, e: Expr) -> bool:
    """Whether conjunct ``c`` fixes ``e`` to one value (``e = constant``)."""
    return c.op in ("=", "<=>") and any(a == e and not refs(b) for a, b in (c.args, c.args[::-1]))


def _through_window(op: Window | WindowGroupLimit, predicate: Expr) -> tuple[list[Expr], str | None]:
    """Table 2's WindowOp, taken at its widest: a row's window values (and, under a group
    limit, whether it is kept at all) read its whole partition, so an output row's lineage
    is its partition; the whole input without a partition spec. Only conjuncts on the
    partition keys go down: one on a column that varies within a partition, or on a window
    value, would drop rows of the partition."""
    kept: list[Expr] = []
    dropped: list[Expr] = []
    for c in conjuncts(predicate):
        (kept if _reads_only(c, op.partition) else dropped).append(c)
    # Like a group's: what is dropped costs precision only when more than one partition can
    # pass what is kept.
    pinned = all(any(_pins(c, p) for c in kept) for p in op.partition)
    why = f"conjuncts within a window partition not pushed: {dropped}" if dropped and not pinned else None
    return [conj(kept)], why


def _reads_only(e: Expr, keys: list[Expr]) -> bool:
    """Whether ``e`` reads columns only through ``keys`` (so is one value per partition)."""
    if e in keys:
        return True
    return e.op != "col" and all(_reads_only(a, keys) for a in e.args)


def _through_generate(op: Generate, predicate: Expr) -> tuple[list[Expr], str | None]:
    """Table 2's RowExpand: an output row's lineage is the input row it was generated from.
    Conjuncts on the input's columns go down. When a known generator's every generated
    column is pinned (``e <=> X``, X reading no generated column), the input rows are those
    whose collection yields the values X: that test goes down (``yields``), and the
    conjuncts on generated columns with X in their place. Otherwise those cannot go down."""
    generated = {a.expr_id for a in op.generated}
    parts = conjuncts(predicate)
    pins: dict[int, Expr] = {}
    for c in parts:
        for side, value in (c.args, c.args[::-1]) if c.op == "<=>" else ():
            if side.op == "col" and col_id(side) in generated and not refs(value) & generated:
                pins.setdefault(col_id(side), value)
    if op.generator.op == "generator" and len(pins) == len(generated):
        yields = Expr("yields", (op.generator.args[0], *(pins[a.expr_id] for a in op.generated)),
                      value=(op.generator.value, op.outer, tuple(a.dtype for a in op.generated)), dtype="boolean")
        rest = [substitute(c, pins) for c in parts]
        return [conj([yields, *(c for c in rest if not (c.op == "<=>" and c.args[0] == c.args[1]))])], None
    dropped = [c for c in parts if refs(c) & generated]
    why = f"conjuncts on generated columns not pushed: {dropped}" if dropped else None
    return [conj(c for c in parts if not refs(c) & generated)], why


def _through_expand(op: Expand, predicate: Expr) -> tuple[list[Expr], str | None]:
    """Table 2's RowExpand: an input row is lineage when any of its projections is selected,
    so the predicate goes down as the disjunction, over projections, of it substituted.
    Each conjunct's own disjunction is implied, and added: a join below can split those by
    side where it cannot split the whole."""
    parts = conjuncts(predicate)
    per = [[_projected(c, {a.expr_id: e for a, e in zip(op.output, p)}) for c in parts] for p in op.projections]
    whole = disj(conj(cs) for cs in per)
    return [conj([whole, *(disj(cs[i] for cs in per) for i in range(len(parts)))])], None


def _projected(c: Expr, mapping: dict[int, Expr]) -> Expr:
    """Conjunct ``c`` over one projection, its direct tests of a NULL the projection puts
    in folded (what reasons about the result, z3 and a join's split, cannot read a NULL)."""
    e = substitute(c, mapping)
    null = [a.op == "lit" and a.value is None for a in e.args]
    if e.op == "<=>" and any(null):
        return TRUE if all(null) else Expr("isnull", (e.args[null.index(False)],), dtype="boolean")
    if e.op in ("isnull", "isnotnull") and any(null):
        return TRUE if e.op == "isnull" else FALSE
    if (e.op in COMPARISONS or e.op == "in_set") and any(null):
        return FALSE  # NULL, never TRUE: the conjunction it is part of passes no row
    return e


def equi_pairs(op: Join) -> list[tuple[Expr, Expr]]:
    """(left expression, right expression) of each equality in the join condition."""
    left_ids = {a.expr_id for a in op.children[0].output}
    right_ids = {a.expr_id for a in op.children[1].output}
    pairs = []
    for c in conjuncts(op.condition) if op.condition is not None else []:
        if c.op != "=":
            continue
        a, b = c.args
        if refs(a) and refs(b) and refs(a) <= left_ids and refs(b) <= right_ids:
            pairs.append((a, b))
        elif refs(a) and refs(b) and refs(b) <= left_ids and refs(a) <= right_ids:
            pairs.append((b, a))
    return pairs


def _split(parts: list[Expr], left_ids: set[int], right_ids: set[int]) -> tuple[list[Expr], list[Expr], list[Expr]]:
    left, right, both = [], [], []
    for c in parts:
        ids = refs(c)
        if ids <= left_ids and ids:
            left.append(c)
        elif ids <= right_ids and ids:
            right.append(c)
        elif not ids:
            left.append(c)
            right.append(c)
        else:
            both.append(c)
    return left, right, both


def _transfer(parts: list[Expr], pairs: list[tuple[Expr, Expr]], to_right: bool) -> list[Expr]:
    """Equalities and value-set facts on one side's join key, restated on the other side's key."""
    moved = []
    for c in parts:
        for left_key, right_key in pairs:
            source, target = (left_key, right_key) if to_right else (right_key, left_key)
            if c.op == "in_set" and c.args[0] == source:
                moved.append(in_set(target, str_value(c)))
                continue
            if c.op not in ("=", "<=>"):
                continue
            for side, value in (c.args, c.args[::-1]):
                if refs(value):
                    continue
                if side == source:
                    moved.append(cmp("=", target, value))
                elif side.op == "col" and refs(source) == {col_id(side)}:
                    # The key is computed from the column (a cast, say): the same of the value.
                    moved.append(cmp("=", target, substitute(source, {col_id(side): value})))
    return moved


def _through_join(op: Join, predicate: Expr) -> tuple[list[Expr], str | None]:
    left_ids = {a.expr_id for a in op.children[0].output}
    right_ids = {a.expr_id for a in op.children[1].output}
    cond = conjuncts(op.condition) if op.condition is not None else []
    pairs = equi_pairs(op)
    on_output = conjuncts(predicate)
    kind = op.join_type
    if kind in ("inner", "cross"):
        left, right, both = _split(on_output + cond, left_ids, right_ids)
        left += _transfer(left, pairs, to_right=False) + _transfer(right, pairs, to_right=False)
        right += _transfer(left, pairs, to_right=True) + _transfer(right, pairs, to_right=True)
        why = _residual(both, cond)
        return [conj(left), conj(right)], why
    if kind == "leftsemi":
        # Table 2 SemiJoin: the outer row; the inner rows matching it by the correlated value.
        out_left, _, out_both = _split(on_output, left_ids, right_ids)
        c_left, c_right, c_both = _split(cond, left_ids, right_ids)
        left = out_left + c_left
        right = c_right + _transfer(left, pairs, to_right=True)
        return [conj(left), conj(right)], _residual(out_both + c_both, cond)
    if kind == "leftanti":
        # Table 2 AntiJoin: the outer row; nothing of the inner side is lineage.
        out_left, _, out_both = _split(on_output, left_ids, right_ids)
        return [conj(out_left), FALSE], _residual(out_both, [])
    if kind == "leftouter":
        out_left, out_right, out_both = _split(on_output, left_ids, right_ids)
        _, c_right, c_both = _split(cond, left_ids, right_ids)
        right = out_right + c_right + _transfer(out_left, pairs, to_right=True)
        return [conj(out_left), conj(right)], _residual(out_both + c_both, cond)
    if kind == "rightouter":
        out_left, out_right, out_both = _split(on_output, left_ids, right_ids)
        c_left, _, c_both = _split(cond, left_ids, right_ids)
        left = out_left + c_left + _transfer(out_right, pairs, to_right=False)
        return [conj(left), conj(out_right)], _residual(out_both + c_both, cond)
    out_left, out_right, out_both = _split(on_output, left_ids, right_ids)  # full outer
    return [conj(out_left), conj(out_right)], _residual(out_both, cond) or "full outer join"


def _residual(both: list[Expr], cond: list[Expr]) -> str | None:
    """Why a join's pushdown may select more: conjuncts reading both sides that are not
    plain key equalities (those the value sets enforce)."""
    loose = [c for c in both if not (c.op == "=" and c in cond and evaluable(c))]
    return f"conjuncts over both join sides not pushed: {loose}" if loose else None


def push_up(plan: Plan) -> dict[int, SetFacts]:
    """Row-value facts (phase 2) at every operator of the plan and its subqueries."""
    facts: dict[int, SetFacts] = {}

    def visit(op: Op) -> SetFacts:
        below = [visit(c) for c in op.children]
        found = _up(op, below)
        facts[op.id] = found
        return found

    visit(plan.root)
    for sub in plan.subqueries.values():
        facts.update(push_up(sub))
    return facts


def _merge(*maps: SetFacts) -> dict[Key, set[str]]:
    out: dict[Key, set[str]] = {}
    for m in maps:
        for k, v in m.items():
            out.setdefault(k, set()).update(v)
    return out


def _frozen(m: dict[Key, set[str]]) -> SetFacts:
    return {k: frozenset(v) for k, v in m.items() if v}


def _renamed(facts: SetFacts, mapping: dict[int, int]) -> SetFacts:
    """Facts on the attributes ``mapping`` passes on unchanged (old exprId → new), under their new ids."""
    out: dict[Key, set[str]] = {}
    for key, names in facts.items():
        ids = key if isinstance(key, tuple) else (key,)
        if all(i in mapping for i in ids):
            new = tuple(mapping[i] for i in ids)
            out.setdefault(new if isinstance(key, tuple) else new[0], set()).update(names)
    return _frozen(out)


def parse_var(var: str) -> tuple[int, tuple[int, ...]]:
    """(relation op id, attribute exprIds) of a value-set variable."""
    relation, attrs = var[1:].split(".", 1)
    return int(relation), tuple(int(a) for a in attrs.split("+"))


def _composite(side: SetFacts, ids: tuple[int, ...]) -> set[str]:
    """Tuple variables for key columns ``ids``: one per relation every key column lies in a
    variable of. Per-column sets lose which values go together; a tuple set keeps it."""
    found = set()
    per_column = [{parse_var(v) for v in side.get(i, ())} for i in ids]
    for relation in set.intersection(*({r for r, _ in vars_} for vars_ in per_column)):
        attrs = [next(a[0] for r, a in vars_ if r == relation and len(a) == 1) for vars_ in per_column]
        found.add(f"r{relation}." + "+".join(str(a) for a in attrs))
    return found


def _up(op: Op, below: list[SetFacts]) -> SetFacts:
    if isinstance(op, Relation):
        return {a.expr_id: frozenset({set_var(op, a.expr_id)}) for a in op.output}
    if isinstance(op, (Filter, Sort, Limit, Deduplicate, Window, WindowGroupLimit, Generate)):
        return below[0]  # input columns keep their exprIds and their values
    if isinstance(op, Expand):  # only what every projection passes on unchanged (the rest is NULL or a tag somewhere)
        sources = [_passed_on(op, i) for i in range(len(op.output))]
        return _renamed(below[0], {source: a.expr_id for a, source in zip(op.output, sources) if source is not None})
    if isinstance(op, Project):
        return _renamed(below[0], {col_id(e): attr.expr_id for attr, e in op.items if e.op == "col"})
    if isinstance(op, Aggregate):
        return _renamed(below[0], {col_id(e): attr.expr_id for attr, e in op.items
                                   if e.op == "col" and e in op.groups})
    if isinstance(op, Join):
        left, right = below
        columns = [(col_id(a), col_id(b)) for a, b in equi_pairs(op) if a.op == "col" and b.op == "col"]
        keys: list[tuple[Key, Key]] = list(columns)
        if len(columns) > 1:
            lk, rk = tuple(a for a, _ in columns), tuple(b for _, b in columns)
            left = {**left, lk: frozenset(left.get(lk, frozenset()) | _composite(left, lk))}
            right = {**right, rk: frozenset(right.get(rk, frozenset()) | _composite(right, rk))}
            keys.append((lk, rk))
        if op.join_type in ("inner", "cross"):
            out = _merge(left, right)
            for a, b in keys:
                joined = out.get(a, set()) | out.get(b, set())
                out[a], out[b] = set(joined), set(joined)
            return _frozen(out)
        if op.join_type == "leftsemi":
            out = _merge(left)
            for a, b in keys:
                out.setdefault(a, set()).update(right.get(b, ()))
            return _frozen(out)
        if op.join_type == "leftouter":
            out = _merge(left, right)
            for a, b in keys:
                out.setdefault(b, set()).update(left.get(a, ()))
            return _frozen(out)
        if op.join_type == "rightouter":
            out = _merge(left, right)
            for a, b in keys:
                out.setdefault(a, set()).update(right.get(b, ()))
            return _frozen(out)
        if op.join_type == "leftanti":
            return dict(below[0])
        return _frozen(_merge(left, right))
    return {}


def _passed_on(op: Expand, i: int) -> int | None:
    """The column every projection passes on unchanged as output column ``i``, if one does."""
    found = {col_id(p[i]) if p[i].op == "col" else None for p in op.projections}
    return found.pop() if len(found) == 1 else None
