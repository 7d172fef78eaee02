"""The HTTP API (``query/http/``, ``headwater serve``) on a Parquet store written without Spark.

Its answers are checked against the Python API's and the path-enumerating oracle's
(``tests/query/test_query_backends.py``); then auth, hostile input, the request limits, the
OpenAPI document, read-only methods and the CLI's start and stop.
"""

from __future__ import annotations

import json
import os
import random
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlencode

import pyarrow as pa
import pytest
from click.testing import CliRunner

from headwater.cli import main as cli
from headwater.core.config import Config
from headwater.core.rid import FOREACH_BATCH_OP, kafka_rid, state_rid, table_rid
from headwater.indexer.shard import Shard
from headwater.query import api, http
from headwater.query import backend as backend_module
from headwater.query.address import parse_source
from headwater.query.api import LineageClient
from headwater.query.backend import Lineage, WalkingBackend
from headwater.query.errors import LineageError
from headwater.query.question import MAX_DEPTH
from headwater.query.walk import Walk
from tests.query.test_query_backends import oracle, pipeline, summary

TOKEN = secrets.token_urlsafe(24)
HEADWATER = Path(sys.executable).with_name("headwater")


def _remap(table: pa.Table, names: list[str], new: dict[int, int]) -> pa.Table:
    for name in names:
        column = [new.get(r, r) for r in table[name].to_pylist()]
        table = table.set_column(table.schema.get_field_index(name), name, pa.array(column, pa.int64()))
    return table


def addressed(tag: str, messages: list, rows: dict) -> tuple[list, dict, dict]:
    """The pipeline with its Kafka rows, static-table rows and state rows named by the rids their addresses hash to.

    Returns the messages, the rows and ``{address: rid}``.
    """
    new, addresses = {}, {}
    for nodes, edges in messages:
        for node in nodes.to_pylist():
            if node["topic"] is not None:
                address = f"kafka:{node['topic']}:{node['partition']}:{node['offset']}"
                new[node["rid"]] = kafka_rid(node["topic"], node["partition"], node["offset"])
            elif node["key"] is not None:
                address = f"table:{tag}-customers:{node['key']}"
                new[node["rid"]] = table_rid(f"{tag}-customers", node["key"])
            else:
                continue
            addresses[address] = new[node["rid"]]
        # the alerts query's state row of each batch: its foreachBatch black box
        for src, dst, query, batch in zip(*(edges[c].to_pylist() for c in ("src", "dst", "query", "batch"))):
            if rows[dst][0] == "state" and dst not in new:
                new[dst] = state_rid(query, FOREACH_BATCH_OP, batch)
                addresses[f"foreachBatch:{query}:{batch}"] = new[dst]
    messages = [(_remap(nodes, ["rid"], new), _remap(edges, ["src", "dst"], new)) for nodes, edges in messages]
    return messages, {new.get(r, r): v for r, v in rows.items()}, addresses


def write(store_dir: Path, topic: str, messages: list, first: int = 0) -> None:
    """Messages into two shards, alternately (message ``first + i`` to shard ``(first + i) % 2``)."""
    shards = [Shard(store_dir, topic, p).open() for p in range(2)]
    for i, (nodes, edges) in enumerate(messages, first):
        shard = shards[i % 2]
        shard.write(nodes, edges, shard.resume, shard.resume)


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Store:
    def __init__(self, root: Path, seed: int, batches: int):
        self.tag = f"h{seed}"
        self.root = root
        messages, rows = pipeline(seed=seed, batches=batches, tag=self.tag)
        self.messages, self.rows, self.addresses = addressed(self.tag, messages, rows)
        # graph_uri: no graph here; a question for the cypher backend finds it unavailable, and fast
        self.config = Config().with_overrides(store_dir=str(root), edges_topic=f"{self.tag}.edges",
                                              graph_uri=f"bolt://127.0.0.1:{unused_port()}")
        self.by_kind = defaultdict(list)
        for rid, (_, dataset) in self.rows.items():
            self.by_kind[dataset.split(":")[-1].split(".")[-1]].append(rid)

    def produced(self, messages: list | None = None) -> list[dict]:
        return [e for _, edges in (messages or self.messages) for e in edges.to_pylist()]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("store"), seed=5, batches=6)
    write(store.root, store.config.edges_topic, store.messages)
    return store


@pytest.fixture(scope="module")
def client(store):
    with LineageClient(store.config, backend="csprov") as found:
        yield found


@pytest.fixture(scope="module")
def logged():
    return []


@pytest.fixture(scope="module")
def server(store, logged):
    running = http.serve(store.config, "127.0.0.1", 0, backend="csprov", token=TOKEN, say=logged.append)
    yield running
    running.close()


def get(server, path: str, params=(), token: str | None = TOKEN, method: str = "GET", headers=None):
    """``(status, JSON body, headers)`` of one request."""
    query = urlencode(params) if not isinstance(params, str) else params
    url = f"http://127.0.0.1:{server.port}{path}" + (f"?{query}" if query else "")
    sent = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers={**sent, **(headers or {})}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status, body, received = response.status, response.read(), response.headers
    except urllib.error.HTTPError as error:
        status, body, received = error.code, error.read(), error.headers
    assert received["Content-Type"] == "application/json"
    return status, (json.loads(body) if body else None), received


def ask(server, direction: str, params) -> tuple[int, dict]:
    status, body, _ = get(server, f"/v1/lineage/{direction}", params)
    return status, body


def raw(server, data: bytes, timeout: float = 10) -> bytes:
    """What the server sends back for these bytes, until it closes the connection."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as s:
        s.sendall(data)
        received = b""
        while chunk := s.recv(65536):
            received += chunk
    return received


def as_dicts(answer) -> list[dict]:
    return [x.to_dict() for x in answer]


def body_of(answer, cut: int | None = None) -> dict:
    """The HTTP body of a Python API answer, its records cut to ``cut``."""
    summary = answer.summary()
    return {"of": answer.of, "answer": as_dicts(answer)[:cut], "truncated": cut is not None and len(answer) > cut,
            "complete": summary["complete"], "gaps": summary["gaps"], "unexplained": summary["unexplained"],
            "read_by": summary["read_by"]}


def test_answers_are_the_python_apis_and_the_oracles(store, client, server):
    rng = random.Random(5)
    produced = store.produced()
    tag = store.tag
    answered = 0
    for backend in ("csprov", "rq"):
        for _ in range(25):
            start = rng.choice(store.by_kind[rng.choice(["alerts", "totals", "enrich", "state"])])
            to = rng.choice(["source", "state", f"{tag}:orders", f"{tag}.enrich"])
            depth = rng.choice([1, 2, 3, 16])
            status, body = ask(server, "backward", {"rid": start, "to": to, "depth": depth, "backend": backend})
            assert status == 200, body
            assert body["of"] == start and body["truncated"] is False
            assert body["answer"] == as_dicts(client.backward(start, to=to, depth=depth)), (backend, start, to, depth)
            got = [Lineage(**x) for x in body["answer"]]
            assert summary(got) == oracle(produced, store.rows, start, to, depth, True)
            answered += bool(body["answer"])

            source = rng.choice(store.by_kind[rng.choice(["orders", "customers", "enrich"])])
            to = rng.choice(["output", f"{tag}.alerts", "state"])
            status, body = ask(server, "forward", {"rid": source, "to": to, "depth": depth, "backend": backend})
            assert status == 200, body
            assert body["answer"] == as_dicts(client.forward(source, to=to, depth=depth)), (backend, source, to, depth)
            got = [Lineage(**x) for x in body["answer"]]
            assert summary(got) == oracle(produced, store.rows, source, to, depth, False)
            answered += bool(body["answer"])
    assert answered > 50  # most questions had an answer


def test_rows_asked_by_address(store, client, server):
    rng = random.Random(6)
    addresses = sorted(store.addresses)
    kinds = {address.split(":")[0] for address in addresses}
    assert kinds == {"kafka", "table", "foreachBatch"}
    asked = 0
    for address in rng.sample(addresses, 20) + [a for a in addresses if a.startswith(("table:", "foreachBatch:"))][:6]:
        rid = store.addresses[address]
        assert parse_source(address) == rid
        status, body = ask(server, "forward", {"source": address})
        assert status == 200, body
        assert body["of"] == rid
        assert body["answer"] == as_dicts(client.forward(rid))
        assert summary([Lineage(**x) for x in body["answer"]]) == oracle(store.produced(), store.rows, rid,
                                                                          "output", 16, False)
        asked += bool(body["answer"])
    assert asked == 26
    # an answer's Kafka rows carry their coordinates, which hash to their rids
    status, body = ask(server, "backward", {"rid": store.by_kind["alerts"][0], "to": f"{store.tag}:orders"})
    assert status == 200 and body["answer"]
    for found in body["answer"]:
        assert kafka_rid(found["topic"], found["partition"], found["offset"]) == found["rid"]


def test_payload_is_the_python_apis(store, client, server):
    """Static-table rows' payloads (no file location recorded: an error record each, no network)."""
    start = store.by_kind["alerts"][0]
    status, body = ask(server, "backward", {"rid": start, "to": f"{store.tag}:customers", "payload": "true"})
    assert status == 200, body
    expected = as_dicts(client.backward(start, to=f"{store.tag}:customers", payload=True))
    assert body["answer"] == expected and expected and all("error" in x["payload"] for x in expected)
    status, body = ask(server, "backward", {"rid": start, "to": f"{store.tag}:customers", "payload": "false"})
    assert body["answer"] == as_dicts(client.backward(start, to=f"{store.tag}:customers"))
    assert all("payload" not in x for x in body["answer"])


def test_token(store, server, logged):
    start = store.by_kind["alerts"][0]
    for token, headers in [(None, {}), ("wrong" * 5, {}), (TOKEN[:-1], {}), (None, {"Authorization": TOKEN}),
                           (None, {"Authorization": f"Basic {TOKEN}"}), (TOKEN + "x", {})]:
        for path in ("/v1/lineage/backward", "/openapi.json", "/v1/nowhere"):
            status, body, headers_back = get(server, path, {"rid": start}, token=token, headers=headers)
            assert status == 401 and headers_back["WWW-Authenticate"] == "Bearer", (token, headers, path)
            assert "error" in body and "answer" not in body
    status, body, _ = get(server, "/v1/lineage/backward", {"rid": start})
    assert status == 200 and body["of"] == start
    status, body, _ = get(server, "/v1/lineage/backward", {"rid": start}, token=None,
                          headers={"Authorization": f"bearer  {TOKEN}"})
    assert status == 200
    assert get(server, "/healthz", token=None)[:2] == (200, {"status": "ok"})
    assert get(server, "/healthz", token="wrong" * 5)[:2] == (200, {"status": "ok"})
    log = "\n".join(logged)
    assert "GET /v1/lineage/backward?rid 401" in log and "GET /v1/lineage/backward?rid 200" in log
    assert "GET /healthz 200" in log
    assert TOKEN not in log and TOKEN[:12] not in log


def test_a_server_without_a_token_binds_to_loopback_only(store):
    with pytest.raises(http.ServeError, match="without a token"):
        http.serve(store.config, "0.0.0.0", 0, backend="csprov")
    with pytest.raises(http.ServeError, match="at least 16"):
        http.serve(store.config, "127.0.0.1", 0, backend="csprov", token="short")
    with pytest.raises(http.ServeError, match="at least 16"):
        http.serve(store.config, "127.0.0.1", 0, backend="csprov", token="")
    with pytest.raises(http.ServeError, match="unknown backend"):
        http.serve(store.config, "127.0.0.1", 0, backend="sql")
    running = http.serve(store.config, "localhost", 0, backend="csprov", say=lambda line: None)
    try:
        start = store.by_kind["totals"][0]
        status, body, _ = get(running, "/v1/lineage/backward", {"rid": start}, token=None)
        assert status == 200 and body["of"] == start
        assert get(running, "/openapi.json", token=None)[0] == 200
    finally:
        running.close()


HOSTILE = [
    ({"rid": "1 OR 1=1"}, 400, "signed 64-bit"),
    ({"rid": "1; DROP TABLE edges; --"}, 400, "signed 64-bit"),
    ({"rid": "1' OR '1'='1"}, 400, "signed 64-bit"),
    ({"rid": str(2 ** 70)}, 400, "signed 64-bit"),
    ({"rid": str(-(2 ** 63) - 1)}, 400, "signed 64-bit"),
    ({"rid": "0x10"}, 400, "signed 64-bit"),
    ({"rid": "1_000"}, 400, "signed 64-bit"),
    ({"rid": "١٢"}, 400, "signed 64-bit"),
    ({"rid": str(2 ** 63 - 1)}, 404, "not in the lineage store"),
    ({"source": "kafka:x' OR 1=1:0:0"}, 404, "not in the lineage store"),
    ({"source": "kafka:a}) DETACH DELETE n //:0:1"}, 404, "not in the lineage store"),
    ({"source": "kafka:orders:0:1 OR 1=1"}, 400, "expected kafka:TOPIC"),
    ({"source": f"kafka:orders:{2 ** 31}:1"}, 400, "expected kafka:TOPIC"),
    ({"source": f"kafka:orders:0:{2 ** 63}"}, 400, "expected kafka:TOPIC"),
    ({"source": "rate:--5"}, 400, "expected kafka:TOPIC"),
    ({"source": "../../etc/passwd"}, 400, "expected kafka:TOPIC"),
    ({"backend": "../../etc"}, 400, "backend is one of"),
    ({"backend": "csprov' OR '1'='1"}, 400, "backend is one of"),
    ({"depth": str(10 ** 9)}, 400, "depth must be"),
    ({"depth": "-1"}, 400, "depth must be"),
    ({"depth": "0"}, 400, "depth must be"),
    ({"depth": str(MAX_DEPTH + 1)}, 400, "depth must be"),
    ({"depth": "1; MATCH (n) DETACH DELETE n"}, 400, "depth must be"),
    ({"depth": "1e3"}, 400, "depth must be"),
    ({"payload": "yes"}, 400, "payload is true or false"),
    ({"payload": "true' --"}, 400, "payload is true or false"),
    ({"to": ""}, 400, "parameter to is empty"),
    ({"since": "yesterday"}, 400, "ISO 8601"),
    ({"until": "2026-13-40T99:00:00"}, 400, "ISO 8601"),
    ({"callback": "x"}, 400, "unknown parameter"),
]


def test_hostile_input(store, client, server):
    start = store.by_kind["alerts"][1]
    base = {"rid": start}
    for params, expected, says in HOSTILE:
        query = {**base, **params} if "rid" in params or "source" not in params else params
        status, body = ask(server, "backward", query)
        assert (status, says in body.get("error", "")) == (expected, True), (params, status, body)
        assert set(body) == {"error"} and "Traceback" not in body["error"]
    for to in ("x' OR '1'='1", "a}) DETACH DELETE n //", "a\r\nX-Injected: 1", "source' --", "%00"):
        status, body, headers = get(server, "/v1/lineage/backward", {"rid": start, "to": to})
        assert (status, body) == (200, body_of(client.backward(start, to=to))) and not body["answer"], to
        assert "X-Injected" not in headers
    malformed = [
        f"rid={start}&rid={start}",  # repeated
        f"rid={start}&depth=2&depth=3",
        f"rid={start}&source=rate:1",  # both
        "depth=3",  # neither
        "rid",  # no value
        f"rid={start}&&depth=2",
        f"rid={start}&to=%ff",  # not UTF-8
        "&".join(f"p{i}=1" for i in range(40)),  # too many
        f"rid={start}&rid",
    ]
    for query in malformed:
        status, body = ask(server, "forward", query)
        assert status == 400 and set(body) == {"error"}, (query, status, body)
    assert ask(server, "backward", {"rid": start, "to": "x" * 10_000})[0] == 414
    huge = raw(server, b"GET /v1/lineage/backward?rid=" + b"1" * 70_000 + b" HTTP/1.1\r\n\r\n")
    assert huge.startswith(b"HTTP/1.0 414") and huge.endswith(b"}") and b"error" in huge
    for line in (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 nonsense", b"GET / HTTP/9", b"A B C D",
                 b"POST /v1/lineage/backward"):
        garbage = raw(server, line + b"\r\n\r\n")
        assert garbage.startswith(b"HTTP/1.0 400") and b'{"error": "Bad ' in garbage, (line, garbage)
    for path in ("/v1/lineage/sideways", "/v1/lineage/backward/", "/v1/../etc/passwd", "/v1", "/index.html",
                 "/explorer/", "/explorer/../http.py", "/explorer/app.js/", "/explorer/nothing.js"):
        status, body, _ = get(server, path, {"rid": start})
        assert status == 404 and set(body) == {"error"}, path
    # the server still answers, and right
    status, body = ask(server, "backward", {"rid": start})
    assert status == 200 and body["answer"] == as_dicts(client.backward(start)) and body["answer"]


def test_the_store_unavailable_is_503_and_the_server_goes_on(store, client, server, logged):
    start = store.by_kind["alerts"][0]
    status, body = ask(server, "backward", {"rid": start, "backend": "cypher"})
    assert status == 503 and body["error"].startswith("unavailable: ServiceUnavailable")
    assert "Traceback" not in body["error"]
    status, body = ask(server, "backward", {"rid": start})
    assert status == 200 and body["answer"] == as_dicts(client.backward(start))
    # auto: the graph does not answer, so the Parquet store does
    status, body = ask(server, "backward", {"rid": start, "backend": "auto"})
    assert status == 200 and body == body_of(client.backward(start)) and body["answer"]
    status, body = ask(server, "backward", {"rid": 12345, "backend": "auto"})
    assert status == 404 and "graph store did not answer" in body["error"] \
        and "not in the lineage store" in body["error"]


def test_max_results_cuts_answers(store, client):
    running = http.serve(store.config, "127.0.0.1", 0, backend="rq", token=TOKEN, max_results=3,
                         say=lambda line: None)
    try:
        long = next(r for r in store.by_kind["customers"] if len(client.forward(r)) > 3)
        status, body = ask(running, "forward", {"rid": long})
        full = as_dicts(client.forward(long))
        assert status == 200 and body == body_of(client.forward(long), cut=3) and body["answer"] == full[:3]
        assert body["truncated"]
        short = next(r for r in store.by_kind["alerts"] if 0 < len(client.backward(r, to="state")) <= 3)
        status, body = ask(running, "backward", {"rid": short, "to": "state"})
        assert body == body_of(client.backward(short, to="state")) and not body["truncated"]
    finally:
        running.close()


class FakeBlockingBackend(WalkingBackend):
    """A fake backend for the concurrency limit only: its questions wait until the test lets them go."""

    entered = threading.Event()
    release = threading.Event()

    def __init__(self, config):
        pass

    def question_from(self, rid, backward) -> None:
        self.entered.set()
        assert self.release.wait(30)

    def walk(self, starts, depth, backward, cols=None, paths=0, max_reach=None, deadline=None, outside=None,
             question=None):
        return Walk({}, set(), set()), {}


def test_max_concurrent_queues_briefly_then_answers_503(store, monkeypatch):
    """Beyond max_concurrent, a query waits for a slot (max_queued of them, queue_wait_s each); past either, 503."""
    monkeypatch.setitem(backend_module.BACKENDS, "fake-blocking", FakeBlockingBackend)
    FakeBlockingBackend.entered.clear()
    FakeBlockingBackend.release.clear()
    running = http.serve(store.config, "127.0.0.1", 0, backend="csprov", token=TOKEN, max_concurrent=1,
                         max_queued=1, queue_wait_s=1.0, say=lambda line: None)
    answers = {}

    def ask_in_thread(name: str, params: dict) -> threading.Thread:
        def one() -> None:
            answer = get(running, "/v1/lineage/backward", params)
            answers[name] = (time.monotonic(), answer)

        thread = threading.Thread(target=one)
        thread.start()
        return thread

    alert = store.by_kind["alerts"][0]
    try:
        blocking = ask_in_thread("blocking", {"rid": 7, "backend": "fake-blocking"})
        assert FakeBlockingBackend.entered.wait(30)
        began = time.monotonic()
        queued = ask_in_thread("queued", {"rid": alert})  # waits for the slot, and its wait runs out
        time.sleep(0.3)
        status, body, headers = get(running, "/v1/lineage/forward", {"rid": 7})  # the queue is full: at once
        assert status == 503 and headers["Retry-After"] == "1" and "retry later" in body["error"]
        assert time.monotonic() - began < 0.9
        assert get(running, "/healthz", token=None)[0] == 200  # not a query: not limited
        queued.join(30)
        ended, (status, body, headers) = answers["queued"]
        assert status == 503 and headers["Retry-After"] == "1" and 0.9 < ended - began < 5
        # a query that waits while the slot comes free is answered
        queued = ask_in_thread("queued", {"rid": alert})
        time.sleep(0.3)
        FakeBlockingBackend.release.set()
        blocking.join(30)
        queued.join(30)
        assert answers["blocking"][1][:2] == (200, {"of": 7, "answer": [], "truncated": False, "complete": True,
                                                    "gaps": [], "unexplained": [], "read_by": []})
        status, body, _ = answers["queued"][1]
        assert status == 200 and body["answer"]
    finally:
        FakeBlockingBackend.release.set()
        running.close()


def test_slots_serve_waiting_queries_first_come_first_served():
    slots = http.Slots(running=1, queued=3, wait_s=10)
    assert slots.enter()
    order = []

    def wait(name: str) -> None:
        assert slots.enter()
        order.append(name)
        slots.leave()

    threads = []
    for name in "abc":
        threads.append(threading.Thread(target=wait, args=(name,)))
        threads[-1].start()
        time.sleep(0.1)  # in this order
    assert not slots.enter(wait_s=0)  # three wait: the queue is full
    slots.leave()
    for thread in threads:
        thread.join(10)
    assert order == ["a", "b", "c"]
    assert slots.enter(wait_s=0)  # every slot came back
    slots.leave()
    slots.close(1.0)
    assert not slots.enter()  # closed: refused


def test_a_slow_client_is_dropped(store):
    running = http.serve(store.config, "127.0.0.1", 0, backend="csprov", token=TOKEN, socket_timeout_s=0.5,
                         say=lambda line: None)
    try:
        began = time.monotonic()
        assert raw(running, b"GET /healthz HTTP/1.1\r\nHost: x\r\n") == b""  # the headers never end
        assert time.monotonic() - began < 5
        assert get(running, "/healthz", token=None)[:2] == (200, {"status": "ok"})
    finally:
        running.close()


def test_openapi_document(store, server):
    status, document, _ = get(server, "/openapi.json")
    assert status == 200
    assert document["openapi"].startswith("3.0.") and document["info"]["title"] and document["info"]["version"]
    assert document["security"] == [{"bearer": []}]
    assert document["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
    schemas = document["components"]["schemas"]
    assert set(schemas["Lineage"]["properties"]) == set(http.lineage_fields())
    assert set(Lineage(of=1, rid=2, kind="source", dataset=None).to_dict()) <= set(http.lineage_fields())
    assert set(document["paths"]) == {r.path for r in http.ROUTES} | {"/", "/openapi.json", "/healthz", "/readyz",
                                                                      "/metrics"}
    for probe in ("/", "/healthz", "/readyz", "/metrics"):  # without the token (tests/query/test_health.py)
        assert document["paths"][probe]["get"]["security"] == []

    def refs(node):
        if isinstance(node, dict):
            yield from ([node["$ref"]] if "$ref" in node else [])
            for value in node.values():
                yield from refs(value)
        elif isinstance(node, list):
            for value in node:
                yield from refs(value)

    for ref in refs(document):
        assert ref.startswith("#/components/schemas/") and ref.rsplit("/", 1)[1] in schemas, ref
    for route in http.ROUTES:
        operation = document["paths"][route.path]["get"]
        params = {p["name"]: p for p in operation["parameters"]}
        assert {"200", "400", "401", "404", "503"} <= set(operation["responses"])
        if not route.row:
            assert list(params) == [p.name for p in route.options]
            assert [n for n, p in params.items() if p["required"]] == list(route.required)
            assert all("default" in p["schema"] for p in params.values() if not p["required"])
            assert operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith(route.answer)
            continue
        assert list(params) == [p.name for p in http.ROW + route.options + (http.BACKEND,)]
        assert all(p["in"] == "query" and "type" in p["schema"] for p in params.values())
        assert params["backend"]["schema"]["enum"] == api.choices()
        assert params["backend"]["schema"]["default"] == "csprov"
        assert params["depth"]["schema"]["default"] == 16 and params["depth"]["schema"]["maximum"] == MAX_DEPTH
        assert params["to"]["schema"]["default"] == {"backward": "source", "forward": "output",
                                                     "co_contributors": "source",
                                                     "co_dependents": "output"}[route.method]
        assert {"200", "400", "401", "404", "503"} <= set(operation["responses"])
    # every path answers, as the document says
    start = store.by_kind["enrich"][0]
    lineage = schemas["Lineage"]
    rows = {r.path for r in http.ROUTES if r.row}
    for path in document["paths"]:
        if path in ("/metrics", "/"):  # not JSON: tests/query/test_health.py, test_the_explorer_is_served_to_anyone
            continue
        if path.startswith("/v1/") and path not in rows:  # this store has neither plans nor a batch log
            route = next(r for r in http.ROUTES if r.path == path)
            status, body, _ = get(server, path)
            if route.required:
                assert status == 400 and set(body) == {"error"} and "give" in body["error"], path
            else:
                assert status == 200 and set(body) == set(schemas[route.answer]["required"]), path
            continue
        status, body, _ = get(server, path, {"rid": start} if path.startswith("/v1/") else ())
        assert status == 200, path
        if path.startswith("/v1/"):
            assert set(body) == set(schemas["Answer"]["required"]) and body["answer"], path
            for row in body["answer"]:
                assert set(lineage["required"]) <= set(row) <= set(lineage["properties"])
    assert get(server, "/healthz", token=None)[1] == {"status": "ok"}


def test_read_only(store, server):
    for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "PROPFIND", "HEAD"):
        for path in ("/v1/lineage/backward", "/healthz", "/openapi.json", "/nowhere", "/", "/explorer/app.js",
                     "/v1/queries", "/v1/where"):
            status, body, headers = get(server, path, {"rid": 1}, method=method)
            assert status == 405 and headers["Allow"] == "GET", (method, path)
            assert body is None if method == "HEAD" else "read-only" in body["error"]


def test_the_server_sees_the_store_grow(tmp_path):
    grown = Store(tmp_path, seed=8, batches=3)
    topic = grown.config.edges_topic
    write(tmp_path, topic, grown.messages[:6])
    late = grown.messages[6][1]["dst"].to_pylist()[0]  # an output of the third batch's enrich query
    running = http.serve(grown.config, "127.0.0.1", 0, backend="csprov", token=TOKEN, say=lambda line: None)
    try:
        for backend in ("csprov", "rq"):
            status, body = ask(running, "backward", {"rid": late, "backend": backend})
            assert status == 404 and "not in the lineage store" in body["error"]
        write(tmp_path, topic, grown.messages[6:], first=6)
        with LineageClient(grown.config, backend="csprov") as fresh:
            expected = as_dicts(fresh.backward(late))
        assert expected
        for backend in ("csprov", "rq"):
            status, body = ask(running, "backward", {"rid": late, "backend": backend})
            assert status == 200 and body["answer"] == expected, backend
    finally:
        running.close()


def test_the_graph_is_read_once_as_soon_as_it_answers(stack_config, tmp_path):
    """A server whose backend may be the graph's reads the whole graph once at start (``graph.warm_up``), in a
    thread of its own: it answers meanwhile."""
    said = []
    running = http.serve(stack_config.with_overrides(store_dir=str(tmp_path)), "127.0.0.1", 0, backend="cypher",
                         say=said.append)
    try:
        assert get(running, "/healthz", token=None)[0] == 200
        deadline = time.monotonic() + 60
        while not any(line.startswith("graph: warm") for line in said) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        running.close()
    assert [line for line in said if line.startswith("graph:")][-1].startswith("graph: warmed up in "), said


def test_a_server_started_before_its_graph_closes_at_once(store):
    """The warm-up waits for a graph that does not answer yet, and is given up when the server closes."""
    said = []
    running = http.serve(store.config, "127.0.0.1", 0, backend="auto", say=said.append)
    assert running.warm_graph
    time.sleep(0.5)  # the warm-up's first probe refused (no graph on store.config's port)
    started = time.monotonic()
    running.close()
    assert time.monotonic() - started < 3
    assert not [line for line in said if line.startswith("graph:")]
    parquet_only = http.serve(store.config, "127.0.0.1", 0, backend="csprov", say=said.append)
    parquet_only.close()
    assert not parquet_only.warm_graph


def test_address_errors_are_lineage_errors():
    for bad in ("kafka:t:99999999999:0", f"kafka:t:0:{2 ** 64}", "kafka:t:²:0", "rate:--5", "file:x:-1",
                "foreachBatch:q:-1", "table:t", "nothing"):
        with pytest.raises(LineageError, match="expected kafka:TOPIC"):
            parse_source(bad)
    assert parse_source("rate:-5") != parse_source("rate:5")


def test_cli_lineage_by_address(store, client, tmp_path):
    env = {"HEADWATER_STORE_DIR": str(store.root), "HEADWATER_EDGES_TOPIC": store.config.edges_topic}
    address = sorted(a for a in store.addresses if a.startswith("kafka:"))[0]
    result = CliRunner().invoke(cli, ["--home", str(tmp_path), "lineage", "forward", "--source", address,
                                      "--backend", "csprov"], env=env)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert rows == as_dicts(client.forward(store.addresses[address])) and rows
    result = CliRunner().invoke(cli, ["--home", str(tmp_path), "lineage", "forward", "--source", "kafka:t:x:1",
                                      "--backend", "csprov"], env=env)
    assert result.exit_code == 2
    assert json.loads(result.stderr) == {"error": "'kafka:t:x:1': expected kafka:TOPIC:PARTITION:OFFSET, "
                                                  "table:NAME:KEY, file:PATH:POSITION, rate:VALUE or "
                                                  "foreachBatch:QUERY:BATCH"}


def test_headwater_serve(store, client, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    env = {k: v for k, v in os.environ.items() if k != http.TOKEN_ENV}
    env.update(HEADWATER_STORE_DIR=str(store.root), HEADWATER_EDGES_TOPIC=store.config.edges_topic)
    process = subprocess.Popen([str(HEADWATER), "--home", str(tmp_path), "serve", "--port", "0", "--backend",
                                "csprov", "--token-file", str(token_file), "--max-results", "5"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    try:
        ready = json.loads(process.stdout.readline())
        assert ready["serving"].startswith("http://127.0.0.1:")
        assert ready["openapi"] == ready["serving"] + "/openapi.json"
        port = int(ready["serving"].rsplit(":", 1)[1])

        running = SimpleNamespace(port=port)
        start = store.by_kind["customers"][0]
        status, body = ask(running, "forward", {"rid": start})
        full = as_dicts(client.forward(start))
        assert status == 200 and body == body_of(client.forward(start), cut=5) and body["answer"] == full[:5]
        assert get(running, "/openapi.json", token=None)[0] == 401
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        log = process.stderr.read()
        assert "GET /v1/lineage/forward?rid 200" in log and "GET /openapi.json 401" in log
        assert TOKEN not in log and TOKEN not in process.stdout.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_headwater_serve_refuses_an_open_non_loopback_host(store, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != http.TOKEN_ENV}
    done = subprocess.run([str(HEADWATER), "--home", str(tmp_path), "serve", "--host", "0.0.0.0", "--port", "0"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2 and "without a token" in json.loads(done.stderr)["error"]


def test_concurrent_questions_get_their_own_answers(store, client):
    rng = random.Random(9)
    questions = [(rng.choice(["backward", "forward"]), rng.choice(list(store.rows)), rng.choice(["csprov", "rq"]))
                 for _ in range(36)]
    expected = {}
    for direction, rid, _ in questions:
        try:
            expected[direction, rid] = (200, as_dicts(getattr(client, direction)(rid)))
        except LineageError:
            expected[direction, rid] = (404, None)
    assert sum(status == 200 and bool(answer) for status, answer in expected.values()) > 20
    running = http.serve(store.config, "127.0.0.1", 0, backend="csprov", token=TOKEN, max_concurrent=len(questions),
                         say=lambda line: None)
    got = {}
    try:
        def one(i: int) -> None:
            direction, rid, backend = questions[i]
            status, body = ask(running, direction, {"rid": rid, "backend": backend})
            got[i] = (status, body["answer"] if status == 200 else None)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(questions))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        running.close()
    assert {i: got[i] for i in range(len(questions))} == {i: expected[d, r] for i, (d, r, _) in enumerate(questions)}


def fetch(server, path: str, token: str | None = None) -> tuple[int, bytes, dict]:
    """``(status, body, headers)`` of a GET, whatever its content type."""
    sent = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}", headers=sent)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read(), response.headers
    except urllib.error.HTTPError as error:
        return error.code, error.read(), error.headers


def test_the_explorer_is_served_to_anyone(server, logged):
    """Its files hold no lineage, and a browser opening the page cannot send a token; the data stays behind it."""
    for path, kind in [("/", "text/html"), ("/explorer/app.js", "text/javascript"),
                       ("/explorer/graph.js", "text/javascript"), ("/explorer/style.css", "text/css"),
                       ("/explorer/icon.svg", "image/svg+xml")]:
        for token in (None, "wrong" * 5, TOKEN):
            status, body, headers = fetch(server, path, token)
            assert status == 200 and headers["Content-Type"].startswith(kind), (path, token)
            assert body == (http.EXPLORER_DIR / http.EXPLORER_FILES[path][0]).read_bytes()
            assert "script-src 'self'" in headers["Content-Security-Policy"]
            assert "frame-ancestors 'none'" in headers["Content-Security-Policy"]
            assert headers["X-Frame-Options"] == "DENY" and headers["Referrer-Policy"] == "no-referrer"
    # nothing fetched from elsewhere: every script, style and image is the server's own (the CSP says so too)
    for name in ("index.html", "app.js", "graph.js", "style.css", "icon.svg"):
        text = (http.EXPLORER_DIR / name).read_text()
        assert set(re.findall(r"\w+://[^'\"\s)]*", text)) <= {"http://www.w3.org/2000/svg"}, name
        assert "import(" not in text and "@import" not in text, name
        assert "innerHTML" not in text and "eval(" not in text, name  # data shown as text, never as markup
    # the lineage is not: without the token, 401
    for path in ("/v1/queries", "/v1/query?name=x", "/v1/batch?query=x&batch=0", "/v1/where?dataset=x&where=y"):
        status, body, _ = fetch(server, path, "wrong" * 5)
        assert status == 401 and json.loads(body) == {"error": "give the server's token: Authorization: Bearer <token>"}
    assert "GET / 200" in "\n".join(logged)


EXPLORER_HOSTILE = [
    ("/v1/queries", {"x": "1"}, 400, "unknown parameter"),
    ("/v1/queries", {"rid": "1"}, 400, "unknown parameter"),
    ("/v1/query", {}, 400, "give name"),
    ("/v1/query", {"name": ""}, 400, "is empty"),
    ("/v1/query", "name=a&name=b", 400, "more than once"),
    ("/v1/query", {"name": "a\x00b"}, 400, "printable"),
    ("/v1/query", {"name": "q\r\nX-Injected: 1"}, 400, "printable"),
    ("/v1/query", {"name": "q" * 257}, 400, "at most 256"),
    ("/v1/query", {"name": "x' OR 1=1 --"}, 404, "no query"),
    ("/v1/query", {"name": "../../etc/passwd"}, 404, "no query"),
    ("/v1/query", {"name": "q", "limit": "0"}, 400, "limit is from 1"),
    ("/v1/query", {"name": "q", "limit": "10001"}, 400, "limit is from 1"),
    ("/v1/query", {"name": "q", "limit": "-1"}, 400, "limit is from 1"),
    ("/v1/query", {"name": "q", "limit": "1e3"}, 400, "limit is from 1"),
    ("/v1/query", {"name": "q", "backend": "csprov"}, 400, "unknown parameter"),
    ("/v1/batch", {"query": "q"}, 400, "give batch"),
    ("/v1/batch", {"batch": "0"}, 400, "give query"),
    ("/v1/batch", {"query": "q", "batch": "-1"}, 400, "non-negative 64-bit"),
    ("/v1/batch", {"query": "q", "batch": str(2 ** 63)}, 400, "non-negative 64-bit"),
    ("/v1/batch", {"query": "q", "batch": "0x1"}, 400, "non-negative 64-bit"),
    ("/v1/batch", {"query": "q", "batch": "1; DROP"}, 400, "non-negative 64-bit"),
    ("/v1/batch", {"query": "q", "batch": "0"}, 404, "not in the batch log"),
    ("/v1/batch", {"query": "q", "batch": "0", "limit": "99999"}, 400, "limit is from 1"),
    ("/v1/where", {}, 400, "give dataset and where"),
    ("/v1/where", {"dataset": "parquet:/etc", "where": "1 = 1"}, 400, "not the sink of a traced query"),
    ("/v1/where", {"dataset": "parquet:/etc", "where": "x = 1", "limit": "1001"}, 400, "limit is from 1"),
    ("/v1/where", {"dataset": "../../etc/passwd", "where": "a = 1"}, 400, "give a sink as lineage names it"),
    ("/v1/where", {"dataset": "table:x; DROP TABLE y", "where": "a = 1"}, 400, "a table is named"),
    ("/v1/where", {"dataset": "parquet:/x\x00", "where": "a = 1"}, 400, "dataset is a sink"),
    ("/v1/where", {"dataset": "parquet:/x", "where": "reflect('java.lang.Runtime', 'exec', 'id')"}, 400,
     "may not call"),
    ("/v1/where", {"dataset": "parquet:/x", "where": "a IN (SELECT b FROM t)"}, 400, ""),
    ("/v1/where", {"dataset": "parquet:/x", "where": "a = 1; DROP TABLE t"}, 400, ""),
    ("/v1/where", {"dataset": "parquet:/x", "where": "a ="}, 400, "position"),
    ("/v1/where", {"dataset": "parquet:/x", "where": "x" * 5000}, 400, ""),
]


def test_explorer_routes_refuse_hostile_input(store, server):
    for path, params, expected, says in EXPLORER_HOSTILE:
        status, body, headers = get(server, path, params)
        assert (status, says in body.get("error", "")) == (expected, True), (path, params, status, body)
        assert set(body) == {"error"} and "Traceback" not in body["error"], (path, params)
        assert "X-Injected" not in headers
    status, body, _ = get(server, "/v1/queries")
    assert (status, body) == (200, {"queries": [], "budget": store.config.overhead_budget})
    # the server still answers, and right
    start = store.by_kind["alerts"][0]
    assert get(server, "/v1/lineage/backward", {"rid": start})[0] == 200
