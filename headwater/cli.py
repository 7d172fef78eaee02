"""The ``headwater`` command. Answers are JSON lines on stdout (or a table, ``--format table``).

Errors, click's own usage errors among them, are one JSON line on stderr, ``{"error": …}``
with what else helps (``position`` in a ``--where``, ``option``, ``usage``), and exit status 2.
Exit status 1 is no error but a state: ``stack status`` with a part down, ``index --drain``
not caught up. ``headwater serve`` prints one JSON line once it listens, logs a line per
request on stderr, and runs until SIGINT or SIGTERM.

A lineage question imports only what answering it needs, when it needs it: nothing heavy
at import time here (``bench/cli_latency.py`` measures whole processes against 0.3 s).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from headwater.core import config as configuration

if TYPE_CHECKING:
    from headwater.query.api import LineageClient

# The query tier's own backends (``headwater.query.api.choices()``), named here so the CLI starts without importing
# them; another package's are found by their entry points' names (``_Backend``).
BACKENDS = ["auto", "cypher", "csprov", "rq"]
BACKEND_ENTRY_POINTS = "headwater.backends"  # ``headwater.query.backend.ENTRY_POINTS``
# ``query.address.SOURCE_FORMS``, which would import the query tier to print --help.
SOURCE_FORMS = ("kafka:TOPIC:PARTITION:OFFSET, table:NAME:KEY, file:PATH:POSITION, rate:VALUE or "
                "foreachBatch:QUERY:BATCH")
FORMATS = ["json", "table"]
PAYLOAD_SHOWN = 80  # characters of a payload a table shows; --format json has it whole


def _home(ctx: click.Context) -> Path:
    return ctx.obj["home"]


def _config(ctx: click.Context):
    """The effective config (``core.config.load``); an unreadable or invalid one is an error."""
    try:
        return configuration.load(_home(ctx))
    except (OSError, ValueError) as exc:
        _fail(f"cannot read headwater's config (home {_home(ctx)}): {type(exc).__name__}: {exc}",
              home=str(_home(ctx)))


def _emit(record: dict) -> None:
    click.echo(json.dumps(record, default=str))


def _fail(message: str, code: int = 2, **details) -> NoReturn:
    click.echo(json.dumps({"error": message, **details}, default=str), err=True)
    sys.exit(code)


class _Cli(click.Group):
    """The root command: every error is one JSON line on stderr and exit status 2, click's usage errors too.

    click runs non-standalone, so its errors come here instead of its own text on stderr.
    """

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        del standalone_mode  # asked for or not: the errors are this method's to print
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.UsageError as exc:
            message, details = exc.format_message(), {}
            if exc.ctx is not None:
                details = {"usage": exc.ctx.get_usage().removeprefix("Usage: "),
                           "help": f"{exc.ctx.command_path} --help"}
                group = exc.ctx.command
                if isinstance(group, click.Group) and (isinstance(exc, click.exceptions.NoArgsIsHelpError)
                                                       or message == "Missing command."):
                    details["commands"] = sorted(group.commands)
                    message = f"{exc.ctx.command_path}: give a command, one of {', '.join(details['commands'])}"
            param = getattr(exc, "param", None)
            option = param.opts[0] if param is not None and getattr(param, "opts", None) else \
                getattr(exc, "param_hint", None)
            if isinstance(option, str):
                details["option"] = option
            _fail(message, **details)
        except click.ClickException as exc:
            _fail(exc.format_message())
        except click.Abort:
            _fail("interrupted")
        except Exception as exc:  # a bug, or a failure no command caught: still one line
            _fail(f"{type(exc).__name__}: {exc}")
        sys.exit(code if isinstance(code, int) else 0)


@click.group(cls=_Cli)
@click.option("--home", type=click.Path(path_type=Path), default=None,
              help="State folder of the local stack (default $HEADWATER_HOME or ~/.headwater).")
@click.pass_context
def main(ctx: click.Context, home: Path | None) -> None:
    """headwater: row-level lineage for Spark Structured Streaming."""
    ctx.obj = {"home": (home or configuration.default_home()).resolve()}


@main.group()
def stack() -> None:
    """The embedded local stack: Apache Kafka, Neo4j and the query service on 127.0.0.1."""


@stack.command("up")
@click.option("--broker-port", type=int, default=9092, show_default=True)
@click.option("--controller-port", type=int, default=0, show_default=True,
              help="Kafka's KRaft controller port (the node's own); 0: any free port, kept across ups.")
@click.option("--bolt-port", type=int, default=7687, show_default=True)
@click.option("--http-port", type=int, default=7474, show_default=True, help="Neo4j's HTTP port.")
@click.option("--query-port", type=int, default=8080, show_default=True,
              help="The query part's port (headwater serve, which lineage questions are asked); 0: any free port.")
@click.pass_context
def stack_up(ctx: click.Context, broker_port: int, controller_port: int, bolt_port: int, http_port: int,
             query_port: int) -> None:
    """Start what is not running and wait until each part answers."""
    from headwater.deploy.stack import Stack, StackError

    ports = {"broker": broker_port, "controller": controller_port, "bolt": bolt_port, "graph_http": http_port,
             "query": query_port}
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
@click.option("--max-seconds", type=float, default=None,
              help="Stop after this long in any case; with --drain, exit 1 if not caught up by then.")
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
    config = _config(ctx)
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
    tracer runs (executors on other hosts). It sends only the lineage of its own destination (the
    broker and edges topic of its settings), from that destination's folder under the spill folder,
    and names the other destinations that have lineage waiting there. One drain runs per folder: a
    second exits at once.
    """
    from headwater.capture.delivery import DeliverySettings, Spill, destinations, spill_root
    from headwater.capture.journal import drain_until_idle
    from headwater.core import config as configuration

    config = configuration.load()
    settings = DeliverySettings.of(config)
    drained = drain_until_idle(settings, config.edges_topic, idle_s=idle)
    result = {"drained": drained, "folder": settings.spill_dir}
    if not drained:
        result["reason"] = "another drain holds the folder"
    root = spill_root(config)
    waiting = []
    for key, described in sorted(destinations(root).items()):
        if key == settings.destination:
            continue
        spill = Spill(Path(root) / key, config.spill_max_bytes)
        files = spill.waiting()
        if files:
            waiting.append({**described, "folder": str(spill.folder), "files": files})
    if waiting:
        result["others_waiting"] = waiting  # lineage of other jobs: a drain with their settings sends it
    left = Spill(settings.spill_dir, config.spill_max_bytes).waiting() if drained else 0
    if left:
        from headwater.adapters.kafka import diagnose

        _fail(f"{left} file(s) of lineage wait unsent in {settings.spill_dir}, kept for the next drain: "
              f"{diagnose(config)}", 2, **result)
    _emit(result)


@main.command("compact")
@click.option("--threshold", type=int, default=None, help="Most rows a connected set holds (default 100,000).")
@click.option("--buckets", type=int, default=None, help="Edge buckets of the generation (default 64).")
@click.option("--components", metavar="ALGORITHM", default=None,
              help="How connected components are found: large-star (the default) or graphx (indexer/README.md).")
@click.pass_context
def compact(ctx: click.Context, threshold: int | None, buckets: int | None, components: str | None) -> None:
    """Recompute the connected sets of the store on Spark and switch to them (a new generation)."""
    from pyspark.sql import SparkSession

    from headwater.adapters.spark import spark_session
    from headwater.indexer import compaction

    config = _config(ctx)
    if threshold is not None and threshold < 1 or buckets is not None and buckets < 1:
        _fail("--threshold and --buckets must be at least 1")
    try:
        compaction.components_algorithm(components or compaction.DEFAULT_COMPONENTS)  # before Spark starts
    except ValueError as exc:
        _fail(str(exc))
    running = SparkSession.getActiveSession()  # a caller's session is used, and left running
    spark = running or spark_session("headwater-compact")
    # Those given: compact's defaults stand for the others.
    options: dict[str, Any] = {k: v for k, v in (("threshold", threshold), ("buckets", buckets),
                                                 ("components", components)) if v is not None}
    try:
        manifest = compaction.compact(spark, config.store_uri(), config.edges_topic,
                                      say=lambda s: click.echo(s, err=True), **options)
    except (compaction.CompactionBusy, ValueError) as exc:
        _fail(str(exc))
    finally:
        if running is None:
            spark.stop()
    _emit({k: v for k, v in manifest.items() if k != "took"})


@main.group("store")
def store() -> None:
    """The store's tables."""


@store.command("migrate")
@click.option("--from", "old", required=True, type=click.Path(path_type=Path, exists=True, file_okay=False),
              help="The store folder of the layout before the lineage tables (a store_dir of release 0.1).")
@click.pass_context
def store_migrate(ctx: click.Context, old: Path) -> None:
    """Read a store of the folder layout into the store's tables (store_dir: a folder or s3://bucket/prefix)."""
    from headwater.store.migrate import migrate

    config = _config(ctx)
    if Path(old).absolute() == Path(config.store_uri()).absolute():
        _fail(f"--from {old} is the store itself: migrate into another store_dir, then point the services at it")
    try:
        counts = migrate(old, config.store_uri(), config.edges_topic, config.log_topic,
                         say=lambda s: click.echo(s, err=True))
    except ValueError as exc:
        _fail(str(exc))
    _emit({"migrated": str(old), "into": config.store_uri(), **counts})


@main.command("narrow")
@click.option("--query", "query", default=None, help="The traced query's name.")
@click.option("--op", type=int, default=None, help="The black box's plan node id (an answer's ops, or its operators).")
@click.option("--batch", "batches", type=int, multiple=True, help="A batch to narrow (repeatable).")
@click.option("--follow", is_flag=True,
              help="Narrow every black-box batch the batch log holds, oldest first, then each new one soon after it "
                   "is indexed, until SIGINT or SIGTERM (what the stack and the Helm chart run).")
@click.option("--once", is_flag=True, help="With --follow: narrow what waits now, then exit.")
@click.option("--metrics-port", type=int, default=0, show_default=True,
              help="With --follow: serve /metrics (headwater_narrowing_*) and /healthz at this port, on the "
                   "metrics_host setting's address; 0: none.")
@click.pass_context
def narrow(ctx: click.Context, query: str | None, op: int | None, batches: tuple[int, ...], follow: bool, once: bool,
           metrics_port: int) -> None:
    """Narrow black boxes' batches by re-running their functions (query/README.md): the batches given, now, one
    line each; or, with --follow, every one ahead of the questions."""
    from headwater.query.errors import LineageError

    if follow:
        if query is not None or op is not None or batches:
            _fail("--follow narrows every black-box batch: give it no --query, --op or --batch")
        _follow(_config(ctx), once, metrics_port)
        return
    if once or metrics_port:
        _fail("--once and --metrics-port go with --follow")
    if query is None or op is None or not batches:
        _fail("give --query, --op and at least one --batch, or --follow")
    from headwater.query.api import LineageClient

    with LineageClient(_config(ctx)) as client:
        for batch in batches:
            try:
                _emit(client.narrow(query, op, batch))
            except LineageError as exc:
                _fail(str(exc), query=query, op=op, batch=batch)


def _follow(config, once: bool, metrics_port: int) -> None:
    import signal
    import threading

    from headwater.adapters import health_http
    from headwater.query.errors import LineageError
    from headwater.query.narrow.follow import Follower

    try:
        follower = Follower(config, say=lambda s: click.echo(s, err=True))
    except LineageError as exc:
        _fail(str(exc))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        server = health_http.serve(config.metrics_host, metrics_port, lambda: {}) if metrics_port else None
    except OSError as exc:
        follower.close()
        _fail(str(exc))
    narrowed, waiting = 0, 0
    try:
        if once:
            narrowed = follower.once()
            waiting = len(follower.waiting())
        else:
            click.echo("narrowing black-box batches ahead of the questions (Ctrl-C to stop)", err=True)
            follower.run(stop)
    except KeyboardInterrupt:
        pass
    finally:
        if server is not None:
            server.shutdown()
        follower.close()
    _emit({"narrowed": narrowed, "waiting": waiting} if once else {"stopped": True})


@main.group()
def lineage() -> None:
    """Lineage queries, answered as JSON lines (or a table: --format table)."""


def _query(ctx: click.Context, question: str, rid: int | None, source: str | None, dataset: str | None,
           where: str | None, backend: str, fmt: str, in_process: bool, **options) -> None:
    given = [name for name, value in (("--rid", rid), ("--source", source), ("--dataset", dataset))
             if value is not None]
    if len(given) != 1:
        _fail("give exactly one of --rid, --source or --dataset (with --where)"
              + (f", not {' and '.join(given)}" if given else ""))
    if (dataset is None) != (where is None):
        _fail("--dataset and --where go together: the sink, and a SQL predicate over its rows")
    from headwater.query.errors import LineageError
    from headwater.query.question import Question

    try:  # checked here, in the words of every route a question may take (the service's, in-process)
        Question(question, source if source is not None else rid if rid is not None else 0, options)
    except LineageError as exc:
        _fail(str(exc))
    service = None if in_process else _Service.of(_home(ctx))
    if service is None or dataset is not None:
        try:
            if source is not None:  # the service checks an address itself, in the same words
                from headwater.query.address import checked_source

                checked_source(source)
            chosen = None
            if dataset is not None and where is not None:  # they go together (above)
                from headwater.query import where as selection

                chosen = selection.check(dataset, where)  # refused here, before any file is read or JVM starts
        except LineageError as exc:
            _fail(str(exc), **getattr(exc, "details", {}))
    config = _config(ctx)
    failed = shown = 0
    with _Answers(config, backend, service) as answers:
        # An address is turned into a rid by the client: a static table's rows are named by where it lives.
        starts = [rid] if rid is not None else [source] if source is not None else answers.selected(chosen)
        for start in starts:
            found = answers.ask(question, start, options, alone=len(starts) == 1)
            if found is None:
                failed += 1  # one of the rows --where selected, not in the store: said, the others answered
                continue
            records, summary = found
            if fmt == "table":
                if shown:
                    click.echo()
                click.echo(_table(question, options.get("to"), records, summary))
                shown += 1
                continue
            for record in records:
                _emit(record)
            # What the answer may miss, apart from the records, so that stdout stays one record a line.
            click.echo(json.dumps({"summary": summary}), err=True)
    if failed:
        sys.exit(2)


class _Answers:
    """Answers a lineage question from the stack's query part when it runs (``_Service``), else in-process.

    In-process means importing the query tier and the store clients, most of a second before a
    question is asked; the query part has them loaded. Its answer is used only where it is the one
    in-process gives: the in-process path is made on first need, for a question the service cannot
    answer in full (``_Service.ask``: None).
    """

    def __init__(self, config, backend: str, service: "_Service | None"):
        self.config, self.backend, self.service = config, backend, service
        self._client: LineageClient | None = None

    def __enter__(self) -> "_Answers":
        return self

    def __exit__(self, *exc) -> None:
        if self._client is not None:
            self._finish_narrowing(self._client)
            self._client.close()

    @staticmethod
    def _finish_narrowing(client: "LineageClient") -> None:
        """The narrowings the answers started (they said ``pending``), run to their end before the process
        exits, so that the next question finds them; said on stderr, the answers already printed."""
        narrower = client._narrower
        under_way = narrower.under_way() if narrower is not None else []
        if narrower is None or not under_way:
            return
        click.echo(f"narrowing {len(under_way)} black-box batch(es) by re-execution for the next questions "
                   f"(Ctrl-C leaves it to a later question or to headwater narrow --follow)", err=True)
        try:
            narrower.wait()
        except KeyboardInterrupt:
            click.echo("narrowing stopped", err=True)

    def _fail(self, exc: Exception) -> NoReturn:
        from headwater.adapters.graph import GraphUnavailable
        from headwater.query.errors import LineageError

        if isinstance(exc, (LineageError, GraphUnavailable)):
            _fail(str(exc), **getattr(exc, "details", {}))
        _fail(f"{type(exc).__name__}: {exc}")  # e.g. the graph store is down

    def selected(self, chosen) -> list[int]:
        try:
            return chosen.select().rids
        except Exception as exc:
            self._fail(exc)

    def ask(self, question: str, start: int | str, options: dict, alone: bool) -> tuple[list[dict], dict] | None:
        """``(records, summary)``; None for an unknown row not ``alone`` in the question (said on stderr)."""
        if self.service is not None:
            try:
                found = self.service.ask(question, start, self.backend, options)
            except _Refused as exc:
                if exc.unknown and not alone:
                    click.echo(json.dumps({"of": start, "error": exc.message}), err=True)
                    return None
                _fail(exc.message)
            if found is not None:
                return found
        try:
            from headwater.query.errors import UnknownRow

            if self._client is None:
                from headwater.query.api import LineageClient

                self._client = LineageClient(self.config, backend=self.backend)
            try:
                answer = getattr(self._client, question)(start, **options)
            except UnknownRow as exc:
                if alone:
                    raise
                click.echo(json.dumps({"of": start, "error": str(exc)}), err=True)
                return None
            return [row.to_dict() for row in answer], answer.summary()
        except Exception as exc:
            self._fail(exc)


class _Refused(Exception):
    """The query part refused the question (400), or does not know the row (404, ``unknown``)."""

    def __init__(self, message: str, unknown: bool):
        super().__init__(message)
        self.message, self.unknown = message, unknown


class _Service:
    """The local stack's query part (``headwater serve`` on 127.0.0.1, ``stack up``), asked over HTTP.

    Only the standard library is imported to ask it: that is what makes a question fast.
    """

    TIMEOUT_S = 60.0
    PATHS = {"backward": "backward", "forward": "forward", "co_contributors": "co-contributors",
             "co_dependents": "co-dependents"}

    def __init__(self, url: str, token: str):
        self.url, self.token = url, token

    @classmethod
    def of(cls, home: Path) -> "_Service | None":
        """The query part of the stack of ``home``, if it runs on the config this process would use."""
        from headwater.deploy.stack import query_service

        try:
            config = configuration.load(home)
        except (OSError, ValueError):
            return None  # the in-process path says what is wrong with it
        found = query_service(home, config.to_dict())
        return cls(*found) if found is not None else None

    @staticmethod
    def parameters(start: int | str, backend: str, options: dict) -> dict:
        """The question, checked already (``question.Question``), as the service's query string takes it."""
        found = {"source" if isinstance(start, str) else "rid": start, "backend": backend}
        for name, value in options.items():
            if value is not None:
                found[name] = ("true" if value else "false") if isinstance(value, bool) else value
        return found

    def ask(self, question: str, start: int | str, backend: str, options: dict) -> tuple[list[dict], dict] | None:
        """``(records, summary)`` as in-process gives them; ``_Refused``; None when the service cannot answer in
        full: not there, busy (503), cut short (``truncated``: the server's --max-results) or any other status."""
        import http.client  # not urllib.request: a fifth of the 0.3 s bar to import, for one GET on 127.0.0.1
        from urllib.parse import urlencode, urlsplit

        parameters = self.parameters(start, backend, options)
        where = urlsplit(self.url)
        if where.hostname is None:  # a stack state file's URL that names no host: in-process answers
            return None
        connection = http.client.HTTPConnection(where.hostname, where.port, timeout=self.TIMEOUT_S)  # never a proxy
        try:
            connection.request("GET", f"/v1/lineage/{self.PATHS[question]}?{urlencode(parameters)}",
                               headers={"Authorization": f"Bearer {self.token}"})
            reply = connection.getresponse()
            status, data = reply.status, reply.read()
        except (OSError, http.client.HTTPException):  # refused, reset, timed out, not HTTP
            return None
        finally:
            connection.close()
        if status in (400, 404):
            try:
                message = json.loads(data)["error"]
            except (ValueError, KeyError, TypeError):
                return None
            raise _Refused(message, unknown=status == 404)
        try:
            body = json.loads(data) if status == 200 else None
        except ValueError:
            return None
        if body is None:  # busy (503) or any other status
            return None
        if body.get("truncated") is not False:
            return None
        records = body["answer"]
        return records, {"of": body["of"], "records": len(records), "complete": body["complete"],
                         "gaps": body["gaps"], "unexplained": body["unexplained"], "read_by": body["read_by"]}


def _table(question: str, to: str | None, records: list[dict], summary: dict) -> str:
    """An answer for a person: a heading, a row per record, and what the answer may miss, in words."""
    heading = f"{question.replace('_', '-')} lineage of rid {summary['of']}" + (f" (to {to})" if to else "")
    columns = ["rid", "kind", "dataset", "row", "exact", "via", "operators", "columns", "batches"]
    if any("payload" in r for r in records):
        columns.append("payload")
    if any(r.get("paths") is not None for r in records):
        columns.append("paths")
    cells = [[_cell(column, record) for column in columns] for record in records]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = [heading, ""] if records else [heading]
    if records:
        lines.append("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths)).rstrip())
        lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in cells]
        lines.append("")
    lines.append(_in_words(summary))
    return "\n".join(lines)


def _cell(column: str, record: dict) -> str:
    if column == "row":
        if record.get("topic") is not None:
            text = f"{record['topic']}:{record.get('partition')}:{record.get('offset')}"
        elif record.get("key") is not None:
            text = f"key {record['key']}"
        elif record.get("path") is not None:
            text = f"{record['path']}:{record.get('position')}"
        else:
            text = ""
        return text + (f" ({record['table']})" if record.get("table") else "")
    if column == "exact":
        return "exact" if record.get("exact") else "superset"
    if column == "operators":
        named = record.get("operators")
        if named is not None:
            return ", ".join(op.get("name") or op.get("kind") or str(op.get("id")) for op in named)
        return ", ".join(f"#{op}" for op in record.get("ops") or [])
    if column == "columns":
        if record.get("columns") is not None:
            return ", ".join(record["columns"])
        cols = record.get("cols")
        if cols is None:
            return ""
        return "all" if cols == -1 else "bits " + ",".join(str(i) for i in range(cols.bit_length()) if cols >> i & 1)
    if column == "batches":
        return ", ".join(str(b) for b in record.get("batches") or [])
    if column == "payload":
        if "payload" not in record:
            return ""
        text = json.dumps(record["payload"], default=str, ensure_ascii=False)
        return text if len(text) <= PAYLOAD_SHOWN else text[:PAYLOAD_SHOWN - 1] + "…"
    if column == "paths":
        paths = record.get("paths")
        return "" if paths is None else f"{len(paths)}{'+' if record.get('paths_cut') else ''}"
    value = record.get(column)
    return "" if value is None else str(value).replace("\n", "\\n")


def _batches(items: list[dict]) -> str:
    return ", ".join(f"{g['query']} batch {g['batch']}" + (f" ({g['status'] or 'not in the batch log'})"
                                                          if "status" in g else "") for g in items)


def _in_words(summary: dict) -> str:
    count = summary.get("records", 0)
    said = [f"{count} record{'s' if count != 1 else ''}."]
    if summary.get("complete"):
        said.append("Complete: every batch on the way was fully captured.")
    else:
        said.append("Not complete.")
    gaps = summary.get("gaps") or []
    if gaps:
        several = len(gaps) != 1
        said.append(f"{len(gaps)} batch{'es' if several else ''} on the way {'were' if several else 'was'} "
                    f"not fully captured, so rows may be missing through {'them' if several else 'it'}: "
                    f"{_batches(gaps)}.")
    unexplained = summary.get("unexplained") or []
    if unexplained:
        rows = ", ".join(f"rid {u.get('rid')} ({u.get('kind')} of {u.get('dataset')})" for u in unexplained)
        said.append(f"{len(unexplained)} row{'s' if len(unexplained) != 1 else ''} reached "
                    f"{'have' if len(unexplained) != 1 else 'has'} no recorded inputs (its batch was not captured, "
                    f"or is not indexed yet): {rows}.")
    for n in summary.get("narrowed") or []:
        how = f"narrowed by re-running it ({n.get('kind')}{', exact' if n.get('exact') else ''})" \
            if n.get("kind") not in ("superset", "pending") else f"not narrowed: {n.get('reason')}"
        superset = n.get("superset")
        if superset:
            read = ", ".join(f"{r['topic']}:{r['partition']} offsets {r['from']} to {r['to'] - 1}"
                             for r in superset.get("read") or [])
            how += (f"; its {superset.get('rows_read'):,} rows read are not listed" + (f" ({read})" if read else "")
                    + (f", tables {', '.join(superset['tables'])}" if superset.get("tables") else ""))
        said.append(f"Black box {n.get('op')} of {n.get('query')}, batch {n.get('batch')}: {how}.")
    read_by = summary.get("read_by") or []
    if read_by:
        said.append(f"Read by {len(read_by)} fully captured batch{'es' if len(read_by) != 1 else ''} that derived "
                    f"nothing from it (filtered, unmatched, late or waiting in state): {_batches(read_by)}.")
    return " ".join(said)


class _Backend(click.Choice):
    """A backend's name: the query tier's own, or one another package registers (its entry point's name)."""

    def __init__(self):
        super().__init__(BACKENDS)

    def convert(self, value, param, ctx):
        if value not in self.choices:
            from importlib.metadata import entry_points

            self.choices = [*BACKENDS, *sorted(p.name for p in entry_points(group=BACKEND_ENTRY_POINTS))]
        return super().convert(value, param, ctx)


class _Option(click.ParamType):
    """A question's option read from its text as every route reads it (``question.READS``), its errors a usage
    error's."""

    def __init__(self, name: str):
        self.name = name

    def convert(self, value, param, ctx):
        from headwater.query import question
        from headwater.query.errors import LineageError

        try:
            return question.READS[self.name](value) if isinstance(value, str) else question.CHECKS[self.name](value)
        except LineageError as exc:
            self.fail(str(exc), param, ctx)


_ROW_OPTIONS = [
    click.option("--rid", type=int, default=None, help="rid of the row (e.g. a sink's _hw_rid)."),
    click.option("--source", default=None, help=f"The row's address: {SOURCE_FORMS}."),
    click.option("--dataset", default=None, help="A sink as lineage names it (parquet:PATH, json:PATH, orc:PATH, "
                 "table:NAME): ask about its rows --where selects."),
    click.option("--where", default=None, help="With --dataset: a Spark SQL predicate over the sink's columns "
                 "(evaluated without Spark where it can; query/README.md says when Spark is needed)."),
    click.option("--depth", type=_Option("depth"), default=16, show_default=True,
                 help="Longest path followed, in edges (each way)."),
    click.option("--payload", is_flag=True, help="Add the original source records."),
    click.option("--since", type=_Option("since"), default=None,
                 help="Time bound: only through batches that ran at or after this ISO 8601 time (e.g. "
                      "2026-11-23T18:00:00Z)."),
    click.option("--until", type=_Option("until"), default=None,
                 help="Time bound: only through batches that ran at or before this time."),
    click.option("--backend", type=_Backend(), default="auto", show_default=True,
                 help="The graph store (cypher), the Parquet store by connected sets (csprov) or whole (rq), or "
                      "the graph when it answers and holds the row, else the Parquet store (auto)."),
    click.option("--format", "fmt", type=click.Choice(FORMATS), default="json", show_default=True,
                 help="json: a record a line on stdout, a summary line on stderr; table: a table and the summary "
                      f"in words, for a person (payloads cut at {PAYLOAD_SHOWN} characters)."),
    click.option("--in-process", is_flag=True, help="Answer in this process even when the local stack's query "
                 "part runs (which is asked by default: it answers the same, faster)."),
]


def _lineage_command(question: str, name: str, defaults: dict, summary: str) -> None:
    def command(ctx, rid, source, dataset, where, backend, fmt, in_process, **options) -> None:
        _query(ctx, question, rid, source, dataset, where, backend, fmt, in_process, **options)

    command.__doc__ = summary
    for option in reversed(_ROW_OPTIONS):
        command = option(command)
    command = click.option("--to", default=defaults["to"], show_default=True,
                           help="The rows answered: source, state or output, or a dataset name.")(command)
    if "via" in defaults:
        command = click.option("--via", default=defaults["via"], show_default=True,
                               help="The rows in between: source, state or output, or a dataset name.")(command)
    else:
        command = click.option("--cols", type=_Option("cols"), default=None,
                               help="Attribute level: a bit mask of the columns of the row asked about (backward) "
                                    "or of the rows answered (forward).")(command)
        command = click.option("--paths", type=_Option("paths"), default=0, show_default=True,
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
@click.option("--backend", type=_Backend(), default="auto", show_default=True,
              help="The backend of questions that name none (backend=).")
@click.option("--token-file", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="File holding the bearer token every /v1 and /openapi.json request must give "
                   "(default $HEADWATER_HTTP_TOKEN; neither: no token, loopback only).")
@click.option("--max-results", type=click.IntRange(min=1), default=10_000, show_default=True,
              help="Rows of an answer at most; longer answers are cut (truncated: true).")
@click.option("--max-concurrent", type=click.IntRange(min=1), default=2, show_default=True,  # http.MAX_CONCURRENT
              help="Queries answered at once; up to 16 more wait their turn for at most 2 s, the rest get 503 with "
                   "Retry-After.")
@click.option("--warm-graph/--no-warm-graph", default=True, show_default=True,
              help="Read the whole graph once as soon as it answers, into the graph server's page cache (size it "
                   "to the store: deploy/README.md).")
@click.pass_context
def serve(ctx: click.Context, host: str, port: int, backend: str, token_file: Path | None, max_results: int,
          max_concurrent: int, warm_graph: bool) -> None:
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
        server = http.serve(_config(ctx), host, port, backend, token, max_results, max_concurrent,
                            say=lambda s: click.echo(s, err=True), warm_graph=warm_graph)
    except (http.ServeError, OSError) as exc:
        _fail(str(exc))
    _emit({"serving": server.url, "openapi": f"{server.url}/openapi.json"})
    stop.wait()
    server.close()


@main.command("demo")
@click.option("--orders", type=int, default=1000, show_default=True)
@click.option("--keep-stack/--stop-stack", default=True, show_default=True,
              help="Leave the stack running afterwards for your own queries.")
@click.option("--topic", default=None, help="The Kafka topic of the orders, one that does not exist yet "
              "(default: orders-<time>). A Kafka record's rid hashes its topic: two runs into topics of the same "
              "name answer with the same rids.")
@click.pass_context
def demo(ctx: click.Context, orders: int, keep_stack: bool, topic: str | None) -> None:
    """Run the demo end to end on the embedded local stack and print a lineage answer."""
    from headwater.demo.run import run

    try:
        run(_home(ctx), orders=orders, keep_stack=keep_stack, say=lambda s: click.echo(s), topic=topic)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None


if __name__ == "__main__":
    main()
