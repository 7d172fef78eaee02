"""Connected components on Spark DataFrames: large-star / small-star (Kiveris et al., 2014).

No GraphFrames jar can be installed here, so compaction finds the weakly connected
components of the whole store with DataFrames alone. Each round alternates:

- large-star: every node links its larger neighbours to the smallest node of its
  neighbourhood (itself included);
- small-star: every node links itself and its smaller neighbours to the smallest of
  them;

until a round changes no edge. Then every node points at its component's smallest
node, the same name ``sets.components`` gives (a component's smallest rid).
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

MAX_ROUNDS = 64  # each round at least halves the distance to the minimum: 2**64 nodes


def _both_ways(pairs: DataFrame) -> DataFrame:
    return pairs.unionByName(pairs.select(F.col("v").alias("u"), F.col("u").alias("v")))


def _large_star(pairs: DataFrame) -> DataFrame:
    both = _both_ways(pairs)
    smallest = both.groupBy("u").agg(F.least(F.min("v"), F.first("u")).alias("m"))
    return (both.join(smallest, "u").where(F.col("v") > F.col("u"))
            .select(F.col("v").alias("u"), F.col("m").alias("v")).distinct())


def _small_star(pairs: DataFrame) -> DataFrame:
    both = _both_ways(pairs)
    smaller = both.where(F.col("v") <= F.col("u"))
    smallest = smaller.groupBy("u").agg(F.min("v").alias("m"))
    linked = smaller.join(smallest, "u")
    return (linked.select(F.col("v").alias("u"), F.col("m").alias("v"))
            .unionByName(linked.select("u", F.col("m").alias("v")))
            .where(F.col("u") != F.col("v")).distinct())


def components(edges: DataFrame, src: str = "src", dst: str = "dst") -> DataFrame:
    """``(rid, component)`` for every rid of ``edges``: its component's smallest rid."""
    pairs = (edges.select(F.least(src, dst).alias("u"), F.greatest(src, dst).alias("v"))
             .where(F.col("u") != F.col("v")).distinct().localCheckpoint())
    nodes = edges.select(F.col(src).alias("rid")).unionByName(edges.select(F.col(dst).alias("rid"))).distinct()
    for _ in range(MAX_ROUNDS):
        stepped = _small_star(_large_star(pairs)).localCheckpoint()
        if stepped.exceptAll(pairs).isEmpty() and pairs.exceptAll(stepped).isEmpty():
            break
        pairs = stepped
    else:
        raise RuntimeError(f"connected components did not converge in {MAX_ROUNDS} rounds")
    # Converged: every edge is (node, its component's smallest node).
    smallest = pairs.groupBy("u").agg(F.min("v").alias("component"))
    return (nodes.join(smallest, nodes.rid == smallest.u, "left")
            .select("rid", F.coalesce("component", "rid").alias("component")))
