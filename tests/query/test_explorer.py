"""The explorer (``query/explorer/``, served by ``headwater serve`` at ``/``) in a real browser.

Headless chromium from Debian's package (``tools.chromium()``), driven by Playwright (never a
browser of Playwright's own), against the demo's stack: ``headwater demo`` once, then the demo
pipeline again on another topic with ``capture="log-only"`` under another query name (the demo
has no option for it), whose every batch is a gap. What the pages show is checked against the
demo's own answer, the sinks' files read with pyarrow, the batch log read directly, and the
API's answers. Screenshots go to the test's tmp dir and to ``/tmp/explorer-shots/``.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import quote, urlencode

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from playwright.sync_api import sync_playwright

from bench.http_load import demo_env, serving
from headwater.core.offsets import offset_ranges
from headwater.deploy import tools
from headwater.spark.table_files import uri_path
from headwater.store.batch_log import BatchLog

SHOTS = Path("/tmp/explorer-shots")
ROOT = Path(__file__).resolve().parents[2]
LOG_ONLY_QUERY = "enriched_orders_log_only"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def log_only_run(home: str, orders: int = 300) -> None:
    """The demo pipeline on a topic of its own, traced with capture="log-only" as ``LOG_ONLY_QUERY``, then
    indexed: its batches are in the batch log (with the files each wrote), no edges anywhere."""
    from headwater.adapters.kafka import ensure_topics
    from headwater.adapters.spark import spark_session
    from headwater.capture import attach
    from headwater.core import config as configuration
    from headwater.demo import orders as data
    from headwater.demo.pipeline import enriched_orders
    from headwater.demo.run import end_offsets, run_until
    from headwater.indexer.service import Indexer

    folder = Path(home) / "demo"
    config = configuration.load(Path(home)).with_overrides(capture="log-only")
    topic = "orders-log-only"
    ensure_topics(config, [topic], 2)
    coordinates = data.produce(config.bootstrap, topic, data.order_events(orders, seed=11))
    spark = spark_session("headwater-explorer-log-only")
    tracer = attach(spark, config)
    frame = enriched_orders(spark, config.bootstrap, topic, str(folder / "customers.parquet"), 100)
    query = (tracer.trace(frame, name=LOG_ONLY_QUERY, keys={"customers": "customer_id"})
             .writeStream.format("parquet").option("checkpointLocation", str(folder / "checkpoint-log-only"))
             .trigger(processingTime="500 milliseconds").start(str(folder / "enriched_orders-log-only")))
    try:
        run_until(query, end_offsets(topic, coordinates), say=print)
    finally:
        tracer.close()
        spark.stop()
    indexer = Indexer(config)
    try:
        indexer.run(drain=True, idle_s=2.0, max_seconds=120)
    finally:
        indexer.close()


@pytest.fixture(scope="module")
def demo(demo_home):
    """The demo's stack with the demo and the log-only run on it, and ``headwater serve`` over it."""
    home, output = demo_home[0], demo_home[1].stdout
    run = f"from tests.query.test_explorer import log_only_run; log_only_run({str(home)!r})"
    done = subprocess.run([sys.executable, "-c", run], cwd=ROOT, env=demo_env(home), capture_output=True,
                          text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rid = int(re.search(r"--rid (-?\d+)", output).group(1))
    sources = [json.loads(line) for line in output.splitlines() if line.startswith('{"of"')]
    token = secrets.token_urlsafe(24)
    with serving(home, token) as port:
        yield SimpleNamespace(home=home, port=port, url=f"http://127.0.0.1:{port}", token=token, rid=rid,
                              sources=sources, store=home / "store")


def api(demo, path: str, **params) -> dict:
    request = urllib.request.Request(f"{demo.url}{path}?{urlencode(params)}",
                                     headers={"Authorization": f"Bearer {demo.token}"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """One headless chromium (a fresh profile), closed at the end; any of its processes left, ended by pid."""
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as driver:
        context = driver.chromium.launch_persistent_context(
            str(profile), executable_path=str(tools.chromium()), headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 900})
        try:
            yield context
        finally:
            context.close()
    for pid in _processes_using(profile):
        os.kill(pid, signal.SIGKILL)


def _processes_using(profile: Path) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(profile).encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:  # gone meanwhile
                pass
    return found


@pytest.fixture
def page(browser, demo, tmp_path):
    """A new tab (its own sessionStorage), its console errors collected; a screenshot with ``page.shot(name)``."""
    tab = browser.new_page()
    tab.set_default_timeout(90_000)
    errors = []
    tab.on("pageerror", lambda error: errors.append(str(error)))

    def shot(name: str) -> None:
        path = tmp_path / f"{name}.png"
        tab.screenshot(path=path, full_page=True)
        SHOTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, SHOTS / path.name)

    tab.shot = shot
    yield tab
    tab.close()
    assert errors == []  # no script error on any page


def log_in(page, demo, hash_path: str = "") -> None:
    page.goto(f"{demo.url}/{hash_path}")
    page.locator("#token").fill(demo.token)
    page.locator("#login-button").click()
    page.locator("#login").wait_for(state="hidden")


def nodes(page) -> dict[str, dict]:
    """The graph's rows: by rid, their kind, dataset and text."""
    found = {}
    for node in page.locator("#graph g.node").all():
        found[node.get_attribute("data-rid")] = {"kind": node.get_attribute("data-kind"),
                                                 "dataset": node.get_attribute("data-dataset"),
                                                 "text": " ".join(node.locator("text").all_text_contents())}
    return found


def test_a_wrong_token_is_refused(page, demo):
    page.goto(f"{demo.url}/")
    page.locator("#login").wait_for(state="visible")
    assert page.locator("#main").is_hidden()
    page.locator("#token").fill("not-the-token-" + "x" * 20)
    page.locator("#login-button").click()
    page.locator("#login-error", has_text="refused").wait_for()
    assert page.locator("#main").is_hidden() and page.locator("#graph").count() == 0
    assert page.evaluate("() => sessionStorage.length") == 0  # the refused token is not kept
    page.shot("explorer-0-wrong-token")
    page.locator("#token").fill(demo.token)
    page.locator("#login-button").click()
    page.locator("#search-row").wait_for()
    assert demo.token not in page.url
    assert page.evaluate("() => sessionStorage.getItem('headwater.token')") == demo.token
    assert page.context.cookies() == []


def test_a_demo_row_shows_its_customers_row_and_kafka_record(page, demo):
    log_in(page, demo)
    page.locator("#row").fill(str(demo.rid))
    page.locator("#go-backward").click()
    page.locator("#graph g.node[data-dataset='customers']").wait_for()
    page.locator("#complete").wait_for()
    shown = nodes(page)
    # the demo's own answer: one Kafka record and one customers row
    kafka = next(s for s in demo.sources if s["topic"])
    customer = next(s for s in demo.sources if s["key"] is not None)
    assert set(shown) == {str(demo.rid), str(kafka["rid"]), str(customer["rid"])}
    assert f"partition {kafka['partition']} · offset {kafka['offset']}" in shown[str(kafka["rid"])]["text"]
    assert kafka["topic"] in shown[str(kafka["rid"])]["text"]
    assert f"key {customer['key']}" in shown[str(customer["rid"])]["text"]
    assert shown[str(demo.rid)]["kind"] == "output"
    # edges labelled with the operators by name, as the API names them
    answer = api(demo, "/v1/lineage/backward", rid=demo.rid)
    labels = " ".join(page.locator("#graph g.edge-label").all_text_contents())
    for record in answer["answer"]:
        assert record["operators"], record
        for op in record["operators"]:
            if op["kind"] != "source":
                assert op["name"] in labels, (op, labels)
    assert "join customers" in labels
    page.shot("explorer-1-demo-row-backward")
    # a row's payload on demand: the customers row as the table holds it
    page.locator(f"#graph g.node[data-rid='{customer['rid']}']").click()
    page.locator("button.load-payload").click()
    payload = json.loads(page.locator(".payload pre").text_content())
    assert payload == customer["payload"]
    page.shot("explorer-2-customers-payload")


def test_expanding_forward_from_the_customer(page, demo):
    customer = next(s for s in demo.sources if s["key"] is not None)
    log_in(page, demo, f"#/lineage?dir=backward&rid={demo.rid}")
    page.locator(f"#graph g.node[data-rid='{customer['rid']}'] .handle.forward").click()
    page.locator("#graph g.node").nth(3).wait_for()
    page.locator(f"#graph g.node[data-rid='{customer['rid']}'] .handle.forward").wait_for(state="detached")
    forward = api(demo, "/v1/lineage/forward", rid=customer["rid"])
    # oracle: the demo sink's rows of that customer are among the rows derived from it
    sink = next((demo.home / "demo").glob("enriched_orders-orders-*"))
    table = pq.read_table(sink, columns=["customer_id", "_hw_rid"])
    expected = set(table.filter(pc.equal(table["customer_id"], int(customer["key"])))["_hw_rid"].to_pylist())
    derived = [r["rid"] for r in forward["answer"]]
    assert len(expected) > 1 and expected <= set(derived)
    # the first rows of the answer are added to the graph, beside the row asked about first
    shown = {rid for rid, n in nodes(page).items() if n["kind"] == "output"}
    assert shown == {str(r) for r in derived[:25]} | {str(demo.rid)}
    if len(derived) > 25:
        assert page.locator("#graph g.node.more").text_content().startswith(f"{len(derived) - 25} more rows")
    page.shot("explorer-3-forward-from-customer")
    page.locator("#fit").click()
    page.shot("explorer-4-forward-from-customer-fit")


def test_a_row_found_by_its_address_and_by_a_predicate(page, demo):
    kafka = next(s for s in demo.sources if s["topic"])
    log_in(page, demo)
    page.locator("#row").fill(f"kafka:{kafka['topic']}:{kafka['partition']}:{kafka['offset']}")
    page.locator("#go-forward").click()
    page.locator(f"#graph g.node[data-rid='{demo.rid}']").wait_for()
    assert {str(demo.rid), str(kafka["rid"])} <= set(nodes(page))
    # by the sink and a predicate: the demo row is order 0's
    sink = next((demo.home / "demo").glob("enriched_orders-orders-*"))
    table = pq.read_table(sink, columns=["order_id", "_hw_rid"])
    expected = sorted(table.filter(pc.less(table["order_id"], 3))["_hw_rid"].to_pylist())
    page.goto(f"{demo.url}/#/")
    page.locator("#dataset").fill(f"parquet:{sink}")
    page.locator("#where").fill("order_id < 3")
    page.locator("#search-where button[type=submit]").click()
    page.locator("#where-count").wait_for()
    listed = [int(t) for t in page.locator("#where-rows code").all_text_contents()]
    assert listed == expected and demo.rid in listed
    page.shot("explorer-5-where")
    page.locator(f"#where-rows li:has(code:text-is('{demo.rid}')) a.rid-link").click()
    page.locator("#graph g.node[data-dataset='customers']").wait_for()
    # as a catalog's page links to it (the OpenLineage events' headwater_rowLineage facet): the sink by its
    # OpenLineage name, the predicate the reader's
    page.goto(f"{demo.url}/#/where?dataset={quote(f'file:{sink}', safe='')}")
    page.locator("#where-ask").wait_for()
    assert page.locator("#dataset").input_value() == f"file:{sink}"
    page.locator("#where").fill("order_id < 3")
    page.locator("#search-where button[type=submit]").click()
    page.locator("#where-count").wait_for()
    assert [int(t) for t in page.locator("#where-rows code").all_text_contents()] == expected


def test_a_gap_batch_of_a_log_only_run_links_to_the_rows_it_wrote(page, demo):
    log = BatchLog(demo.store, "headwater.log")
    batches = log.batches(LOG_ONLY_QUERY)
    assert len(batches) >= 2 and set(log.statuses((LOG_ONLY_QUERY, b) for b in batches).values()) == {"log-only"}
    log_in(page, demo, "#/queries")
    page.locator(f"a.query-link:text-is('{LOG_ONLY_QUERY}')").click()
    page.locator("#timeline").wait_for()
    assert page.locator("#timeline a.batch-bar.gap").count() == len(batches)
    assert [int(t.split()[1]) for t in page.locator("#gaps a.gap-link").all_text_contents()] == batches
    page.shot("explorer-6-log-only-query")
    batch = batches[1]
    page.locator(f"#gaps a.gap-link:text-is('batch {batch}')").click()
    page.locator("#gap-note").wait_for()
    # oracle: the rows of the files the batch log says this batch wrote, and those only
    record = log.batch(LOG_ONLY_QUERY, batch)
    expected = [r for f in record["sink_files"] for r in pq.read_table(uri_path(f), columns=["_hw_rid"])
                ["_hw_rid"].to_pylist()]
    listed = [int(t.split()[1]) for t in page.locator("#batch-rows a.rid-link").all_text_contents()]
    assert listed == expected[:200] and expected
    # and the batches' rows together are the sink's rows, each once
    every = [r["rid"] for b in batches for r in api(demo, "/v1/batch", query=LOG_ONLY_QUERY, batch=b)["rows"]]
    sink = pq.read_table(demo.home / "demo" / "enriched_orders-log-only", columns=["_hw_rid"])["_hw_rid"].to_pylist()
    assert sorted(every) == sorted(sink) and len(set(every)) == len(every)
    page.shot("explorer-7-gap-batch")
    # follow a row: its lineage, inferred from the log, through the gap
    page.locator("#batch-rows a.rid-link").first.click()
    page.locator("#incomplete").wait_for()
    page.locator("#graph g.node[data-dataset='customers']").wait_for()
    assert page.locator("#graph path.edge.inferred.gap").count() == 2
    assert page.locator("#summary a.gap-link").text_content() == f"{LOG_ONLY_QUERY} batch {batch} (log-only)"
    kafka = [n for n in nodes(page).values() if n["dataset"].startswith("kafka:")]
    assert len(kafka) == 1
    partition, offset = map(int, re.search(r"partition (\d+) · offset (\d+)", kafka[0]["text"]).groups())
    start, end = offset_ranges(record["sources"])["orders-log-only", partition]
    assert start <= offset < end  # a record this batch read
    page.shot("explorer-8-gap-row-lineage")


def test_the_query_page_shows_the_plan_and_the_batches(page, demo):
    log = BatchLog(demo.store, "headwater.log")
    batches = log.batches("enriched_orders")
    operators = api(demo, "/v1/query", name="enriched_orders")["operators"]
    log_in(page, demo, "#/query?name=enriched_orders")
    page.locator("#plan g.node").first.wait_for()
    drawn = [node.get_attribute("data-name") for node in page.locator("#plan g.node").all()]
    assert sorted(drawn) == sorted(op["name"] for op in operators) and "join customers" in drawn
    for node in page.locator("#plan g.node").all():  # each named in the drawing (long names cut, ending in …)
        text = node.locator("text.title").text_content()
        assert node.get_attribute("data-name").startswith(text.removesuffix("…"))
    assert page.locator("#timeline a.batch-bar").count() == len(batches)
    assert page.locator("#timeline a.batch-bar.gap").count() == 0
    assert page.locator("#gaps").count() == 0
    rows = page.locator("#batches tr").count() - 1
    assert rows == min(50, len(batches))
    page.shot("explorer-9-query")
