"""HTTP API under load: ``headwater serve`` with its default settings, asked by 8 clients at once, then by many.

On the demo's stack (a fresh one on free ports: ``headwater stack up``, ``headwater demo``,
the store in its home; stopped at the end; or ``--home`` of one already there), the server
runs as ``headwater serve`` in a process of its own, with a token and nothing else set
(``--max-concurrent`` ``http.MAX_CONCURRENT``, a queue of ``http.MAX_QUEUED`` for up to
``http.QUEUE_WAIT_S``). The clients are threads of another process of their own.

Each client asks, one after another for ``--seconds``, questions drawn at random from
the demo's: backward from a sink row (``rid``, its ``_hw_rid``), forward from a Kafka
record (``source=kafka:TOPIC:PARTITION:OFFSET``), the explorer's ``/v1/queries``. Each
request is a new connection (the server speaks HTTP/1.0); its time runs from connecting
to the last byte of the answer. Every question is asked once alone first, and must be
answered 200; then the light load runs ``WARMUP_S`` seconds, not counted (``warmup`` in the line).

One JSON line: for ``--clients`` (8) and for ``--heavy`` (64) clients, ``p50_ms``,
``p99_ms``, ``requests``, ``errors`` (anything but 200: a 503 included), ``statuses``;
under the heavy load, 503s are expected (the limit still limits) and each carries
Retry-After; ``load_average_1m``, how busy the machine was.

    .venv/bin/python bench/http_load.py [--seconds 10] [--clients 8] [--heavy 64] [--home DIR]
"""

from __future__ import annotations

import argparse
import glob
import http.client
import json
import multiprocessing
import os
import random
import re
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator
from urllib.parse import urlencode

HEADWATER = Path(sys.executable).with_name("headwater")
# The light load once, not counted, before the counted loads: a graph server fresh from the demo compiles its
# plans and JIT-compiles its hot paths over the first few thousand questions (the first seconds' p99 ran up to
# twice the steady one on Neo4j 5), as a long-running service has done long before anyone measures it.
WARMUP_S = 4.0


def _cli(home: Path, env: dict, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(HEADWATER), "--home", str(home), *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def demo_env(home: Path) -> dict:
    """The environment of every headwater process on the demo's stack: its store in ``home``, no token from
    the caller's environment."""
    env = {k: v for k, v in os.environ.items() if k != "HEADWATER_HTTP_TOKEN"}
    env["HEADWATER_HOME"] = str(home)  # the store (store_dir "") is <HEADWATER_HOME>/store
    return env


@dataclass(frozen=True)
class DemoRun:
    """``headwater demo`` run on a stack: what it printed, and how long it took (the stack's start left out)."""

    stdout: str
    seconds: float


@contextmanager
def demo_stack(home: Path) -> Iterator[DemoRun]:
    """A stack on free ports in ``home`` with the demo run on it. Stopped at the end."""
    from headwater.deploy.stack import free_port

    env = demo_env(home)
    up = _cli(home, env, "stack", "up", "--broker-port", str(free_port()), "--bolt-port", str(free_port()),
              "--http-port", str(free_port()), "--query-port", str(free_port()))
    if up.returncode != 0:  # the parts that did start are stopped: the state names them
        _cli(home, env, "stack", "down", timeout=120)
        raise RuntimeError(f"headwater stack up failed: {up.stderr[-2000:]}")
    try:
        started = time.monotonic()
        demo = _cli(home, env, "demo")
        seconds = time.monotonic() - started
        if demo.returncode != 0:
            raise RuntimeError(f"headwater demo failed: {demo.stdout[-2000:]}{demo.stderr[-2000:]}")
        yield DemoRun(demo.stdout, seconds)
    finally:
        _cli(home, env, "stack", "down", timeout=120)


@contextmanager
def serving(home: Path, token: str, *options: str):
    """``headwater serve`` on the stack in ``home`` (a free port, the token, ``options``); yields its port.
    Stopped by its pid at the end."""
    token_file = home / "http-token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    process = subprocess.Popen([str(HEADWATER), "--home", str(home), "serve", "--port", "0", "--token-file",
                                str(token_file), *options], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               text=True, env=demo_env(home))
    try:
        line = process.stdout.readline()
        if not line:
            raise RuntimeError(f"headwater serve did not start (exit {process.wait(30)})")
        yield int(json.loads(line)["serving"].rsplit(":", 1)[1])
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def ask(port: int, token: str, path: str, params: dict) -> tuple[int, float, dict]:
    """``(status, seconds, headers)`` of one GET on a new connection."""
    began = time.monotonic()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", f"{path}?{urlencode(params)}" if params else path,
                           headers={"Authorization": f"Bearer {token}"})
        response = connection.getresponse()
        response.read()
        return response.status, time.monotonic() - began, dict(response.getheaders())
    finally:
        connection.close()


def questions(home: Path, demo_output: str | None, count: int = 60, seed: int = 3) -> list[tuple[str, dict]]:
    """The demo's questions: backward from its sink rows, forward from its Kafka records, the queries."""
    import pyarrow.parquet as pq

    rng = random.Random(seed)
    sinks = sorted(glob.glob(str(home / "demo" / "enriched_orders-orders-*")))
    if not sinks:
        raise RuntimeError(f"no demo sink under {home / 'demo'}: run the demo first")
    rids = [r for f in sorted(glob.glob(f"{sinks[-1]}/*.parquet")) for r in pq.read_table(f, columns=["_hw_rid"])
            .column("_hw_rid").to_pylist()]
    topic = sinks[-1].rsplit("enriched_orders-", 1)[1]
    if demo_output:  # the topic the demo says it produced to, where it says so
        found = re.search(r"Kafka topic (\S+)", demo_output)
        topic = found.group(1) if found else topic
    asked = [("/v1/lineage/backward", {"rid": r}) for r in rng.sample(rids, min(count, len(rids)))]
    asked += [("/v1/lineage/forward", {"source": f"kafka:{topic}:{rng.randrange(2)}:{rng.randrange(400)}"})
              for _ in range(count // 2)]
    asked += [("/v1/queries", {})] * (count // 10)
    return asked


def load(port: int, token: str, asked: list, clients: int, seconds: float, seed: int = 1) -> dict:
    """``clients`` threads asking ``asked`` at random for ``seconds``: latency percentiles and errors."""
    times: list[float] = []
    by_route: dict[str, list[float]] = {}
    statuses: dict[str, int] = {}
    retry_after_missing = 0
    lock = threading.Lock()
    start = threading.Barrier(clients)
    deadline = [0.0]

    def client(i: int) -> None:
        nonlocal retry_after_missing
        rng = random.Random(seed * 1000 + i)
        start.wait()
        while time.monotonic() < deadline[0]:
            path, params = rng.choice(asked)
            try:
                status, took, headers = ask(port, token, path, params)
            except OSError as exc:
                status, took, headers = type(exc).__name__, 0.0, {}
            with lock:
                statuses[str(status)] = statuses.get(str(status), 0) + 1
                if status == 200:
                    times.append(took)
                    by_route.setdefault(path, []).append(took)
                elif status == 503 and "Retry-After" not in headers:
                    retry_after_missing += 1

    deadline[0] = time.monotonic() + seconds + 0.5
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    def percentile(found: list[float], q: float) -> float | None:
        found = sorted(found)
        return round(1000 * found[min(len(found) - 1, int(q * len(found)))], 1) if found else None

    requests = sum(statuses.values())
    return {"clients": clients, "requests": requests, "errors": requests - statuses.get("200", 0),
            "p50_ms": percentile(times, 0.50), "p99_ms": percentile(times, 0.99), "max_ms": percentile(times, 1.0),
            "statuses": dict(sorted(statuses.items())), "503_without_retry_after": retry_after_missing,
            "p99_ms_by_route": {path: percentile(found, 0.99) for path, found in sorted(by_route.items())}}


def measure(home: Path, demo_output: str | None, clients: int, heavy: int, seconds: float) -> dict:
    """Both loads, each from a process of its own: the clients' threads then share an interpreter lock with
    nothing else (the caller's threads, a test session's Spark and Kafka clients among them). A warm-up load
    of ``clients`` for ``WARMUP_S`` comes first, reported apart (``warmup``)."""
    token = secrets.token_urlsafe(24)
    asked = questions(home, demo_output)
    with serving(home, token) as port:
        for path, params in asked:  # each once alone: every one answered, and the server warm
            status, _, _ = ask(port, token, path, params)
            if status != 200:
                raise RuntimeError(f"{path} {params}: {status} asked alone")
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as clients_process:
            warmup = clients_process.submit(load, port, token, asked, clients, WARMUP_S, seed=3).result()
            light = clients_process.submit(load, port, token, asked, clients, seconds).result()
            heavier = clients_process.submit(load, port, token, asked, heavy, seconds, seed=2).result()
        return {"bench": "http_load", "questions": len(asked), "seconds": seconds, "light": light, "heavy": heavier,
                "warmup": {k: warmup[k] for k in ("requests", "errors", "p50_ms", "p99_ms")},
                "load_average_1m": round(os.getloadavg()[0], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--heavy", type=int, default=64)
    parser.add_argument("--home", type=Path, default=None, help="A home whose stack runs and holds the demo's run.")
    args = parser.parse_args()
    if args.home is not None:
        result = measure(args.home, None, args.clients, args.heavy, args.seconds)
    else:
        with tempfile.TemporaryDirectory(prefix="headwater-http-load-") as folder:
            home = Path(folder) / "home"
            with demo_stack(home) as demo:
                result = measure(home, demo.stdout, args.clients, args.heavy, args.seconds)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
