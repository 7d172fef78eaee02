"""Getting lineage to the broker without ever blocking the stream.

Every message capture publishes (lineage payloads from the executors, log records
from the driver) goes through a ``Delivery``: a kafka-python producer with a bounded
buffer, a circuit breaker, and a local spill folder.

- A message the broker does not acknowledge in time (unreachable, buffer full) is
  written to the spill folder instead, and the circuit breaker opens: for
  ``breaker_cooldown_s`` every process on the host spills at once instead of waiting
  for a broker that is away. The breaker is a file in the spill folder, so the
  driver and every Python worker share it.
- The spill folder holds at most ``spill_max_bytes``; a message that does not fit is
  dropped and counted, and its batch is logged as a gap.
- ``drain`` sends spilled messages once the broker answers again (the tracer's own thread).
  Delivery is at least once: a message may arrive twice (a timed-out send that landed after
  all), which is harmless because rids and edges are idempotent; none is lost unless it was
  counted as dropped.

The spill folder is also the journal the tasks write lineage rows to (``journal.py``): its
bound counts both kinds of file.

**One folder per destination.** ``spill_dir`` (by default the same for every job of a user on a host)
is a root: each destination, a broker and an edges topic (``Destination``), has a folder of its own
under it, named by the topic and a digest of both (``Destination.key``), with a ``destination.json``
that says what it is for (no secrets). Every delivery, drain, breaker and bound works in one
destination's folder, and every file names its destination too (a journal file's spec, a spilled
message's header), so lineage journaled for one job is never sent to another job's topic or broker:
a drain that meets a file of another destination moves it to that destination's folder unsent.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kafka import KafkaProducer
    from kafka.producer.future import FutureRecordMetadata

    from headwater.core.config import Config

log = logging.getLogger("headwater.capture")

SENT, SPILLED, DROPPED = "sent", "spilled", "dropped"
_SUFFIX = ".msg"
_JOURNALED = (".msg", ".rows")  # what the folder's bound counts: spilled messages, journaled lineage rows
_BREAKER = "breaker"
DESTINATION_FILE = "destination.json"
_counter = itertools.count()


@dataclass(frozen=True)
class Destination:
    """Where one job's lineage goes: the broker (its bootstrap servers) and the edges topic."""

    bootstrap: str
    edges_topic: str

    @property
    def key(self) -> str:
        """The name of this destination's folder under the spill root: the topic, then a digest of the
        broker's servers (in any order) and the topic, so two destinations never share a folder."""
        servers = ",".join(sorted({s.strip() for s in self.bootstrap.split(",") if s.strip()}))
        digest = hashlib.sha256(f"{servers}\n{self.edges_topic}".encode()).hexdigest()[:12]
        return f"{self.edges_topic[:100]}-{digest}"

    def folder(self, root: str | Path) -> Path:
        return Path(root) / self.key

    def describe(self, folder: Path) -> None:
        """Write ``destination.json`` into the destination's folder, once: what its files are for."""
        path = folder / DESTINATION_FILE
        if path.exists():
            return
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{DESTINATION_FILE}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps({"bootstrap": self.bootstrap, "edges_topic": self.edges_topic, "key": self.key}))
        os.replace(tmp, path)


def destinations(root: str | Path) -> dict[str, dict]:
    """The destination folders under a spill root, by key, with what each one's ``destination.json`` says."""
    found = {}
    try:
        for path in Path(root).glob(f"*/{DESTINATION_FILE}"):
            try:
                found[path.parent.name] = json.loads(path.read_text())
            except (OSError, ValueError):
                found[path.parent.name] = {}
    except FileNotFoundError:
        pass
    return found


@dataclass(frozen=True)
class DeliverySettings:
    """How capture delivers messages; picklable, so executors get the same settings."""

    bootstrap: str
    spill_dir: str  # the folder this delivery spills to: its destination's, for settings made ``of`` a config
    spill_max_bytes: int = 1 << 30
    buffer_bytes: int = 32 << 20  # unacknowledged bytes at most; beyond, wait send_timeout_s, then spill
    send_timeout_s: float = 10.0  # longest wait for the broker's acknowledgements, per flush
    breaker_cooldown_s: float = 5.0
    topic_partitions: int = 2  # for topics a returning broker lost (made again when probing)
    destination: str = ""  # the ``Destination.key`` of ``spill_dir``; "": a folder of no one destination
    # The ``core.config.Config`` the Kafka clients take their security settings and topic replication
    # from; None: the effective config's (``adapters.kafka.config_of``). Not shown: it holds secrets.
    config: Config | None = field(default=None, repr=False, compare=False)

    @staticmethod
    def of(config) -> "DeliverySettings":
        """The settings a ``core.config.Config`` gives: its destination's folder under the spill root
        (``spill_dir``, by default in headwater's home)."""
        destination = Destination(config.bootstrap, config.edges_topic)
        return DeliverySettings(
            config.bootstrap, str(destination.folder(spill_root(config))),
            spill_max_bytes=config.spill_max_bytes, buffer_bytes=config.buffer_bytes,
            send_timeout_s=config.send_timeout_s, breaker_cooldown_s=config.breaker_cooldown_s,
            topic_partitions=config.topic_partitions, destination=destination.key, config=config)

    @property
    def kafka(self):
        """What ``adapters.kafka`` makes this delivery's clients from."""
        return self.config if self.config is not None else self.bootstrap


def spill_root(config) -> str:
    """The spill root of a ``core.config.Config``: ``spill_dir``, else ``spill`` in headwater's home."""
    from headwater.core.config import default_home

    return config.spill_dir or str(default_home() / "spill")


class Breaker:
    """A circuit breaker shared through a file: while open, nobody waits for the broker.

    Once the cool-down is over, the first process to ask may try the broker (and the
    breaker stays open for everyone else meanwhile); its success closes the breaker,
    its failure opens it for another cool-down.
    """

    def __init__(self, folder: Path, cooldown_s: float):
        self.path = folder / _BREAKER
        self.cooldown_s = cooldown_s

    def _until(self) -> float | None:
        try:
            return float(self.path.read_text() or 0)
        except (OSError, ValueError):
            return None

    def is_open(self) -> bool:
        return self._until() is not None

    def allow(self) -> bool:
        """Whether this process may try the broker now: closed, or its turn to probe."""
        until = self._until()
        if until is None:
            return True
        if until > time.time():
            return False
        self.open()  # this process probes; the others wait one more cool-down
        return True

    def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{_BREAKER}-{os.getpid()}")
        tmp.write_text(repr(time.time() + self.cooldown_s))
        os.replace(tmp, self.path)

    def close(self) -> None:
        self.path.unlink(missing_ok=True)


class Spill:
    """A folder of messages waiting for the broker, oldest first, bounded in bytes.

    One file per message: a JSON header line (topic, key, and the ``destination`` key it was spilled
    for) and the value. Files are written under a temporary name and renamed, and claimed by renaming
    before they are sent, so concurrent writers and drainers never see half a message twice.
    """

    def __init__(self, folder: str | Path, max_bytes: int, destination: str = ""):
        self.folder = Path(folder)
        self.max_bytes = max_bytes
        self.destination = destination

    def files(self, suffix: str = _SUFFIX) -> list[Path]:
        """The folder's files of one kind, oldest first: spilled messages, or (``.rows``) journal files."""
        try:
            return sorted(p for p in self.folder.iterdir() if p.name.endswith(suffix))
        except FileNotFoundError:
            return []

    def waiting(self) -> int:
        """Files the folder holds that are not sent yet: spilled messages and journal files."""
        return sum(len(self.files(suffix)) for suffix in _JOURNALED)

    def size(self) -> int:
        """Bytes the folder holds: spilled messages and journaled lineage rows (as ``Journal.used``)."""
        total = 0
        try:
            entries = list(self.folder.iterdir())
        except FileNotFoundError:
            return 0
        for path in entries:
            if path.name.endswith(_JOURNALED):
                try:
                    total += path.stat().st_size
                except FileNotFoundError:
                    pass
        return total

    def put(self, topic: str, key: bytes | None, value: bytes, used: int | None = None,
            bounded: bool = True) -> int | None:
        """Spill one message; returns its size, or None when it does not fit (``used``: bytes already
        spilled). ``bounded=False`` spills it anyway: what it stands for was in the folder already."""
        header = json.dumps({"topic": topic, "key": None if key is None else key.decode("latin-1"),
                             "destination": self.destination}).encode() + b"\n"
        size = len(header) + len(value)
        if bounded and (self.size() if used is None else used) + size > self.max_bytes:
            return None
        self.folder.mkdir(parents=True, exist_ok=True)
        name = f"{time.time_ns():020d}-{os.getpid()}-{next(_counter):06d}"
        tmp = self.folder / f".{name}.tmp"
        with open(tmp, "wb") as f:
            f.write(header)
            f.write(value)
        os.replace(tmp, self.folder / f"{name}{_SUFFIX}")
        return size

    def claim_file(self, path: Path) -> Path | None:
        """Take one file of the folder for this process, by renaming it; None if another took it first."""
        claimed = path.with_name(f".{path.name}.{os.getpid()}.claimed")
        try:
            os.replace(path, claimed)
        except FileNotFoundError:
            return None
        return claimed

    def claim(self, path: Path) -> tuple[Path, str, bytes | None, bytes] | None:
        """Take one spilled message of this folder's destination for sending; None if another drainer
        took it first, or if it was spilled for another destination (moved to that one's folder)."""
        claimed = self.claim_file(path)
        if claimed is None:
            return None
        data = claimed.read_bytes()
        header, _, value = data.partition(b"\n")
        meta = json.loads(header)
        if not self.owns(meta.get("destination", "")):
            self.send_home(claimed, meta["destination"])
            return None
        key = None if meta["key"] is None else meta["key"].encode("latin-1")
        return claimed, meta["topic"], key, value

    def owns(self, destination: str | None) -> bool:
        """Whether a file naming ``destination`` is this folder's to send: a file of no destination is
        the folder's (it was written there); a folder of no destination sends what it holds."""
        return not destination or not self.destination or destination == self.destination

    def send_home(self, claimed: Path, destination: str) -> Path:
        """Move a claimed file of another destination, unsent, into that destination's folder (a sibling
        of this one), where that destination's own drain finds it."""
        home = self.folder.parent / destination
        home.mkdir(parents=True, exist_ok=True)
        target = home / claimed.name[1:].rsplit(".", 2)[0]
        os.replace(claimed, target)
        log.warning("%s was written for destination %s, not %s: moved to %s, unsent", target.name, destination,
                    self.destination, home)
        return target

    def release_stale(self, older_than_s: float = 600.0) -> int:
        """Give back files whose drainer died: at once where its process is gone (a pid of this
        host), else once claimed longer ago than ``older_than_s``."""
        released = 0
        for path in self.folder.glob(".*.claimed"):
            try:
                if not _alive(int(path.name.rsplit(".", 2)[1])) or \
                        time.time() - path.stat().st_ctime >= older_than_s:
                    self.release(path)
                    released += 1
            except (FileNotFoundError, ValueError):
                pass
        return released

    def release(self, claimed: Path) -> None:
        """Give a claimed message back, unsent."""
        original = claimed.name[1:].rsplit(".", 2)[0]
        os.replace(claimed, claimed.with_name(original))


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _close_quietly(producer, timeout_s: float = 5.0) -> None:
    try:
        producer.close(timeout=timeout_s)
    except Exception:
        pass


class Delivery:
    """One process's way to the broker: send, and spill what the broker does not take."""

    def __init__(self, settings: DeliverySettings):
        self.settings = settings
        self.spill = Spill(settings.spill_dir, settings.spill_max_bytes, settings.destination)
        self.breaker = Breaker(Path(settings.spill_dir), settings.breaker_cooldown_s)
        self._producer: KafkaProducer | None = None
        # The topics known to exist since this process last saw the broker away: a broker that comes
        # back may have lost them, and another process's probe (which closes the breaker) checks only
        # its own. Until a topic is in here, it is made sure of before anything is sent to it.
        self._topics_known: set[str] = set()

    def producer(self):
        """The producer, made on first use; None while the broker cannot be reached."""
        if self._producer is None:
            from headwater.adapters.kafka import producer

            try:
                self._producer = producer(
                    # A broker that restarted empty must not make a topic on the first send to it (with
                    # its own partition count, racing the probe's ``ensure_topics``): the send fails,
                    # is spilled, and the probe makes the topics as configured.
                    self.settings.kafka, max_block_ms=1000, allow_auto_create_topics=False,
                    bootstrap_timeout_ms=2000, reconnect_backoff_max_ms=1000,
                    request_timeout_ms=int(self.settings.send_timeout_s * 1000),
                    delivery_timeout_ms=int(self.settings.send_timeout_s * 1000) + 1000,
                )
            except Exception as exc:
                log.warning("no broker at %s (%s); spilling to %s", self.settings.bootstrap, exc,
                            self.settings.spill_dir)
                return None
        return self._producer

    def _reset(self) -> None:
        """Forget a producer that failed; what it still holds was spilled.

        It is closed on a thread of its own: closing waits for the broker, which is away.
        """
        failed, self._producer = self._producer, None
        if failed is not None:
            threading.Thread(target=_close_quietly, args=(failed,), name="headwater-close", daemon=True).start()

    def deliver(self, messages, bounded: bool = True) -> list[str]:
        """Send ``(topic, key, value)`` messages; each one's outcome: SENT, SPILLED or DROPPED.

        ``messages`` may be a generator: each is sent as soon as it is made. ``bounded=False``
        spills what is not sent past the folder's bound (``Spill.put``).
        """
        taken: list[tuple[str, bytes | None, bytes]] = []
        pending: list[tuple[int, FutureRecordMetadata]] = []
        in_flight = 0  # bytes handed to the producer in this call, bounded by buffer_bytes
        probing = tried = False
        producer = None
        for message in messages:
            if not taken:  # the breaker is asked only when there is something to send
                probing = self.breaker.is_open()
                tried = self.breaker.allow()
                producer = self.producer() if tried else None
                if probing:
                    self._topics_known.clear()
            taken.append(message)
            if producer is None:
                continue
            topic, key, value = message
            if not self._known([topic]):
                producer = None
                continue
            if in_flight and in_flight + len(value) > self.settings.buffer_bytes:
                if not self._flush(pending):  # the buffer is full and the broker does not empty it
                    producer = None
                    continue
                in_flight = 0
            try:
                pending.append((len(taken) - 1, producer.send(topic, key=key, value=value)))
                in_flight += len(value)
            except Exception as exc:  # no metadata in time: the broker is away
                log.warning("send to %s failed (%s); spilling", topic, exc)
                producer = None
        sent: set[int] = set()
        if pending:
            self._flush(pending)
            sent = {i for i, future in pending if future.is_done and future.succeeded()}
        if taken and len(sent) == len(taken) and probing:
            self.breaker.close()
        outcomes = [SENT] * len(taken)
        if len(sent) < len(taken):
            if tried:
                self.breaker.open()
            if any(i not in sent for i, _ in pending):
                self._reset()
            used = self.spill.size()
            for i, message in enumerate(taken):
                if i not in sent:
                    size = self.spill.put(*message, used=used, bounded=bounded)
                    outcomes[i] = DROPPED if size is None else SPILLED
                    used += size or 0
        return outcomes

    def _flush(self, pending) -> bool:
        """Wait, at most ``send_timeout_s``, for the broker to acknowledge what was sent."""
        producer = self._producer  # None if reset since the sends: it was closed, nothing is left to wait for
        if producer is not None:
            try:
                producer.flush(timeout=self.settings.send_timeout_s)
            except Exception:
                pass
        return all(f.is_done and f.succeeded() for _, f in pending)

    def _known(self, names) -> bool:
        """Whether the broker has the topics, made sure of once since this process last saw it away
        (one that restarted empty may not have them)."""
        from headwater.adapters.kafka import ensure_topics

        unknown = sorted(set(names) - self._topics_known)
        if not unknown:
            return True
        try:
            ensure_topics(self.settings.kafka, unknown, self.settings.topic_partitions, timeout_s=2.0)
        except Exception as exc:
            log.info("broker still away (%s); spilled messages wait", exc)
            return False
        self._topics_known.update(unknown)
        return True

    def drain(self, budget_s: float = 5.0) -> tuple[int, int]:
        """Send spilled messages, oldest first, for at most ``budget_s``; returns (sent, left)."""
        self.spill.release_stale()
        files = self.spill.files()
        if not files:
            return 0, 0
        if self.breaker.is_open():  # a broker coming back may have lost the topics
            self._topics_known.clear()
        if not self.breaker.allow():
            return 0, len(files)
        deadline = time.monotonic() + budget_s
        sent = 0
        while files and time.monotonic() < deadline:
            chunk, files = files[:64], files[64:]
            claimed = [c for c in (self.spill.claim(p) for p in chunk) if c is not None]
            if not claimed:
                continue
            known = self._known(topic for _, topic, _, _ in claimed)
            outcomes = self._send_claimed(claimed) if known else [False] * len(claimed)
            for (path, *_), ok in zip(claimed, outcomes):
                if ok:
                    path.unlink(missing_ok=True)
                    sent += 1
                else:
                    self.spill.release(path)
            if not all(outcomes):
                self.breaker.open()
                break
            self.breaker.close()
        return sent, len(self.spill.files())

    def _send_claimed(self, claimed) -> list[bool]:
        producer = self.producer()
        if producer is None:
            return [False] * len(claimed)
        futures = []
        for _, topic, key, value in claimed:
            try:
                futures.append(producer.send(topic, key=key, value=value))
            except Exception:
                futures.append(None)
        try:
            producer.flush(timeout=self.settings.send_timeout_s)
        except Exception:
            pass
        ok = [f is not None and f.is_done and f.succeeded() for f in futures]
        if not all(ok):
            self._reset()
        return ok

    def close(self, timeout_s: float = 10.0) -> None:
        if self._producer is not None:
            try:
                self._producer.close(timeout=timeout_s)
            finally:
                self._producer = None
