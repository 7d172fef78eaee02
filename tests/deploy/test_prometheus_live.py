"""A real Prometheus (Debian's) on 127.0.0.1, scraping a live traced stream, a live indexer and a
live query service, with the rules shipped in deploy/prometheus/rules.yaml: the overhead alert
fires for a query over its budget and stays silent for one within it, and every PromQL query of
the Grafana dashboard and alert rules returns series."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from headwater.deploy.stack import free_port
from tests.conftest import own_topics, stop_process, stop_when_idle
from tests.deploy.test_grafana import alert_files, dashboards

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "rules.yaml"
# A capturing batch here costs capture 0.07% to 40% of its own time (a small sample the least, a
# batch on a busy machine the most): one budget far below any of that, one far above.
OVER_BUDGET, WITHIN_BUDGET = 1e-5, 10.0
SCRAPE_S = 1
# Grafana's $__rate_interval: four scrape intervals (its floor, and what short panels get).
RATE_INTERVAL = f"{4 * SCRAPE_S}s"

pytestmark = [pytest.mark.stack, pytest.mark.spark]


def shortened_rules(folder: Path) -> Path:
    """The shipped rules with every alert's ``for`` cut to a second (a test cannot wait minutes);
    nothing else changes: the expressions, labels and recording rules are the file's own."""
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = "1s"
    path = folder / "rules.yaml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    return path


class Prometheus:
    """The Debian prometheus binary on a free loopback port, stopped by its PID."""

    def __init__(self, binary: Path, folder: Path, targets: dict[str, int], rules: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": f"{SCRAPE_S}s", "scrape_timeout": f"{SCRAPE_S}s",
                       "evaluation_interval": f"{SCRAPE_S}s"},
            "rule_files": [str(rules)],
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
                               for job, port in targets.items()],
        }
        (folder / "prometheus.yaml").write_text(yaml.safe_dump(config))
        self.log = folder / "prometheus.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [str(binary), f"--config.file={folder / 'prometheus.yaml'}", f"--storage.tsdb.path={folder / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    def wait_ready(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            assert self.proc.poll() is None, f"prometheus exited: {self.log.read_text()[-2000:]}"
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as answer:
                    if answer.status == 200:
                        return
            assert time.monotonic() < deadline, f"prometheus not ready in {timeout_s}s: {self.log.read_text()[-2000:]}"
            time.sleep(0.2)

    def api(self, path: str, **params) -> dict:
        url = f"{self.url}/api/v1/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        with urllib.request.urlopen(url, timeout=30) as answer:
            body = json.load(answer)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        return self.api("query", query=expr)["result"]

    def stop(self) -> None:
        stop_process(self.proc)


def start_part(stack, config, port: int, log: Path, *command: str) -> subprocess.Popen:
    """``headwater COMMAND --metrics-port PORT`` in a process of its own (its /metrics is only that part's), on
    the test's topics: ``index``, or ``narrow --follow``."""
    env = {**os.environ, "HEADWATER_EDGES_TOPIC": config.edges_topic, "HEADWATER_LOG_TOPIC": config.log_topic,
           "HEADWATER_DLQ_TOPIC": config.dlq_topic, "HEADWATER_STORE_DIR": config.store_dir}
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "headwater.cli", "--home", str(stack.home), *command,
                                 "--metrics-port", str(port)],
                                env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)


def traced_rate_stream(spark, tracer, name: str, folder: Path):
    df = (spark.readStream.format("rate").option("rowsPerSecond", 50).option("numPartitions", 2).load()
          .where("value % 2 = 0"))
    return (tracer.trace(df, name=name).writeStream.format("parquet")
            .option("checkpointLocation", str(folder / f"{name}-checkpoint")).trigger(processingTime="1 second")
            .start(str(folder / f"{name}-sink")))


def alerts_of(prometheus: Prometheus, name: str) -> dict[str, str]:
    """The state of alert ``name`` (pending or firing) by its query label."""
    return {a["labels"].get("query"): a["state"] for a in prometheus.api("alerts")["alerts"]
            if a["labels"]["alertname"] == name}


@pytest.fixture(scope="module")
def live(spark, stack, stack_config, tools, tmp_path_factory):
    """Two traced queries (one over its budget, one within) on capture's metrics endpoint, an indexer,
    a narrowing follower and a query service, all scraped every second by a Prometheus loading the shipped rules."""
    from headwater.capture import attach
    from headwater.query import http

    folder = tmp_path_factory.mktemp("prometheus")
    config, tag = own_topics(stack_config, "prom")
    over, within = f"over-{tag}", f"within-{tag}"
    ports = {"headwater-capture": free_port(), "headwater-indexer": free_port(), "headwater-narrow": free_port()}
    with contextlib.ExitStack() as stop:
        indexer = start_part(stack, config, ports["headwater-indexer"], folder / "indexer.log",
                             "index", "--group", f"prometheus-{config.edges_topic}")
        stop.callback(stop_process, indexer, signal.SIGINT)
        narrower = start_part(stack, config, ports["headwater-narrow"], folder / "narrow.log", "narrow", "--follow")
        stop.callback(stop_process, narrower, signal.SIGINT)
        server = http.serve(config, "127.0.0.1", 0, say=lambda _: None)
        stop.callback(server.close)
        ports["headwater-query"] = urllib.parse.urlsplit(server.url).port
        over_tracer = attach(spark, config, overhead_budget=OVER_BUDGET, metrics_port=ports["headwater-capture"])
        stop.callback(over_tracer.close)
        within_tracer = attach(spark, config, overhead_budget=WITHIN_BUDGET)  # the same process: the same endpoint
        stop.callback(within_tracer.close)
        for tracer, name in ((over_tracer, over), (within_tracer, within)):
            stop.callback(stop_when_idle, traced_rate_stream(spark, tracer, name, folder))
        prometheus = Prometheus(tools("prometheus"), folder, ports, shortened_rules(folder))
        stop.callback(prometheus.stop)
        prometheus.wait_ready()
        # Requests for the query service's histogram: answered or not, each is one observation.
        for path in ("/v1/lineage/backward?rid=1", "/v1/lineage/forward?rid=2", "/healthz"):
            with contextlib.suppress(urllib.error.HTTPError):
                urllib.request.urlopen(f"{server.url}{path}", timeout=30).close()
        yield SimpleNamespace(prometheus=prometheus, over=over, within=within, indexer=indexer, folder=folder)


def wait_until(check, what: str, live, timeout_s: float = 150):
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        assert live.indexer.poll() is None, f"the indexer died: {(live.folder / 'indexer.log').read_text()[-2000:]}"
        assert time.monotonic() < deadline, f"{what} within {timeout_s}s"
        time.sleep(SCRAPE_S)


def test_the_overhead_alert_fires_for_the_query_over_its_budget_and_not_for_the_one_within(live):
    prometheus = live.prometheus
    states = []  # the alert's states by query, at each look until it fired for the query over budget

    def fired() -> bool:
        states.append(alerts_of(prometheus, "HeadwaterCaptureOverBudget"))
        return states[-1].get(live.over) == "firing"

    wait_until(fired, "no HeadwaterCaptureOverBudget firing for the query over budget", live)
    (alert,) = [a for a in prometheus.api("alerts")["alerts"]
                if a["labels"]["alertname"] == "HeadwaterCaptureOverBudget" and a["labels"]["query"] == live.over]
    assert alert["labels"]["job"] == "headwater-capture" and alert["labels"]["severity"] == "warning"
    assert float(alert["value"]) > OVER_BUDGET
    assert f"overhead_budget of {OVER_BUDGET * 100:.4g}%" in alert["annotations"]["description"]

    # The query within budget captures and is measured (the silence is not for want of series) ...
    def value(expr: str) -> float:
        (result,) = prometheus.query(expr)
        return float(result["value"][1])

    captured = f'headwater_capture:overhead_ratio:captured{{query="{live.within}"}}'
    wait_until(lambda: prometheus.query(captured), "no batch of the query within budget captured lineage", live)
    assert value(f'headwater_capture_overhead_budget{{query="{live.within}"}}') == WITHIN_BUDGET
    assert 0 < value(captured) < WITHIN_BUDGET
    # ... and the alert never named it, pending or firing, while it fired for the other.
    assert all(live.within not in seen for seen in states)
    time.sleep(3 * SCRAPE_S)  # a few more evaluations
    assert live.within not in alerts_of(prometheus, "HeadwaterCaptureOverBudget")

    # Over budget, capture's controller samples, then logs only: that alert too, for that query alone.
    def degraded() -> dict[str, str]:
        found = alerts_of(prometheus, "HeadwaterCaptureDegraded")
        return found if found.get(live.over) == "firing" else {}

    assert live.within not in wait_until(degraded, "no HeadwaterCaptureDegraded for the query over budget", live)
    batches = {r["metric"]["status"]: float(r["value"][1])
               for r in prometheus.query(f'headwater_capture_batches_total{{query="{live.over}"}}')}
    print(json.dumps({"over": {"alert_value": float(alert["value"]), "batches": batches},
                      "within": {how: value(f"{how}_over_time({captured}[5m])") for how in ("min", "avg", "max")},
                      "looks_until_fired": len(states)}))


def dashboard_queries() -> list[tuple[str, str]]:
    """``(where, PromQL)`` of every dashboard panel target and Grafana alert query, with the dashboard's
    variables as Grafana gives them for "All" and the interval it gives a 1-second scrape."""
    found = []
    for name, dashboard in dashboards().items():
        variables = {v["name"]: v.get("allValue", ".*")
                     for v in dashboard["templating"]["list"] if v["type"] == "query"}
        for panel in dashboard["panels"]:
            for target in panel.get("targets", []):
                expr = target["expr"].replace("$__rate_interval", RATE_INTERVAL)
                expr = re.sub(r"\$(\w+)", lambda m: variables[m.group(1)], expr)
                found.append((f"{name}: {panel['title']} {target['refId']}", expr))
    for name, alerts in alert_files().items():
        for group in alerts["groups"]:
            for rule in group["rules"]:
                for query in rule["data"]:
                    if "expr" in query["model"]:
                        found.append((f"{name}: {rule['title']} {query['refId']}", query["model"]["expr"]))
    return found


def test_every_dashboard_panel_and_grafana_alert_query_returns_series(live):
    queries = dashboard_queries()
    assert len(queries) >= 20
    deadline = time.monotonic() + 90  # series of the rarer events (a write, a delivery) come in a while
    while missing := [where for where, expr in queries if not live.prometheus.query(expr)]:
        assert time.monotonic() < deadline, f"queries that returned no series: {missing}"
        time.sleep(SCRAPE_S)


def test_the_grafana_overhead_alert_condition_holds_for_the_query_over_budget_only(live):
    """Its query gives the overhead as a multiple of the budget; the rule's threshold is 1."""
    (alerts,) = alert_files().values()
    (rule,) = alerts["groups"][0]["rules"]
    expr = next(q for q in rule["data"] if q["refId"] == "A")["model"]["expr"]
    threshold = next(q for q in rule["data"] if q["refId"] == rule["condition"])["model"]["conditions"][0]["evaluator"]
    assert threshold == {"type": "gt", "params": [1]}

    def times_budget() -> dict[str, float]:
        return {r["metric"]["query"]: float(r["value"][1]) for r in live.prometheus.query(expr)
                if r["metric"]["query"] in (live.over, live.within)}

    found = wait_until(lambda: len(times_budget()) == 2 and times_budget(), "both queries in the Grafana alert's query",
                       live)
    assert found[live.over] > 1 > found[live.within]
