"""headwater's OpenLineage events beside OpenLineage's own Spark agent, on the demo stream, in one run.

Starts a local stack on free ports, produces orders into a topic at a steady rate, and runs the demo's pipeline
(``headwater/demo/pipeline.py``: Kafka orders, the static customers table, a Parquet sink, a 500 ms trigger) twice at
once, each in a Spark process of its own for ``--minutes``: untraced with OpenLineage's agent
(``io.openlineage:openlineage-spark`` from Maven Central, ``spark.extraListeners``, its HTTP transport), and traced
by headwater with its events on (``OPENLINEAGE_URL``, the default 5-minute RUNNING interval). Each sends to a
receiver of the bench's own (``openlineage_receiver.Receiver``). Then prints one JSON line:

- ``valid``: every event of headwater's passed OpenLineage's schemas (``agent_valid`` the same of the agent's);
- ``events_per_hour`` and ``agent_events_per_hour`` (every event of its Spark application), their ``ratio``;
- ``datasets_superset``: headwater's input and output datasets contain those the agent reports for the stream
  (its events of processing type STREAMING), names equal by OpenLineage's naming; ``column_lineage_superset``:
  the same of column lineage (output column ← input column, direct and indirect);
- ``agent_links_source_to_sink``: whether any of the agent's events names the stream's Kafka topic as an input
  and its sink as an output;
- ``details``: the datasets and column lineage each reported, event counts by type, the batches each ran.

    .venv/bin/python bench/openlineage_events.py [--minutes 10] [--rate 20]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.openlineage_receiver import Receiver  # noqa: E402

QUERY = "enriched_orders"
BAR = 0.1  # headwater's events per hour at most this share of the agent's


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long each stream runs")
    parser.add_argument("--rate", type=float, default=20.0, help="orders produced per second")
    parser.add_argument("--child", choices=("agent", "headwater"), help=argparse.SUPPRESS)
    parser.add_argument("--home", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        stream(args.child, Path(args.home), args.topic, args.url, args.minutes * 60)
        return
    print(json.dumps(compare(args.minutes, args.rate)))


def compare(minutes: float, rate: float) -> dict:
    from headwater.adapters.kafka import ensure_topics
    from headwater.demo import orders as data
    from headwater.deploy.stack import Stack, free_port

    with tempfile.TemporaryDirectory(prefix="openlineage-events-") as tmp, Receiver() as ours, Receiver() as agent:
        home = Path(tmp) / "home"
        stack = Stack(home, ports={"broker": free_port(), "bolt": free_port(), "graph_http": free_port()},
                      say=lambda s: print(s, file=sys.stderr))
        stack.up()
        try:
            config = stack.config()
            topic = f"orders-{int(time.time())}"
            ensure_topics(config, [topic])
            (home / "bench").mkdir()
            stop = threading.Event()
            producer = threading.Thread(target=produce, args=(config.bootstrap, topic, rate, stop, data), daemon=True)
            producer.start()
            children = [subprocess.Popen([sys.executable, __file__, "--child", child,
                                          "--home", str(home), "--topic", topic, "--url", receiver.url,
                                          "--minutes", str(minutes)], stdout=subprocess.PIPE, text=True,
                                         env={**os.environ, "HEADWATER_HOME": str(home)})
                        for child, receiver in (("agent", agent), ("headwater", ours))]
            outputs = [child.communicate(timeout=minutes * 60 + 900)[0] for child in children]
            stop.set()
            producer.join(timeout=30)
            if any(child.returncode for child in children):
                raise RuntimeError(f"a stream failed: {[child.returncode for child in children]}")
            ran = [json.loads(out.strip().splitlines()[-1]) for out in outputs]
            time.sleep(2)  # the agent's last events, sent from its listener thread as the application ends
            return report(agent.events(), ours.events(), ran[0], ran[1], config.bootstrap, topic, minutes)
        finally:
            stack.down()


def produce(bootstrap: str, topic: str, rate: float, stop: threading.Event, data) -> None:
    """Orders into ``topic``, ``rate`` a second, until ``stop``."""
    from headwater.adapters.kafka import producer

    client = producer(bootstrap)
    sent, started = 0, time.monotonic()
    try:
        while not stop.is_set():
            due = int((time.monotonic() - started) * rate) - sent
            for key, value in data.order_events(due, seed=sent) if due > 0 else ():
                client.send(topic, key=key, value=value)
            sent += max(due, 0)
            client.flush(timeout=30)
            stop.wait(0.25)
    finally:
        client.close()


def stream(child: str, home: Path, topic: str, url: str, seconds: float) -> None:
    """One Spark process: the demo pipeline, untraced with the agent or traced with headwater's events; prints
    the batches it ran and its seconds."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from headwater.adapters.spark import spark_session
    from headwater.adapters.spark_lines import recent_progress
    from headwater.core.config import load
    from headwater.demo import orders as data
    from headwater.demo.pipeline import enriched_orders
    from headwater.deploy import tools

    config = load(home)
    work = home / "bench" / child
    work.mkdir(parents=True, exist_ok=True)
    customers = home / "bench" / "customers.parquet"
    if child == "agent" or not customers.exists():
        pq.write_table(pa.Table.from_pylist(data.customers()), customers)  # the same rows from either
    if child == "agent":
        jars = tools.spark_kafka_jars() + sorted(str(j) for j in tools.openlineage_spark().glob("*.jar"))
        spark = spark_session("demo_agent", **{
            "spark.jars": ",".join(jars),
            "spark.extraListeners": "io.openlineage.spark.agent.OpenLineageSparkListener",
            "spark.openlineage.transport.type": "http", "spark.openlineage.transport.url": url,
            "spark.openlineage.namespace": "headwater"})
    else:
        os.environ["OPENLINEAGE_URL"] = url
        spark = spark_session("demo_headwater")
    df = enriched_orders(spark, config.bootstrap, topic, str(customers))
    started = time.monotonic()
    if child == "agent":
        writer = df.writeStream
        tracer = None
    else:
        from headwater.capture import attach

        tracer = attach(spark, config.with_overrides(openlineage="on"))
        writer = tracer.trace(df, name=QUERY, keys={"customers": "customer_id"}).writeStream
    query = (writer.format("parquet").option("checkpointLocation", str(work / "checkpoint"))
             .trigger(processingTime="500 milliseconds").start(str(work / "sink")))
    try:
        while time.monotonic() - started < seconds:
            if query.exception() is not None:
                raise RuntimeError(str(query.exception()))
            time.sleep(1)
        batches = sum(1 for p in recent_progress(query) if p.numInputRows)  # the last 100 at most
        query.stop()
    finally:
        if tracer is not None:
            tracer.close()
    ran = {"seconds": round(time.monotonic() - started, 1), "batches_last_100": batches,
           "last_batch": query.lastProgress["batchId"] if query.lastProgress else None, "sink": str(work / "sink")}
    spark.stop()
    print(json.dumps(ran))


def report(agent_events: list[dict], our_events: list[dict], agent_ran: dict, our_ran: dict, bootstrap: str,
           topic: str, minutes: float) -> dict:
    from headwater.core import openlineage as names
    from headwater.deploy.openlineage_schema import OpenLineageSchemas

    schemas = OpenLineageSchemas()
    our_problems = [p for e in our_events for p in schemas.check(e)]
    agent_problems = [p for e in agent_events for p in schemas.check(e)]
    streaming = [e for e in agent_events
                 if ((e.get("job") or {}).get("facets") or {}).get("jobType", {}).get("processingType") == "STREAMING"]
    ours = [e for e in our_events if e["job"]["name"] == QUERY]

    def datasets(events: list[dict]) -> dict[str, list[str]]:
        return {side: sorted({names.DatasetName(d["namespace"], d["name"]).uri for e in events
                              for d in e.get(side) or []}) for side in ("inputs", "outputs")}

    def column_lineage(events: list[dict]) -> list[str]:
        edges = set()
        for event in events:
            for output in event.get("outputs") or []:
                lineage = (output.get("facets") or {}).get("columnLineage") or {}
                target = names.DatasetName(output["namespace"], output["name"]).uri
                for column, found in (lineage.get("fields") or {}).items():
                    edges |= {f"{target}#{column} <- {names.DatasetName(f['namespace'], f['name']).uri}#{f['field']}"
                              for f in found.get("inputFields") or []}
                edges |= {f"{target}#* <- {names.DatasetName(f['namespace'], f['name']).uri}#{f['field']}"
                          for f in lineage.get("dataset") or []}
        return sorted(edges)

    def indirect_of(edges: list[str]) -> set[str]:
        """An edge to every column (``#*``) covers the same edge to each column."""
        return {e.split("#", 1)[0] + "#* <- " + e.split(" <- ")[1] for e in edges}

    hours = minutes / 60
    our_sets, agent_sets = datasets(ours), datasets(streaming)
    our_columns, agent_columns = column_lineage(ours), column_lineage(streaming)
    kafka = names.kafka(bootstrap, topic).uri
    sink = names.location(agent_ran["sink"]).uri
    linked = any(kafka in {names.DatasetName(d["namespace"], d["name"]).uri for d in e.get("inputs") or []}
                 and sink in {names.DatasetName(d["namespace"], d["name"]).uri for d in e.get("outputs") or []}
                 for e in agent_events)
    events_per_hour = round(len(ours) / hours, 1)
    agent_per_hour = round(len(agent_events) / hours, 1)
    # The sinks differ (each stream its own folder): the agent's output names compared by what they are.
    agent_outputs = {o.replace(sink, "<sink>") for o in agent_sets["outputs"]}
    our_outputs = {o.replace(names.location(our_ran["sink"]).uri, "<sink>") for o in our_sets["outputs"]}
    columns_covered = set(our_columns) | indirect_of(our_columns)
    agent_columns_named = {c.replace(sink, "<sink>") for c in agent_columns}
    our_columns_named = {c.replace(names.location(our_ran["sink"]).uri, "<sink>") for c in columns_covered}
    result = {
        "valid": bool(ours) and not our_problems, "agent_valid": not agent_problems,
        "events_per_hour": events_per_hour, "agent_events_per_hour": agent_per_hour,
        "ratio": round(events_per_hour / agent_per_hour, 4) if agent_per_hour else None, "bar": BAR,
        "datasets_superset": set(agent_sets["inputs"]) <= set(our_sets["inputs"]) and agent_outputs <= our_outputs,
        "column_lineage_superset": agent_columns_named <= our_columns_named,
        "agent_links_source_to_sink": linked,
        "details": {
            "minutes": minutes, "spark": _spark_version(),
            "events": {"headwater": dict(Counter(e["eventType"] for e in ours)),
                       "agent": dict(Counter(f"{e['eventType']} {e['job']['name']}" for e in agent_events))},
            "datasets": {"headwater": our_sets, "agent": agent_sets},
            "column_lineage": {"headwater": our_columns, "agent": agent_columns},
            "ran": {"headwater": our_ran, "agent": agent_ran},
            "problems": {"headwater": our_problems[:10], "agent": agent_problems[:10]},
            "facets_checked": sorted(schemas.check_all.checked),
            "facets_unchecked": sorted(schemas.check_all.unchecked),
        },
    }
    result["passed"] = bool(result["valid"] and result["datasets_superset"] and result["column_lineage_superset"]
                            and result["ratio"] is not None and result["ratio"] <= BAR)
    return result


def _spark_version() -> str:
    from importlib.metadata import version

    return version("pyspark")


if __name__ == "__main__":
    main()
