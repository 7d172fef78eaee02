"""kill -9 the indexer while 200k edges stream in, five times: the graph and the Parquet store
end with exactly the edges produced, none lost, none twice. Then two replicas share the rest."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from bench.workload import lineage_messages
from headwater.adapters.kafka import ensure_topics, producer
from headwater.core.schema import encode_lineage
from headwater.indexer.service import FAULT_PAUSE_ENV
from tests.conftest import graph_edge_counts, own_topics, stored_edges, topic_records

pytestmark = pytest.mark.stack

EDGES = 200_000
KILLS = 5
PAUSE_S = 0.6  # between the stores' commits and the offset commit, so some kills land there
HELD_BACK = 10  # messages produced only once the kills are over, so the kills never see the whole stream


def start_indexer(stack, config, log, *args) -> subprocess.Popen:
    env = {**os.environ, "HEADWATER_EDGES_TOPIC": config.edges_topic, "HEADWATER_LOG_TOPIC": config.log_topic,
           "HEADWATER_DLQ_TOPIC": config.dlq_topic, "HEADWATER_STORE_DIR": config.store_dir,
           FAULT_PAUSE_ENV: str(PAUSE_S)}
    return subprocess.Popen([sys.executable, "-m", "headwater.cli", "--home", str(stack.home), "index", *args],
                            env=env, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                            start_new_session=True)


def wait_for(log: Path, text: str, proc: subprocess.Popen, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in log.read_text(errors="replace"):
        assert proc.poll() is None, f"the indexer died on its own: {log.read_text()[-2000:]}"
        assert time.monotonic() < deadline, f"no {text!r} from the indexer in {timeout_s}s"
        time.sleep(0.1)


def check_set_index(config) -> None:
    """Each shard recorded every row of its edges exactly once, at its first sight (the rid → set index)."""
    from headwater.store.edges import EdgeStore

    for partition in (0, 1):
        store = EdgeStore(config.store_dir, config.edges_topic, partition)
        edges, rows = store.read(), store.records("rows")
        recorded = rows["rid"].to_pylist()
        assert len(recorded) == len(set(recorded)), f"shard {partition}: rows recorded twice"
        assert set(recorded) == set(edges["src"].to_pylist()) | set(edges["dst"].to_pylist()), \
            f"shard {partition}: rows of the edges missing from the rid → set index"


def test_kill_9_five_times_while_edges_stream_in_loses_and_repeats_nothing(stack, stack_config, tmp_path):
    config, tag = own_topics(stack_config, "crash")
    config = config.with_overrides(store_dir=str(tmp_path / "store"))
    ensure_topics(config.bootstrap, [config.edges_topic, config.log_topic, config.dlq_topic], 2)
    messages = list(lineage_messages(EDGES, seed=11, edges_per_message=1000, prefix=f"{tag}-"))
    produced = Counter()
    for _, edges in messages:
        produced.update(zip(edges["src"].to_pylist(), edges["dst"].to_pylist(), edges["query"].to_pylist()))
    assert sum(produced.values()) == EDGES and max(produced.values()) == 1
    queries = sorted({q for _, _, q in produced})

    kills_over = threading.Event()

    def produce() -> None:
        client = producer(config.bootstrap)
        try:
            for i, (nodes, edges) in enumerate(messages):
                if i == len(messages) - HELD_BACK:
                    client.flush()
                    kills_over.wait()
                client.send(config.edges_topic, key=f"m{i}".encode(), value=encode_lineage(nodes, edges))
                if i % 40 == 20:
                    client.send(config.edges_topic, key=f"bad{i}".encode(), value=b"not a lineage payload")
                if not kills_over.is_set():
                    time.sleep(0.25)  # a stream over the whole kill phase, not one burst
            client.flush()
        finally:
            client.close()

    streaming = threading.Thread(target=produce)
    streaming.start()
    rng = random.Random(5)
    log_path = tmp_path / "indexer.log"
    with open(log_path, "ab") as log:
        try:
            for kill in range(KILLS):
                own_log = tmp_path / f"indexer-{kill}.log"
                with open(own_log, "wb") as out:
                    proc = start_indexer(stack, config, out)
                try:
                    wait_for(own_log, "resuming at offset", proc)  # it owns partitions: it is writing
                    if kill % 2:  # between the stores' commits and the offset commit
                        wait_for(own_log, "fault pause", proc)
                        time.sleep(rng.uniform(0.0, PAUSE_S / 2))
                    else:  # anywhere
                        time.sleep(rng.uniform(0.5, 8.0))
                    assert proc.poll() is None, f"the indexer died on its own: {own_log.read_text()[-2000:]}"
                finally:
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=30)
                log.write(own_log.read_bytes())
                log.flush()
            # The kills cut real work: restarts resumed mid-stream, with part of the edges stored.
            assert re.search(r"resuming at offset [1-9]", log_path.read_text())
            assert 0 < sum(stored_edges(config).values()) < EDGES
            kills_over.set()
            streaming.join(timeout=300)
            assert not streaming.is_alive()
            # Two replicas in one group drain the rest, sharing the partitions.
            replica_logs = [tmp_path / f"replica-{i}.log" for i in range(2)]
            replicas = []
            for replica_log in replica_logs:
                with open(replica_log, "wb") as out:
                    replicas.append(start_indexer(stack, config, out, "--drain", "--idle", "4", "--max-seconds", "400"))
            outputs = []
            for proc, replica_log in zip(replicas, replica_logs):
                try:
                    out, _ = proc.communicate(timeout=460)
                finally:
                    if proc.poll() is None:
                        os.kill(proc.pid, signal.SIGKILL)
                        proc.wait(timeout=30)
                assert proc.returncode == 0, replica_log.read_text()[-3000:]
                outputs.append(json.loads(out.decode().strip().splitlines()[-1]))
                log.write(replica_log.read_bytes())
        finally:
            kills_over.set()
            streaming.join(timeout=300)

    assert stored_edges(config) == produced, "the Parquet store lost or repeated edges"
    check_set_index(config)
    assert graph_edge_counts(config, queries) == produced, "the graph lost or repeated edges"
    text = log_path.read_text()
    assert text.count("resuming at offset") >= KILLS  # each restart resumed from the store
    assert all(o["retries"] == 0 for o in outputs)
    owned = [{m for m in re.findall(r"store shard \S+/(\d+)", p.read_text())} for p in replica_logs]
    assert all(owned), owned  # each replica owned an edges partition (one may have had both before the other joined)
    # a kill after the dlq send may send one twice, never lose one
    dead = {m.key for m in topic_records(config, config.dlq_topic)}
    assert dead == {f"bad{i}".encode() for i in range(len(messages)) if i % 40 == 20}
