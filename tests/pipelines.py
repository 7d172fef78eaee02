"""Randomized operator pipelines, each runnable by Spark and by a brute-force oracle.

A pipeline is a list of steps. Every step has a Spark form (DataFrame → DataFrame) and
an oracle form over rows that carry their lineage: ``(values dict, frozenset of
inputs)``. The oracle follows SQL's three-valued logic where the pipelines need it
(a filter keeps a row only when its predicate is true, not null).

Lineage semantics the oracle encodes (and capture must match):
- project, filter, UDFs: an output row derives from the row it was computed from;
- explode: each element's row derives from the exploded row;
- union: a row derives from the branch row it came from;
- inner / left outer join with a static table: from the stream row and, when one
  matched, the table row; left semi join: from the stream row and the table rows
  that matched, though it outputs only the stream row's columns; left anti join: from
  the stream row alone (no table row contributed to it);
- unpivot, every generator (inline, stack, json_tuple, …) and a lateral join with a
  table-valued function: each row made from a row derives from that row;
- hints, range repartitioning, coalesce, observations, an index column: each row from itself.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Iterator

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

EVENT_SCHEMA = "id long, k int, v int, tags array<int>, s string"
DIM_KEYS = range(10)

Row = tuple  # (dict, frozenset)


def events(count: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        if rng.random() < 0.02:
            out.append(b"{broken json")
            continue
        event = {
            "id": i,
            "k": rng.randint(0, 13),  # 10..13 have no dims row
            "v": rng.randint(-50, 50),
            "tags": None if rng.random() < 0.1 else [rng.randint(0, 3) for _ in range(rng.randint(0, 3))],
            "s": rng.choice(["a", "b", "c", None]),
        }
        out.append(json.dumps(event).encode())
    return out


def dims() -> list[dict]:
    return [{"k": k, "name": f"dim-{k}", "w": k * 10} for k in DIM_KEYS]


def parse(value: bytes) -> dict:
    """What ``from_json(value, EVENT_SCHEMA)`` then ``select("e.*")`` yields."""
    try:
        event = json.loads(value)
    except ValueError:
        event = {}
    return {field: event.get(field) for field in ("id", "k", "v", "tags", "s")}


def sql_and(*values):
    if any(v is False for v in values):
        return False
    return None if any(v is None for v in values) else True


def cmp(a, op: str, b):
    if a is None or b is None:
        return None
    return {">": a > b, "<": a < b, "=": a == b, "!=": a != b, ">=": a >= b}[op]


@dataclass
class Filter:
    sql: str
    oracle: Callable[[dict], object]

    def spark(self, df: DataFrame, env) -> DataFrame:
        return df.where(self.sql)

    def run(self, rows: list[Row], env) -> list[Row]:
        return [(r, lin) for r, lin in rows if self.oracle(r) is True]


@dataclass
class With:
    name: str
    sql: str
    oracle: Callable[[dict], object]

    def spark(self, df, env):
        return df.withColumn(self.name, F.expr(self.sql))

    def run(self, rows, env):
        return [({**r, self.name: self.oracle(r)}, lin) for r, lin in rows]


@dataclass
class Select:
    columns: tuple

    def spark(self, df, env):
        return df.select(*self.columns)

    def run(self, rows, env):
        return [({c: r[c] for c in self.columns}, lin) for r, lin in rows]


def _upper(s):
    return None if s is None else s.upper() + "!"


def _plus_one(series):
    return series + 1


@dataclass
class PythonUdf:
    name: str
    column: str

    def spark(self, df, env):
        return df.withColumn(self.name, F.udf(_upper, "string")(F.col(self.column)))

    def run(self, rows, env):
        return [({**r, self.name: _upper(r[self.column])}, lin) for r, lin in rows]


@dataclass
class PandasUdf:
    name: str
    column: str

    def spark(self, df, env):
        return df.withColumn(self.name, F.pandas_udf(_plus_one, "long")(F.col(self.column).cast("long")))

    def run(self, rows, env):
        return [({**r, self.name: None if r[self.column] is None else r[self.column] + 1}, lin) for r, lin in rows]


@dataclass
class Explode:
    column: str
    name: str
    position: bool = False
    outer: bool = False

    def spark(self, df, env):
        fn = {(False, False): F.explode, (False, True): F.explode_outer,
              (True, False): F.posexplode, (True, True): F.posexplode_outer}[(self.position, self.outer)]
        names = (f"{self.name}_pos", self.name) if self.position else (self.name,)
        return df.select("*", fn(self.column).alias(*names))

    def run(self, rows, env):
        out = []
        for r, lin in rows:
            items = r[self.column] or []
            pairs = list(enumerate(items)) or ([(None, None)] if self.outer else [])
            for pos, item in pairs:
                extra = {f"{self.name}_pos": pos} if self.position else {}
                out.append(({**r, **extra, self.name: item}, lin))
        return out


@dataclass
class JoinDims:
    how: str  # inner | left | left_anti | left_semi

    def spark(self, df, env):
        return df.join(env.dims_df, "k", self.how)

    def run(self, rows, env):
        by_key = {d["k"]: d for d in dims()}
        out = []
        for r, lin in rows:
            match = by_key.get(r["k"])
            if self.how == "left_anti":
                if match is None:
                    out.append((r, lin))
            elif self.how == "left_semi":
                if match is not None:
                    out.append((r, lin | {("table", "dims", str(r["k"]))}))
            elif match is not None:
                out.append(({**r, **match}, lin | {("table", "dims", str(r["k"]))}))
            elif self.how == "left":
                out.append(({**r, "name": None, "w": None}, lin))
        return out


@dataclass
class Repartition:
    partitions: int

    def spark(self, df, env):
        return df.repartition(self.partitions, "k")

    def run(self, rows, env):
        return rows


@dataclass
class Reshuffle:
    """Operators that keep every row as it is: a range repartition, a coalesce, an observation, an index
    (``zipWithIndex``, Spark 4's: left out of a pipeline on Spark 3.5, where the rows are the same without it)."""

    kind: str  # range | coalesce | observe | index
    transparent = True

    @property
    def since(self) -> str:
        return "4.2" if self.kind == "index" else "3.5"

    def spark(self, df, env):
        if self.kind == "range":
            return df.repartitionByRange(3, "v")
        if self.kind == "coalesce":
            return df.coalesce(1)
        if self.kind == "observe":
            return df.observe(f"observed_{id(self)}", F.count(F.lit(1)).alias("rows"), F.max("v").alias("top"))
        return df.zipWithIndex("ix").drop("ix")

    def run(self, rows, env):
        return rows


@dataclass
class HintedJoin:
    """``JoinDims`` with the dims table under a broadcast hint."""

    how: str

    def spark(self, df, env):
        return df.join(env.dims_df.hint("broadcast"), "k", self.how)

    def run(self, rows, env):
        return JoinDims(self.how).run(rows, env)


@dataclass
class Unpivot:
    """``unpivot(ids, values, "var", "val")``: one row per value column of each row (nulls kept)."""

    ids: tuple
    values: tuple

    def spark(self, df, env):
        return df.unpivot(list(self.ids), list(self.values), "var", "val")

    def run(self, rows, env):
        return [({**{c: r[c] for c in self.ids}, "var": v, "val": r[v]}, lin) for r, lin in rows for v in self.values]


def _tag_structs(tags):
    return [{"a": t, "b": None if t is None else t * 2} for t in tags] if tags is not None else None


@dataclass
class Generator:
    """A generator of Spark's besides explode: ``inline``/``inline_outer`` over structs made of ``tags``,
    ``stack(2, k, v)``, ``json_tuple`` over a JSON text of ``k`` and ``s``, or a lateral join with
    ``spark.tvf.explode`` of ``tags``."""

    kind: str  # inline | inline_outer | stack | json_tuple | lateral

    @property
    def since(self) -> str:
        return "4.0" if self.kind == "lateral" else "3.5"  # DataFrame.lateralJoin is Spark 4's

    def spark(self, df, env):
        structs = F.transform("tags", lambda t: F.struct(t.alias("a"), (t * 2).alias("b")))
        if self.kind == "inline":
            return df.select("*", F.inline(structs))
        if self.kind == "inline_outer":
            return df.select("*", F.inline_outer(structs))
        if self.kind == "stack":
            return df.select("*", F.expr("stack(2, k, v) AS (x)"))
        if self.kind == "json_tuple":
            return df.select("*", F.json_tuple(F.to_json(F.struct("k", "s")), "k", "s").alias("jk", "js"))
        return df.lateralJoin(df.sparkSession.tvf.explode(F.col("tags").outer())).withColumnRenamed("col", "tag")

    def run(self, rows, env):
        out = []
        for r, lin in rows:
            if self.kind in ("inline", "inline_outer"):
                structs = _tag_structs(r["tags"]) or ([{"a": None, "b": None}] if self.kind == "inline_outer" else [])
                out += [({**r, **item}, lin) for item in structs]
            elif self.kind == "stack":
                out += [({**r, "x": x}, lin) for x in (r["k"], r["v"])]
            elif self.kind == "json_tuple":
                out.append(({**r, "jk": None if r["k"] is None else str(r["k"]), "js": r["s"]}, lin))
            else:
                out += [({**r, "tag": tag}, lin) for tag in r["tags"] or []]
        return out


@dataclass
class UnionOf:
    """``df.where(a).union(df.where(b))``: rows in both branches appear twice.

    With ``by_name`` the right branch's columns come in reverse order and
    ``unionByName`` puts them back.
    """

    left: Filter
    right: Filter
    by_name: bool = False

    def spark(self, df, env):
        left, right = self.left.spark(df, env), self.right.spark(df, env)
        if self.by_name:
            return left.unionByName(right.select(*reversed(right.columns)))
        return left.union(right)

    def run(self, rows, env):
        return self.left.run(rows, env) + self.right.run(rows, env)


PIPELINES = {
    "filter_project": [
        Filter("v > 0", lambda r: cmp(r["v"], ">", 0)),
        With("v2", "v * 2 + k", lambda r: None if None in (r["v"], r["k"]) else r["v"] * 2 + r["k"]),
        Select(("id", "v2", "k")),
    ],
    "explode_filter_join": [
        Explode("tags", "tag"),
        Filter("tag != 1", lambda r: cmp(r["tag"], "!=", 1)),
        JoinDims("inner"),
        Select(("id", "tag", "name")),
    ],
    "left_join_coalesce": [
        JoinDims("left"),
        With("label", "coalesce(name, 'none')", lambda r: r["name"] if r["name"] is not None else "none"),
        Filter("v % 2 = 0", lambda r: None if r["v"] is None else r["v"] % 2 == 0),
        Select(("id", "label", "w")),
    ],
    "udf_filter_join": [
        PythonUdf("loud", "s"),
        Filter("loud IS NOT NULL", lambda r: r["loud"] is not None),
        JoinDims("inner"),
        Select(("id", "loud", "w")),
    ],
    "anti_join": [
        JoinDims("left_anti"),
        Filter("v < 10", lambda r: cmp(r["v"], "<", 10)),
        With("neg", "-v", lambda r: None if r["v"] is None else -r["v"]),
        Select(("id", "k", "neg")),
    ],
    "union_join": [
        UnionOf(Filter("v > 10", lambda r: cmp(r["v"], ">", 10)), Filter("v < -10 OR v > 40",
                lambda r: None if r["v"] is None else (r["v"] < -10 or r["v"] > 40)), by_name=True),
        JoinDims("inner"),
        Select(("id", "v", "name")),
    ],
    "posexplode_left_join": [
        Explode("tags", "tag", position=True),
        With("score", "tag_pos * v", lambda r: None if None in (r["tag_pos"], r["v"]) else r["tag_pos"] * r["v"]),
        Filter("score >= 0", lambda r: cmp(r["score"], ">=", 0)),
        JoinDims("left"),
        Select(("id", "tag_pos", "score", "name")),
    ],
    "pandas_udf_explode_outer": [
        PandasUdf("v1", "v"),
        Filter("v1 > -20", lambda r: cmp(r["v1"], ">", -20)),
        Explode("tags", "tag", outer=True),
        Select(("id", "v1", "tag")),
    ],
    "two_joins": [
        JoinDims("inner"),
        With("k2", "(k + 1) % 10", lambda r: (r["k"] + 1) % 10),
        Select(("id", "k2", "name")),
        With("k", "k2", lambda r: r["k2"]),
        JoinDims("left"),
        Select(("id", "k2", "w")),
    ],
    "six_operators": [
        Filter("s IS NOT NULL", lambda r: r["s"] is not None),
        UnionOf(Filter("s = 'a'", lambda r: cmp(r["s"], "=", "a")), Filter("v > 0", lambda r: cmp(r["v"], ">", 0))),
        Explode("tags", "tag"),
        JoinDims("inner"),
        With("tw", "tag + w", lambda r: None if None in (r["tag"], r["w"]) else r["tag"] + r["w"]),
        Select(("id", "s", "tw")),
    ],
    "semi_join_explode": [
        Filter("v > -30", lambda r: cmp(r["v"], ">", -30)),
        JoinDims("left_semi"),
        Explode("tags", "tag", outer=True),
        With("kv", "k * 100 + v", lambda r: r["k"] * 100 + r["v"]),
        Select(("id", "tag", "kv")),
    ],
    "case_where_join": [
        With("band", "CASE WHEN v < -10 THEN 'low' WHEN v > 10 THEN 'high' ELSE 'mid' END",
             lambda r: None if r["v"] is None else ("low" if r["v"] < -10 else "high" if r["v"] > 10 else "mid")),
        Filter("band != 'mid'", lambda r: cmp(r["band"], "!=", "mid")),
        Repartition(3),
        JoinDims("inner"),
        Select(("id", "band", "name", "k")),
    ],
    "hinted_join_reshuffled": [
        HintedJoin("inner"),
        Reshuffle("range"),
        Filter("v != 0", lambda r: cmp(r["v"], "!=", 0)),
        Reshuffle("coalesce"),
        Reshuffle("observe"),
        Reshuffle("index"),
        Select(("id", "v", "name")),
    ],
    "unpivot_filter": [
        Select(("id", "k", "v")),
        Unpivot(("id",), ("k", "v")),
        Filter("val > 5", lambda r: cmp(r["val"], ">", 5)),
    ],
    "generators": [
        Generator("inline"),
        Generator("stack"),
        Filter("x > a", lambda r: cmp(r["x"], ">", r["a"])),
        Select(("id", "k", "v", "s", "tags", "a", "b", "x")),
        Generator("json_tuple"),
        Select(("id", "tags", "a", "b", "x", "jk", "js")),
    ],
    "outer_generators_lateral": [
        Generator("inline_outer"),
        Select(("id", "tags", "a", "b")),
        Explode("tags", "p", position=True, outer=True),
        Filter("p_pos IS NULL OR p_pos = 0", lambda r: r["p_pos"] is None or r["p_pos"] == 0),
        Generator("lateral"),
        Select(("id", "a", "b", "p_pos", "p", "tag")),
    ],
}


def _steps(name: str) -> list | None:
    """The steps of pipeline ``name`` on the installed Spark's line: those of an operator it has (a step's
    ``since``, else any line), and those it lacks that keep every row as it is (``transparent``) left out;
    None if it lacks another."""
    from headwater.adapters import spark_lines

    line = spark_lines.installed()
    steps = []
    for step in PIPELINES[name]:
        if line.has(getattr(step, "since", "3.5")):
            steps.append(step)
        elif not getattr(step, "transparent", False):
            return None
    return steps


def pipelines_here() -> list[str]:
    """The pipelines the installed Spark's line can run, by name (all of them on the default line)."""
    return sorted(name for name in PIPELINES if _steps(name) is not None)


def spark_pipeline(name: str, source: DataFrame, env) -> DataFrame:
    df = source.select(F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e")).select("e.*")
    for step in _steps(name) or []:
        df = step.spark(df, env)
    return df


def oracle(name: str, topic: str, values: list[bytes], coordinates: list[tuple[int, int]], env) -> list[Row]:
    rows = [(parse(value), frozenset({("kafka", topic, p, o)})) for value, (p, o) in zip(values, coordinates)]
    for step in _steps(name) or []:
        rows = step.run(rows, env)
    return rows


def event_env(spark, stack_config, workdir: Path, prefix: str, count: int, seed: int) -> Iterator[SimpleNamespace]:
    """For a module fixture: ``count`` randomized events on a fresh topic, the dims table and
    a tracer writing to topics of its own; closes the tracer afterwards."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from headwater.adapters.kafka import ensure_topics
    from headwater.capture import attach
    from headwater.demo import orders as demo_data
    from tests.conftest import own_topics

    config, tag = own_topics(stack_config, prefix)
    topic = f"{prefix}-events-{tag}"
    ensure_topics(config.bootstrap, [topic], 2)
    values = events(count, seed)  # an even split, so that maxOffsetsPerTrigger cuts the same batches every run
    coordinates = demo_data.produce(config.bootstrap, topic, [(None, v) for v in values], partitions=2)
    pq.write_table(pa.Table.from_pylist(dims()), workdir / "dims.parquet")
    tracer = attach(spark, config)
    yield SimpleNamespace(config=config, topic=topic, values=values, coordinates=coordinates, workdir=workdir,
                          dims_df=spark.read.parquet(str(workdir / "dims.parquet")), tracer=tracer)
    tracer.close()
