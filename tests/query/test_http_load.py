"""The HTTP API under load on the demo's stack (``bench/http_load.py``): ``headwater serve`` with its default
settings holds 8 concurrent clients with no error and a p99 of at most 150 ms, and under 64 the limit
still limits: 503 with Retry-After for what neither runs nor waits, nothing else failing."""

from __future__ import annotations

import json

from bench.http_load import measure

CLIENTS = 8
P99_MS = 150.0


def test_eight_clients_without_error_and_the_limit_under_many(demo_home):
    home, run = demo_home
    result = measure(home, run.stdout, clients=CLIENTS, heavy=64, seconds=8.0)
    print(json.dumps(result))
    light, heavy = result["light"], result["heavy"]
    assert light["errors"] == 0 and light["statuses"] == {"200": light["requests"]}, light
    assert light["requests"] > 200 and light["p99_ms"] <= P99_MS, light
    # many clients: what neither runs nor waits gets 503 with Retry-After; every other answer is a 200
    assert set(heavy["statuses"]) == {"200", "503"} and heavy["statuses"]["503"] > 0, heavy
    assert heavy["statuses"]["200"] > 200 and heavy["503_without_retry_after"] == 0, heavy
