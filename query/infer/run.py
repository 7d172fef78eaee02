"""Running a logged plan over tables in memory, optionally carrying each row's lineage.

The log-only fallback needs this for the values of scalar subqueries (a predicate
compares with them), and the precise mode for the intermediate results it saves. With
``lineage=True`` every row carries the set of (relation id, row position) it derives from,
by the rules of Perm and PredTrace's Table 2: a join's row from both sides, a group from
all its rows, a semi join's row from the inner rows that matched it, an anti join's only
from its outer row, a scalar subquery's value from every row of its input, a window's row
from every row of its partition, a generated or expanded row from the input row it came
from. The tests use that mode, on small tables, as the oracle for the inference.
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal
from typing import Callable

import numpy as np
import pandas as pd

from headwater.spark.expr import Expr, agg_spec, conjuncts, int_value, lit, sort_spec, str_value
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

from .evaluate import Binding, NotEvaluable, evaluate, generated, holds, objects, value_key
from .pushdown import equi_pairs

LINEAGE = "__lineage"
CROSS_LIMIT = 20_000_000  # rows a join without equal keys may pair up: beyond it, refuse

Tables = Callable[[Relation], pd.DataFrame]  # a relation's rows, by column name


class Running:
    """One run of a plan: the relations' tables, subquery values, and whether lineage is carried."""

    def __init__(self, plan: Plan, tables: Tables, lineage: bool = False,
                 frames: dict[int, pd.DataFrame] | None = None):
        self.plan = plan
        self.tables = tables
        self.lineage = lineage
        self.frames = frames or {}  # relation id → its rows as ``relation_frame`` gives them, where already made
        self.bind = Binding()
        self.subquery_lineage: frozenset = frozenset()
        for sid, sub in plan.subqueries.items():
            frame = self.run(sub.root)
            column = sub.root.output[0].expr_id
            self.bind.scalars[sid] = frame[column].iloc[0] if len(frame) else None
            if lineage and len(frame):
                self.subquery_lineage |= frame[LINEAGE].iloc[0]

    def run(self, op: Op) -> pd.DataFrame:
        runner = _RUNNERS.get(type(op))
        if runner is None:
            raise NotEvaluable(f"cannot run {getattr(op, 'spark_class', op.kind)}")
        return runner(self, op)

    def output(self) -> pd.DataFrame:
        frame = self.run(self.plan.root)
        if self.lineage and self.subquery_lineage:
            frame[LINEAGE] = [rows | self.subquery_lineage for rows in frame[LINEAGE]]
        return frame


_INTEGRAL = ("integer", "long", "short", "byte")


def relation_frame(relation: Relation, table: pd.DataFrame) -> pd.DataFrame:
    """A relation's rows keyed by its attributes' exprIds, NULLs as None: pandas reads a
    nullable integer column as floats with NaN, which must compare as Spark's longs do."""
    columns = {}
    for a in relation.output:
        values = table[a.name].to_numpy(dtype=object)
        missing = pd.isna(values)
        if missing.any() or a.dtype in _INTEGRAL:
            values = np.array([None if m else (int(v) if a.dtype in _INTEGRAL else v)
                               for v, m in zip(values, missing)], dtype=object)
        columns[a.expr_id] = values
    return pd.DataFrame(columns, index=range(len(table)))


def _relation(r: Running, op: Relation) -> pd.DataFrame:
    frame = r.frames[op.id].copy() if op.id in r.frames else relation_frame(op, r.tables(op))
    if r.lineage:
        frame[LINEAGE] = [frozenset({(op.id, i)}) for i in range(len(frame))]
    return frame


def _keep_lineage(r: Running, frame: pd.DataFrame, out: pd.DataFrame) -> pd.DataFrame:
    if r.lineage:
        out[LINEAGE] = frame[LINEAGE].to_numpy()
    return out


def _project(r: Running, op: Project) -> pd.DataFrame:
    frame = r.run(op.children[0])
    out = pd.DataFrame({a.expr_id: evaluate(e, frame, r.bind).to_numpy(dtype=object) for a, e in op.items},
                       index=frame.index)
    return _keep_lineage(r, frame, out)


def _filter(r: Running, op: Filter) -> pd.DataFrame:
    frame = r.run(op.children[0])
    return frame[holds(op.condition, frame, r.bind)].reset_index(drop=True)


def _sort(r: Running, op: Sort) -> pd.DataFrame:
    frame = r.run(op.children[0])
    return frame.iloc[_ordered(frame, op.order, r.bind)].reset_index(drop=True)


def _ordered(frame: pd.DataFrame, order: list[Expr], bind: Binding) -> np.ndarray:
    """Positions of ``frame``'s rows in ``order`` (stable: ties keep their input order)."""
    if not len(frame) or not order:
        return np.arange(len(frame))
    keys, names, ascending = {}, [], []
    for i, o in enumerate(order):
        direction, nulls_first = sort_spec(o)
        values = evaluate(o.args[0], frame, bind)
        # NULLs placed by a key of their own, as each sort order says.
        keys[f"null{i}"] = values.isna().to_numpy(dtype=bool) != nulls_first
        keys[f"sort{i}"] = values.map(_sortable).to_numpy()
        names += [f"null{i}", f"sort{i}"]
        ascending += [True, direction != "Descending"]
    return pd.DataFrame(keys).sort_values(names, ascending=ascending, kind="stable").index.to_numpy()


def _sortable(v):
    return float(v) if isinstance(v, Decimal) else v


def _limit(r: Running, op: Limit) -> pd.DataFrame:
    return r.run(op.children[0]).head(op.n).reset_index(drop=True)


def _union(r: Running, op: Union) -> pd.DataFrame:
    parts = []
    for child in op.children:
        frame = r.run(child)
        renamed = frame.rename(columns={c.expr_id: a.expr_id for a, c in zip(op.output, child.output)})
        parts.append(renamed[[a.expr_id for a in op.output] + ([LINEAGE] if r.lineage else [])])
    return pd.concat(parts, ignore_index=True)


def _deduplicate(r: Running, op: Deduplicate) -> pd.DataFrame:
    frame = r.run(op.children[0])
    keys = [tuple(_hashable(v) for v in row) for row in frame[op.keys].itertuples(index=False)]
    first: dict[tuple, int] = {}  # key → the position of its first row
    lineage: dict[tuple, frozenset] = {}
    for i, key in enumerate(keys):
        first.setdefault(key, i)
        if r.lineage:
            lineage[key] = lineage.get(key, frozenset()) | frame[LINEAGE].iloc[i]
    out = frame.iloc[sorted(first.values())].reset_index(drop=True)
    if r.lineage:
        out[LINEAGE] = [lineage[k] for k in sorted(first, key=first.__getitem__)]
    return out


def _hashable(v):
    """A group or partition key's value as Spark keeps it (``Decimal('2.00')`` stays itself,
    unlike ``value_key``'s 2: the key is output), its NULLs one NULL."""
    if v is None or v is pd.NA or (isinstance(v, float) and np.isnan(v)):
        return None
    return v


def _aggregate(r: Running, op: Aggregate) -> pd.DataFrame:
    frame = r.run(op.children[0])
    group_values = [evaluate(g, frame, r.bind).to_numpy(dtype=object) for g in op.groups]
    groups: dict[tuple, list[int]] = {}
    for i in range(len(frame)):
        groups.setdefault(tuple(_hashable(g[i]) for g in group_values), []).append(i)
    if not op.groups and not groups:
        groups[()] = []  # a global aggregate yields one row, even over no rows
    rows = []
    for key, members in groups.items():
        part = frame.iloc[members]
        row: dict[int | str, object] = {}  # exprId → value, and the lineage column
        for attr, e in op.items:
            row[attr.expr_id] = _aggregate_value(e, part, op.groups, key, r.bind)
        if r.lineage:
            row[LINEAGE] = frozenset().union(*part[LINEAGE]) if members else frozenset()
        rows.append(row)
    columns = [a.expr_id for a in op.output] + ([LINEAGE] if r.lineage else [])
    return pd.DataFrame(rows, columns=columns, dtype=object)


def _aggregate_value(e: Expr, part: pd.DataFrame, groups: list[Expr], key: tuple, bind: Binding):
    """An aggregate output column's value for one group: aggregates over the group's rows,
    grouping expressions by the group's key, anything else over those."""
    if e in groups:
        return key[groups.index(e)]
    if e.op == "agg":
        return _apply(e, part, bind)
    if e.op == "col":
        raise NotEvaluable(f"{e} is neither grouped nor aggregated")
    one = pd.DataFrame(index=[0])
    values = {}
    for i, arg in enumerate(e.args):
        values[i] = _aggregate_value(arg, part, groups, key, bind)
    folded = Expr(e.op, tuple(lit(values[i], a.dtype) for i, a in enumerate(e.args)), e.value, e.dtype)
    return evaluate(folded, one, bind).iloc[0]


def _apply(e: Expr, part: pd.DataFrame, bind: Binding):
    fn, distinct = agg_spec(e)
    if fn == "count" and (not e.args or all(a.op == "lit" and a.value is not None for a in e.args)):
        return len(part) if not distinct else len(part.drop_duplicates())
    values = evaluate(e.args[0], part, bind).tolist() if e.args else []
    values = [v for v in values if v is not None and not (isinstance(v, float) and np.isnan(v))]
    if distinct:
        values = list(dict.fromkeys(values))
    if fn == "count":
        return len(values)
    if not values:
        return None
    if fn == "sum":
        return sum(values[1:], values[0])
    if fn == "avg":
        total = sum(values[1:], values[0])
        if isinstance(total, Decimal):
            exponent = total.as_tuple().exponent
            if not isinstance(exponent, int):  # 'n', 'N' or 'F': NaN or infinity, which no Spark decimal holds
                raise NotEvaluable(f"avg of decimals whose sum is {total}")
            scale = max(-exponent, 0) + 4
            return (total / len(values)).quantize(Decimal(1).scaleb(-scale), rounding=ROUND_HALF_UP)
        return total / len(values)
    if fn == "min":
        return min(values)
    if fn == "max":
        return max(values)
    if fn in ("first", "last"):
        return values[0] if fn == "first" else values[-1]
    raise NotEvaluable(f"aggregate {fn}")


def _partitions(frame: pd.DataFrame, op: Window | WindowGroupLimit, bind: Binding) -> list[tuple[np.ndarray, list]]:
    """Each partition of ``frame``: its rows' positions in the window's order, and their
    order keys (rows with equal keys are peers)."""
    keys = [evaluate(p, frame, bind).to_numpy(dtype=object) for p in op.partition]
    order_keys = [[value_key(_hashable(v)) for v in evaluate(o.args[0], frame, bind).tolist()] for o in op.order]
    groups: dict[tuple, list[int]] = {}
    for i in _ordered(frame, op.order, bind):
        groups.setdefault(tuple(_hashable(k[i]) for k in keys), []).append(i)
    return [(np.array(members, dtype=int), [tuple(k[i] for k in order_keys) for i in members])
            for members in groups.values()]


def _rank_like(fn: str, peers: list) -> list[int]:
    """``row_number``, ``rank`` or ``dense_rank`` of each row of a partition in order."""
    out, rank, dense = [], 0, 0
    for i, key in enumerate(peers):
        if i == 0 or key != peers[i - 1]:
            rank, dense = i + 1, dense + 1
        out.append(i + 1 if fn == "row_number" else rank if fn == "rank" else dense)
    return out


def _window_column(e: Expr, ordered: pd.DataFrame, peers: list, bind: Binding) -> list:
    """One window function's values over one partition, its rows in order."""
    fn, spec = e.args
    if fn.op == "winfn" and fn.value in ("row_number", "rank", "dense_rank"):
        return _rank_like(str_value(fn), peers)
    if fn.op == "winfn":  # lag or lead: the input ``offset`` rows before or after, else the default
        source, offset, default = fn.args
        if offset.op != "lit" or offset.value is None:
            raise NotEvaluable(f"{fn.value} by {offset}")
        step = -int_value(offset) if fn.value == "lag" else int_value(offset)
        values = evaluate(source, ordered, bind).tolist()
        defaults = evaluate(default, ordered, bind).tolist()
        return [values[i + step] if 0 <= i + step < len(values) else defaults[i] for i in range(len(values))]
    if fn.op != "agg":
        raise NotEvaluable(f"window function {fn}")
    found: dict[tuple[int, int], object] = {}  # a frame's value, computed once per frame
    out = []
    for i in range(len(ordered)):
        lo, hi = _frame(spec.args[-1], i, peers)
        if (lo, hi) not in found:
            found[lo, hi] = _apply(fn, ordered.iloc[max(lo, 0):max(hi + 1, 0)], bind)
        out.append(found[lo, hi])
    return out


def _frame(frame: Expr, i: int, peers: list) -> tuple[int, int]:
    """First and last positions of row ``i``'s frame in its ordered partition (empty when
    the first is past the last). A range frame's current row is its peers; range offsets
    by value are not modelled."""
    if frame.op != "frame":
        raise NotEvaluable(f"window frame {frame}")
    bounds = []
    for bound, last in zip(frame.args, (False, True)):
        if bound.op == "bound" and bound.value == "unbounded_preceding":
            bounds.append(0)
        elif bound.op == "bound" and bound.value == "unbounded_following":
            bounds.append(len(peers) - 1)
        elif bound.op == "bound" and bound.value == "current_row" and frame.value == "range":
            same = [j for j, key in enumerate(peers) if key == peers[i]]
            bounds.append(same[-1] if last else same[0])
        elif bound.op == "bound" and bound.value == "current_row":
            bounds.append(i)
        elif bound.op == "lit" and frame.value == "rows" and isinstance(bound.value, int):
            bounds.append(i + bound.value)
        else:
            raise NotEvaluable(f"window frame {frame}")
    return bounds[0], min(bounds[1], len(peers) - 1)


def _window(r: Running, op: Window) -> pd.DataFrame:
    frame = r.run(op.children[0])
    computed = {a.expr_id: np.full(len(frame), None, dtype=object) for a, _ in op.items}
    lineage = np.empty(len(frame), dtype=object)
    for positions, peers in _partitions(frame, op, r.bind):
        ordered = frame.iloc[positions].reset_index(drop=True)
        for attr, e in op.items:
            computed[attr.expr_id][positions] = objects(_window_column(e, ordered, peers, r.bind))
        if r.lineage:
            lineage[positions] = [frozenset().union(*ordered[LINEAGE])] * len(positions)
    out = pd.DataFrame({a.expr_id: computed[a.expr_id] if a.expr_id in computed else frame[a.expr_id].to_numpy()
                        for a in op.output}, index=frame.index)
    if r.lineage:
        out[LINEAGE] = lineage
    return out


def _window_group_limit(r: Running, op: WindowGroupLimit) -> pd.DataFrame:
    frame = r.run(op.children[0])
    if op.function.op != "winfn" or op.function.value not in ("row_number", "rank", "dense_rank"):
        raise NotEvaluable(f"a group limit by {op.function}")
    keep = np.zeros(len(frame), dtype=bool)
    lineage = np.empty(len(frame), dtype=object)
    for positions, peers in _partitions(frame, op, r.bind):
        keep[positions] = np.array(_rank_like(str_value(op.function), peers)) <= op.limit
        if r.lineage:
            lineage[positions] = [frozenset().union(*frame[LINEAGE].iloc[positions])] * len(positions)
    out = frame[keep].reset_index(drop=True)
    if r.lineage:
        out[LINEAGE] = lineage[keep]
    return out


def _generate(r: Running, op: Generate) -> pd.DataFrame:
    if op.generator.op != "generator":
        raise NotEvaluable(f"generator {op.generator}")
    frame = r.run(op.children[0])
    collections = evaluate(op.generator.args[0], frame, r.bind).tolist()
    rows, produced = [], []
    for i, collection in enumerate(collections):
        found = generated(str_value(op.generator), collection, len(op.generated), op.outer)
        rows += [i] * len(found)
        produced += found
    own = {a.expr_id for a in op.generated}
    out = {a.expr_id: frame[a.expr_id].to_numpy(dtype=object)[rows] for a in op.output if a.expr_id not in own}
    for j, a in enumerate(op.generated):
        out[a.expr_id] = objects([values[j] for values in produced])
    result = pd.DataFrame({a.expr_id: out[a.expr_id] for a in op.output}, index=range(len(rows)))
    if r.lineage:
        result[LINEAGE] = frame[LINEAGE].to_numpy()[rows] if rows else []
    return result


def _expand(r: Running, op: Expand) -> pd.DataFrame:
    frame = r.run(op.children[0])
    parts = []
    for projection in op.projections:
        part = pd.DataFrame({a.expr_id: evaluate(e, frame, r.bind).to_numpy(dtype=object)
                             for a, e in zip(op.output, projection)}, index=frame.index)
        parts.append(_keep_lineage(r, frame, part))
    return pd.concat(parts, ignore_index=True)


def _join(r: Running, op: Join) -> pd.DataFrame:
    left, right = r.run(op.children[0]), r.run(op.children[1])
    pairs = equi_pairs(op)
    cond = op.condition
    residual = [c for c in conjuncts(cond) if not any(c.op == "=" and {*c.args} == {a, b} for a, b in pairs)] \
        if cond is not None else []
    li, ri = _matches(left, right, pairs, residual, r.bind)
    kind = op.join_type
    if kind in ("leftsemi", "leftanti"):
        matched = np.zeros(len(left), dtype=bool)
        matched[li] = True
        keep = matched if kind == "leftsemi" else ~matched
        out = left[keep].reset_index(drop=True)
        if r.lineage and kind == "leftsemi":
            inner: dict[np.integer, frozenset] = {}  # left position → lineage of the right rows it matched
            for a, b in zip(li, ri):
                inner[a] = inner.get(a, frozenset()) | right[LINEAGE].iloc[b]
            out[LINEAGE] = [left[LINEAGE].iloc[i] | inner[i] for i in np.flatnonzero(keep)]
        return out
    lrows, rrows = list(li), list(ri)
    if kind in ("leftouter", "fullouter"):
        unmatched = sorted(set(range(len(left))) - set(li))
        lrows += unmatched
        rrows += [None] * len(unmatched)
    if kind in ("rightouter", "fullouter"):
        unmatched = sorted(set(range(len(right))) - set(ri))
        lrows += [None] * len(unmatched)
        rrows += unmatched
    out = pd.DataFrame({**_take(left, lrows, op.children[0]), **_take(right, rrows, op.children[1])}, dtype=object)
    if r.lineage:
        out[LINEAGE] = [(left[LINEAGE].iloc[a] if a is not None else frozenset())
                        | (right[LINEAGE].iloc[b] if b is not None else frozenset()) for a, b in zip(lrows, rrows)]
    return out


def _take(frame: pd.DataFrame, rows: list, child: Op) -> dict:
    out = {}
    for a in child.output:
        values = frame[a.expr_id].to_numpy(dtype=object)
        out[a.expr_id] = [values[i] if i is not None else None for i in rows]
    return out


def _matches(left: pd.DataFrame, right: pd.DataFrame, pairs, residual: list[Expr], bind: Binding):
    """(left row, right row) position pairs the join condition holds for."""
    if pairs:
        lk = list(zip(*[evaluate(a, left, bind).map(value_key).tolist() for a, _ in pairs]))
        rk = list(zip(*[evaluate(b, right, bind).map(value_key).tolist() for _, b in pairs]))
        index: dict[tuple, list[int]] = {}
        for j, key in enumerate(rk):
            if None not in key:
                index.setdefault(key, []).append(j)
        li = [i for i, key in enumerate(lk) for _ in index.get(key, ())]
        ri = [j for key in lk for j in index.get(key, ())]
    else:
        if len(left) * len(right) > CROSS_LIMIT:
            raise NotEvaluable(f"a join without equal keys pairs {len(left)} × {len(right)} rows")
        li = [i for i in range(len(left)) for _ in range(len(right))]
        ri = [j for _ in range(len(left)) for j in range(len(right))]
    if not residual or not li:
        return np.array(li, dtype=int), np.array(ri, dtype=int)
    both = pd.concat([left.iloc[li].drop(columns=[LINEAGE], errors="ignore").reset_index(drop=True),
                      right.iloc[ri].drop(columns=[LINEAGE], errors="ignore").reset_index(drop=True)], axis=1)
    ok = np.ones(len(both), dtype=bool)
    for c in residual:
        ok &= holds(c, both, bind)
    return np.array(li, dtype=int)[ok], np.array(ri, dtype=int)[ok]


# Each runner takes the operator of the type it is filed under.
_RUNNERS: dict[type[Op], Callable[..., pd.DataFrame]] = {
    Relation: _relation, Project: _project, Filter: _filter, Sort: _sort, Limit: _limit, Union: _union,
    Deduplicate: _deduplicate, Aggregate: _aggregate, Join: _join, Window: _window,
    WindowGroupLimit: _window_group_limit, Generate: _generate, Expand: _expand}
