"""Is a pushdown exact? z3 over bounded symbolic tables (PredTrace §4.2).

For one operator, the predicate ``F`` that reached its output and the predicates ``G``
pushed to each input: each input becomes a table of ``ROWS`` symbolic rows (every cell a
z3 constant, every row a symbolic "exists"), the operator's output is computed over them
symbolically, and z3 is asked, for every input row ``r``:

- **sound**: ``lineage(r) → G(r)``, and
- **exact**: ``G(r) → lineage(r)``,

under the assumptions that the traced output row exists and that ``F`` selects exactly the
output rows equal to it (``F(o) ⇔ F_row(o)``: what Lemma 3.1 needs of the operator above).
``lineage(r)`` is the operator's lineage rule (Table 2) applied to the output rows
``F_row`` selects. A value set ``@V`` in ``G`` stands for the key values of the rows the
other input's ``G`` selects (what refinement computes at its fixpoint).

Cells are non-null in the model: SQL's nulls are left to the tests against the oracle.
Functions z3 has no theory for are uninterpreted (deterministic, otherwise unknown), so a
proof never depends on what they compute. Like MagicPush, two rows per table: enough for
the operators here, whose lineage relates rows pairwise.
"""

from __future__ import annotations

import datetime
import itertools
from dataclasses import dataclass
from decimal import Decimal

import z3

from headwater.spark.expr import COMPARISONS, Expr, col_id, conjuncts, str_value, yields_spec
from headwater.spark.operators import (
    Aggregate,
    Deduplicate,
    Expand,
    Filter,
    Generate,
    Join,
    Limit,
    Op,
    Project,
    Relation,
    Sort,
    Union,
    Window,
    WindowGroupLimit,
)

from .pushdown import equi_pairs, parse_var

ROWS = 3
ELEMENTS = 2  # what a generator yields per input row, at most, in the model
TIMEOUT_MS = 5_000


class Unsupported(Exception):
    """The operator or an expression has no symbolic model here: nothing is proved."""


@dataclass
class Verdict:
    sound: bool | None  # None: not decided (unsupported, or z3 gave up)
    exact: bool | None
    detail: str = ""


def _sort(dtype: str | None):
    if dtype in ("integer", "long", "short", "byte", "date"):
        return z3.IntSort()
    if dtype and (dtype.startswith("decimal") or dtype in ("double", "float")):
        return z3.RealSort()
    if dtype == "string":
        return z3.StringSort()
    if dtype == "boolean":
        return z3.BoolSort()
    if not dtype:  # an aggregate's or subquery's result the plan did not type: a value, nothing more known
        return UNTYPED
    # Binary, timestamps, structs…: values that are equal or not, and nothing more z3 needs.
    return z3.DeclareSort(f"Opaque_{dtype}")


UNTYPED = z3.DeclareSort("Untyped")


class _Symbols:
    """Fresh z3 names, parameters shared by F and F_row, and uninterpreted functions."""

    def __init__(self) -> None:
        self.count = itertools.count()
        self.params: dict[str, z3.ExprRef] = {}
        self.functions: dict[tuple, z3.FuncDeclRef] = {}
        self.sets: dict[tuple, z3.FuncDeclRef] = {}

    def fresh(self, prefix: str, sort) -> z3.ExprRef:
        return z3.Const(f"{prefix}!{next(self.count)}", sort)

    def param(self, name: str, sort) -> z3.ExprRef:
        if name not in self.params:
            self.params[name] = z3.Const(f"${name}", sort)
        return self.params[name]

    def function(self, name: str, args: list[z3.ExprRef], sort) -> z3.ExprRef:
        key = (name, tuple(str(a.sort()) for a in args), str(sort))
        if key not in self.functions:
            self.functions[key] = z3.Function(f"{name}!{len(self.functions)}", *[a.sort() for a in args], sort)
        return self.functions[key](*args)

    def member(self, var: str, values: list[z3.ExprRef]) -> z3.ExprRef:
        """Whether ``values`` (a key, one term per column) is in the value set ``var``."""
        key = (var, *(str(v.sort()) for v in values))  # a set met with untyped and typed keys: one per typing
        if key not in self.sets:
            self.sets[key] = z3.Function(f"@{var}!{len(self.sets)}", *[v.sort() for v in values], z3.BoolSort())
        return self.sets[key](*values)


Row = dict[int, z3.ExprRef]  # exprId → cell


def _value(v, sort):
    if isinstance(v, bool):
        return z3.BoolVal(v)
    if isinstance(v, datetime.date):
        return z3.IntVal(v.toordinal())
    if isinstance(v, (int, Decimal, float)):
        return z3.RealVal(str(v)) if sort == z3.RealSort() else z3.IntVal(int(v))
    if isinstance(v, str):
        return z3.StringVal(v)
    raise Unsupported(f"literal {v!r}")


def _coerce(a: z3.ExprRef, b: z3.ExprRef) -> tuple[z3.ExprRef, z3.ExprRef]:
    if a.sort() == z3.IntSort() and b.sort() == z3.RealSort():
        return z3.ToReal(a), b
    if a.sort() == z3.RealSort() and b.sort() == z3.IntSort():
        return a, z3.ToReal(b)
    return a, b


def key_terms(e: Expr, row: Row, sym: _Symbols) -> list[z3.ExprRef]:
    """A key's terms: one per column of a composite key (``tuple``), else one."""
    return [symbolic(a, row, sym) for a in e.args] if e.op == "tuple" else [symbolic(e, row, sym)]


def _pair(left: Expr, right: Expr, row: Row, sym: _Symbols) -> tuple[z3.ExprRef, z3.ExprRef]:
    """Two operands of one sort: an untyped side takes the other's sort; ints meet reals as reals."""
    a, b = symbolic(left, row, sym), symbolic(right, row, sym)
    if a.sort() == UNTYPED and b.sort() != UNTYPED:
        a = symbolic(left, row, sym, b.sort())
    elif b.sort() == UNTYPED and a.sort() != UNTYPED:
        b = symbolic(right, row, sym, a.sort())
    return _coerce(a, b)


def symbolic(e: Expr, row: Row, sym: _Symbols, want=None) -> z3.ExprRef:
    """``e`` over one symbolic row; ``want``: the sort to read a result the plan left untyped
    as (one function per sort, so the same value read twice is the same term)."""
    found = _symbolic(e, row, sym)
    if want is not None and found.sort() == UNTYPED:
        return sym.function("typed", [found], want)
    return found


def _symbolic(e: Expr, row: Row, sym: _Symbols) -> z3.ExprRef:
    op = e.op
    if op == "col":
        if col_id(e) not in row:
            raise Unsupported(f"{e} is not in the row")
        return row[col_id(e)]
    if op == "lit":
        if e.value is None:
            raise Unsupported("null literal")
        return _value(e.value, _sort(e.dtype) if e.dtype else z3.IntSort())
    if op == "param":
        return sym.param(str_value(e), _sort(e.dtype))
    if op == "scalar_subquery":
        return sym.param(f"subquery{e.value}", _sort(e.dtype))
    if op == "in_set":
        return sym.member(str_value(e), key_terms(e.args[0], row, sym))
    if op == "yields":
        kind, _, dtypes = yields_spec(e)
        collection = symbolic(e.args[0], row, sym)
        found = []
        for k in range(ELEMENTS):
            cells = _element(kind, collection, k, dtypes, sym)
            wanted = [_coerce(c, symbolic(v, row, sym, c.sort())) for c, v in zip(cells, e.args[1:])]
            found.append(z3.And(_has(collection, k, sym), *[a == b for a, b in wanted]))
        return z3.Or(*found)
    if op in ("and", "or"):
        parts = [symbolic(a, row, sym) for a in e.args]
        return z3.And(*parts) if op == "and" else z3.Or(*parts)
    if op == "not":
        return z3.Not(symbolic(e.args[0], row, sym))
    if op in COMPARISONS:
        a, b = _pair(e.args[0], e.args[1], row, sym)
        if op in ("=", "<=>"):
            return a == b
        if not z3.is_arith(a):  # strings, dates as text, opaque values: an order z3 knows nothing of
            less = sym.function("less", [a, b], z3.BoolSort())
            return {"<": less, "<=": z3.Or(less, a == b), ">": sym.function("less", [b, a], z3.BoolSort()),
                    ">=": z3.Or(sym.function("less", [b, a], z3.BoolSort()), a == b)}[op]
        return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]
    if op in ("isnotnull",):
        return z3.BoolVal(True)
    if op == "isnull":
        return z3.BoolVal(False)
    if op == "in":
        return z3.Or(*[a == b for a, b in (_pair(e.args[0], x, row, sym) for x in e.args[1:])])
    if op in ("+", "-", "*"):
        a, b = _pair(e.args[0], e.args[1], row, sym)
        return {"+": a + b, "-": a - b, "*": a * b}[op]
    if op == "neg":
        return -symbolic(e.args[0], row, sym)
    if op == "startswith":
        return z3.PrefixOf(symbolic(e.args[1], row, sym), symbolic(e.args[0], row, sym))
    if op == "endswith":
        return z3.SuffixOf(symbolic(e.args[1], row, sym), symbolic(e.args[0], row, sym))
    if op == "contains":
        return z3.Contains(symbolic(e.args[0], row, sym), symbolic(e.args[1], row, sym))
    if op in ("case", "if"):
        args = list(e.args)
        otherwise = symbolic(args[-1], row, sym) if len(args) % 2 else sym.fresh("null", _sort(e.dtype))
        pairs = [(args[i], args[i + 1]) for i in range(0, len(args) - 1, 2)]
        for cond, value in reversed(pairs):
            then = symbolic(value, row, sym)
            then, otherwise = _coerce(then, otherwise)
            otherwise = z3.If(symbolic(cond, row, sym), then, otherwise)
        return otherwise
    if op == "cast":
        inner = symbolic(e.args[0], row, sym)
        target = _sort(e.dtype)
        if inner.sort() == target:
            return inner
        if inner.sort() == z3.IntSort() and target == z3.RealSort():
            return z3.ToReal(inner)
        return sym.function(f"cast_{e.dtype}", [inner], target)
    # Anything else (aggregates, opaque functions…) is a deterministic function of its
    # arguments, nothing more.
    args = [symbolic(a, row, sym) for a in e.args]
    return sym.function(f"{op}_{e.value}", args, _sort(e.dtype))


@dataclass
class _Output:
    cells: Row
    exists: z3.ExprRef
    inputs: list[tuple[int, int, z3.ExprRef]]  # (child, row, condition under which that input row contributes)


class _Tables:
    def __init__(self, op: Op, sym: _Symbols):
        self.rows: list[list[Row]] = []
        self.exists: list[list[z3.ExprRef]] = []
        for c, child in enumerate(op.children):
            rows, flags = [], []
            for i in range(ROWS):
                rows.append({a.expr_id: sym.fresh(f"c{c}r{i}.{a.name}", _sort(a.dtype)) for a in child.output})
                flags.append(z3.Bool(f"exists!c{c}r{i}"))
            self.rows.append(rows)
            self.exists.append(flags)


def _outputs(op: Op, t: _Tables, sym: _Symbols) -> list[_Output]:
    """The operator's output rows over the symbolic inputs, each with the inputs it derives from."""
    if isinstance(op, (Filter, Project, Sort, Limit, Deduplicate)):
        outs = []
        for i, row in enumerate(t.rows[0]):
            exists = t.exists[0][i]
            cells = row
            if isinstance(op, Filter):
                exists = z3.And(exists, symbolic(op.condition, row, sym))
            if isinstance(op, Project):
                cells = {a.expr_id: symbolic(e, row, sym) for a, e in op.items}
            outs.append(_Output(cells, exists, [(0, i, z3.BoolVal(True))]))
        return outs
    if isinstance(op, Union):
        outs = []
        for c, child in enumerate(op.children):
            for i, row in enumerate(t.rows[c]):
                cells = {a.expr_id: row[b.expr_id] for a, b in zip(op.output, child.output)}
                outs.append(_Output(cells, t.exists[c][i], [(c, i, z3.BoolVal(True))]))
        return outs
    if isinstance(op, Aggregate):
        outs = []
        for i, row in enumerate(t.rows[0]):
            key = [symbolic(g, row, sym) for g in op.groups]
            cells = {}
            typed = {a.expr_id: a.dtype for a in op.output}  # the logged output's types, where the items have none
            for attr, e in op.items:
                if e in op.groups:
                    cells[attr.expr_id] = key[op.groups.index(e)]
                else:  # an aggregate: one value per group, otherwise unknown
                    cells[attr.expr_id] = sym.function(f"agg{attr.expr_id}", key or [z3.IntVal(0)],
                                                       _sort(attr.dtype or typed.get(attr.expr_id)))
            members = []
            for j, other in enumerate(t.rows[0]):
                theirs = [symbolic(g, other, sym) for g in op.groups]
                same = z3.And(t.exists[0][j], *[a == b for a, b in zip(key, theirs)])
                members.append((0, j, same))
            outs.append(_Output(cells, t.exists[0][i], members))
        return outs
    if isinstance(op, Join):
        condition = op.condition
        cond = (lambda cells: symbolic(condition, cells, sym)) if condition is not None \
            else (lambda cells: z3.BoolVal(True))
        outs = []
        for i, left in enumerate(t.rows[0]):
            matches = []
            for j, right in enumerate(t.rows[1]):
                matches.append((j, z3.And(t.exists[1][j], cond({**left, **right}))))
            if op.join_type in ("inner", "cross"):
                for j, matched in matches:
                    outs.append(_Output({**left, **t.rows[1][j]}, z3.And(t.exists[0][i], matched),
                                        [(0, i, z3.BoolVal(True)), (1, j, z3.BoolVal(True))]))
            elif op.join_type == "leftsemi":
                found = z3.Or(*[m for _, m in matches])
                outs.append(_Output(dict(left), z3.And(t.exists[0][i], found),
                                    [(0, i, z3.BoolVal(True))] + [(1, j, m) for j, m in matches]))
            elif op.join_type == "leftanti":
                found = z3.Or(*[m for _, m in matches])
                outs.append(_Output(dict(left), z3.And(t.exists[0][i], z3.Not(found)), [(0, i, z3.BoolVal(True))]))
            else:
                raise Unsupported(f"{op.join_type} join (nulls are not modelled)")
        return outs
    if isinstance(op, (Window, WindowGroupLimit)):
        return _window_outputs(op, t, sym)
    if isinstance(op, Generate):
        # An outer generator's row of NULLs is none the model's traced row can be (cells are non-null).
        if op.generator.op != "generator":
            raise Unsupported(f"generator {op.generator}")
        dtypes = tuple(a.dtype for a in op.generated)
        outs = []
        for i, row in enumerate(t.rows[0]):
            collection = symbolic(op.generator.args[0], row, sym)
            for k in range(ELEMENTS):
                cells = dict(zip([a.expr_id for a in op.generated],
                                 _element(str_value(op.generator), collection, k, dtypes, sym)))
                exists = z3.And(t.exists[0][i], _has(collection, k, sym))
                outs.append(_Output({**row, **cells}, exists, [(0, i, z3.BoolVal(True))]))
        return outs
    if isinstance(op, Expand):
        # Cells are non-null in the model, so no traced row is one a projection puts a NULL
        # in: such projections yield no rows here (the pushdown folds its tests of those NULLs).
        outs = []
        for projection in op.projections:
            if any(e.op == "lit" and e.value is None for e in projection):
                continue
            for i, row in enumerate(t.rows[0]):
                cells = {a.expr_id: symbolic(e, row, sym) for a, e in zip(op.output, projection)}
                outs.append(_Output(cells, t.exists[0][i], [(0, i, z3.BoolVal(True))]))
        if not outs:
            raise Unsupported("Expand: every projection puts a NULL somewhere")
        return outs
    raise Unsupported(f"{op.kind}")


def _has(collection: z3.ExprRef, k: int, sym: _Symbols) -> z3.ExprRef:
    """Whether a generator yields a ``k``-th row for ``collection``."""
    return sym.function(f"has{k}", [collection], z3.BoolSort())


def _element(kind: str, collection: z3.ExprRef, k: int, dtypes: tuple, sym: _Symbols) -> list[z3.ExprRef]:
    """The cells of the ``k``-th row a generator yields for ``collection``: unknown values,
    but for posexplode's position."""
    cells = [sym.function(f"element{k}.{j}", [collection], _sort(d)) for j, d in enumerate(dtypes)]
    return [z3.IntVal(k), *cells[1:]] if kind == "posexplode" else cells


def _window_outputs(op: Window | WindowGroupLimit, t: _Tables, sym: _Symbols) -> list[_Output]:
    """Each input row with its window values, from every row of its partition. What a window
    computes, and which rows a group limit keeps, are left free: any values, any rows."""
    keys = [[symbolic(p, row, sym) for p in op.partition] for row in t.rows[0]]
    typed = {a.expr_id: a.dtype for a in op.output}
    outs = []
    for i, row in enumerate(t.rows[0]):
        cells = dict(row)
        for attr, _ in getattr(op, "items", []):
            cells[attr.expr_id] = sym.fresh(f"w{attr.expr_id}", _sort(typed.get(attr.expr_id) or attr.dtype))
        exists = t.exists[0][i]
        if isinstance(op, WindowGroupLimit):
            exists = z3.And(exists, sym.fresh("kept", z3.BoolSort()))
        members = [(0, j, z3.And(t.exists[0][j], *[a == b for a, b in zip(keys[i], keys[j])])) for j in range(ROWS)]
        outs.append(_Output(cells, exists, members))
    return outs


def _row_selection(op: Op, cells: Row, sym: _Symbols) -> z3.ExprRef:
    return z3.And(*[cells[a.expr_id] == sym.param(f"row{a.expr_id}", cells[a.expr_id].sort()) for a in op.output])


def verify(op: Op, predicate: Expr, pushed: list[Expr], facts_of: dict[str, tuple[int, Expr]] | None = None) \
        -> list[Verdict]:
    """One verdict per input of ``op``: whether ``pushed[i]`` selects exactly (and at least)
    the lineage of the output rows ``predicate`` selects, assumed to be one traced row's.

    ``facts_of`` names, for value sets in ``pushed``, the input and key expression whose
    selected values they hold (refinement's fixpoint), so z3 can use what they mean.
    """
    if isinstance(op, Relation):
        return []
    sym = _Symbols()
    try:
        tables = _Tables(op, sym)
        outs = _outputs(op, tables, sym)
        solver = z3.Solver()
        solver.set("timeout", TIMEOUT_MS)
        row_sel = [_row_selection(op, o.cells, sym) for o in outs]
        solver.add(z3.Or(*[z3.And(o.exists, s) for o, s in zip(outs, row_sel)]))
        for o, s in zip(outs, row_sel):
            solver.add(z3.Implies(o.exists, symbolic(predicate, o.cells, sym) == s))
        selected = [[z3.And(tables.exists[c][j], symbolic(g, row, sym)) for j, row in enumerate(tables.rows[c])]
                    for c, g in enumerate(pushed)]
        lineage = [[_lineage(outs, row_sel, c, j) for j in range(ROWS)] for c in range(len(op.children))]
        only = []
        for c2, g in enumerate(pushed):
            for node in g.walk():
                if node.op != "in_set":
                    continue
                var = str_value(node)
                terms = [key_terms(node.args[0], row, sym) for row in tables.rows[c2]]
                for j in range(ROWS):  # refinement's invariant: a value set holds the lineage's values
                    solver.add(z3.Implies(lineage[c2][j], sym.member(var, terms[j])))
                if facts_of is not None and var in facts_of:  # and only the keys of the rows the other input selects
                    c, key = facts_of[var]
                    keys = [key_terms(key, row, sym) for row in tables.rows[c]]
                    for term in terms:
                        only.append(z3.Implies(sym.member(var, term), z3.Or(*[
                            z3.And(selected[c][j], *[k == t for k, t in zip(keys[j], term)]) for j in range(ROWS)])))
    except (Unsupported, z3.Z3Exception) as exc:
        return [Verdict(None, None, f"not verified: {exc}") for _ in op.children]
    # Soundness needs only that value sets hold the lineage's values; exactness also what
    # they hold no more than. A contradiction among the assumptions would prove anything:
    # then nothing is claimed.
    if solver.check() != z3.sat:
        return [Verdict(None, None, "not verified: no model of the operator") for _ in op.children]
    sound = [_all(solver, [z3.Implies(lineage[c][j], selected[c][j]) for j in range(ROWS)])
             for c in range(len(op.children))]
    solver.add(*only)
    if solver.check() != z3.sat:
        return [Verdict(s, None, "not verified: the value sets' assumptions contradict") for s in sound]
    return [Verdict(sound[c], _all(solver, [z3.Implies(selected[c][j], lineage[c][j]) for j in range(ROWS)]))
            for c in range(len(op.children))]


def _all(solver: z3.Solver, claims: list) -> bool | None:
    found: bool | None = True
    for claim in claims:
        found = _and3(found, _valid(solver, claim))
    return found


def _lineage(outs: list[_Output], row_sel: list, c: int, j: int) -> z3.ExprRef:
    """Input row ``j`` of input ``c`` is lineage of a selected output row."""
    return z3.Or(*[z3.And(o.exists, s, z3.Or(*[cond for child, row, cond in o.inputs if child == c and row == j]
                                              or [z3.BoolVal(False)]))
                   for o, s in zip(outs, row_sel)])


def _valid(solver: z3.Solver, claim: z3.ExprRef) -> bool | None:
    solver.push()
    solver.add(z3.Not(claim))
    result = solver.check()
    solver.pop()
    if result == z3.unsat:
        return True
    if result == z3.sat:
        return False
    return None


def _and3(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    if a is None or b is None:
        return None
    return True


def key_facts(op: Join, pushed: list[Expr]) -> dict[str, tuple[int, Expr]]:
    """For value sets a join hands from one input to the other: the input whose selected rows'
    key values each holds (its relation is under that input), and that key."""
    found: dict[str, tuple[int, Expr]] = {}
    pairs = equi_pairs(op)
    for c2, g in enumerate(pushed):
        for part in conjuncts(g):
            if part.op != "in_set":
                continue
            var = str_value(part)
            relation, attrs = parse_var(var)
            for c, child in enumerate(op.children):
                if c == c2 or relation not in {r.id for r in child.relations()}:
                    continue
                columns = _key_columns(pairs, c)
                keys = [columns[a] for a in attrs if a in columns]
                if len(keys) == len(attrs):
                    found[var] = (c, keys[0] if len(keys) == 1 else Expr("tuple", tuple(keys)))
    return found


def _key_columns(pairs: list[tuple[Expr, Expr]], c: int) -> dict[int, Expr]:
    """Input ``c``'s join keys that are columns, by exprId (the first, where one repeats)."""
    found: dict[int, Expr] = {}
    for pair in pairs:
        if pair[c].op == "col":
            found.setdefault(col_id(pair[c]), pair[c])
    return found
