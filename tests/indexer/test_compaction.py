"""Compaction on Spark: its connected components against the numpy ones; its generations against brute force."""

from __future__ import annotations

import json
import random
import shutil
from collections import defaultdict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest
from click.testing import CliRunner

from bench.workload import chain_messages, lineage_messages
from headwater.cli import main
from headwater.indexer import metrics
from headwater.indexer.compaction import COMPONENTS, CompactionBusy, compact
from headwater.indexer.sets import components
from headwater.indexer.shard import Shard
from headwater.store.edges import LineageTables, with_src_sets
from headwater.store.generation import Generation, Snapshot
from tests.indexer.test_sets import random_lineage, reach
from tests.indexer.test_shard import pairs


@pytest.mark.spark
@pytest.mark.parametrize("algorithm", sorted(COMPONENTS))
def test_spark_components_equal_numpy_components(spark, algorithm):
    from headwater.indexer.compaction import components as spark_components

    for seed in range(3):
        src, dst, _ = random_lineage(seed)
        rng = np.random.default_rng(seed)
        chain = rng.integers(-(1 << 62), 1 << 62, 40)  # a long path, the worst case for rounds
        src = np.concatenate([src, chain[:-1]])
        dst = np.concatenate([dst, chain[1:]])
        df = spark.createDataFrame([(int(a), int(b)) for a, b in zip(src, dst)], "src long, dst long")
        got = {r.rid: r.component for r in spark_components(df, algorithm=algorithm).collect()}
        rids, labels = components(src, dst)
        assert got == dict(zip(rids.tolist(), labels.tolist()))
    # GraphX caches its graphs' vertices and edges (RDDs it names so); repeated compactions must not keep them.
    cached = spark.sparkContext._jsc.getPersistentRDDs()
    assert not [n for n in (str(cached.get(k).name()) for k in cached.keySet().toArray()) if "RDD" in n]


def test_an_unknown_components_algorithm_is_refused(tmp_path):
    with pytest.raises(ValueError, match="expected one of large-star, graphx"):
        compact(None, tmp_path, "t.edges", components="graphframes")  # before Spark is used
    result = CliRunner().invoke(main, ["--home", str(tmp_path / "home"), "compact", "--components", "pregel"],
                                env={"HEADWATER_STORE_DIR": str(tmp_path)})
    assert result.exit_code == 2 and "unknown components algorithm 'pregel'" in result.output


@pytest.mark.spark
def test_both_components_algorithms_compact_to_the_same_sets(spark, tmp_path):
    # The bench workload (a hub split by Algorithm 3, components of small diameter) and chains of 100 rows, the
    # case where GraphX needs a round per hop; each algorithm on its own copy of one store.
    messages = list(lineage_messages(6_000, seed=8, edges_per_message=1000)) + list(chain_messages(3, 99, seed=9))
    produced = write_shards(tmp_path / "store", "t.edges", messages)
    mappings = {}
    for algorithm in sorted(COMPONENTS):
        shutil.copytree(tmp_path / "store", tmp_path / algorithm)
        manifest = compact(spark, tmp_path / algorithm, "t.edges", threshold=400, buckets=4, components=algorithm)
        assert manifest["components"] == algorithm and manifest["edges"] == len(produced)
        rows = generation_rows(Generation.current(tmp_path / algorithm, "t.edges"))
        mappings[algorithm] = dict(zip(rows["rid"].to_pylist(), rows["set"].to_pylist()))
    first, *others = mappings.values()
    assert all(other == first for other in others)
    chain = [r for n, _ in messages[-99:] for r in n["rid"].to_pylist()]
    assert len({first[r] for r in chain}) == 3 and len(set(first.values())) > 10  # 3 chains; the hub was split


def write_shards(store_dir, topic: str, messages, partitions: int = 2, shards=None) -> list[tuple[int, int]]:
    """The messages into ``partitions`` shards (or ``shards``, open), as the indexer writes them; returns the edges."""
    shards = shards or [Shard(store_dir, topic, p).open() for p in range(partitions)]
    produced = []
    for i in range(0, len(messages), 3):
        take = messages[i: i + 3]
        shard = shards[(i // 3) % partitions]
        nodes = pa.concat_tables([n for n, _ in take])
        edges = pa.concat_tables([e for _, e in take])
        shard.write(nodes, edges, shard.resume, shard.resume + len(take) - 1)
        produced += list(zip(edges["src"].to_pylist(), edges["dst"].to_pylist()))
    return produced


def generation_rows(gen: Generation) -> pa.Table:
    return ds.dataset(gen.row_files(), format="parquet", filesystem=gen.tables.rows.filesystem).to_table()


def generation_edges(gen: Generation) -> pa.Table:
    return gen.edges(pc.unique(generation_rows(gen)["set"]).to_pylist())


def table_edges(store, topic: str) -> list[tuple[int, int]]:
    """Every edge the edges table holds now (a generation's and the shards'), as Spark or DuckDB would read it."""
    edges = LineageTables(store, topic).edges
    return pairs(with_src_sets(edges.read(edges.files()["path"].to_pylist())))


@pytest.mark.spark
def test_compaction_sets_hold_every_lineage_across_shards(spark, tmp_path):
    messages = list(lineage_messages(24_000, seed=5, edges_per_message=1000))
    datasets = {r: d for n, _ in messages for r, d in zip(n["rid"].to_pylist(), n["dataset"].to_pylist())}
    produced = write_shards(tmp_path, "t.edges", messages)
    threshold = 400
    before = metrics.COMPACTION_SECONDS._sum.get()
    manifest = compact(spark, tmp_path, "t.edges", threshold=threshold, buckets=8)
    assert metrics.COMPACTION_SECONDS._sum.get() > before

    gen = Generation.current(tmp_path, "t.edges")
    assert {**gen.manifest, "dropped_bytes": 0} == manifest
    assert {r[0] for r in manifest["took"]} == {"p0.e0", "p1.e0"}
    rows = generation_rows(gen)
    set_of = dict(zip(rows["rid"].to_pylist(), rows["set"].to_pylist()))
    assert len(set_of) == rows.num_rows == len(datasets)  # every row once
    assert dict(zip(rows["rid"].to_pylist(), rows["dataset"].to_pylist())) == datasets
    fields = ["kind", "topic", "partition", "offset", "key"]  # what lineage answers with
    described = {r: v for n, _ in messages for r, *v in zip(*[n[c].to_pylist() for c in ["rid"] + fields])}
    assert {r: v for r, *v in zip(*[rows[c].to_pylist() for c in ["rid"] + fields])} == described
    assert any(v[2] is not None for v in described.values()) and any(v[4] is not None for v in described.values())
    stored = generation_edges(gen)
    assert sorted(pairs(stored)) == sorted(produced) == sorted(table_edges(tmp_path, "t.edges"))
    # Every edge lies in its dst's set, and names its src's.
    assert stored["dst_set"].to_pylist() == [set_of[d] for d in stored["dst"].to_pylist()]
    assert stored["src_set"].to_pylist() == [set_of[s] for s in stored["src"].to_pylist()]
    members = defaultdict(set)
    for r, s in set_of.items():
        members[s].add(r)
    assert all(s == min(m) and (len(m) <= threshold or len({datasets[r] for r in m}) == 1)
               for s, m in members.items())
    assert max(map(len, members.values())) == manifest["largest_set"] and len(members) == manifest["sets"]
    assert len(members) > 10  # the one component the customers hub makes was split
    # The members table holds the rows records again, by set: a set's are its rows', each once.
    every_set = sorted(members)
    edges_read, by_set = gen.sets(every_set)
    assert sorted(pairs(edges_read)) == sorted(produced)
    assert sorted(by_set.to_pylist(), key=lambda r: r["rid"]) == sorted(rows.select(by_set.column_names).to_pylist(),
                                                                         key=lambda r: r["rid"])
    for s in random.Random(6).sample(every_set, 20):
        assert set(gen.sets([s])[1]["rid"].to_pylist()) == members[s]

    check_lineage(gen, produced, sorted(set_of), random.Random(5))


def check_lineage(gen: Generation, produced: list[tuple[int, int]], rows: list[int], rng: random.Random) -> None:
    """For 40 random rows: the edges of the row's set and the sets it depends on (depending on it) are its lineage."""
    up, down = defaultdict(set), defaultdict(set)
    for a, b in produced:
        up[b].add(a)
        down[a].add(b)
    for row in rng.sample(rows, 40):
        for step, direction in ((up, "backward"), (down, "forward")):
            sets = gen.related_sets({gen.set_of([row])[row]}, direction)
            local = defaultdict(set)
            for a, b in pairs(gen.edges(sets)):  # only those sets' buckets
                (local[b].add(a) if direction == "backward" else local[a].add(b))
            assert reach({row}, local) == reach({row}, step)


@pytest.mark.spark
def test_a_new_generation_replaces_the_current_one_whole(spark, tmp_path):
    messages = list(lineage_messages(6_000, seed=6, edges_per_message=1000))
    produced = write_shards(tmp_path, "t.edges", messages[:4])
    compact(spark, tmp_path, "t.edges", threshold=100, buckets=4)
    first = Generation.current(tmp_path, "t.edges")
    produced += write_shards(tmp_path, "t.edges", messages[4:5])  # the shards go on growing

    # Two compactions at once: the one that switches second fails, and changes nothing.
    def meanwhile(line: str) -> None:
        if line.startswith("sets written"):
            compact(spark, tmp_path, "t.edges", threshold=100, buckets=4)

    with pytest.raises(CompactionBusy, match="switched first"):
        compact(spark, tmp_path, "t.edges", threshold=100, buckets=4, say=meanwhile)
    between = Generation.current(tmp_path, "t.edges")
    assert between.number == first.number + 2  # the other's; this one's claim is not reused
    assert sorted(pairs(generation_edges(between))) == sorted(produced) == sorted(table_edges(tmp_path, "t.edges"))
    first = between
    produced += write_shards(tmp_path, "t.edges", messages[5:])
    # A compaction that fails half-way (a shard file it cannot read) leaves the current generation as it was.
    tables = LineageTables(tmp_path, "t.edges")
    shard_files = Snapshot.of(tmp_path, "t.edges").shard_files
    victim = tmp_path / "t.edges" / "edges" / shard_files[-1]["path"]
    good = victim.read_bytes()
    victim.write_bytes(good[: len(good) // 2])
    with pytest.raises(Exception):
        compact(spark, tmp_path, "t.edges", threshold=100, buckets=4)
    assert Generation.current(tmp_path, "t.edges").number == first.number
    assert {f["partition.generation"] for f in tables.edges.files().to_pylist()} == {0, first.number}
    victim.write_bytes(good)

    compact(spark, tmp_path, "t.edges", threshold=100, buckets=4)
    second = Generation.current(tmp_path, "t.edges")
    assert second.number > first.number + 1  # the claimed ones are never reused
    assert sorted(pairs(generation_edges(second))) == sorted(produced) == sorted(table_edges(tmp_path, "t.edges"))
    assert second.snapshot.shard_files == []
    first_rows = {f["path"] for f in tables.rows.files().to_pylist() if f["partition.generation"] == first.number}
    assert first_rows  # kept for readers still in it, until the next switch
    compact(spark, tmp_path, "t.edges", threshold=100, buckets=4)
    assert not first_rows & {f["path"] for f in tables.rows.files().to_pylist()}
    # Time travel: the edges table's version before the second switch is the first generation and the shards.
    before = tables.edges.delta(second.snapshot.version - 1)
    assert before is not None

    # The same from the command line, in this process's Spark session.
    env = {"HEADWATER_STORE_DIR": str(tmp_path), "HEADWATER_EDGES_TOPIC": "t.edges"}
    result = CliRunner().invoke(main, ["--home", str(tmp_path / "home"), "compact", "--buckets", "4"], env=env)
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout.strip().splitlines()[-1])
    assert printed["generation"] > second.number + 1 and printed["edges"] == len(produced)
    assert spark.range(1).count() == 1  # the session was left running
    result = CliRunner().invoke(main, ["--home", str(tmp_path / "home"), "compact", "--threshold", "0"], env=env)
    assert result.exit_code == 2 and "at least 1" in result.output


@pytest.mark.spark
def test_compactions_build_on_the_last_generation_and_the_shards_shrink(spark, tmp_path):
    topic = "t.edges"
    messages = list(lineage_messages(27_000, seed=7, edges_per_message=1000))
    shards = [Shard(tmp_path, topic, p).open() for p in range(2)]  # a running indexer's
    produced = write_shards(tmp_path, topic, messages[:12], shards=shards)
    first = compact(spark, tmp_path, topic, threshold=300, buckets=4)
    assert first["dropped_bytes"] == 0  # no generation before it: the shards' records stay
    assert sorted(r[2] for r in first["took"]) == [2, 2, 5, 5]  # each shard's two writes, offsets 0-2 and 3-5
    assert all(s.store.committed() == [] for s in shards)  # the generation holds them

    produced += write_shards(tmp_path, topic, messages[12:21], shards=shards)
    second = compact(spark, tmp_path, topic, threshold=300, buckets=4)
    gen = Generation.current(tmp_path, topic)
    assert sorted(pairs(generation_edges(gen))) == sorted(produced) == sorted(table_edges(tmp_path, topic))
    # The records of the ranges the first generation took (kept: a reader may be in it) are gone.
    assert second["dropped_bytes"] > 0
    for shard in shards:
        reopened = Shard(tmp_path, topic, shard.partition).open()
        assert reopened.resume == shard.resume  # it resumes past what the generations hold
        assert reopened.store.records("rows") is None  # the generation holds every range the shard wrote
        assert len(reopened.index.parent) < len(shard.index.parent)

    # The running indexer's shards forget the taken ranges' rows at their next write.
    produced += write_shards(tmp_path, topic, messages[21:27], shards=shards)
    recent = {r for nodes, _ in messages[21:27] for r in nodes["rid"].to_pylist()}
    assert all(s.index.parent and set(s.index.parent) <= recent for s in shards)
    third = compact(spark, tmp_path, topic, threshold=300, buckets=4)
    gen = Generation.current(tmp_path, topic)
    stored = generation_edges(gen)
    assert sorted(pairs(stored)) == sorted(produced) and third["edges"] == len(produced)
    rows = generation_rows(gen)
    set_of = dict(zip(rows["rid"].to_pylist(), rows["set"].to_pylist()))
    assert len(set_of) == rows.num_rows  # each row once, though the shards recorded some twice
    assert stored["dst_set"].to_pylist() == [set_of[d] for d in stored["dst"].to_pylist()]
    check_lineage(gen, produced, sorted(set_of), random.Random(7))

    # A shard set aside and rebuilt from its partition's start: its edges are not held twice.
    LineageTables(tmp_path, topic).set_aside(1)
    rebuilt = Shard(tmp_path, topic, 1).open()
    assert rebuilt.resume == 0
    again = write_shards(tmp_path, topic, messages[3:6] + messages[9:12], shards=[rebuilt, rebuilt])
    assert set(again) <= set(produced)
    assert len(table_edges(tmp_path, topic)) > len(produced)  # read twice until the next compaction
    fourth = compact(spark, tmp_path, topic, threshold=300, buckets=4)
    assert fourth["distinct"] and fourth["edges"] == len(produced)
    assert sorted(pairs(generation_edges(Generation.current(tmp_path, topic)))) == sorted(produced)
    assert sorted(table_edges(tmp_path, topic)) == sorted(produced)
