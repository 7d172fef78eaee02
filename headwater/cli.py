"""The ``headwater`` command. Answers are JSON lines on stdout; errors a JSON line on stderr.

``headwater serve`` prints one JSON line once it listens, logs a line per request on
stderr, and runs until SIGINT or SIGTERM.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from headwater.core import config as configuration
from headwater.query.address import SOURCE_FORMS, checked_source


# The query backends (``headwater.query.api.choices()``), named here so the CLI starts without importing them.
BACKENDS = ["auto", "cypher", "csprov", "rq"]


def _home(ctx: click.Context) -> Path:
    return ctx.obj["home"]


def _emit(record: dict) -> None:
    click.echo(json.dumps(record, default=str))


def _fail(message: str, code: int = 2) -> None:
    click.echo(json.dumps({"error": message}), err=True)
    sys.exit(code)


@click.group()
@click.option("--home", type=click.Path(path_type=Path), default=None,
              help="State folder of the local stack (default $HEADWATER_HOME or ~/.headwater).")
@click.pass_context
def main(ctx: click.Context, home: Path | None) -> None:
    """headwater: row-level lineage for Spark Structured Streaming."""
    ctx.obj = {"home": (home or configuration.default_home()).resolve()}


@main.group()
def stack() -> None:
    """The embedded local stack: Kafka-protocol broker and Bolt graph server on 127.0.0.1."""


@stack.command("up")
@click.option("--broker-port", type=int, default=9092, show_default=True)
@click.option("--bolt-port", type=int, default=7687, show_default=True)
@click.option("--http-port", type=int, default=2480, show_default=True, help="The graph server's HTTP port.")
@click.pass_context
def stack_up(ctx: click.Context, broker_port: int, bolt_port: int, http_port: int) -> None:
    """Start what is not running and wait until each part answers."""
    from headwater.deploy.stack import Stack, StackError

    ports = {"broker": broker_port, "bolt": bolt_port, "graph_http": http_port}
    try:
        statuses = Stack(_home(ctx), ports, say=lambda s: click.echo(s, err=True)).up()
    except StackError as exc:
        _fail(str(exc))
    for status in statuses:
        _emit(status.to_dict())


@stack.command("down")
@click.pass_context
def stack_down(ctx: click.Context) -> None:
    """Stop exactly the processes `stack up` started."""
    from headwater.deploy.stack import Stack

    stopped = Stack(_home(ctx), say=lambda s: click.echo(s, err=True)).down()
    _emit({"stopped": stopped})


@stack.command("status")
@click.pass_context
def stack_status(ctx: click.Context) -> None:
    """Each part's health; exit status 1 when any part is not healthy."""
    from headwater.deploy.stack import Stack

    statuses = Stack(_home(ctx)).status()
    for status in statuses:
        _emit(status.to_dict())
    sys.exit(0 if all(s.healthy for s in statuses) else 1)


@main.command("index")
@click.option("--drain", is_flag=True, help="Stop once caught up with the topics and idle.")
@click.option("--idle", type=float, default=3.0, show_default=True, help="Seconds idle before --drain stops.")
@click.option("--max-seconds", type=float, default=None, help="Stop after this long in any case; with --drain, exit 1 if not caught up by then.")
@click.option("--metrics-port", type=int, default=0, show_default=True,
              help="Serve /metrics (headwater_indexer_*), /healthz and /readyz at this port, on the metrics_host "
                   "setting's address ($HEADWATER_METRICS_HOST, default 127.0.0.1); 0: none.")
@click.option("--group", default=None, help="Consumer group; default: headwater-indexer.<edges topic>.")
@click.pass_context
def index(ctx: click.Context, drain: bool, idle: float, max_seconds: float | None, metrics_port: int,
          group: str | None) -> None:
    """Consume the edges and log topics into the graph store and the Parquet store, until SIGINT or SIGTERM."""
    import signal

    from headwater.adapters import health_http
    from headwater.indexer.service import Indexer

    # Kubernetes stops a pod with SIGTERM: stop as on Ctrl-C, leaving the consumer group at once
    # (its partitions move now, not after the session timeout) with every written offset committed.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    config = configuration.load(_home(ctx))
    indexer = Indexer(config, group=group, say=lambda s: click.echo(s, err=True))
    try:
        server = health_http.serve(config.metrics_host, metrics_port, indexer.unready) if metrics_port else None
    except OSError as exc:
        indexer.close()
        _fail(str(exc))
    interrupted = False
    try:
        stats = indexer.run(drain=drain, idle_s=idle, max_seconds=max_seconds)
    except KeyboardInterrupt:
        stats, interrupted = indexer.stats, True
    finally:
        if server is not None:
            server.shutdown()
        indexer.close()
    _emit(stats.to_dict())
    if drain and not interrupted and not stats.caught_up:
        _fail(f"--drain: not caught up with the topics after {max_seconds:g}s", 1)


@main.command("drain")
@click.option("--idle", default=60.0, show_default=True, help="Stop after this many seconds with nothing to send.")
@click.pass_context
def drain(ctx: click.Context, idle: float) -> None:
    """Send the lineage capture journaled on this host (HEADWATER_SPILL_DIR) to the edges topic.

    A tracer sends what its own host journals; run this where Spark executors journal and no
    tracer runs (executors on other hosts). One drain runs per folder: a second exits at once.
    """
    from headwater.capture.delivery import DeliverySettings
    from headwater.capture.journal import drain_until_idle
    from headwater.core import config as configuration

    config = configuration.load()
    settings = DeliverySettings.of(config)
    drained = drain_until_idle(settings, config.edges_topic, idle_s=idle)
    _emit({"drained": drained, "folder": settings.spill_dir} if drained else
          {"drained": False, "folder": settings.spill_dir, "reason": "another drain holds the folder"})


@main.command("compact")
@click.option("--threshold", type=int, default=None, help="Most rows a connected set holds (default 100,000).")
@click.option("--buckets", type=int, default=None, help="Edge buckets of the generation (default 64).")
@click.pass_context
def compact(ctx: click.Context, threshold: int | None, buckets: int | None) -> None:
    """Recompute the connected sets of the Parquet store on Spark and switch to them (a new generation)."""
    from pyspark.sql import SparkSession

    from headwater.demo.run import spark_session
    from headwater.indexer import compaction

    config = configuration.load(_home(ctx))
    if threshold is not None and threshold < 1 or buckets is not None and buckets < 1:
        _fail("--threshold and --buckets must be at least 1")
    running = SparkSession.getActiveSession()  # a caller's session is used, and left running
    spark = running or spark_session("headwater-compact")
    options = {k: v for k, v in (("threshold", threshold), ("buckets", buckets)) if v is not None}
    try:
        manifest = compaction.compact(spark, config.store_path(), config.edges_topic,
                                      say=lambda s: click.echo(s, err=True), **options)
    except (compaction.CompactionBusy, ValueError) as exc:
        _fail(str(exc))
    finally:
        if running is None:
            spark.stop()
    _emit({k: v for k, v in manifest.items() if k != "covers"})


@main.group()
def lineage() -> None:
    """Lineage queries, answered as JSON lines."""


def _query(ctx: click.Context, question: str, rid: int | None, source: str | None, dataset: str | None,
           where: str | None, backend: str, **options) -> None:
    from headwater.adapters.graph import GraphUnavailable
    from headwater.query.api import LineageClient
    from headwater.query.backend import LineageError, UnknownRow

    if sum(x is not None for x in (rid, source, dataset)) != 1:
        _fail("give exactly one of --rid, --source or --dataset (with --where)")
    if (dataset is None) != (where is None):
        _fail("--dataset and --where go together: the sink, and a SQL predicate over its rows")
    failed = 0
    try:
        # An address is turned into a rid by the client: a static table's rows are named by where it lives.
        starts = [rid] if rid is not None else [checked_source(source)] if source is not None else \
            _selected(dataset, where)
        with LineageClient(configuration.load(_home(ctx)), backend=backend) as client:
            for start in starts:
                try:
                    answer = getattr(client, question)(start, **options)
                except UnknownRow as exc:
                    if len(starts) == 1:
                        raise
                    failed += 1  # one of the rows --where selected: say so, answer the others
                    click.echo(json.dumps({"of": start, "error": str(exc)}), err=True)
                    continue
                for row in answer:
                    _emit(row.to_dict())
                # What the answer may miss, apart from the records, so that stdout stays one record a line.
                click.echo(json.dumps({"summary": answer.summary()}), err=True)
    except (LineageError, GraphUnavailable) as exc:
        _fail(str(exc))
    except Exception as exc:  # e.g. the graph store is down
        _fail(f"{type(exc).__name__}: {exc}", code=1)
    if failed:
        sys.exit(2)


def _selected(dataset: str, where: str) -> list[int]:
    """The rids of the sink's rows the predicate holds for (a local Spark session reads the sink)."""
    from headwater.demo.run import spark_session
    from headwater.query.sink import select

    spark = spark_session("headwater-lineage-where")
    try:
        return select(spark, dataset, where)
    finally:
        spark.stop()


def _mask(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text, 0)
    except ValueError:
        raise click.BadParameter(f"{text!r}: a bit mask of columns, e.g. 5 or 0b101") from None


_ROW_OPTIONS = [
    click.option("--rid", type=int, default=None, help="rid of the row (e.g. a sink's _hw_rid)."),
    click.option("--source", default=None, help=f"The row's address: {SOURCE_FORMS}."),
    click.option("--dataset", default=None, help="A sink as lineage names it (parquet:PATH, json:PATH, orc:PATH, "
                 "table:NAME): ask about its rows --where selects."),
    click.option("--where", default=None, help="With --dataset: a Spark SQL predicate over the sink's columns."),
    click.option("--depth", type=int, default=16, show_default=True, help="Longest path followed, in edges (each way)."),
    click.option("--payload", is_flag=True, help="Add the original source records."),
    click.option("--since", default=None, help="Time bound: only through batches that ran at or after this "
                 "ISO 8601 time (e.g. 2026-11-23T18:00:00Z)."),
    click.option("--until", default=None, help="Time bound: only through batches that ran at or before this time."),
    click.option("--backend", type=click.Choice(BACKENDS), default="auto", show_default=True,
                 help="The graph store (cypher), the Parquet store by connected sets (csprov) or whole (rq), or "
                      "the graph when it answers and holds the row, else the Parquet store (auto)."),
]


def _lineage_command(question: str, name: str, defaults: dict, summary: str) -> None:
    def command(ctx, rid, source, dataset, where, backend, **options) -> None:
        if "cols" in options:
            options["cols"] = _mask(options["cols"])
        _query(ctx, question, rid, source, dataset, where, backend, **options)

    command.__doc__ = summary
    for option in reversed(_ROW_OPTIONS):
        command = option(command)
    command = click.option("--to", default=defaults["to"], show_default=True,
                           help="The rows answered: source, state or output, or a dataset name.")(command)
    if "via" in defaults:
        command = click.option("--via", default=defaults["via"], show_default=True,
                               help="The rows in between: source, state or output, or a dataset name.")(command)
    else:
        command = click.option("--cols", default=None, help="Attribute level: a bit mask of the columns of the "
                               "row asked about (backward) or of the rows answered (forward).")(command)
        command = click.option("--paths", type=click.IntRange(0, 100), default=0, show_default=True,
                               help="How-provenance: keep up to N paths (query, batch, op steps) per row.")(command)
    lineage.command(name)(click.pass_context(command))


_lineage_command("backward", "backward", {"to": "source"}, "The inputs a row was derived from.")
_lineage_command("forward", "forward", {"to": "output"}, "The rows derived from an input.")
_lineage_command("co_contributors", "co-contributors", {"to": "source", "via": "output"},
                 "The rows used together with a row to make others (TensProv Q10).")
_lineage_command("co_dependents", "co-dependents", {"to": "output", "via": "source"},
                 "The rows derived from the inputs of a row (TensProv Q11).")


@main.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; other than loopback only with a token.")
@click.option("--port", type=int, default=8080, show_default=True, help="0: any free port.")
@click.option("--backend", type=click.Choice(BACKENDS), default="auto", show_default=True,
              help="The backend of questions that name none (backend=).")
@click.option("--token-file", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="File holding the bearer token every /v1 and /openapi.json request must give "
                   "(default $HEADWATER_HTTP_TOKEN; neither: no token, loopback only).")
@click.option("--max-results", type=click.IntRange(min=1), default=10_000, show_default=True,
              help="Rows of an answer at most; longer answers are cut (truncated: true).")
@click.option("--max-concurrent", type=click.IntRange(min=1), default=4, show_default=True,
              help="Queries answered at once; more get 503 with Retry-After.")
@click.pass_context
def serve(ctx: click.Context, host: str, port: int, backend: str, token_file: Path | None, max_results: int,
          max_concurrent: int) -> None:
    """Answer lineage questions over HTTP (read-only JSON; GET /openapi.json) until SIGINT or SIGTERM."""
    import signal
    import threading

    from headwater.query import http

    try:
        token = token_file.read_text().strip() if token_file is not None else os.environ.get(http.TOKEN_ENV)
    except OSError as exc:
        _fail(f"cannot read the token file: {exc}")
    stop = threading.Event()
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, lambda *_: stop.set())
    try:
        server = http.serve(configuration.load(_home(ctx)), host, port, backend, token, max_results, max_concurrent,
                            say=lambda s: click.echo(s, err=True))
    except (http.ServeError, OSError) as exc:
        _fail(str(exc))
    _emit({"serving": server.url, "openapi": f"{server.url}/openapi.json"})
    stop.wait()
    server.close()


@main.command("demo")
@click.option("--orders", type=int, default=1000, show_default=True)
@click.option("--keep-stack/--stop-stack", default=True, show_default=True,
              help="Leave the stack running afterwards for your own queries.")
@click.pass_context
def demo(ctx: click.Context, orders: int, keep_stack: bool) -> None:
    """Run the demo end to end on the embedded local stack and print a lineage answer."""
    from headwater.demo.run import run

    run(_home(ctx), orders=orders, keep_stack=keep_stack, say=lambda s: click.echo(s))


if __name__ == "__main__":
    main()
