"""Narrowing ahead: ``headwater narrow --follow`` narrows each black box's batch once, soon after it is indexed.

It follows the batch log in the store (``store/batch_log.py``, written by the indexer): each batch whose
capture is ``full`` and whose plan has a black box (``Narrower.boxes``) waits until its narrowing is kept
(``NarrowStore``), oldest first. A batch is read back once the rows the store records entering its black
box have stopped growing (``SETTLE_S``), and are not none (for ``EMPTY_WAIT_S``); one whose edges were not
all in the store yet after all (``NotIndexedYet``) is tried again once the store holds as many as the
read-back found, and after ``RETRY_UNINDEXED_S``, doubling each time; a narrowing that
could not run (the broker away, a key not set right) after ``narrower.RETRY_S``. A batch is claimed
before it is narrowed (``NarrowStore.claim``), so followers on several hosts, and questions that start a
narrowing, run each batch once.
"""

from __future__ import annotations

import bisect
import threading
import time
from typing import Callable

from headwater.core.config import Config

from ..errors import LineageError
from ..fallback import logged_time
from . import metrics
from .narrower import RETRY_S, Box, Narrower, NotIndexedYet

POLL_S = 1.0  # how often the batch log is read again when nothing waits
SETTLE_S = 1.0  # a batch is read back once the rows entering its box have not grown for this long
RETRY_UNINDEXED_S = 2.0  # read back too early (``NotIndexedYet``): tried again after this, doubling each time
EMPTY_WAIT_S = 300.0  # a batch whose black box the store records no row entering is read back after this long


def _at(entry: dict) -> float | None:
    """When the batch ran (its log entry's ``at``), as a Unix time."""
    at = entry.get("at")
    if not at:
        return None
    try:
        return logged_time(str(at)).timestamp()
    except ValueError:
        return None


def read_back_due(entering: int, needed: int | None, waited_s: float, settle: bool) -> bool:
    """Whether a batch whose entering rows have stopped growing (``entering`` of them) is read back now: not
    while the store holds fewer than a read-back found entering its box (``needed``: a 1,000,000-row batch read
    back while its edges came in cost a minute each time), nor, unless settling now (``--once``), while it
    holds none, for ``EMPTY_WAIT_S`` after the batch was first seen (``waited_s``; a batch's edges come after
    its log entry)."""
    if needed is not None:
        return entering >= needed
    return entering > 0 or settle or waited_s >= EMPTY_WAIT_S


def next_floor(batches: list[int], floor: int | None, done: Callable[[int], bool]) -> int | None:
    """Below which batch every batch of a query is done, given its logged ``batches`` from ``floor`` on (in
    order): the first not ``done``, or the first not logged (a gap: its record may come later, spilled by
    capture), else the one after the last; None if there are none."""
    expected = floor
    for batch in batches:
        if expected is not None and batch != expected:
            return expected
        if not done(batch):
            return batch
        expected = batch + 1
    return expected


class Follower:
    """Narrows the black-box batches the batch log holds, oldest first, each once (``once``, ``run``)."""

    def __init__(self, config: Config, say: Callable[[str], None] = lambda _: None):
        from ..api import LineageClient

        self.say = say
        self.client = LineageClient(config)
        narrower = self.client.narrower()
        if narrower is None:
            self.client.close()
            raise LineageError("no narrowing key is set (narrowing_key or narrowing_key_file, the same as capture's): "
                               "nothing can be narrowed")
        self.narrower: Narrower = narrower
        self.log = narrower.fallback.log  # the one reader of the batch log the narrower refreshes too
        self._done: set[tuple[str, int, int]] = set()  # kept, or no black box: never looked at again
        self._floor: dict[str, int] = {}  # by query: every batch below it is done
        self._later: dict[tuple[str, int, int], float] = {}  # tried, to try again from this time (monotonic)
        self._entering: dict[tuple[str, int, int], int] = {}  # rows seen entering the box at the last look
        self._tries: dict[tuple[str, int, int], int] = {}  # read back too early (``NotIndexedYet``), so far
        self._needed: dict[tuple[str, int, int], int] = {}  # rows a read-back too early found entering the box
        self._seen: dict[tuple[str, int, int], float] = {}  # when first looked at (monotonic)

    def close(self) -> None:
        self.client.close()

    def waiting(self) -> list[tuple[float, Box, int]]:
        """The black-box batches not narrowed yet, oldest first: (when the batch ran, its box, the batch)."""
        log = self.log.refresh()
        found = []
        for query in log.queries():
            if not self.narrower.has_boxes(query):
                continue
            batches = log.batches(query)
            batches = batches[bisect.bisect_left(batches, self._floor.get(query, 0)):]  # none below its floor

            def done(batch: int) -> bool:
                return all((query, op, batch) in self._done for op in self.narrower.boxes(query, batch))

            for batch in batches:
                if done(batch):
                    continue
                boxes = self.narrower.boxes(query, batch)
                entry = log.batch(query, batch) or {}
                if entry.get("status") != "full":  # sampled, log-only, failed: no whole superset to narrow
                    if entry.get("status") is not None:  # said for good (none yet: its record still coming)
                        self._done.update((query, op, batch) for op in boxes)
                    continue
                for op, box in boxes.items():
                    key = (query, op, batch)
                    if key in self._done:
                        continue
                    if self.narrower.store.get(*key) is not None:
                        self._done.add(key)
                        continue
                    found.append((_at(entry) or time.time(), box, batch))
            self._raise_floor(query, next_floor(batches, self._floor.get(query), done))
        found.sort(key=lambda t: (t[0], t[1].query, t[2], t[1].op))
        return found

    def once(self, settle: bool = True) -> int:
        """Narrow every batch that waits and is due; returns how many were narrowed (kept) here. ``settle``:
        wait here for a batch's edges to stop coming in (``--once``), else come back to it (``run``)."""
        waiting = self.waiting()
        self._report(waiting)
        narrowed = 0
        backend = self.client._backend(self.client.names[0])
        if settle:  # every batch first seen now looked at once, then again after one wait for them all
            first = [(box, batch) for _, box, batch in waiting if (box.query, box.op, batch) not in self._entering]
            for box, batch in first:
                self._entering[box.query, box.op, batch] = self.narrower.entering(box, batch, backend)
            if first:
                time.sleep(SETTLE_S)
        for _, box, batch in waiting:
            key = (box.query, box.op, batch)
            if time.monotonic() < self._later.get(key, 0.0):
                continue
            # Its edges still coming into the store (the count of rows entering the box grew since the last
            # look): looked at again soon, before reading the batch's input back (seconds for 100,000 rows).
            entering = self.narrower.entering(box, batch, backend)
            while entering != self._entering.get(key):
                self._entering[key] = entering
                if not settle:
                    self._later[key] = time.monotonic() + SETTLE_S
                    break
                time.sleep(SETTLE_S)
                entering = self.narrower.entering(box, batch, backend)
            if key in self._later and time.monotonic() < self._later[key]:
                continue
            if not self._due(key, entering, settle):
                self._later[key] = time.monotonic() + SETTLE_S
                continue
            started = time.monotonic()
            try:
                found = self.narrower.narrow(box, batch, backend, exclusive=True)
            except NotIndexedYet as exc:
                self._tries[key] = tries = self._tries.get(key, 0) + 1
                if exc.needed > self._needed.get(key, 0):  # read back again once the store holds them all
                    self._needed[key] = exc.needed
                    self._later[key] = time.monotonic() + SETTLE_S
                else:  # as many as found before, still not all the same rows
                    self._later[key] = time.monotonic() + min(RETRY_UNINDEXED_S * 2 ** tries, RETRY_S)
                self.say(f"{box.query} op {box.op} batch {batch}: {exc}")
                continue
            if found is None:  # another narrower holds it
                self._later[key] = time.monotonic() + RETRY_UNINDEXED_S
                continue
            if self.narrower.store.get(*key) is None:  # not kept: it could not run; tried again later
                self._later[key] = time.monotonic() + RETRY_S
                self.say(f"{box.query} op {box.op} batch {batch}: not narrowed, tried again in {RETRY_S:.0f} s: "
                         f"{found.reason}")
                continue
            self._done.add(key)
            for held in (self._later, self._entering, self._tries, self._needed, self._seen):
                held.pop(key, None)
            narrowed += 1
            metrics.NARROWED.labels(found.kind).inc()
            metrics.SECONDS.observe(time.monotonic() - started)
            self.say(f"{box.query} op {box.op} batch {batch}: {found.kind}"
                     f"{' (exact)' if found.exact else ''} in {found.seconds:.1f} s"
                     + (f": {found.reason}" if found.reason else ""))
            self._report([w for w in waiting if (w[1].query, w[1].op, w[2]) not in self._done])
        return narrowed

    def _raise_floor(self, query: str, floor: int | None) -> None:
        """Every batch of ``query`` below ``floor`` is done: never looked at again, nor held in ``_done``."""
        if floor is not None and floor > self._floor.get(query, 0):
            self._floor[query] = floor
            self._done = {key for key in self._done if key[0] != query or key[2] >= floor}

    def _due(self, key: tuple[str, int, int], entering: int, settle: bool) -> bool:
        first_seen = self._seen.setdefault(key, time.monotonic())
        return read_back_due(entering, self._needed.get(key), time.monotonic() - first_seen, settle)

    def _report(self, waiting: list[tuple[float, Box, int]]) -> None:
        metrics.WAITING.set(len(waiting))
        metrics.LAG.set(max(0.0, time.time() - waiting[0][0]) if waiting else 0.0)

    def run(self, stop: threading.Event, poll_s: float = POLL_S) -> None:
        """Narrow what waits, then look again every ``poll_s``, until ``stop`` is set."""
        while not stop.is_set():
            if not self.once(settle=False):
                stop.wait(poll_s)
