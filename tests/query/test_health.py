"""What Prometheus and Kubernetes see of the services: ``/metrics``, ``/healthz`` and ``/readyz`` of the
query service (``query/http/``) and of the indexer (``headwater index --metrics-port``), on real
servers: the local stack's graph, a Parquet store written without Spark, and a graph address nobody
listens on for a graph that is down.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from headwater.adapters import health_http
from headwater.adapters.kafka import ensure_topics, producer
from headwater.capture import metrics as capture_metrics
from headwater.deploy.stack import free_port
from headwater.indexer.service import Indexer
from headwater.query import http
from tests.indexer.test_indexer import lineage_payload
from tests.query.test_http import TOKEN, Store, get, unused_port, write


def fetch(url: str, token: str | None = None) -> tuple[int, str, str]:
    """``(status, content type, body)`` of a GET."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read().decode()


def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of a ``/metrics`` page, parsed as Prometheus parses it: ``{(name, labels): value}``."""
    status, content_type, text = fetch(url)
    assert status == 200 and content_type.startswith("text/plain; version=0.0.4"), (status, content_type)
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A Parquet store; its config's graph is an address nobody listens on (a graph that is down)."""
    store = Store(tmp_path_factory.mktemp("store"), seed=3, batches=3)
    write(store.root, store.config.edges_topic, store.messages)
    return store


def serving(config, backend: str, token: str | None = TOKEN):
    return http.serve(config, "127.0.0.1", 0, backend=backend, token=token, say=lambda _: None)


def test_readyz_says_whether_the_backend_answers(store, stack_config):
    up = stack_config.with_overrides(store_dir=str(store.root))
    gone = store.config.with_overrides(store_dir=str(store.root / "not-there"))
    cases = [  # (config, backend, what does not answer)
        (store.config, "cypher", {"graph"}),
        (up, "cypher", set()),
        (store.config, "csprov", set()),
        (store.config, "auto", set()),  # the graph is down, the Parquet store answers
        (up.with_overrides(store_dir=gone.store_dir), "auto", set()),  # and the other way round
        (gone, "rq", {"store"}),
        (gone, "auto", {"graph", "store"}),
    ]
    for config, backend, unreachable in cases:
        server = serving(config, backend)
        try:
            status, body, _ = get(server, "/readyz", token=None)
            assert get(server, "/healthz", token=None)[:2] == (200, {"status": "ok"})  # liveness, whatever the stores
        finally:
            server.close()
        if not unreachable:
            assert (status, body) == (200, {"status": "ready"}), (backend, body)
            continue
        assert status == 503 and body["status"] == "unready" and set(body["unreachable"]) == unreachable, body
        if "graph" in unreachable:
            port = config.graph_uri.rsplit(":", 1)[1]
            assert f"graph store bolt://127.0.0.1:{port} (database lineage) does not answer: ServiceUnavailable" \
                in body["unreachable"]["graph"]
        if "store" in unreachable:
            assert body["unreachable"]["store"] == f"store folder {gone.store_dir} does not exist (nothing indexed " \
                                                   f"into it yet, or not mounted)"
    assert stack_config.graph_password and stack_config.graph_password not in json.dumps(body)


def test_metrics_count_requests_by_route_and_status(store):
    server = serving(store.config, "csprov")
    base = f"http://127.0.0.1:{server.port}"
    rid = store.by_kind["enrich"][0]
    try:
        before = scrape(f"{base}/metrics")  # no token: Prometheus scrapes without one
        for _ in range(3):
            assert get(server, "/v1/lineage/backward", {"rid": rid})[0] == 200
        assert get(server, "/v1/lineage/backward", {"rid": "x"})[0] == 400
        assert get(server, "/v1/lineage/forward", {"rid": rid}, token=None)[0] == 401
        assert get(server, "/v1/lineage/backward", {"rid": rid, "backend": "cypher"})[0] == 503  # the graph is down
        assert get(server, f"/v1/lineage/{rid}/scan", {"secret": TOKEN})[0] == 404
        assert get(server, "/healthz", token=None)[0] == 200
        status, content_type, text = fetch(f"{base}/metrics")
        after = scrape(f"{base}/metrics")
    finally:
        server.close()

    def grew(name: str, **labels) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    count = "headwater_query_request_seconds_count"
    assert grew(count, route="/v1/lineage/backward", status="200") == 3
    assert grew(count, route="/v1/lineage/backward", status="400") == 1
    assert grew(count, route="/v1/lineage/backward", status="503") == 1
    assert grew(count, route="/v1/lineage/forward", status="401") == 1
    assert grew(count, route="other", status="404") == 1  # the path asked for is not a label
    assert grew(count, route="/healthz", status="200") == 1
    assert grew(count, route="/metrics", status="200") == 2  # the first scrape, and the second
    assert grew("headwater_query_request_seconds_bucket", route="/v1/lineage/backward", status="200", le="+Inf") == 3
    assert grew("headwater_query_errors_total", route="/v1/lineage/backward") == 1
    assert grew("headwater_query_errors_total", route="/v1/lineage/forward") == 0
    assert value(after, "headwater_query_in_flight") == 1  # the scrape itself
    assert value(after, "process_resident_memory_bytes") > 0
    # Labels are the document's paths (the explorer's files all count as "/") or "other", whichever requests the
    # process served before this test (an explorer test's among them).
    routes = {dict(labels).get("route") for name, labels in after if name.startswith("headwater_query_")}
    assert routes <= set(server.openapi["paths"]) | {"other", None}
    assert TOKEN not in text and str(rid) not in text and "headwater_indexer_" not in text


def test_the_indexer_serves_metrics_and_its_readiness(config):
    ensure_topics(config, [config.edges_topic, config.log_topic, config.dlq_topic], 1)
    client = producer(config)
    for i in range(3):
        client.send(config.edges_topic, value=lineage_payload(8100 + i, 8200))
    client.send(config.edges_topic, value=b"not a payload")  # consumed too: to the dlq
    client.flush()
    client.close()

    said = []
    indexer = Indexer(config, say=said.append)
    server = health_http.serve("127.0.0.1", 0, indexer.unready)
    base = f"http://127.0.0.1:{server.port}"
    before = scrape(f"{base}/metrics")
    stats, ready = [], []
    try:
        assert fetch(f"{base}/healthz")[:2] == (200, "application/json")
        status, _, body = fetch(f"{base}/readyz")
        assert status == 503 and set(json.loads(body)["unreachable"]) == {"consumer"}, body  # not joined yet

        running = threading.Thread(target=lambda: stats.append(indexer.run(drain=True, idle_s=4, max_seconds=90)))
        running.start()
        while running.is_alive() and not ready:
            status, _, body = fetch(f"{base}/readyz")
            if status == 200:
                ready.append(json.loads(body))
            time.sleep(0.1)
        running.join()
        assert ready == [{"status": "ready"}], said[-10:]
        assert stats[0].caught_up and stats[0].edges == 3 and stats[0].dlq == 1
        status, _, body = fetch(f"{base}/readyz")  # stopped: out of its group
        assert status == 503 and set(json.loads(body)["unreachable"]) == {"consumer"}
        after = scrape(f"{base}/metrics")
        assert fetch(f"{base}/nowhere")[0] == 404
    finally:
        server.shutdown()
        indexer.close()
    messages = "headwater_indexer_messages_total"
    assert value(after, messages, topic=config.edges_topic) - value(before, messages, topic=config.edges_topic) == 4
    assert value(after, "headwater_indexer_lag", topic=config.edges_topic, partition="0") == 0

    down = Indexer(config.with_overrides(graph_uri=f"bolt://127.0.0.1:{unused_port()}"))
    try:
        assert set(down.unready()) == {"consumer", "graph"}
    finally:
        down.close()


def test_headwater_index_serves_them_on_the_metrics_host(config, stack):
    """The CLI's wiring, on the address the metrics_host setting names (127.0.0.2: loopback too,
    yet not the default, so the setting is seen to decide)."""
    port = free_port()
    env = {**os.environ, "HEADWATER_EDGES_TOPIC": config.edges_topic, "HEADWATER_LOG_TOPIC": config.log_topic,
           "HEADWATER_DLQ_TOPIC": config.dlq_topic, "HEADWATER_STORE_DIR": config.store_dir,
           "HEADWATER_METRICS_HOST": "127.0.0.2"}
    process = subprocess.Popen([sys.executable, "-m", "headwater.cli", "--home", str(stack.home), "index",
                                "--metrics-port", str(port), "--max-seconds", "120"],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.2:{port}"
    try:
        deadline = time.monotonic() + 60
        status = body = None
        while status != 200 and time.monotonic() < deadline and process.poll() is None:
            try:
                status, _, body = fetch(f"{base}/readyz")
            except urllib.error.URLError:  # not listening yet
                pass
            time.sleep(0.2)
        assert status == 200, body
        assert fetch(f"{base}/healthz")[0] == 200
        status, _, text = fetch(f"{base}/metrics")
        assert status == 200 and "# TYPE headwater_indexer_messages_total counter" in text
        assert "headwater_indexer_lag" in text and "headwater_capture_" not in text
        with pytest.raises(urllib.error.URLError):
            fetch(f"http://127.0.0.1:{port}/healthz")  # not on the default address
    finally:
        process.send_signal(signal.SIGTERM)  # as Kubernetes stops a pod: the indexer stops as on Ctrl-C
        out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err[-2000:]
    assert "caught_up" in json.loads(out.strip().splitlines()[-1])


def test_captures_endpoint_binds_to_the_metrics_host(monkeypatch):
    monkeypatch.setenv("HEADWATER_METRICS_HOST", "127.0.0.2")
    server = capture_metrics.serve(0)
    try:
        host, port = server.server_address[:2]
        assert host == "127.0.0.2"
        assert fetch(f"http://127.0.0.2:{port}/metrics")[0] == 200
    finally:
        server.shutdown()
        server.server_close()
