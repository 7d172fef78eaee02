"""Compaction: the connected sets of a whole edges topic, recomputed on Spark and written as a generation.

The indexer keeps sets per shard (one edges partition) and never rewrites a file, so
between compactions sets that meet across shards stay apart and merges pile up
aliases. ``compact`` reads the current generation and what every shard committed
since (``generation.snapshot``), and:

1. finds the weakly connected components of the whole graph (``components``, below);
2. keeps each component of at most ``threshold`` rows as one set, and splits each
   larger one with ``sets.connected_sets`` (CSProv's Algorithm 3, the same code the
   property tests check), one component per group, on Spark's Python workers;
3. writes the edges bucketed by their dst's set, the rid → set index and the set
   dependencies as a new generation, and switches to it atomically
   (``generation.py``).

Components are found one of two ways, named in ``COMPONENTS`` (``compact(components=…)``, ``headwater
compact --components``; the manifest records which ran), both exact and both naming a component by its
smallest rid, the name ``sets.components`` gives. GraphFrames' ``connectedComponents`` cannot be used: this
machine's Maven Central mirror serves no ``io.graphframes:graphframes-spark4_2.13`` (all versions refused,
2026-12-03).

- ``large-star``, with DataFrames alone (Kiveris et al., 2014). Each round alternates large-star (every node
  links its larger neighbours to the smallest node of its neighbourhood, itself included) and small-star
  (every node links itself and its smaller neighbours to the smallest of them) until a round changes no
  edge; then every node points at its component's smallest node. O(log² n) rounds whatever the depth,
  each a few shuffles of the whole edge set.
- ``graphx``: Spark's own GraphX (``spark-graphx``, in pyspark's jars), its ``connectedComponents`` through
  py4j: Pregel rounds that send each vertex the smallest id (a signed long, as rids are) its neighbours
  hold. One round per step of the longest shortest path in a component: cheap rounds, but as many as
  the deepest lineage is long. Its cached graphs are freed once the labels are read out.

``DEFAULT_COMPONENTS`` stays ``large-star``, by ``bench/compaction_components.py`` and the tests (indexer/README.md
has the figures and the command): GraphX found the bench workload's components (1M edges) 8.7× faster (the whole
compaction 5.6×, the same sets) and was as fast on chains 100 hops deep, but on 300-hop chains in a 1 GB driver
it ran out of heap after 600 s (Pregel's lineage grows a step a round, unchecked), where large-star takes
seconds. A compaction that fails on a deep stream is worse than a slow one: ``graphx`` is for lineage known
to be shallow.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.fs as pafs
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from headwater.store.edges import (
    ROW_FIELDS,
    ROWS_SCHEMA,
    SHARD_GENERATION,
    STORE_SCHEMA,
    orphan_records,
    range_of,
    write_of,
)
from headwater.store.generation import Snapshot
from headwater.store.tables import FilesGone

from . import metrics

THRESHOLD = 100_000  # most rows a set holds, unless it lies in one dataset (CSProv's λ)
BUCKETS = 64  # edge buckets of a generation
EDGE_COLUMNS = ("src", "dst", "query", "batch", "op", "exact", "cols")
# Small row groups: their key ranges in the footers let a lookup decode a few thousand rows, not a file.
ROW_GROUP_BYTES = 256 << 10
PARQUET_OPTIONS = {"compression": "zstd", "parquet.block.size": str(ROW_GROUP_BYTES)}
# The shards' schemas in Spark's words
STORE_DDL = from_arrow_schema(STORE_SCHEMA)
ROWS_DDL = from_arrow_schema(ROWS_SCHEMA)

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


def _large_star_components(edges: DataFrame, src: str, dst: str) -> DataFrame:
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


def _graphx_components(edges: DataFrame, src: str, dst: str) -> DataFrame:
    """GraphX's ``connectedComponents`` through py4j: a vertex's component is the smallest vertex id (a signed
    long) of its component, as ``sets.components`` names it."""
    spark = edges.sparkSession
    jvm = spark._jvm
    if jvm is None:  # pyspark types it Optional (None before a first SparkContext starts); a session has one
        raise RuntimeError("GraphX components need a classic SparkSession of a running SparkContext")
    encoders = jvm.org.apache.spark.sql.Encoders
    pair = encoders.tuple(encoders.scalaLong(), encoders.scalaLong())
    # GraphX keeps its input's partitions: two per core (4 on this machine's 2) ran faster than fewer (issue 47).
    parts = 2 * spark.sparkContext.defaultParallelism
    tuples = edges.select(F.col(src).cast("long"), F.col(dst).cast("long")).repartition(parts)
    level = jvm.org.apache.spark.storage.StorageLevel.MEMORY_AND_DISK()
    int_tag = getattr(getattr(jvm.scala.reflect, "ClassTag$"), "MODULE$").Int()
    none = getattr(getattr(jvm.scala, "None$"), "MODULE$")  # no partition strategy: edges stay as they came
    graph = jvm.org.apache.spark.graphx.Graph.fromEdgeTuples(
        getattr(tuples._jdf, "as")(pair).rdd(), 1, none, level, level, int_tag)
    labelled = graph.ops().connectedComponents()
    try:
        found = DataFrame(spark._jsparkSession.createDataset(labelled.vertices(), pair).toDF(), spark)
        return found.toDF("rid", "component").localCheckpoint()  # read out before GraphX's RDDs are freed
    finally:
        # GraphX caches its graphs' vertices and edges: freed here, or each compaction would keep them.
        labelled.unpersist(False)
        graph.unpersist(False)


# How ``components`` finds weakly connected components, by name (``compact(components=…)``, ``headwater
# compact --components``): both exact, both naming a component by its smallest rid (indexer/README.md).
COMPONENTS: dict[str, Callable[[DataFrame, str, str], DataFrame]] = {
    "large-star": _large_star_components,
    "graphx": _graphx_components,
}
DEFAULT_COMPONENTS = "large-star"  # GraphX ran out of a 1 GB heap on 300-hop chains (indexer/README.md)


def components_algorithm(name: str) -> Callable[[DataFrame, str, str], DataFrame]:
    """The function ``COMPONENTS`` names ``name``; a ``ValueError`` that lists them for any other name."""
    try:
        return COMPONENTS[name]
    except KeyError:
        raise ValueError(f"unknown components algorithm {name!r}: expected one of {', '.join(COMPONENTS)}") from None


def components(edges: DataFrame, src: str = "src", dst: str = "dst",
               algorithm: str = DEFAULT_COMPONENTS) -> DataFrame:
    """``(rid, component)`` for every rid of ``edges``: its component's smallest rid, found by ``algorithm``."""
    return components_algorithm(algorithm)(edges, src, dst)


class CompactionBusy(RuntimeError):
    """Another compaction of the same topic is running (or switched first)."""


def _split_large(threshold: int):
    """A grouped-map function: the connected sets of one large component's edges."""
    def split(frame):
        import pandas as pd

        from .sets import connected_sets

        datasets = dict(zip(frame["src"].tolist(), frame["src_dataset"].tolist()))
        datasets.update(zip(frame["dst"].tolist(), frame["dst_dataset"].tolist()))
        rids, set_of = connected_sets(frame["src"].to_numpy(), frame["dst"].to_numpy(), datasets, threshold)
        return pd.DataFrame({"rid": rids, "set": set_of})
    return split


def connected_sets(edges: DataFrame, rows: DataFrame, threshold: int,
                   algorithm: str = DEFAULT_COMPONENTS) -> DataFrame:
    """``(rid, set)`` for every rid of ``edges`` (``rows``: ``rid, dataset``); ``algorithm`` finds the components."""
    labelled = components(edges, algorithm=algorithm).localCheckpoint()
    sizes = labelled.groupBy("component").agg(F.count("*").alias("size"))
    small = (labelled.join(sizes.where(F.col("size") <= threshold), "component")
             .select("rid", F.col("component").alias("set")))
    large = labelled.join(sizes.where(F.col("size") > threshold), "component").select("rid", "component")
    dataset = rows.select("rid", F.coalesce("dataset", F.lit("")).alias("dataset"))
    inside = (edges.select("src", "dst")
              .join(large.withColumnRenamed("rid", "dst"), "dst")
              .join(dataset.withColumnRenamed("rid", "src").withColumnRenamed("dataset", "src_dataset"), "src", "left")
              .join(dataset.withColumnRenamed("rid", "dst").withColumnRenamed("dataset", "dst_dataset"), "dst", "left")
              .fillna("", ["src_dataset", "dst_dataset"]))
    split = inside.groupBy("component").applyInPandas(_split_large(threshold), "rid long, set long")
    return small.unionByName(split)


def compact(spark: SparkSession, store: "str | os.PathLike", topic: str, threshold: int = THRESHOLD,
            buckets: int = BUCKETS, say: Callable[[str], None] = lambda _: None,
            components: str = DEFAULT_COMPONENTS) -> dict:
    """Recompute the connected sets of ``topic`` and switch to them; returns the manifest.

    ``components`` names how the weakly connected components are found (``COMPONENTS``); the manifest
    records it.

    The input is the edges table's current generation and the shards' ranges it does not hold, at one
    snapshot. Spark works on a local scratch folder (the tables' files copied there first when they are in
    S3); the new generation's files are then added to the tables and switched to in one commit
    (``generation.py``), which also removes the files it took in. The generation before stays readable
    until the next compaction, which removes its rows and the shards' records of the ranges it took.
    """
    started = time.monotonic()
    components_algorithm(components)  # an unknown name fails before anything is read
    snapshot = Snapshot.of(store, topic)
    tables = snapshot.tables
    previous = snapshot.current()
    if not snapshot.shard_files and previous is None:
        raise ValueError(f"nothing to compact: no committed edges in {tables.edges}")
    number = max(snapshot.generation, tables.generations.applied(CLAIM) or 0) + 1
    if not tables.generations.commit(txn=(CLAIM, number)):
        raise CompactionBusy(f"another compaction of {topic} claimed generation {number}")
    took = sorted(snapshot.shard_ranges())
    stores = {store_id for store_id, _, _ in took}
    # A shard set aside and rebuilt from its partition's start (``Indexer.set_aside``) may hold edges the
    # previous generation or the old store holds too: kept once, from then on.
    distinct = any(not s.endswith(".e0") for s in stores) or bool(previous and previous.manifest.get("distinct"))
    say(f"compacting {len(snapshot.shard_files)} new edge files of {len(stores)} shard stores"
        + (f" onto generation {previous.number}" if previous else "")
        + ("; keeping one copy of each edge (a shard was set aside)" if distinct else ""))
    with tempfile.TemporaryDirectory(prefix="headwater-compact-") as scratch:
        local = Path(scratch)
        edge_files = _local(tables.edges, [f["path"] for f in snapshot.shard_files], local / "in-edges")
        row_files = _local(tables.rows, snapshot.shard_rows_files(), local / "in-rows")
        if previous is not None:
            edge_files += _local(tables.edges, [f["path"] for f in snapshot.generation_files], local / "in-edges")
            row_files += _local(tables.rows, [_relative(tables.rows, p) for p in previous.row_files()],
                                local / "in-rows")
        out = local / "out"
        with _no_broadcast_joins(spark):
            manifest = _write(spark, edge_files, row_files, out, threshold, buckets, say, distinct=distinct,
                              components=components)
        manifest.update(generation=number, topic=topic, threshold=threshold, buckets=buckets, members=True,
                        components=components, distinct=distinct, took=[list(r) for r in took],
                        created=datetime.now(timezone.utc).isoformat(timespec="seconds"))
        say(f"sets written; adding generation {number} to {tables.location}")
        for name, table in (("exits", tables.exits), ("dependencies", tables.dependencies), ("rows", tables.rows)):
            table.commit([table.add_file(str(p), {"generation": number})
                          for p in sorted((out / name).glob("*.parquet"))])
        tables.members.commit(_bucket_files(tables.members, out / "members", number))
        added = _bucket_files(tables.edges, out / "edges", number)
    manifest["seconds"] = round(time.monotonic() - started, 3)
    generations = tables.generations
    generations.commit([generations.write_file(pa.table({
        "generation": [number], "buckets": [buckets], "manifest": [json.dumps(manifest)]}))])
    removed = [f["path"] for f in snapshot.shard_files + snapshot.generation_files]
    try:
        switched = tables.switch(added, removed, number, f"compact generation {number}")
    except FilesGone as exc:
        raise CompactionBusy(f"another compaction of {topic} switched first: {exc}") from None
    if not switched:
        raise CompactionBusy(f"another compaction of {topic} switched first: generation {tables.generation()} "
                             f"is current")
    metrics.COMPACTION_SECONDS.observe(manifest["seconds"])
    say(f"generation {number}: {manifest['edges']} edges, {manifest['sets']} sets, "
        f"{manifest['dependencies']} dependencies in {manifest['seconds']:.1f}s")
    freed = _remove_superseded(tables, number, previous, set(took), say)
    return {**manifest, "dropped_bytes": freed}


CLAIM = "compaction"  # the generations table's app id: the generation number a compaction claimed


def _bucket_files(table, folder: Path, number: int) -> list:
    """Spark's files of ``folder/bucket=B/`` added to ``table`` as generation ``number``'s (not committed)."""
    return [table.add_file(str(p), {"generation": number, "bucket": int(p.parent.name.split("=", 1)[1])})
            for p in sorted(folder.glob("bucket=*/*.parquet"))]


def _relative(table, path: str) -> str:
    return path.removeprefix(table.file_path(""))


def _local(table, paths: list[str], folder: Path) -> list[str]:
    """The files as local paths Spark reads: themselves on a local disk, else copies in ``folder``."""
    if not table.location.is_s3:
        return [table.file_path(p) for p in paths]
    folder.mkdir(parents=True, exist_ok=True)
    copies = []
    for path in paths:
        copy = folder / path.replace("/", "_")  # a file's path in its table names it once
        pafs.copy_files(table.file_path(path), str(copy), source_filesystem=table.filesystem,
                        destination_filesystem=pafs.LocalFileSystem())
        copies.append(str(copy))
    return copies


def _remove_superseded(tables, number: int, previous, took_now: set, say: Callable[[str], None]) -> int:
    """Remove what no reader of generation ``number`` or of the one before it needs: older generations' rows,
    exits and dependencies, the shards' records of the ranges the one before took, and the shards' records of
    ranges that never committed (``edges.orphan_records``); then vacuum."""
    keep = {number, previous.number if previous else number}
    took = {tuple(r) for r in previous.manifest.get("took", [])} if previous else set()
    live = took | took_now | {write_of(f) for f in tables.edges.files().to_pylist()
                              if f["partition.generation"] == SHARD_GENERATION}
    freed = 0
    for table in (tables.rows, tables.members, tables.exits, tables.dependencies, tables.records):
        files = table.files().to_pylist()
        gone = [f for f in files
                if (f.get("partition.generation") not in (None, SHARD_GENERATION)
                    and f["partition.generation"] not in keep)
                or (f.get("partition.generation", SHARD_GENERATION) == SHARD_GENERATION and f.get("min.store")
                    and range_of(f) in took)]
        if table in (tables.rows, tables.records):
            named = {f["path"] for f in gone}
            gone += [f for f in orphan_records(tables, files, live) if f["path"] not in named]
        if gone:
            table.commit(removed=[f["path"] for f in gone])
            freed += sum(int(f["size_bytes"]) for f in gone)
    for table in (tables.edges, tables.rows, tables.members, tables.exits, tables.dependencies, tables.records):
        table.vacuum()
    if freed:
        say(f"removed {freed / 1e6:.1f} MB that generation {number} superseded")
    return freed


@contextmanager
def _no_broadcast_joins(spark: SparkSession):
    """Sort-merge joins only, while compacting: Spark sizes a join's side from its files, and the
    rows records' files are small on disk next to what they take in memory: broadcast, they ran a
    1 GB driver out of memory on 1M edges."""
    key = "spark.sql.autoBroadcastJoinThreshold"
    before = spark.conf.get(key)
    spark.conf.set(key, "-1")
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)


def _write(spark: SparkSession, edge_files: list[str], row_files: list[str], out: Path, threshold: int,
           buckets: int, say: Callable[[str], None], distinct: bool = False,
           components: str = DEFAULT_COMPONENTS) -> dict:
    edges = spark.read.schema(STORE_DDL).parquet(*edge_files).select(*EDGE_COLUMNS)
    edges = (edges.distinct() if distinct else edges).localCheckpoint()
    # A rid recorded more than once (by two shards, or again after a drop) is one row.
    rows = (spark.read.schema(ROWS_DDL).parquet(*row_files)
            .groupBy("rid").agg(*[F.first(name, ignorenulls=True).alias(name) for name in ROW_FIELDS]))
    sets_started = time.monotonic()
    sets = connected_sets(edges, rows, threshold, components).localCheckpoint()
    sets_seconds = round(time.monotonic() - sets_started, 3)  # components and the large ones' splits
    say(f"sets found ({components} components); writing the generation")
    src_sets = sets.select(F.col("rid").alias("src"), F.col("set").alias("src_set"))
    dst_sets = sets.select(F.col("rid").alias("dst"), F.col("set").alias("dst_set"))
    placed = (edges.join(src_sets, "src").join(dst_sets, "dst")
              .select(*EDGE_COLUMNS, "src_set", "dst_set").localCheckpoint())
    (placed.withColumn("src_set", F.when(F.col("src_set") != F.col("dst_set"), F.col("src_set")))
     .withColumn("bucket", F.pmod("dst_set", F.lit(buckets)))
     # The writer sorts by the partition column unless the data already is: bucket leads.
     .repartition("bucket").sortWithinPartitions("bucket", "dst_set", "dst")
     .write.options(**PARQUET_OPTIONS).partitionBy("bucket").parquet(str(out / "edges")))
    # Whether a row has edges in (out): a walk need not read the set of a row it cannot go on from.
    has_in = edges.select(F.col("dst").alias("rid")).distinct().withColumn("has_in", F.lit(True))
    has_out = edges.select(F.col("src").alias("rid")).distinct().withColumn("has_out", F.lit(True))
    indexed = (sets.join(rows, "rid", "left").join(has_in, "rid", "left").join(has_out, "rid", "left")
               .select("rid", "set", *ROW_FIELDS, F.coalesce("has_in", F.lit(False)).alias("has_in"),
                       F.coalesce("has_out", F.lit(False)).alias("has_out"))).localCheckpoint()
    (indexed.repartitionByRange(max(1, spark.sparkContext.defaultParallelism), "rid").sortWithinPartitions("rid")
     .write.options(**PARQUET_OPTIONS).parquet(str(out / "rows")))
    # The same records by set, in the edges' buckets: a walk reads a set's rows' records with its edges.
    (indexed.withColumn("bucket", F.pmod("set", F.lit(buckets)))
     .repartition("bucket").sortWithinPartitions("bucket", "set", "rid")
     .write.options(**PARQUET_OPTIONS).partitionBy("bucket").parquet(str(out / "members")))
    crossing = placed.where(F.col("src_set") != F.col("dst_set"))
    dependencies = crossing.select("src_set", "dst_set").distinct()
    dependencies.coalesce(1).write.option("compression", "zstd").parquet(str(out / "dependencies"))
    # A forward step from a row reads its own set and the sets its edges lead into: those.
    (crossing.select("src", "dst_set").distinct()
     .repartitionByRange(max(1, spark.sparkContext.defaultParallelism), "src").sortWithinPartitions("src")
     .write.options(**PARQUET_OPTIONS).parquet(str(out / "exits")))
    counts = sets.groupBy("set").count()
    largest = counts.agg(F.max("count")).first()
    assert largest is not None  # an aggregate of no grouping has one row, of no rows too
    found = {"edges": placed.count(), "rows": sets.count(), "sets": counts.count(), "largest_set": largest[0],
             "dependencies": spark.read.parquet(str(out / "dependencies")).count(), "sets_seconds": sets_seconds}
    read = edges.count()
    if found["edges"] != read:  # every rid of an edge has a set; anything else is a bug, not a generation
        raise RuntimeError(f"compaction placed {found['edges']} edges of the {read} it read")
    return found
