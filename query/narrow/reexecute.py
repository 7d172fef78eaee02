"""Re-running a black box's function on its batch's input, and on parts of it: which input rows each output row
comes from, decided by execution (runs in the narrowing worker, ``worker.py``; pure pandas and pyarrow).

The function is called as PySpark's worker calls it (the same Arrow-to-pandas and pandas-to-Arrow conversions,
as the installed Spark's line makes them, ``spark_lines.SparkLine.to_pandas``, so its output rows hash as Spark's
did), and each output row is named by
its digest (``rid.box_output_digests``), the name capture gave the output rows of the real run.

Cui and Widom's classes, each verified on this batch, never assumed:

- **dispatcher**: ``f(I) = ⊎ f({i})`` over the input rows (multisets of output rows): an output row derives
  from each input row whose own run yields it. Up to ``ALONE_ROWS`` rows, every row is run alone. Past that,
  one call per row costs about a millisecond of the user's pandas (17 minutes for 1,000,000 rows), so the
  input is cut into chunks of ``CHUNK_ROWS`` and each chunk is run whole and in its two halves by each bit
  of a row's place in it (``Coded``): ``f(C) = f(A_j) ⊎ f(C - A_j)`` is checked for every bit j, and an
  output row made by one row (k times) is in ``f(A_j)`` k times for the bits of its row's place and never
  for the others, which names the row in 2·log2(c) calls. Output rows alike from several rows (some bit
  splits their copies) are told apart by halving
  the rows that made them until one is left (``_resolve``). Then ``SAMPLE_ROWS`` rows of each chunk are
  run alone, each checked to give exactly the rows decoded for it, and the chunks' outputs must add up to
  ``f(I)``. ``verified`` says which check the batch passed;
- **grouped**: ``f(I) = ⊎ f(G)`` over the groups of a key (``applyInPandas``'s own key, or, for a map, the
  first input column that verifies it): an output row derives from the rows of the groups that yield it;
- **per key** (a stateful function): replayed batch after batch from the query's first, each key's state
  carried as Spark carries it; an output row derives from its key's rows since that key last had no state;
- otherwise the **superset** (the whole input), with the reason.

A function whose output on the same input differs between two runs is non-deterministic: superset,
flagged. ``exact`` holds only where the property was verified on the batch's whole input and every output
column is in the digest.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from headwater.adapters import spark_lines
from headwater.core import rid as rids

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import Row
    from pyspark.sql.types import StructType

MAP_PANDAS, GROUPED_PANDAS, MAP_ARROW, GROUPED_WITH_STATE = 205, 201, 207, 208
SUPPORTED = (MAP_PANDAS, GROUPED_PANDAS, MAP_ARROW, GROUPED_WITH_STATE)
MAX_GROUPING_CALLS = 4  # a map tried as grouped by its columns: at most this many calls per input row in all
PROBE_ROWS = 32  # rows of a map's input run alone and together before every row is run alone
PARALLEL_CALLS = 2000  # from this many calls on, forked copies of the worker share them
PARALLEL_ROWS = 200_000  # or from this many rows in all (big calls: the coded runs)
MAX_FORKS = 4
ALONE_ROWS = 4096  # up to this many rows, a dispatcher is verified by running every row alone
CHUNK_ROWS = 1 << 16  # rows of one chunk of a dispatcher's coded runs
SAMPLE_ROWS = 64  # rows of each chunk run alone and checked against what the coded runs decoded for them
RESOLVE_CALLS = 0.5  # calls per row of a chunk at most, telling apart the rows that made output rows alike


@dataclass
class Narrowed:
    """What re-execution decided for one batch: per output digest, the input row positions it derives from."""

    kind: str  # dispatcher | grouped | per key | superset
    exact: bool
    reason: str = ""
    deterministic: bool | None = None
    # digest -> the input rows it derives from: positions in the batch's input, or (batch, position) pairs
    # for a stateful black box, whose rows come from earlier batches too
    lineage: dict[int, list] = field(default_factory=dict)
    calls: int = 0
    verified: str = ""  # how the class was checked on the batch (a dispatcher: every row alone, or coded runs)

    def to_dict(self) -> dict:
        """As the worker hands it on: each distinct set of input rows once (``sets``), and per output digest
        the index of its set (``set_of``): a group's rows are written once, not once per output row."""
        index: dict[tuple, int] = {}
        shared: dict[int, int] = {}  # id of a list digests share (``_lineage``) -> its set: hashed once, not per digest
        set_of = []
        for rows in self.lineage.values():
            if id(rows) not in shared:
                shared[id(rows)] = index.setdefault(tuple(rows), len(index))
            set_of.append(shared[id(rows)])
        return {"kind": self.kind, "exact": self.exact, "reason": self.reason, "deterministic": self.deterministic,
                "digests": list(self.lineage), "set_of": set_of, "sets": [[_plain(r) for r in rows] for rows in index],
                "calls": self.calls, "verified": self.verified}


class Function:
    """A black box's function, callable on a set of its input rows; what comes out is a Counter of digests."""

    def __init__(self, record: dict, dataset: str, digest: list[int]):
        import pyspark.cloudpickle as cloudpickle
        from pyspark.sql.types import StructField, StructType

        self.record = record
        self.eval_type = record["eval_type"]
        if self.eval_type not in SUPPORTED:
            raise ValueError(f"PySpark eval type {self.eval_type} is not re-run (mapInPandas, mapInArrow, "
                             f"applyInPandas and applyInPandasWithState are)")
        self.function, self.return_type = cloudpickle.loads(record["command"])
        self.input_type = _struct(record, "input")
        self.output_type = _struct(record, "output")
        self.keys = list(record.get("grouping") or [])  # positions of the key's columns in the input
        data = record.get("data")
        self.data = list(data if data is not None else range(len(self.input_type.fields)))
        self.timezone = record.get("timezone") or "UTC"
        self.dataset = dataset
        self.digest = digest
        fields = self.output_type.fields
        self.dtypes = [fields[i].dataType.simpleString() for i in digest]
        self.wrapped = StructType([StructField("_0", self.return_type if self.eval_type != GROUPED_WITH_STATE
                                               else self.output_type)])
        self.calls = 0
        if self.eval_type == GROUPED_WITH_STATE:
            from pyspark.sql.streaming.state import GroupStateTimeout

            if "NoTimeout" not in str(record.get("timeout")):
                raise ValueError(f"a stateful function with {record.get('timeout')} is not replayed (its timeouts "
                                 f"depend on clocks, not rows)")
            self.no_timeout = GroupStateTimeout.NoTimeout
            self.state_type = _struct(record, "state")
        import inspect

        self.takes_key = self.eval_type == GROUPED_PANDAS and len(inspect.getfullargspec(self.function).args) == 2

    # The input as the worker gets it --------------------------------------------------------------

    def frame(self, table: pa.Table, columns: list[int]):
        """Columns ``columns`` of ``table`` (the child's rows) as the pandas DataFrame the function gets."""
        part = table.select(columns)
        struct = pa.StructArray.from_arrays([c.combine_chunks() for c in part.columns], fields=list(part.schema))
        batch = pa.RecordBatch.from_arrays([struct], names=["_0"])
        return spark_lines.installed().to_pandas(batch, self.timezone)

    def _frames(self, table: pa.Table):
        """(the data columns' frame, the grouping columns' frame) of the whole input, made once per table."""
        held = getattr(self, "_held", None)
        if held is None or held[0] is not table:
            held = (table, self.frame(table, self.data), self.frame(table, self.keys) if self.keys else None)
            self._held = held
        return held[1], held[2]

    def run(self, table: pa.Table, groups: list[list[int]]) -> list[Counter]:
        """The output digests of one call per group of row positions (stateless functions); many calls are
        shared by forked copies of this process, one per core (``PARALLEL_CALLS``)."""
        self.calls += len(groups)
        workers = min(os.cpu_count() or 1, MAX_FORKS)
        many = len(groups) >= PARALLEL_CALLS or (len(groups) >= workers and sum(map(len, groups)) >= PARALLEL_ROWS)
        if not many or workers < 2 or self.eval_type == MAP_ARROW:
            return self._run(table, groups)
        self._frames(table)  # made before the fork: the copies share them
        global _FORKED
        _FORKED = (self, table, groups)
        # Contiguous shares of about equal rows (the coded runs' calls differ in size).
        ends = np.cumsum([len(g) for g in groups])
        cuts = [0, *np.searchsorted(ends, [ends[-1] * i / workers for i in range(1, workers)], side="right"),
                len(groups)]
        chunks = [(int(a), int(b)) for a, b in zip(cuts, cuts[1:]) if b > a]
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(workers) as pool:
            parts = pool.map(_run_chunk, chunks)
        _FORKED = None
        return [c for part in parts for c in part]

    def _run(self, table: pa.Table, groups: list[list[int]]) -> list[Counter]:
        if self.eval_type == MAP_ARROW:
            found = []
            for group in groups:
                part = table.take(pa.array(group, pa.int64())).combine_chunks()
                found.append(self._arrow_digests(self.function(iter(part.to_batches()))))
            return found
        data, keys = self._frames(table)
        produced: list[tuple[int, pd.DataFrame]] = []
        for i, group in enumerate(groups):
            # A slice where the group is one row (the dispatcher's test runs every row alone): cheaper than a take.
            part = (data.iloc[group[0]:group[0] + 1] if len(group) == 1 else data.iloc[group]).reset_index(drop=True)
            if self.eval_type == MAP_PANDAS:
                produced.extend((i, df) for df in self._checked(self.function(iter([part]))))
            elif self.takes_key:
                key = tuple(keys.iloc[group[0]]) if group else ()
                produced.append((i, self.function(key, part)))
            else:
                produced.append((i, self.function(part)))
        return self.digests(produced, len(groups))

    @staticmethod
    def _checked(result):
        import pandas as pd

        for df in result:
            if not isinstance(df, pd.DataFrame):
                raise TypeError(f"the function yielded a {type(df).__name__}, not a pandas.DataFrame")
            yield df

    def digests(self, produced: list[tuple[int, pd.DataFrame]], calls: int) -> list[Counter]:
        """Per call, the Counter of its output rows' digests; the frames of every call converted together
        where they agree in columns and types (one conversion, not one per call)."""
        import pandas as pd

        found: list[Counter] = [Counter() for _ in range(calls)]
        alike: dict[tuple, list[tuple[int, pd.DataFrame]]] = {}
        for i, df in produced:
            if len(df):
                alike.setdefault((tuple(map(str, df.columns)), tuple(map(str, df.dtypes))), []).append((i, df))
        for frames in alike.values():
            whole = pd.concat([df for _, df in frames], ignore_index=True) if len(frames) > 1 else frames[0][1]
            owners = [i for i, df in frames for _ in range(len(df))]
            for owner, digest in zip(owners, self._digest_rows(whole)):
                found[owner][digest] += 1
        return found

    def _digest_rows(self, df) -> list[int]:
        batch = spark_lines.installed().from_pandas(df, self.wrapped, self.timezone)
        rows = batch.column(0)
        if not self.digest:  # no column is digested: every row is named alike
            return [rids.spark_xxhash64(rids.BOX_OUTPUT, self.dataset)] * len(rows)
        return rids.box_output_digests_arrow(self.dataset, [rows.field(i) for i in self.digest], self.dtypes).tolist()

    def _arrow_digests(self, batches) -> Counter:
        found: Counter = Counter()
        for batch in batches:
            table = pa.Table.from_batches([batch]).cast(pa.schema(_arrow_schema(self.output_type)))
            found.update(rids.box_output_digests_arrow(self.dataset, [table.column(i) for i in self.digest],
                                                       self.dtypes).tolist())
        return found


_FORKED: tuple | None = None  # (function, table, groups) of the calls a fork shares out


def _run_chunk(bounds: tuple[int, int]) -> list[Counter]:
    assert _FORKED is not None, "runs only in the forks of Function.run, which sets _FORKED before forking"
    fn, table, groups = _FORKED
    return fn._run(table, groups[bounds[0]:bounds[1]])


def _struct(record: dict, what: str) -> StructType:
    """The record's ``what`` type (a black box's input, output or state: each a struct), from Spark's JSON."""
    from pyspark.sql.types import StructType, _parse_datatype_json_value

    found = _parse_datatype_json_value(record[what])
    if not isinstance(found, StructType):
        raise ValueError(f"the black box's {what} type is {found.simpleString()}, not a struct")
    return found


def _arrow_schema(struct_type) -> list[pa.Field]:
    from pyspark.sql.pandas.types import to_arrow_schema

    return list(to_arrow_schema(struct_type))


def _total(counters: list[Counter]) -> Counter:
    total: Counter = Counter()
    for c in counters:
        total.update(c)
    return total


def _plain(row):
    return list(row) if isinstance(row, tuple) else row


def _derives_from(lineage: dict[int, list[int]], digest: int, rows: list[int]) -> None:
    """``rows`` (sorted) into ``digest``'s lineage: the list itself where the digest has none yet, so that the
    digests of one call share it; merged where a row alike came out of another call too (it derives from both)."""
    had = lineage.get(digest)
    lineage[digest] = rows if had is None else sorted(set(had) | set(rows))


def _lineage(groups: list[list[int]], outputs: list[Counter]) -> dict[int, list[int]]:
    """Per output digest, the sorted rows of the calls it came out of. The digests of one call share one
    list: a grouped batch of 100,000 rows in groups of 1,000 holds 100 lists, not 100,000 (4 GB)."""
    lineage: dict[int, list[int]] = {}
    for group, out in zip(groups, outputs):
        rows = sorted(group)
        for digest in out:
            _derives_from(lineage, digest, rows)
    return lineage


def _key_groups(table: pa.Table, columns: list[int]) -> list[list[int]]:
    keys: dict[tuple, list[int]] = {}
    values = [table.column(i).to_pylist() for i in columns]
    for position, key in enumerate(zip(*values)):
        keys.setdefault(key, []).append(position)
    return list(keys.values())


def narrow_stateless(fn: Function, table: pa.Table, complete_digest: bool) -> Narrowed:
    """Classify and narrow one batch of a stateless black box; ``table`` holds its input rows, in order."""
    n = table.num_rows
    everything = [list(range(n))]
    if fn.eval_type == GROUPED_PANDAS:  # Spark calls it once per group of its key: that is f(I)
        whole = _key_groups(table, fn.keys)
    else:
        whole = everything
    first = _total(fn.run(table, whole))
    if _total(fn.run(table, whole)) != first:
        return Narrowed("superset", False, "non-deterministic: two runs on the batch's input gave different rows",
                        False, calls=fn.calls)
    partial = "" if complete_digest else _PARTIAL
    # A probe first: a dispatcher's property holds on every part of the input, so one part that fails it
    # (a group, or the first rows) saves running every row alone.
    probe = whole[0][:PROBE_ROWS] if fn.eval_type != GROUPED_PANDAS else whole[0]
    maybe = n > 0 and (_total(fn.run(table, [probe])) == _total(fn.run(table, [[i] for i in probe])))
    if maybe and n <= ALONE_ROWS:
        singles = [[i] for i in range(n)]
        per_row = fn.run(table, singles)
        if _total(per_row) == first:
            return Narrowed("dispatcher", complete_digest, partial, True, _lineage(singles, per_row), fn.calls,
                            "every row alone")
    elif maybe:
        coded = Coded(fn, table, whole).lineage(first)
        if isinstance(coded, dict):
            return Narrowed("dispatcher", complete_digest, partial, True, coded, fn.calls,
                            f"coded runs of chunks of up to {CHUNK_ROWS:,} rows, {SAMPLE_ROWS} rows of each alone")
    if fn.eval_type == GROUPED_PANDAS:
        outputs = fn.run(table, whole)
        return Narrowed("grouped", complete_digest, partial, True, _lineage(whole, outputs), fn.calls,
                        "one call per group, as Spark calls it")
    budget = MAX_GROUPING_CALLS * n
    for column in fn.data:
        groups = _key_groups(table, [column])
        if not 1 < len(groups) < n or fn.calls + len(groups) > budget:
            continue
        outputs = fn.run(table, groups)
        if _total(outputs) == first:
            name = table.column_names[column]
            return Narrowed("grouped", complete_digest, f"grouped by {name}" if complete_digest else _PARTIAL,
                            True, _lineage(groups, outputs), fn.calls, f"f(I) = ⊎ f(G) over the groups of {name}")
    return Narrowed("superset", False, "neither a dispatcher nor grouped by one column on this batch: every "
                    "output row may derive from every input row", True, calls=fn.calls)


class Coded:
    """A dispatcher's lineage from few calls: each chunk of the input run whole and in halves by the bits of
    each row's place in the chunk (module docstring). ``lineage`` gives digest -> input rows, or the reason
    the batch is not a dispatcher (a check that failed)."""

    def __init__(self, fn: Function, table: pa.Table, whole: list[list[int]]):
        self.fn = fn
        self.table = table
        # For applyInPandas, a set of rows is called as Spark calls it: once per group of its key.
        self.group_of = np.zeros(table.num_rows, dtype=np.int64)
        for g, rows in enumerate(whole):
            self.group_of[rows] = g

    def calls(self, rows: np.ndarray) -> list[list[int]]:
        """The calls of ``f`` on ``rows`` (sorted positions): one for a map, one per group for applyInPandas."""
        if self.fn.eval_type != GROUPED_PANDAS:
            return [rows.tolist()] if len(rows) else []
        groups = self.group_of[rows]
        order = np.argsort(groups, kind="stable")
        cuts = np.flatnonzero(np.diff(groups[order])) + 1
        return [part.tolist() for part in np.split(rows[order], cuts)] if len(rows) else []

    def outputs(self, sets: list[np.ndarray]) -> list[Counter]:
        """``f`` of each set of rows, as multisets of digests: every set's calls made at once."""
        calls: list[list[int]] = []
        owner: list[int] = []
        for i, rows in enumerate(sets):
            made = self.calls(rows)
            calls.extend(made)
            owner.extend([i] * len(made))
        found: list[Counter] = [Counter() for _ in sets]
        for i, out in zip(owner, self.fn.run(self.table, calls)):
            found[i].update(out)
        return found

    def lineage(self, first: Counter) -> dict[int, list[int]] | str:
        n = self.table.num_rows
        lineage: dict[int, list[int]] = {}
        total: Counter = Counter()
        for start in range(0, n, CHUNK_ROWS):
            found = self._chunk(np.arange(start, min(n, start + CHUNK_ROWS)))
            if isinstance(found, str):
                return found
            made, rows_of = found
            total.update(made)
            for digest, rows in rows_of.items():
                _derives_from(lineage, digest, rows)
        if total != first:
            return "the chunks' outputs do not add up to the batch's"
        return lineage

    def _chunk(self, chunk: np.ndarray) -> tuple[Counter, dict[int, list[int]]] | str:
        c = len(chunk)
        place = np.arange(c)
        halves = []
        for bit in range(max(1, (c - 1).bit_length())):
            ones = (place >> bit) & 1 == 1
            halves.extend([chunk[ones], chunk[~ones]])
        made, *parts = self.outputs([chunk, *halves])
        for bit in range(len(parts) // 2):
            if parts[2 * bit] + parts[2 * bit + 1] != made:
                return f"not a dispatcher: f(C) differs from f(A) ⊎ f(C - A) for the rows of bit {bit} of a chunk"
        # An output row made k times by one row is in f(A_j) k times for the bits of that row's place, and
        # 0 times for the others; made by several rows, some bit splits them.
        digests = np.array(sorted(made), dtype=np.int64)
        counts = np.array([made[d] for d in digests.tolist()], dtype=np.int64)
        index = np.zeros(len(digests), dtype=np.int64)
        one_row = np.ones(len(digests), dtype=bool)
        for bit in range(len(parts) // 2):
            part = parts[2 * bit]
            keys = np.fromiter(part.keys(), dtype=np.int64, count=len(part))
            inside = np.zeros(len(digests), dtype=np.int64)
            inside[np.searchsorted(digests, keys)] = np.fromiter(part.values(), dtype=np.int64, count=len(part))
            one_row &= (inside == 0) | (inside == counts)
            index |= (inside == counts).astype(np.int64) << bit
        if one_row.any() and index[one_row].max() >= c:
            return "not a dispatcher: an output row's runs name no row of its chunk"
        rows_of: dict[int, list[int]] = {int(d): [int(chunk[i])] for d, i in
                                         zip(digests[one_row].tolist(), index[one_row].tolist())}
        alike = Counter({d: made[d] for d in digests[~one_row].tolist()})
        if alike:
            resolved = self._resolve(chunk, alike, int(RESOLVE_CALLS * c) + 2)
            if isinstance(resolved, str):
                return resolved
            rows_of.update(resolved)
        if not self._sampled(chunk, rows_of):
            return "not a dispatcher: a row run alone gives other rows than the coded runs decoded for it"
        return made, rows_of

    def _resolve(self, chunk: np.ndarray, alike: Counter, budget: int) -> dict[int, list[int]] | str:
        """The rows that make each of the output rows ``alike`` (made more than once in ``chunk``), by halving
        the rows that made them until one is left, a level of halves in one round of calls."""
        level = [(chunk, alike)]
        found: dict[int, set[int]] = {}
        calls = 0
        while level:
            splits = [(rows[:len(rows) // 2], rows[len(rows) // 2:], want) for rows, want in level if len(rows) > 1]
            for rows, want in level:
                if len(rows) == 1:
                    for digest in want:
                        found.setdefault(digest, set()).add(int(rows[0]))
            calls += 2 * len(splits)
            if calls > budget:
                return (f"not narrowed by coded runs: telling apart the rows that made {len(alike)} output rows "
                        f"alike needs more than {budget} calls")
            outs = self.outputs([half for low, high, _ in splits for half in (low, high)])
            level = []
            for i, (low, high, want) in enumerate(splits):
                left = Counter({d: outs[2 * i][d] for d in want if outs[2 * i][d]})
                right = Counter({d: outs[2 * i + 1][d] for d in want if outs[2 * i + 1][d]})
                if left + right != want:
                    return "not a dispatcher: halves of a chunk's rows give other rows alike than the whole"
                level.extend((rows, part) for rows, part in ((low, left), (high, right)) if part)
        return {d: sorted(rows) for d, rows in found.items()}

    def _sampled(self, chunk: np.ndarray, rows_of: dict[int, list[int]]) -> bool:
        """Whether ``SAMPLE_ROWS`` rows of ``chunk`` (spread over it), each run alone, give exactly the output
        rows decoded for them (as sets: how often a row makes one of the rows alike is not decoded; the
        chunk's counts were checked whole)."""
        picked = np.unique(np.linspace(0, len(chunk) - 1, min(SAMPLE_ROWS, len(chunk))).astype(np.int64))
        rows = chunk[picked]
        wanted = set(rows.tolist())
        decoded: dict[int, set[int]] = {int(r): set() for r in rows}
        for digest, sources in rows_of.items():
            for r in wanted.intersection(sources):
                decoded[r].add(digest)
        alone = self.outputs([np.array([r]) for r in rows])
        return all(set(+alone[i]) == decoded[int(r)] for i, r in enumerate(rows))


_PARTIAL = "some output columns are not in the digest (nested types): rows alike in the rest share lineage"


def narrow_stateful(fn: Function, batches: list[tuple[int, pa.Table]], complete_digest: bool) -> dict[int, Narrowed]:
    """Replay a stateful black box (``applyInPandasWithState``) over its batches, in order, from the query's
    first: per batch, each output digest's input row positions (into that batch's ``table`` and earlier
    ones: positions are ``(batch, row)`` pairs flattened by the caller). Twice, to check determinism."""
    first = _replay(fn, batches)
    if _replay(fn, batches)[0] != first[0]:
        reason = "non-deterministic: two replays of the key's history gave different rows"
        return {b: Narrowed("superset", False, reason, False, calls=fn.calls) for b, _ in batches}
    outputs, lineage = first
    exact = complete_digest
    return {b: Narrowed("per key", exact, "" if exact else _PARTIAL, True, lineage.get(b, {}), fn.calls)
            for b, _ in batches}


def _replay(fn: Function, batches: list[tuple[int, pa.Table]]) -> tuple[dict, dict]:
    """(per batch, the Counter of output digests), (per batch, digest -> [(batch, row)…], sorted). The digests of
    one call share one list, as ``_lineage``'s do: a sessionisation's 1,000,000-row batch, each output row holding
    its key's 10,000 rows in a set of its own, went past the worker's memory."""
    from pyspark.sql.streaming.state import GroupState

    states: dict[tuple, Row] = {}  # key -> state value, absent: none
    since: dict[tuple, list] = {}  # key -> (batch, row) of its rows since it last had no state, in order
    outputs: dict[int, Counter] = {}
    lineage: dict[int, dict[int, list]] = {}
    for batch, table in batches:
        out_batch: Counter = Counter()
        for group in _key_groups(table, fn.keys):
            part = table.take(pa.array(group, pa.int64()))
            key = tuple(part.column(i)[0].as_py() for i in fn.keys)
            value = states.get(key)
            if value is None:
                since[key] = []
            since[key].extend((batch, i) for i in group)
            # pyspark annotates the state value Row, but passes None for none itself (its serializers.py)
            state = GroupState(value, 0, -1, fn.no_timeout, False, False, value is not None,  # type: ignore[arg-type]
                               False, False, -1, b"", fn.state_type)
            fn.calls += 1
            returned = fn._checked(fn.function(key, iter([fn.frame(part, fn.data)]), state))
            found = fn.digests([(0, df) for df in returned], 1)[0]
            if state._removed:
                states.pop(key, None)
            elif state._updated:
                states[key] = state._value
            out_batch.update(found)
            if not found:
                continue
            rows = list(since[key])  # sorted: batches in order, a key's rows in a batch in order (``_key_groups``)
            of_batch = lineage.setdefault(batch, {})
            for digest in found:
                _derives_from(of_batch, digest, rows)
        outputs[batch] = out_batch
    return outputs, lineage
