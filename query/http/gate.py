"""How the HTTP API shares its work out: ``Slots``, the queries answered at once and those waiting their turn (503
beyond), and ``Clients``, the ``LineageClient``s the request threads borrow, one per question where a backend
must not be shared."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

from headwater.core.config import Config
from headwater.store.edges import LineageTables

from .. import api


class Slots:
    """``running`` queries at once; up to ``queued`` more wait for a slot, each at most ``wait_s``.

    A query that finds a slot free and nobody waiting takes it; the others wait their turn
    (first come, first served). One that finds the queue full, or whose wait runs out, is
    refused (``enter`` is False): the server answers 503 with Retry-After.
    """

    def __init__(self, running: int, queued: int, wait_s: float):
        self.running, self.queued, self.wait_s = running, queued, wait_s
        self._free = running
        self._waiting: list[threading.Event] = []  # in arrival order; the first is handed the next slot
        self._closed = False
        self._lock = threading.Lock()

    def enter(self, wait_s: float | None = None) -> bool:
        with self._lock:
            if self._closed:
                return False
            if self._free and not self._waiting:
                self._free -= 1
                return True
            if len(self._waiting) >= self.queued:
                return False
            turn = threading.Event()
            self._waiting.append(turn)
        if turn.wait(self.wait_s if wait_s is None else wait_s):
            return True
        with self._lock:
            if turn.is_set():  # handed a slot as its wait ran out: it is this query's
                return True
            self._waiting.remove(turn)
            return False

    def leave(self) -> None:
        with self._lock:
            if self._waiting:
                self._waiting.pop(0).set()  # the slot goes to the first waiting, never free in between
            else:
                self._free += 1

    def close(self, wait_s: float) -> None:
        """Refuse every query from now on, and wait (at most ``wait_s``) for those running or waiting."""
        deadline = time.monotonic() + wait_s
        with self._lock:
            self._closed = True
        while time.monotonic() < deadline:
            with self._lock:
                if self._free == self.running and not self._waiting:
                    return
            time.sleep(0.01)



# Backends that read the Parquet store as it was when they were made (``parquet.StoreView``).
_SNAPSHOTS = ("csprov", "rq", "auto")


class Clients:
    """``LineageClient``s by backend, made at a backend's first question and shared by the request threads.

    The Cypher client takes questions from any number of threads at once: its neo4j
    ``Driver`` is concurrency-safe and it opens a session (which is not) per query. A
    Parquet client (csprov, rq, and auto, which asks one when the graph does not hold the
    row) takes one question at a time: each question builds its own walk state and the
    ``StoreView``'s tables are immutable, but the generation keeps readers between
    questions (lazily built caches; open ``pq.ParquetFile``s, whose shared use Arrow does
    not promise to be safe). So each of those backends keeps a pool: a question borrows an
    idle client, or makes one, and gives it back after; the server's slots bound the
    questions running at once, and so each pool's clients. A Parquet client sees the store
    as it was when made: one made before the store changed is closed when given back
    (its question done), never lent again. ``LineageServer.close`` closes them all after
    the last question (the neo4j ``Driver.close`` is not concurrency-safe).
    """

    def __init__(self, config: Config):
        self.config = config
        self._lock = threading.Lock()
        self._shared: dict[str, api.LineageClient] = {}
        self._idle: dict[str, list[tuple[api.LineageClient, int | None]]] = {}
        self._latest: dict[str, int | None] = {}
        self._closed = False
        # The lineage tables, kept open: a question reads only what their logs gained since the last one.
        self._tables = LineageTables(config.store_uri(), config.edges_topic)

    @contextmanager
    def lease(self, backend: str):
        """The backend's client, this question's alone where it must be."""
        if backend not in _SNAPSHOTS:
            with self._lock:
                if backend not in self._shared:
                    self._shared[backend] = api.LineageClient(self.config, backend=backend)
                client = self._shared[backend]
            yield client
            return
        with self._lock:
            stamp = self._tables.edges.version()
            self._latest[backend] = stamp
            idle = self._idle.setdefault(backend, [])
            stale = [c for c, made in idle if made != stamp]
            idle[:] = [(c, made) for c, made in idle if made == stamp]
            client = idle.pop()[0] if idle else api.LineageClient(self.config, backend=backend)
        for old in stale:
            old.close()
        try:
            yield client
        finally:
            with self._lock:
                kept = not self._closed and self._latest[backend] == stamp
                if kept:
                    self._idle[backend].append((client, stamp))
            if not kept:
                client.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            clients = [*self._shared.values(), *(c for idle in self._idle.values() for c, _ in idle)]
            self._shared.clear()
            self._idle.clear()
        for client in clients:
            client.close()

