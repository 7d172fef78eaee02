"""The batch log in the store (``store/batch_log.py``), checked against a brute-force merge and against the graph.

The brute force: every record written, once per (partition, epoch, offset), applied as
dict updates in (partition, epoch, offset) order, as the graph's ``SET b += $props``
does in offset order.
"""

from __future__ import annotations

import json
import random
import threading
import time

import pytest

from headwater.adapters.graph import driver
from headwater.adapters.kafka import ensure_topics, producer
from headwater.core.schema import CAPTURE_STATUSES, LOG_BATCH, LOG_PLAN, LOG_PROGRESS, encode_log
from headwater.indexer.service import Indexer
from headwater.query import cypher
from headwater.query.cypher import CypherBackend
from headwater.store.batch_log import RUN_RECORDS, BatchLog, BatchLogWriter, batch_log_table
from headwater.store.graph import GraphWriter, batch_graph, batch_statuses
from tests.conftest import index

TOPIC = "hw.log"


def topic_records(rng: random.Random, count: int, queries: list[str], batches: int) -> list[tuple]:
    """A log partition's records, offset by offset: batch halves in any order, retried batches, plans."""
    records = []
    for _ in range(count):
        kind = rng.random()
        query, batch = rng.choice(queries), rng.randrange(batches)
        if kind < 0.45:
            fields = {"status": rng.choice(CAPTURE_STATUSES), "seconds": round(rng.random(), 3)}
            if rng.random() < 0.3:
                fields["dropped_edges"] = rng.randrange(5)
            records.append(("batch", query, batch, fields))
        elif kind < 0.9:
            offsets = {"t": {str(p): rng.randrange(1000) for p in range(rng.randint(1, 2))}}
            fields = {"rows_in": rng.randrange(100), "durations_ms": {"addBatch": rng.randrange(50)},
                      "sources": [{"start": None if rng.random() < 0.2 else offsets, "end": offsets}]}
            records.append(("batch", query, batch, fields))
        else:
            props = {k: v for k, v in {"source": "static", "location": rng.choice(["/d/a", "/d/b"]),
                                       "format": rng.choice(["parquet", "csv"]), "key": "id"}.items()
                     if rng.random() < 0.7}
            records.append(("datasets", {rng.choice(["dim_a", "dim_b"]): props}))
    return records


def append(writer: BatchLogWriter, partition: int, offset: int, record: tuple) -> None:
    if record[0] == "batch":
        writer.append_batch(partition, offset, record[1], record[2], record[3])
    else:
        writer.append_datasets(partition, offset, record[1])


def brute_force(written, records: dict) -> tuple[dict, dict]:
    batches, datasets = {}, {}
    for partition, _, offset in sorted(set(written)):
        record = records[partition][offset]
        if record[0] == "batch":
            batches.setdefault((record[1], record[2]), {}).update(record[3])
        else:
            for name, props in record[1].items():
                datasets.setdefault(name, {}).update(props)
    return batches, datasets


def check(log: BatchLog, written, records: dict, queries: list[str], batches: int) -> None:
    expected, datasets = brute_force(written, records)
    pairs = [(q, b) for q in queries for b in range(batches + 1)]  # the last batch is never logged
    assert log.statuses(pairs) == {p: expected.get(p, {}).get("status") for p in pairs}
    for query in queries:
        assert log.batches(query) == sorted(b for q, b in expected if q == query)
    for query, batch in pairs:
        want = expected.get((query, batch))
        assert log.batch(query, batch) == (None if want is None else {"query": query, "batch": batch, **want})
    for name in ("dim_a", "dim_b", "dim_c"):
        assert log.dataset(name) == (None if name not in datasets else {"name": name, **datasets[name]})


@pytest.mark.parametrize("seed", range(20))
def test_the_reader_merges_like_brute_force_through_crashes_replays_and_new_epochs(tmp_path, seed):
    rng = random.Random(seed)
    queries = [f"q{i}" for i in range(rng.randint(1, 3))]
    batches = rng.randint(2, 12)
    partitions = rng.randint(1, 3)
    run_records = rng.choice([2, 3, 5, 8, 10_000])
    unordered = rng.random() < 0.3  # a session writes its records in any order
    records = {p: topic_records(rng, rng.randint(5, 60), queries, batches) for p in range(partitions)}
    # Each partition's owner is a writer of its own (a replica); a crash leaves it behind as a former owner.
    owner = {p: BatchLogWriter(tmp_path, TOPIC, run_records) for p in range(partitions)}
    epoch = {p: 0 for p in range(partitions)}
    committed = {p: 0 for p in range(partitions)}
    position = {p: 0 for p in range(partitions)}
    former: dict[int, tuple] = {}  # partition -> (writer, its epoch, its next offset)
    written: list[tuple[int, int, int]] = []
    log = BatchLog(tmp_path, TOPIC)

    def take_over(p: int) -> None:
        """A new owner; like the indexer, it starts a new epoch where the group has no offset but the folder holds
        entries."""
        owner[p] = BatchLogWriter(tmp_path, TOPIC, run_records)
        if committed[p] == 0 and owner[p].holds(p):
            epoch[p] = owner[p].new_epoch(p)
            assert epoch[p] > max(e for q, e, _ in written if q == p)
        position[p] = committed[p]

    for _ in range(200):
        p = rng.randrange(partitions)
        action = rng.random()
        if action < 0.55:
            upto = min(len(records[p]), position[p] + rng.randint(1, 8))
            offsets = list(range(position[p], upto))
            if unordered:
                rng.shuffle(offsets)
            for offset in offsets:
                append(owner[p], p, offset, records[p][offset])
                written.append((p, epoch[p], offset))
            position[p] = max(position[p], upto)
            committed[p] = rng.randint(committed[p], position[p])
        elif action < 0.7:  # a crash: a new owner resumes from the committed offset
            former[p] = (owner[p], epoch[p], position[p])
            take_over(p)
        elif action < 0.8 and p in former:  # the former owner still writes what it read
            writer, its_epoch, its_next = former[p]
            for offset in range(its_next, min(len(records[p]), its_next + rng.randint(1, 5))):
                append(writer, p, offset, records[p][offset])
                written.append((p, its_epoch, offset))
                its_next = offset + 1
            former[p] = (writer, its_epoch, its_next)
        elif action < 0.85:  # a new consumer group: the partition again from its beginning
            committed[p] = 0
            take_over(p)
        else:
            check(log.refresh(), written, records, queries, batches)
    for p in range(partitions):  # each owner reads its partition to the end
        for offset in range(position[p], len(records[p])):
            append(owner[p], p, offset, records[p][offset])
            written.append((p, epoch[p], offset))
    check(log.refresh(), written, records, queries, batches)
    check(BatchLog(tmp_path, TOPIC), written, records, queries, batches)
    held = {f["partition.partition"] for f in batch_log_table(tmp_path, TOPIC).files().to_pylist()}
    assert held == set(range(partitions))


@pytest.mark.parametrize("run_records", [10_000, 4])
def test_an_append_cut_before_its_commit_is_never_read_and_nothing_before_it_is_lost(tmp_path, run_records,
                                                                                     monkeypatch):
    rng = random.Random(run_records)
    records = {0: topic_records(rng, 40, ["q"], 10)}
    for trial in range(5):
        root = tmp_path / str(trial)
        count = rng.randrange(1, 41)
        writer = BatchLogWriter(root, TOPIC, run_records)
        for offset in range(count - 1):
            append(writer, 0, offset, records[0][offset])
        # The process dies in its last append, after the entry's file was written, before its commit.
        table = writer.table
        real = type(table).commit

        def die(self, written=(), removed=(), txn=None, metadata=None):
            raise OSError("killed")

        monkeypatch.setattr(type(table), "commit", die)
        with pytest.raises(OSError):
            append(writer, 0, count - 1, records[0][count - 1])
        monkeypatch.setattr(type(table), "commit", real)
        check(BatchLog(root, TOPIC), [(0, 0, o) for o in range(count - 1)], records, ["q"], 10)
        # The next owner resumes from a committed offset no later than the lost record.
        resume = rng.randint(0, count - 1)
        writer = BatchLogWriter(root, TOPIC, run_records)
        for offset in range(resume, 40):
            append(writer, 0, offset, records[0][offset])
        check(BatchLog(root, TOPIC), [(0, 0, o) for o in range(40)], records, ["q"], 10)


def test_replicas_and_a_former_owner_write_at_once_while_a_reader_reads(tmp_path):
    rng = random.Random(3)
    queries = ["q0", "q1", "q2"]
    records = {p: topic_records(rng, 300, queries, 40) for p in range(3)}
    written, failures = [], []
    reads = threading.Condition()
    seen = []

    def write(writer: BatchLogWriter, partition: int, offsets) -> None:
        try:
            for i, offset in enumerate(offsets):
                if i and i % 50 == 0:  # the reader reads at least once every 50 records, however fast they go
                    with reads:
                        before = len(seen)
                        reads.wait_for(lambda: len(seen) > before, timeout=30)
                append(writer, partition, offset, records[partition][offset])
                written.append((partition, 0, offset))
        except Exception as exc:  # reported by the test's thread
            failures.append(exc)

    # Partition 0's former owner replays its records while the new owner writes them all.
    writers = [threading.Thread(target=write, args=(BatchLogWriter(tmp_path, TOPIC, 16), p, range(300)))
               for p in range(3)]
    writers.append(threading.Thread(target=write, args=(BatchLogWriter(tmp_path, TOPIC, 16), 0, range(100, 300))))
    pairs = [(q, b) for q in queries for b in range(40)]
    for thread in writers:
        thread.start()
    log = BatchLog(tmp_path, TOPIC)
    while any(t.is_alive() for t in writers):
        found = sum(s is not None for s in log.refresh().statuses(pairs).values())
        with reads:
            seen.append(found)
            reads.notify_all()
    for thread in writers:
        thread.join()
    assert not failures
    assert len(seen) > 5 and seen == sorted(seen)  # a status once read is never lost to a compaction
    check(log.refresh(), written, records, queries, 40)


def test_thousands_of_batches_stay_a_few_files_and_read_fast(tmp_path):
    writer = BatchLogWriter(tmp_path, TOPIC)
    rng = random.Random(5)
    expected = {}
    batches = 20_000
    records = []
    for batch in range(batches):  # two halves per batch, the progress sometimes first
        status = rng.choice(CAPTURE_STATUSES)
        halves = [{"status": status, "seconds": 0.5}, {"rows_in": batch, "sources": [{"end": {"t": {"0": batch}}}]}]
        if rng.random() < 0.5:
            halves.reverse()
        records += [(2 * batch + i, "q", batch, fields) for i, fields in enumerate(halves)]
        expected[("q", batch)] = status
    appends = 0
    while records:  # many records a commit, as a migration appends them
        size = rng.randint(1, 2 * RUN_RECORDS)
        writer.append_many(0, records[:size])
        records = records[size:]
        appends += 1
    files = batch_log_table(tmp_path, TOPIC).files().to_pylist()
    runs = [f for f in files if f["path"].split("/")[-1].startswith("run")]
    assert len(runs) <= (appends // RUN_RECORDS).bit_length() + 1
    assert len(files) - len(runs) < RUN_RECORDS
    started = time.perf_counter()
    log = BatchLog(tmp_path, TOPIC)
    assert log.statuses(expected) == expected
    seconds = time.perf_counter() - started
    assert seconds < 2.0, f"reading the statuses of {batches} batches took {seconds:.2f}s"
    assert log.batch("q", 17)["sources"] == [{"end": {"t": {"0": 17}}}]


# -- through the real indexer on the local stack


def publish(config, rng: random.Random, queries: list[str], batches: int) -> tuple[dict, dict]:
    """Log records of ``queries`` (each keyed to a partition of its own) on the real broker; returns the oracle."""
    client = producer(config.bootstrap)
    statuses = {}
    plan_sources = [
        {"source": "static", "dataset": "dim_customers", "key": ["id"],
         "location": {"paths": ["/data/customers"], "format": "parquet"}},
        {"source": "kafka", "dataset": "kafka:orders"},
    ]
    for i, query in enumerate(queries):
        partition = i % 2

        def send(value: bytes, query=query, partition=partition) -> None:
            client.send(config.log_topic, key=query.encode(), value=value, partition=partition)
            record = json.loads(value)
            if record["schema"] == LOG_BATCH:  # one partition per query: offset order is publish order
                statuses[(query, record["batch"])] = record["status"]

        send(encode_log(LOG_PLAN, query=query, sources=plan_sources))
        for batch in rng.sample(range(batches), batches):  # batches out of order
            half_status = encode_log(LOG_BATCH, query=query, batch=batch, status=rng.choice(CAPTURE_STATUSES),
                                     seconds=0.1)
            progress = encode_log(LOG_PROGRESS, query=query, batch=batch, rows_in=batch, run_id="r",
                                  durations_ms={"addBatch": 3}, sources=[{"start": None, "end": {"t": {"0": batch}}}])
            if batch % 5 == 4:  # the hook never logged it: a gap with progress only
                send(progress)
                continue
            halves = [half_status, progress] if rng.random() < 0.5 else [progress, half_status]
            for value in halves:
                send(value)
            if batch % 7 == 3:  # retried: failed first, full at the retry
                send(encode_log(LOG_BATCH, query=query, batch=batch, status="full", seconds=0.2))
    client.flush()
    client.close()
    datasets = {"dim_customers": {"name": "dim_customers", "source": "static", "location": "/data/customers",
                                  "format": "parquet", "key": "id"}}
    return statuses, datasets


def run_indexer(config, group: str) -> None:
    index(config, group=group)


@pytest.mark.stack
def test_the_store_and_the_graph_give_the_same_gap_map(config):
    ensure_topics(config.bootstrap, [config.edges_topic, config.log_topic, config.dlq_topic], 2)
    rng = random.Random(11)
    queries = [f"bl-{config.log_topic}-{i}" for i in range(4)]
    statuses, datasets = publish(config, rng, queries, 30)
    pairs = [(q, b) for q in queries for b in range(31)]  # batch 30 never ran
    expected = {p: statuses.get(p) for p in pairs}
    assert sum(s is None for s in expected.values()) == 4 * 7 and set(statuses.values()) == set(CAPTURE_STATUSES)

    # The store fails at first (its table's folder cannot be made): the records are retried, not lost.
    store = config.store_path() / config.log_topic
    store.mkdir(parents=True, exist_ok=True)
    blocked = [store / "batch_log"]
    for path in blocked:
        path.write_text("not a folder")
    indexer = Indexer(config)

    def unblock() -> None:
        deadline = time.monotonic() + 60
        while indexer.stats.retries < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        for path in blocked:
            path.unlink()

    unblocking = threading.Thread(target=unblock)
    unblocking.start()
    try:
        stats = indexer.run(drain=True, idle_s=1.5, max_seconds=120)
    finally:
        unblocking.join()
        indexer.close()
    assert stats.retries >= 2 and stats.dlq == 0

    log = BatchLog(config.store_uri(), config.log_topic)
    with driver(config) as d:
        graph = batch_statuses(d, pairs, database=config.graph_database)
        with d.session(database=config.graph_database) as s:
            nodes = {(r["p"]["query"], r["p"]["batch"]): r["p"] for r in s.run(
                "MATCH (b:Batch) WHERE b.query IN $queries RETURN properties(b) AS p", queries=queries)}
            reads = {}
            for r in s.run("MATCH (b:Batch)-[r:READ]->(d:Dataset) WHERE b.query IN $queries "
                           "RETURN b.query AS query, b.batch AS batch, d.name AS name, properties(r) AS p",
                           queries=queries):
                reads.setdefault((r["query"], r["batch"]), []).append({"dataset": r["name"], **r["p"]})
            assert batch_statuses(s, [(queries[1], 8), (queries[1], 99)]) == {
                (queries[1], 8): expected[(queries[1], 8)], (queries[1], 99): None}
    assert graph == expected
    assert log.statuses(pairs) == expected
    # Every field of every batch as the graph has it (graph.batch_graph: durations as properties, sources
    # as READ links to their datasets), also after the records of one batch were merged in any order.
    assert len(nodes) == 4 * 30
    for (query, batch), node in nodes.items():
        stored = log.batch(query, batch)
        props, links = batch_graph({k: v for k, v in stored.items() if k not in ("query", "batch")})
        assert {**props, "query": query, "batch": batch} == node and node["addBatch_ms"] == 3
        assert stored["sources"] == [{"start": None, "end": {"t": {"0": batch}}}]
        assert reads.get((query, batch), []) == [{"dataset": "kafka:t", "topic": "t",
                                                  "partition": 0, "start_offset": 0, "end_offset": batch}][:batch]
        assert [{"dataset": link["dataset"], **link["props"]} for link in links["sources"]] == reads.get(
            (query, batch), [])
    stored = log.batch(queries[1], 8)
    backend = CypherBackend(config)
    try:
        for name in ("dim_customers", "kafka:orders", "nowhere"):
            assert log.dataset(name) == backend.dataset(name) == datasets.get(name)
    finally:
        backend.close()

    # A new consumer group reads the whole topic again: a new epoch, the same gap map.
    run_indexer(config, group="headwater-indexer-again")
    table = batch_log_table(config.store_uri(), config.log_topic)
    assert [table.applied(f"{config.log_topic}/epoch/p{p}") for p in (0, 1)] == [1, 1]
    assert log.refresh().statuses(pairs) == expected
    assert BatchLog(config.store_uri(), config.log_topic).batch(queries[1], 8) == stored


@pytest.mark.stack
def test_the_graphs_statuses_are_kept_briefly_and_a_batch_logged_anew_shows_after(config, monkeypatch):
    query = f"ttl-{config.log_topic}"
    first, second = (query, 1), (query, 2)
    asked = []
    read = cypher.batch_statuses
    monkeypatch.setattr(cypher, "batch_statuses", lambda d, pairs, db: asked.append(list(pairs)) or read(d, pairs, db))
    writer, backend = GraphWriter(config), CypherBackend(config)
    try:
        writer.write_batch(query, 1, {"status": "full"})
        assert backend.batch_statuses([first, second]) == {first: "full", second: None}
        writer.write_batch(query, 2, {"status": "sampled"})
        # the batch with no status yet is asked again at once; the other is taken as read
        assert backend.batch_statuses([first, second]) == {first: "full", second: "sampled"}
        assert asked == [[first, second], [second]]
        writer.write_batch(query, 1, {"status": "failed"})  # the batch run again after a restart
        time.sleep(cypher.STATUS_TTL_S + 0.1)
        assert backend.batch_statuses([first, second]) == {first: "failed", second: "sampled"}
        assert asked[2:] == [[first, second]]
    finally:
        backend.close()
        writer.close()
