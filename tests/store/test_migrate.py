"""``headwater store migrate``: a store of the folder layout before the tables, read into the tables, checked
record by record.

The old store is written here file by file in its layout (store/migrate.py's docstring): two shards, one of
whose ranges a compacted generation covers, a set-aside shard, a batch log of a run and a segment with a
torn last line, and plans. After the migration the tables hold every edge once (the generation's and the
ranges it did not cover), the rows records, the shards resume where they did, and the batch log and the
plans read as the old ones did; a second migration changes nothing.
"""

from __future__ import annotations

import json
import zlib
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from click.testing import CliRunner

from headwater.cli import main
from headwater.store.batch_log import BatchLog
from headwater.store.edges import ROWS_SCHEMA, STORE_SCHEMA, EdgeStore, LineageTables, with_src_sets
from headwater.store.generation import Generation
from headwater.store.plans import PlanStore
from tests.store.test_store import edges

TOPIC, LOG = "t.edges", "t.log"


def old_range(shard, partition: int, first: int, last: int, table: pa.Table, buckets: int = 8) -> None:
    name = f"{TOPIC}~{partition}~{first:012d}~{last:012d}"
    stored = table.set_column(table.schema.get_field_index("src_set"), "src_set",
                              pa.compute.if_else(pa.compute.equal(table["src_set"], table["dst_set"]),
                                                 pa.scalar(None, pa.int64()), table["src_set"]))
    bucket = np.mod(table["dst_set"].to_numpy(), buckets)
    for b in np.unique(bucket).tolist():
        (shard / "edges" / f"bucket={b}").mkdir(parents=True, exist_ok=True)
        pq.write_table(stored.filter(pa.array(bucket == b)), shard / "edges" / f"bucket={b}" / f"{name}.parquet")
    rows = pa.table({"rid": table["dst"], "set": table["dst_set"]}).append_column(
        "kind", pa.array(["output"] * table.num_rows))
    (shard / "rows").mkdir(parents=True, exist_ok=True)
    pq.write_table(rows, shard / "rows" / f"{name}.parquet")
    (shard / "commits").mkdir(parents=True, exist_ok=True)
    (shard / "commits" / f"{name}.json").write_text(json.dumps({"edges": table.num_rows}))


def old_store(root) -> dict:
    """The old layout under ``root``; returns what it holds."""
    topic = root / TOPIC
    ranges = {0: [(0, 4, edges(40)), (5, 9, edges(41)), (10, 14, edges(42))], 1: [(0, 6, edges(43))]}
    for partition, held in ranges.items():
        shard = topic / f"partition={partition}"
        shard.mkdir(parents=True)
        (shard / "store.json").write_text(json.dumps({"id": f"old{partition}", "buckets": 8}))
        for first, last, table in held:
            old_range(shard, partition, first, last, table)
    aside = topic / "set-aside" / "partition=1-20261201T000000-7"
    aside.mkdir(parents=True)
    (aside / "store.json").write_text(json.dumps({"id": "old1-before", "buckets": 8}))
    old_range(aside, 1, 0, 3, edges(44))
    # The generation covers partition 0 below offset 10: its first two ranges (their edges, as compaction placed them).
    gen = topic / "compacted" / "gen=3"
    held = pa.concat_tables([edges(40), edges(41)])
    (gen / "edges" / "bucket=0").mkdir(parents=True)
    pq.write_table(held, gen / "edges" / "bucket=0" / "part-0.parquet")
    for name, table in (("rows", pa.table({"rid": held["dst"], "set": held["dst_set"]})),
                        ("exits", pa.table({"src": held["src"], "dst_set": held["dst_set"]})),
                        ("dependencies", pa.table({"src_set": held["src_set"], "dst_set": held["dst_set"]}))):
        (gen / name).mkdir()
        pq.write_table(table, gen / name / "part-0.parquet")
    (gen / "manifest.json").write_text(json.dumps({"generation": 3, "buckets": 1, "edges": held.num_rows,
                                                   "covers": {"0": {"store": "old0", "next": 10}}}))
    (topic / "compacted" / "CURRENT").write_text(json.dumps({"generation": 3}))

    log = root / LOG / "partition=0"
    log.mkdir(parents=True)
    run = {"q": {0: {"status": [2, "full"], "rows_in": [1, 7]}, 1: {"status": [4, "failed"]}}}
    pq.write_table(pa.Table.from_pylist(
        [{"query": "q", "batch": b, "status": f["status"][1], "status_at": f["status"][0], "fields": json.dumps(f)}
         for b, f in run["q"].items()] + [{"dataset": "dim", "fields": json.dumps({"key": [3, "id"]})}],
        schema=pa.schema([("query", pa.string()), ("batch", pa.int64()), ("dataset", pa.string()),
                          ("status", pa.string()), ("status_at", pa.int64()), ("fields", pa.string())])),
        log / "run-00000001-000000-0123456789ab.parquet")
    lines = [{"at": 5, "query": "q", "batch": 1, "fields": {"status": "full", "seconds": 0.5}},
             {"at": 6, "query": "q", "batch": 2, "fields": {"rows_in": 3}}]
    text = b"".join(b"%08x %s\n" % (zlib.crc32(body), body)
                    for body in (json.dumps(line, sort_keys=True).encode() for line in lines))
    (log / "seg-000000-000000000005-0123456789ab.log").write_bytes(text + b"0badc0de {\"at\": 7")  # torn last line
    plan = root / LOG / "plans" / "q".encode().hex()
    plan.mkdir(parents=True)
    (plan / "000000000000-aa11.json").write_text(json.dumps({"query": "q", "from_batch": 0, "fingerprint": "aa11",
                                                           "optimized": [{"n": 1}], "sink": "parquet:/out"}))
    every = [t for held in ranges.values() for _, _, t in held] + [edges(44)]
    return {"edges": Counter(e for t in every for e in zip(*[t[c].to_pylist() for c in STORE_SCHEMA.names])),
            "batches": {("q", 0): {"query": "q", "batch": 0, "status": "full", "rows_in": 7},
                        ("q", 1): {"query": "q", "batch": 1, "status": "full", "seconds": 0.5},
                        ("q", 2): {"query": "q", "batch": 2, "rows_in": 3}},
            "dataset": {"name": "dim", "key": "id"}}


def migrated_edges(store) -> Counter:
    table = LineageTables(store, TOPIC).edges
    read = with_src_sets(table.read(table.files()["path"].to_pylist(), STORE_SCHEMA.names))
    return Counter(zip(*[read[c].to_pylist() for c in STORE_SCHEMA.names]))


def test_an_old_store_migrates_record_by_record_and_once(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    expected = old_store(old)
    env = {"HEADWATER_STORE_DIR": str(new), "HEADWATER_EDGES_TOPIC": TOPIC, "HEADWATER_LOG_TOPIC": LOG}
    result = CliRunner().invoke(main, ["--home", str(tmp_path / "home"), "store", "migrate", "--from", str(old)],
                                env=env)
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout.strip().splitlines()[-1])
    assert (printed["generation_edges"], printed["shard_ranges"], printed["plans"]) == (1000, 3, 1)

    # Every edge once: the generation's, and the shards' ranges it did not cover (the set-aside shard's too).
    assert migrated_edges(new) == expected["edges"]
    generation = Generation.current(new, TOPIC)
    assert generation is not None and generation.number == 1 and generation.buckets == 1
    covered = pa.concat_tables([edges(40), edges(41)])
    assert generation.set_of(covered["dst"].to_pylist()) == dict(zip(covered["dst"].to_pylist(),
                                                                      covered["dst_set"].to_pylist()))
    zero, one = EdgeStore(new, TOPIC, 0), EdgeStore(new, TOPIC, 1)
    assert zero.resume() == 15 and zero.committed() == [(10, 14)]
    assert one.identity() == "p1.e1" and one.resume() == 7 and one.committed() == [(0, 6)]
    assert EdgeStore(new, TOPIC, 1).records("rows").num_rows == edges(43).num_rows
    assert set(ROWS_SCHEMA.names) <= set(zero.records("rows").column_names)

    log = BatchLog(new, LOG)
    for (query, batch), fields in expected["batches"].items():
        assert log.batch(query, batch) == fields
    assert log.statuses(expected["batches"]) == {k: v.get("status") for k, v in expected["batches"].items()}
    assert log.dataset("dim") == expected["dataset"]
    plans = PlanStore(new, LOG)
    kept = [(q, start, p["optimized"], p["sink"]) for q, start, p in plans.kept()]
    assert kept == [("q", 0, [{"n": 1}], "parquet:/out")]

    # Again: nothing written twice.
    again = CliRunner().invoke(main, ["--home", str(tmp_path / "home"), "store", "migrate", "--from", str(old)],
                               env=env)
    assert again.exit_code == 0, again.output
    assert migrated_edges(new) == expected["edges"] and PlanStore(new, LOG).starts("q") == [0]
    assert BatchLog(new, LOG).batch("q", 1) == expected["batches"][("q", 1)]
    refused = CliRunner().invoke(main, ["--home", str(tmp_path / "home"), "store", "migrate", "--from", str(new)],
                                 env=env)
    assert refused.exit_code == 2 and "is the store itself" in refused.output
