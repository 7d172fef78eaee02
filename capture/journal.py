"""The write-ahead journal between the stream and the broker: tasks never wait for either Python or Kafka.

In the hot path, a filter that keeps every row (``jar.Journals``, the JVM class ``Journal.java``) hands
each publisher's narrow lineage columns (rids and coordinates, never the user's columns) to the JVM,
which writes them, one file per task, to the host's journal folder (``spill_dir``): ``*.rows``, the
publisher's spec, the batch's ``Setting`` and an Arrow IPC stream. Late rows and rows outside a
sampled batch's sample are left out there, and the edges counted, so the batch's capture record is
exact when the batch ends.

The drain (``Drain``, in the tracer's own thread; ``headwater drain`` on other hosts) turns each
file into lineage payloads (``convert``: ``lineage.lineage_tables`` per the publisher's ``Group``s) and
sends them through a ``delivery.Delivery``: what the broker does not take is spilled as ``*.msg`` files
and sent once it answers again. A file is claimed by renaming before it is read and deleted only once
all its payloads are sent or spilled, so a drain that dies leaves it for the next (``Spill.release_stale``
gives back a dead drain's claims); a payload may go out twice, which is harmless (rids and edges are
idempotent).

A publisher is one kind of lineage a traced query journals: the rows it writes to its sink
(``outputs``), the rows entering one of its stateful aggregates, or a black box, or its user's
foreachBatch code. Its spec is plain JSON, written at the head of each of its files, so a drain
anywhere converts any file without the query's plan.

A journal file belongs to its job: it is written into the folder of the tracer's destination (broker
and edges topic, ``delivery.Destination``) under the host's spill root, and its spec names that
destination and the tracer that wrote it (``Publisher.destination``, ``writer``). A drain converts only
its own destination's files; one of another destination is moved to that one's folder, unsent.
"""

from __future__ import annotations

import io
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headwater.core import rid as rids
from headwater.core.schema import encode_lineage

from .delivery import Delivery, DeliverySettings, Destination, Spill
from .lineage import BatchContext, SourceEdges, lineage_tables, state_rids

log = logging.getLogger("headwater.capture")

PROPERTY = "headwater.journal"  # the Spark local property holding the batch's ``Setting``, as JSON
NOT_CAPTURED = "none"  # PROPERTY of a batch whose edges are not captured: its filters journal nothing (as Journal.java)
ROWS = ".rows"
SAMPLE_MODULUS = 1_000_003  # a rid is sampled when pmod(rid, SAMPLE_MODULUS) < fraction * SAMPLE_MODULUS
MAX_ROWS_PER_MESSAGE = 20_000
# Under Kafka's default message.max.bytes (1 MiB, the broker's and each topic's): 20,000 rows of a black box's
# output with its payload columns made 1.3 MB messages, which the broker refused, so they stayed spilled.
MAX_MESSAGE_BYTES = 900_000
STALE_TEMPORARY_S = 3600.0  # a task's unfinished file older than this was left by a task that died


@dataclass(frozen=True)
class Setting:
    """What the tasks of one batch need to journal lineage, set by the per-batch hook."""

    batch: int
    run: int | None  # ``rid.run_hash`` of Spark's query id: state keys belong to it
    fraction: float | None  # sampled: the fraction of rids whose edges are journaled; None: every one
    late: dict[str, int | None]  # by aggregate node id: rows with a watermark column at or before this are late

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @staticmethod
    def from_json(text: str) -> "Setting":
        return Setting(**json.loads(text))


@dataclass(frozen=True)
class Group:
    """Edges into one kind of row: from the sources of ``template`` to the rid ``dst`` names.

    ``dst`` is a field of the journaled rows: the rid itself, or (``state_key``) a state key whose
    node's rid depends on the run; or, with ``node`` set, the edges end at a node of that operator
    that is one per batch, or (``stateful``) one for all batches.
    """

    template: BatchContext  # its batch and run are each file's
    dst: str | None = None
    state_key: bool = False
    node: int | None = None
    stateful: bool = False

    def context(self, setting: Setting) -> BatchContext:
        template = self.template
        sources = tuple(s.in_batch(template.query, setting.batch) for s in template.sources)
        return replace(template, batch=setting.batch, run=setting.run, sources=sources)

    def destinations(self, rows: pa.RecordBatch, ctx: BatchContext) -> pa.Array:
        if self.node is not None:
            rid = rids.state_rid(ctx.query, self.node, None if self.stateful else ctx.batch)
            return pa.repeat(pa.scalar(rid, pa.int64()), rows.num_rows)
        values = rows.column(self.dst)
        return state_rids(values, ctx.run) if self.state_key else values

    def to_dict(self) -> dict:
        return {**asdict(self), "template": {**asdict(self.template),
                                             "sources": [asdict(s) for s in self.template.sources]}}

    @staticmethod
    def from_dict(data: dict) -> "Group":
        template = dict(data["template"])
        template["sources"] = tuple(SourceEdges(**s) for s in template["sources"])
        return Group(**{**data, "template": BatchContext(**template)})


@dataclass(frozen=True)
class Publisher:
    """What one publisher journals: its rows' ``fields`` (in order) and the edges they make.

    ``mode`` says how a sampled batch is sampled: ``row`` by the rid in field 0 (the row's own),
    ``input`` each input field by its own rid. ``inputs`` are the fields holding the sources of
    edges; ``late`` a field by which rows of aggregate ``op`` are late (``Setting.late``).
    ``destination`` (a ``delivery.Destination.key``) and ``writer`` (the tracer) say whose lineage it is,
    as ``jar.Journals`` writes it into each file.
    """

    name: str
    query: str
    fields: tuple[str, ...]
    inputs: tuple[str, ...]
    groups: tuple[Group, ...]
    mode: str = "row"
    late: str | None = None
    op: int | None = None
    destination: str | None = None
    writer: str | None = None

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "groups": [g.to_dict() for g in self.groups]}, separators=(",", ":"))

    @staticmethod
    def from_json(text: str) -> "Publisher":
        data = json.loads(text)
        data["groups"] = tuple(Group.from_dict(g) for g in data["groups"])
        for name in ("fields", "inputs"):
            data[name] = tuple(data[name])
        return Publisher(**data)


def read(path: Path) -> tuple[Publisher, Setting, pa.Table]:
    """A journal file: its publisher, its batch's setting, its rows."""
    data = path.read_bytes()
    spec, setting, stream = data.split(b"\n", 2)
    with pa.ipc.open_stream(io.BytesIO(stream)) as reader:
        rows = reader.read_all()
    return Publisher.from_json(spec.decode()), Setting.from_json(setting.decode()), rows


def payloads(publisher: Publisher, setting: Setting, rows: pa.Table,
             max_rows: int = MAX_ROWS_PER_MESSAGE, max_bytes: int = MAX_MESSAGE_BYTES) -> Iterator[bytes]:
    """The lineage payloads of journaled rows, each of at most ``max_rows`` rows and ``max_bytes`` bytes (a
    part over it is halved until it fits; a row's lineage stays in one payload).

    In ``input`` mode an input the JVM left out of the sample is null, and a row none of whose
    inputs a group reads is present makes nothing of that group (not even its destination node).
    """
    for batch in rows.combine_chunks().to_batches(max_chunksize=max_rows):
        for group in publisher.groups:
            ctx = group.context(setting)
            sources = [s.column for s in ctx.sources]
            part = batch
            if publisher.mode == "input":
                present = None
                for column in sources:
                    valid = pc.is_valid(batch.column(column))
                    present = valid if present is None else pc.or_(present, valid)
                part = batch.filter(present)
            if part.num_rows:
                yield from _fitted(group, ctx, sources, part, max_bytes)


def _fitted(group, ctx, sources: list[str], part: pa.RecordBatch, max_bytes: int) -> Iterator[bytes]:
    """The payload of ``part``'s rows for one group, or of its halves while it is over ``max_bytes``."""
    columns = [group.destinations(part, ctx), *[part.column(c) for c in sources]]
    nodes, edges = lineage_tables(pa.RecordBatch.from_arrays(columns, names=["_hw_rid", *sources]), ctx)
    payload = encode_lineage(nodes, edges)
    if len(payload) <= max_bytes or part.num_rows == 1:
        yield payload
        return
    half = part.num_rows // 2
    yield from _fitted(group, ctx, sources, part.slice(0, half), max_bytes)
    yield from _fitted(group, ctx, sources, part.slice(half), max_bytes)


def messages(publisher: Publisher, setting: Setting, rows: pa.Table, topic: str) -> list[tuple[str, bytes, bytes]]:
    """Journaled rows' lineage as messages for the edges topic ``topic`` (keyed ``query/batch``)."""
    key = f"{publisher.query}/{setting.batch}".encode()
    return [(topic, key, payload) for payload in payloads(publisher, setting, rows)]


class Drain:
    """Turns the journal's files into payloads on the edges topic; one per process and folder.

    ``run_once`` claims the folder's ``*.rows`` files oldest first, converts and delivers each
    (``Delivery.deliver``: sent, or spilled as ``*.msg`` while the broker is away, past the folder's
    bound if need be), and deletes it;
    a file that cannot be read is moved aside as ``*.rows.bad`` (logged) rather than retried forever,
    and one of another destination to that destination's folder (``Spill.send_home``).
    """

    def __init__(self, settings: DeliverySettings, topic: str, on_sent=None):
        if settings.destination:
            destination = Destination(settings.bootstrap, topic)
            if destination.key != settings.destination:
                raise ValueError(f"a drain of {settings.destination}'s folder cannot send to topic {topic!r} "
                                 f"of {settings.bootstrap}")
            destination.describe(Path(settings.spill_dir))
        self.settings = settings
        self.topic = topic
        self.spill = Spill(settings.spill_dir, settings.spill_max_bytes, settings.destination)
        self.on_sent = on_sent  # (query, messages, payload bytes, seconds since journaled) per file
        self.delivery: Delivery | None = None

    def files(self) -> list[Path]:
        return self.spill.files(ROWS)

    def run_once(self, budget_s: float = 5.0) -> int:
        """Convert and deliver journal files for at most ``budget_s``; returns how many."""
        self._remove_stale_temporaries()
        self.spill.release_stale()
        deadline = time.monotonic() + budget_s
        done = 0
        for path in self.files():
            if time.monotonic() > deadline:
                break
            claimed = self.spill.claim_file(path)
            if claimed is None:
                continue
            journaled = claimed.stat().st_mtime
            try:
                publisher, setting, rows = read(claimed)
                owned = self.spill.owns(publisher.destination)
                sent = messages(publisher, setting, rows, self.topic) if owned else []
            except Exception:
                log.exception("journal file %s cannot be read; kept aside as %s.bad", path.name, path.name)
                os.replace(claimed, path.with_name(path.name + ".bad"))
                continue
            if not owned:
                assert publisher.destination  # a file of no destination is always the folder's own
                self.spill.send_home(claimed, publisher.destination)
                continue
            self.delivery = self.delivery or Delivery(self.settings)
            # Unbounded: what is not sent is spilled, since the file it replaces was counted in the bound.
            self.delivery.deliver(sent, bounded=False)
            claimed.unlink(missing_ok=True)
            done += 1
            if self.on_sent is not None:
                self.on_sent(publisher.query, len(sent), sum(len(m[2]) for m in sent), time.time() - journaled)
        return done

    def pending(self) -> int:
        """Journal files and spilled messages not yet sent."""
        return self.spill.waiting()

    def flush(self, timeout_s: float) -> bool:
        """Convert and send everything the folder holds, for at most ``timeout_s``; whether it is empty."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.run_once(budget_s=max(0.1, deadline - time.monotonic()))
            self.delivery = self.delivery or Delivery(self.settings)
            self.delivery.drain(budget_s=max(0.1, deadline - time.monotonic()))
            if not self.pending():
                return True
            time.sleep(0.1)
        return not self.pending()

    def close(self) -> None:
        if self.delivery is not None:
            self.delivery.close(timeout_s=self.settings.send_timeout_s)
            self.delivery = None

    def _remove_stale_temporaries(self) -> None:
        now = time.time()
        try:
            for path in self.spill.folder.glob(".*.tmp"):
                try:
                    if now - path.stat().st_mtime > STALE_TEMPORARY_S:
                        path.unlink(missing_ok=True)
                except FileNotFoundError:
                    pass
        except FileNotFoundError:
            pass


def sampled(rids_: np.ndarray, fraction: float) -> np.ndarray:
    """Whether rids are in a sample of ``fraction``, as ``Journal.sampled`` decides in the JVM: by rid,
    so a retried batch samples the same rows."""
    return np.mod(rids_, SAMPLE_MODULUS) < int(fraction * SAMPLE_MODULUS)


LOCK = "drain.lock"  # held by the one drain process of a folder (``drain_until_idle``); as Journal.DRAIN_LOCK
DRAIN_SETTINGS = ("bootstrap", "edges_topic", "spill_max_bytes", "buffer_bytes", "send_timeout_s",
                  "breaker_cooldown_s", "topic_partitions", "topic_replication", "kafka_security_protocol")
# Passed on when set, so that an executor's own environment (``spark.executorEnv``) can give them otherwise. The
# SASL password itself never is: the drain's settings travel in every task; give it as a file (``attach`` warns).
DRAIN_SETTINGS_IF_SET = ("kafka_sasl_mechanism", "kafka_sasl_username", "kafka_sasl_password_file",
                         "kafka_ssl_cafile", "kafka_ssl_certfile", "kafka_ssl_keyfile")


def drain_env(config) -> dict[str, str]:
    """The ``HEADWATER_*`` environment of a drain process started by an executor: the delivery settings
    of ``config`` (a ``core.config.Config``); the executor adds its own folder."""
    names = [*DRAIN_SETTINGS, *[name for name in DRAIN_SETTINGS_IF_SET if getattr(config, name)]]
    return {f"HEADWATER_{name.upper()}": str(getattr(config, name)) for name in names}


def drain_until_idle(settings: DeliverySettings, topic: str, idle_s: float = 60.0, every_s: float = 0.5) -> bool:
    """Drain the folder until it has held nothing for ``idle_s``, or nothing it holds could be sent for
    ``idle_s`` (the broker away or refusing: it stays, unsent); False at once if another drain
    process holds the folder's lock. For hosts where no tracer runs (``headwater drain``, started by
    an executor's journal filter or by hand). The lock is a POSIX record lock, as Java's
    ``FileChannel.tryLock`` takes it, so the executor's check and this agree."""
    import fcntl

    folder = Path(settings.spill_dir)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / LOCK, "a+") as lock:
        try:
            fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        lock.seek(0)
        lock.truncate()
        lock.write(str(os.getpid()))
        lock.flush()
        drain = Drain(settings, topic)
        idle_since = moved = time.monotonic()
        try:
            while time.monotonic() - idle_since < idle_s:
                waiting = drain.pending()
                if waiting:
                    drain.flush(timeout_s=settings.send_timeout_s)
                    idle_since = time.monotonic()
                    if drain.pending() < waiting:
                        moved = idle_since
                    elif idle_since - moved >= idle_s:  # nothing sent for that long: the broker refuses, or is away
                        break
                time.sleep(every_s)
        finally:
            drain.close()
    return True
