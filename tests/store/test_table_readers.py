"""The lineage tables read by the engines a user already has, with no headwater code: Spark and DuckDB.

Lineage of three chained queries goes into two shards; half of it is compacted into a generation before the
rest arrives, so the edges table holds a generation's files and the shards' at once. Spark (Delta's own
connector, ``format("delta")``) and DuckDB (its ``delta`` extension, ``delta_scan``) then read the tables:
every edge once, an earlier version by time travel, and query/README.md's two questions in the SQL that
README shows: "every output of one Kafka partition's offsets in a range", compared with a brute-force walk over
the edges produced and with the CSProv backend's answers; and "which batches read a version of a static
table", over a batch log of appended records and merged runs with a batch run twice, compared with what the
records say and with the batch log as headwater reads it (``BatchLog``).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from collections import defaultdict
from pathlib import Path

import pytest

from headwater.deploy.tools import delta_spark_jars
from headwater.indexer.compaction import compact
from headwater.indexer.shard import Shard
from headwater.query.parquet import CSProvBackend
from headwater.store.batch_log import BatchLog, BatchLogWriter, batch_log_table
from headwater.store.edges import LineageTables
from tests.query.test_query_backends import pipeline

README = Path(__file__).resolve().parents[2] / "query" / "README.md"


def readme_sql(name: str) -> str:
    """The ``sql`` block of query/README.md whose first line is ``-- name: <name>``."""
    for block in re.findall(r"```sql\n(.*?)```", README.read_text(), re.S):
        if block.startswith(f"-- name: {name}\n"):
            return block
    raise AssertionError(f"query/README.md has no sql block named {name}")


def outputs_from_offsets(produced: list[dict], rows: dict, sources: set[int]) -> set[int]:
    """Brute force: every output row some path of edges leads to from ``sources``."""
    onward = defaultdict(set)
    for e in produced:
        onward[e["src"]].add(e["dst"])
    seen, todo = set(sources), list(sources)
    while todo:
        for nxt in onward[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return {r for r in seen if rows[r][0] == "output"}


def users_spark(job: dict) -> dict:
    """``spark_delta_reader.py``'s answers: a Spark session of its own, with Delta's connector."""
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("spark_delta_reader.py"))],
                          input=json.dumps(job), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, "\n".join(line for line in done.stderr.splitlines() if "Exception" in line)[:3000]
    return json.loads(done.stdout.strip().splitlines()[-1])


def duckdb_connection():
    """DuckDB with its ``delta`` extension, from the ``duckdb-extension-delta`` wheel (nothing fetched at run time)."""
    import duckdb
    import duckdb_extension_delta

    (extension,) = Path(duckdb_extension_delta.__path__[0]).rglob("delta.duckdb_extension")
    con = duckdb.connect()
    con.sql(f"LOAD '{extension}'")
    return con


@pytest.mark.spark
def test_spark_and_duckdb_read_the_tables_and_answer_the_readme_question(spark, stack_config, tmp_path):
    tag = "r" + uuid.uuid4().hex[:6]
    config = stack_config.with_overrides(store_dir=str(tmp_path), edges_topic=f"{tag}.edges")
    messages, rows = pipeline(seed=5, batches=8, tag=tag)
    shards = [Shard(tmp_path, config.edges_topic, p).open() for p in range(2)]
    tables = LineageTables(tmp_path, config.edges_topic)
    produced, before_switch, at_switch = [], None, None
    for i, (nodes, edges) in enumerate(messages):
        shard = shards[i % 2]
        shard.write(nodes, edges, shard.resume, shard.resume)
        produced += edges.to_pylist()
        if i == len(messages) // 2:
            before_switch, at_switch = tables.edges.version(), len(produced)
            compact(spark, tmp_path, config.edges_topic, threshold=30, buckets=4)
    assert {f["partition.generation"] for f in tables.edges.files().to_pylist()} == {0, 1}
    edges_uri, rows_uri = str(tmp_path / config.edges_topic / "edges"), str(tmp_path / config.edges_topic / "rows")
    expected = sorted((e["src"], e["dst"], e["query"], e["batch"]) for e in produced)

    # Every edge once, now and at the version before the compaction's switch.
    con = duckdb_connection()
    con.sql(f"CREATE VIEW edges AS SELECT * FROM delta_scan('{edges_uri}')")
    con.sql(f"CREATE VIEW rows AS SELECT * FROM delta_scan('{rows_uri}')")
    assert sorted(con.sql(f"SELECT src, dst, query, batch FROM delta_scan('{edges_uri}')").fetchall()) == expected
    assert con.sql(f"SELECT count(*) FROM delta_scan('{edges_uri}', version => {before_switch})").fetchone() \
        == (at_switch,)

    # The README's question, on both engines, for a few offset ranges of the orders topic's partition 0.
    sql = readme_sql("outputs_of_offsets")
    orders = _orders(messages)
    ranges = ((0, 5), (10, 40), (3, 4), (1000, 2000))
    params = [{"topic": f"{tag}-orders", "partition": 0, "first": first, "end": end} for first, end in ranges]
    log_topic, truth_of_log = f"{tag}.log", batch_log_with_versions(tmp_path, f"{tag}.log")
    log_uri = batch_log_table(tmp_path, log_topic).location.uri
    con.sql(f"CREATE VIEW batch_log AS SELECT * FROM delta_scan('{log_uri}')")
    log_sql = readme_sql("batches_reading_version")
    log_params = [{"table": table, "version": version} for table, version in truth_of_log]
    on_spark = users_spark({"jars": delta_spark_jars(), "edges": edges_uri, "rows": rows_uri,
                            "version": before_switch, "sql": sql, "params": params,
                            "batch_log": log_uri, "log_sql": log_sql, "log_params": log_params})
    assert sorted(tuple(e) for e in on_spark["edges"]) == expected
    assert on_spark["count_at_version"] == at_switch
    backend = CSProvBackend(config)
    for (first, end), asked, spark_answer in zip(ranges, params, on_spark["answers"]):
        sources = {r for r, (topic, partition, offset) in orders.items() if first <= offset < end}
        truth = outputs_from_offsets(produced, rows, sources)
        by_backend = {x.rid for s in sources for x in backend.forward(s, to="output")}
        on_duckdb = {r for (r,) in con.execute(re.sub(r":(\w+)", r"$\1", sql), asked).fetchall()}
        assert set(spark_answer) == on_duckdb == by_backend == truth, (first, end)
        assert truth or first >= 1000  # the ranges within the topic reach outputs
    backend.close()

    # Which batches read a version of a static table: the README's SQL on both engines, the batch log as
    # headwater reads it, and what the records say.
    log = BatchLog(tmp_path, log_topic)
    for asked, spark_answer in zip(log_params, on_spark["log_answers"]):
        truth = truth_of_log[(asked["table"], asked["version"])]
        by_headwater = sorted([query, batch] for query in ("enrich", "totals") for batch in log.batches(query)
                              if (log.batch(query, batch).get("tables") or {}).get(asked["table"]) == asked["version"])
        on_duckdb = [list(r) for r in con.execute(re.sub(r":(\w+)", r"$\1", log_sql), asked).fetchall()]
        assert spark_answer == on_duckdb == by_headwater == truth, asked
    assert any(truth_of_log.values()) and not all(truth_of_log.values())  # versions read and one never read


CUSTOMERS, SITES = "file:/data/customers.parquet", "file:/data/sites.parquet,file:/data/sites-eu.parquet"


def batch_log_with_versions(store: Path, log_topic: str) -> dict[tuple[str, str], list[list]]:
    """A batch log whose batches read versions of two static tables, as capture logs them: two queries, each
    keyed to a log partition of its own, records appended and merged into runs (``run_records``: 4), and batch
    ``totals``/5 run twice (a driver crash), the second run reading a newer version. Returns, for each
    ``(table, version)`` asked, the ``[query, batch]`` whose latest run read it, sorted."""
    writer = BatchLogWriter(store, log_topic, run_records=4)
    latest: dict[tuple[str, int], dict] = {}
    offsets = {0: 0, 1: 0}

    def log(partition: int, query: str, batch: int, tables: dict) -> None:
        writer.append_batch(partition, offsets[partition], query, batch, {"tables": tables, "status": "full"})
        writer.append_batch(partition, offsets[partition] + 1, query, batch, {"rows": 10})  # progress: no tables
        offsets[partition] += 2
        latest[(query, batch)] = tables

    for batch in range(12):
        log(0, "enrich", batch, {CUSTOMERS: "c1" if batch < 7 else "c2"})
        log(1, "totals", batch, {CUSTOMERS: "c1" if batch < 4 else "c2", SITES: "s1"})
    log(1, "totals", 5, {CUSTOMERS: "c3", SITES: "s1"})  # batch 5 again, reading a newer version
    asked = [(CUSTOMERS, "c1"), (CUSTOMERS, "c2"), (CUSTOMERS, "c3"), (SITES, "s1"), (SITES, "s0")]
    return {(table, version): sorted([q, b] for (q, b), read in latest.items() if read.get(table) == version)
            for table, version in asked}


def _orders(messages) -> dict[int, tuple[str, int, int]]:
    found = {}
    for nodes, _ in messages:
        for r in nodes.to_pylist():
            if r["topic"] is not None:
                found[r["rid"]] = (r["topic"], r["partition"], r["offset"])
    return found
