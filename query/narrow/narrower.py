"""Narrowing a black box's superset lineage by re-running its function: on demand, per batch, kept.

The stores hold, per batch of a black box, its state node (``S``), superset edges from every row that
entered it to ``S`` and from ``S`` to each of its output rows (named by their digests:
``capture/lineage.py``). To narrow batch ``b`` of black box ``op`` of ``query``:

1. the rows that entered it are read back as the log-only fallback reads a batch (the Kafka records of
   the batch's offsets, static tables as logged) and the plan below the black box is run over them
   (``infer/run.py``, carrying each row's sources); the rids found must be exactly those the store's edges
   into ``S`` name, or nothing is narrowed;
2. the worker (``worker.py``, a process of its own with memory and CPU limits) checks the function's
   signature and re-runs it (``reexecute.py``);
3. every output row the stream produced (``S``'s edges in the store) must be among the re-run's; then
   the narrowed edges (input row -> output row, ``via: reexecution``, exact as verified) are kept in the
   store (``NarrowStore``) with the class, and the reason when the batch stays a superset (kept too, so it
   is not re-run for every question).

``overlay`` puts them in a walk: where a batch is narrowed, the edges through ``S`` are replaced by the
narrowed ones; elsewhere the superset stays, never a wrong exact answer.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headwater.core import rid as rids
from headwater.core import signing
from headwater.core.config import Config
from headwater.core.offsets import offset_ranges
from headwater.store.narrowed import SCHEMA, NarrowedFiles

from ..errors import LineageError

TIMEOUT_S = 60.0  # wall and CPU time of one narrowing's worker, and ``PER_ROW_S`` more per input row
PER_ROW_S = 0.0005  # 1,000,000 rows: 560 s (the coded runs took 6.4 s for 150,000 rows of a pandas map)
MEMORY_BYTES = 4 << 30  # address space of the worker
MAX_ROWS = 1_000_000  # input rows a narrowing re-runs at most (a stateful one: over all its batches)
REEXECUTION = "reexecution"
PENDING = "pending"  # a narrowing under way: the answer keeps the flagged superset meanwhile
REREAD_S = 5.0  # how long the plans' black boxes are kept read
RETRY_S = 60.0  # how long a narrowing that failed to run is answered as such before it is tried again
CACHED = 64  # narrowings a store keeps read
PENDING_LISTED = 1000  # a pending batch that read more rows is described, its rows not listed (``held_back``)


class NotIndexedYet(LineageError):
    """The store holds fewer of the rows entering a black box's batch than the log says it read: its
    edges are still on their way to the store. Tried again soon, never kept. ``needed``: how many rows
    entered it, read back (0: not said)."""

    def __init__(self, message: str, needed: int = 0):
        super().__init__(message)
        self.needed = needed


def time_limit(rows: int) -> float:
    """The wall and CPU time a narrowing's worker may take for ``rows`` input rows."""
    return TIMEOUT_S + rows * PER_ROW_S


def _ints(values=()) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


@dataclass
class Narrowing:
    """One batch of one black box: how it was narrowed, and its narrowed lineage (none for a superset).

    Kept compact: each black box output row (``outs``, its rid) points at a set of source rows
    (``out_set``), each distinct set held once (``set_offsets`` into ``members``, the rows' rids), so a
    group's rows are kept once however many output rows derive from it."""

    query: str
    op: int
    batch: int
    kind: str  # dispatcher | grouped | per key | superset
    exact: bool
    reason: str = ""
    outs: np.ndarray = field(default_factory=_ints)
    out_set: np.ndarray = field(default_factory=_ints)
    set_offsets: np.ndarray = field(default_factory=lambda: _ints([0]))
    members: np.ndarray = field(default_factory=_ints)
    mask: int = -1
    seconds: float = 0.0
    steps: dict = field(default_factory=dict)  # seconds of each step: read_back, rerun (the worker), checks
    verified: str = ""  # how the class was checked on the batch (``reexecute.Narrowed.verified``)
    superset: dict | None = None  # pending: what the batch read, its rows not listed (``Narrower.held_back``)
    # Made on first use, by the walks: (outs sorted, their sets), and (members sorted, their sets, out_set
    # sorted, its outs): a lookup is a binary search, however many rows the batch had.
    _by_out: tuple | None = field(default=None, repr=False, compare=False)
    _by_member: tuple | None = field(default=None, repr=False, compare=False)

    @property
    def narrowed(self) -> bool:
        return self.kind not in ("superset", PENDING)

    def to_table(self) -> pa.Table:
        """One row, as ``NarrowStore`` keeps it."""
        row = {"query": self.query, "op": self.op, "batch": self.batch, "kind": self.kind, "exact": self.exact,
               "reason": self.reason, "mask": self.mask, "seconds": round(self.seconds, 3),
               "steps": json.dumps(self.steps), "verified": self.verified}
        arrays = {name: pa.array([getattr(self, name)], pa.list_(pa.int64()))
                  for name in ("outs", "out_set", "set_offsets", "members")}
        return pa.table({**{k: pa.array([v], SCHEMA.field(k).type) for k, v in row.items()}, **arrays},
                        schema=SCHEMA)

    @staticmethod
    def from_table(table: pa.Table) -> "Narrowing":
        row = {name: table[name][0].as_py() for name in SCHEMA.names[:10]}
        outs, out_set, set_offsets, members = (
            _ints(table[name].combine_chunks().flatten().to_numpy(zero_copy_only=False))
            for name in ("outs", "out_set", "set_offsets", "members"))
        return Narrowing(row["query"], row["op"], row["batch"], row["kind"], row["exact"], row["reason"], outs,
                         out_set, set_offsets, members, row["mask"], row["seconds"], json.loads(row["steps"] or "{}"),
                         row["verified"] or "")

    def summary(self) -> dict:
        return {"query": self.query, "op": self.op, "batch": self.batch, "kind": self.kind, "exact": self.exact,
                "reason": self.reason, "seconds": round(self.seconds, 3),
                **({"steps": self.steps} if self.steps else {}),
                **({"verified": self.verified} if self.verified else {}),
                **({"superset": self.superset} if self.superset is not None else {})}

    def _members_of(self, sets: np.ndarray) -> list[int]:
        bounds = self.set_offsets
        if not len(sets):
            return []
        return np.unique(np.concatenate([self.members[bounds[k]:bounds[k + 1]] for k in sets.tolist()])).tolist()

    def into(self, out: int) -> list[int]:
        """The source rows' rids narrowed lineage gives black box output row ``out``."""
        if self._by_out is None:
            order = np.argsort(self.outs, kind="stable")
            self._by_out = (self.outs[order], self.out_set[order])
        outs, sets = self._by_out
        lo, hi = np.searchsorted(outs, out, "left"), np.searchsorted(outs, out, "right")
        return self._members_of(np.unique(sets[lo:hi]))

    def out_of(self, source: int) -> list[int]:
        """The black box output rows narrowed lineage derives (in part) from source row ``source``."""
        if self._by_member is None:
            sets = np.repeat(np.arange(len(self.set_offsets) - 1), np.diff(self.set_offsets))
            by_member = np.argsort(self.members, kind="stable")
            by_set = np.argsort(self.out_set, kind="stable")
            self._by_member = (self.members[by_member], sets[by_member], self.out_set[by_set], self.outs[by_set])
        members, sets_of, out_sets, outs = self._by_member
        lo, hi = np.searchsorted(members, source, "left"), np.searchsorted(members, source, "right")
        found: set[int] = set()
        for k in np.unique(sets_of[lo:hi]).tolist():
            a, b = np.searchsorted(out_sets, k, "left"), np.searchsorted(out_sets, k, "right")
            found.update(outs[a:b].tolist())
        return sorted(found)


class NarrowStore:
    """The narrowings of one log topic's queries as the store keeps them (``store/narrowed.py``), the last
    ones read held (re-read when their file changes)."""

    def __init__(self, config: Config):
        self.files = NarrowedFiles(config.store_uri(), config.log_topic)
        self._read: dict[tuple, tuple[tuple, Narrowing]] = {}  # the last read, by batch, with their stamp

    def get(self, query: str, op: int, batch: int) -> Narrowing | None:
        key = (query, op, batch)
        stamp = self.files.stamp(*key)
        if stamp is None:
            return None
        held = self._read.get(key)
        if held is None or held[0] != stamp:
            held = self._read[key] = (stamp, Narrowing.from_table(self.files.read(*key)))
            while len(self._read) > CACHED:
                self._read.pop(next(iter(self._read)))
        return held[1]

    def put(self, narrowing: Narrowing) -> None:
        self.files.write(narrowing.to_table())

    def remove(self, query: str) -> None:
        """Forget every narrowing of ``query`` (its black boxes' functions changed under the same name)."""
        self.files.remove(query)

    def claim(self, query: str, op: int, batch: int, limit_s: float = TIMEOUT_S) -> bool:
        return self.files.claim(query, op, batch, limit_s)

    def claimed(self, query: str, op: int, batch: int) -> bool:
        return self.files.claimed(query, op, batch)

    def release(self, query: str, op: int, batch: int) -> None:
        self.files.release(query, op, batch)

    def of_box(self, query: str, op: int) -> list[Narrowing]:
        return [n for n in (self.get(query, op, b) for b in self.files.batches(query, op)) if n is not None]


@dataclass(frozen=True)
class Box:
    query: str
    op: int
    dataset: str
    stateful: bool
    record: dict  # as the plan log holds it

    def node(self, batch: int) -> int:
        """The rid of its state node that batch ``batch``'s edges go through."""
        return rids.state_rid(self.query, self.op, None if self.stateful else batch)


class Narrower:
    """Narrows the black boxes of one log topic's queries (``narrow``) and puts the result in walks (``overlay``)."""

    def __init__(self, config: Config, on_demand: bool = True, wait_s: float = 0.0):
        """``on_demand``: a question that meets a batch not narrowed yet starts its narrowing, in the
        background; ``wait_s``: how long the question waits for it before answering with the flagged
        superset and ``kind: pending`` (0: not at all, as the query service answers)."""
        from ..fallback import Fallback

        self.config = config
        self.key = signing.key_of(config)
        self.on_demand = on_demand and self.key is not None
        self.wait_s = wait_s
        self.store = NarrowStore(config)
        self.fallback = Fallback(config)
        # By query: when read, and each kept plan's first batch with its black boxes by node id.
        self._boxes: dict[str, tuple[float, list[tuple[int, dict[int, Box]]]]] = {}
        self._locks: dict[tuple[str, int, int], threading.Lock] = {}  # one narrowing of a batch at a time
        self._locking = threading.Lock()
        self._failed: dict[tuple[str, int, int], tuple[float, Narrowing]] = {}  # not kept: tried again later
        self._met = threading.local()  # per thread (a question): the narrowings its walks met
        # Narrowings questions started, one at a time, each in a process of its own (``one.py``) waited for by
        # a thread of this one, by (query, op, batch).
        self._background: ThreadPoolExecutor | None = None
        self._started: dict[tuple[str, int, int], Future] = {}
        self._workers: set[subprocess.Popen] = set()  # the processes running now (``close`` kills them)
        self._closed = False

    def close(self) -> None:
        """Stop: narrowings not begun are dropped (a later question or ``headwater narrow --follow`` makes
        them), a process running one is stopped by its PID (SIGTERM, then SIGKILL after 10 s), its claim
        released."""
        self._closed = True
        if self._background is not None:
            self._background.shutdown(wait=False, cancel_futures=True)
        running = list(self._workers)
        for proc in running:  # SIGTERM first: a narrowing apart (``one.py``) then stops its own worker
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in running:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        if self._background is not None:
            self._background.shutdown(wait=True)

    def under_way(self) -> list[tuple[str, int, int]]:
        """The batches whose narrowing this process started and has not finished."""
        return [key for key, future in self._started.items() if not future.done()]

    def wait(self, timeout_s: float | None = None) -> None:
        """Wait until the narrowings this process started have finished (at most ``timeout_s``)."""
        futures = [f for f in self._started.values() if not f.done()]
        if futures:
            futures_wait(futures, timeout=timeout_s)

    @property
    def narrowings_met(self) -> dict[tuple[str, int, int], Narrowing]:
        if not hasattr(self._met, "found"):
            self._met.found = {}
        return self._met.found

    @property
    def held_back(self) -> set[int]:
        """The black boxes' nodes this thread's backward walks stopped at: batches pending and too large to list
        (``PENDING_LISTED``), whose superset the answer describes (the narrowing's ``superset``)."""
        if not hasattr(self._met, "held"):
            self._met.held = set()
        return self._met.held

    def pop_narrowings_met(self) -> list[dict]:
        """The narrowings this thread's walks met since the last call, as an answer's summary lists them."""
        found = [n.summary() for _, n in sorted(self.narrowings_met.items())]
        self._met.found = {}
        self._met.held = set()
        return found

    # What the plan log says ------------------------------------------------------------------------

    def boxes(self, query: str, batch: int = 1 << 62) -> dict[int, Box]:
        """The black boxes of the plan batch ``batch`` of ``query`` ran (the latest by default), by node id;
        the kept plans are read again every few seconds."""
        held = self._boxes.get(query)
        if held is None or time.monotonic() - held[0] > REREAD_S:
            plans = []
            for start in self.fallback.plans.starts(query):
                kept = self.fallback.plans.plan_for(query, start) or {}
                plans.append((start, {b["node_id"]: Box(query, b["node_id"], b["dataset"], bool(b["stateful"]), b)
                                      for b in kept.get("black_boxes") or []}))
            self._boxes[query] = held = (time.monotonic(), plans)
        ran = [boxes for start, boxes in held[1] if start <= batch]
        return ran[-1] if ran else {}

    def has_boxes(self, query: str | None) -> bool:
        """Whether any kept plan of ``query`` has a black box."""
        if query is None:
            return False
        self.boxes(query)
        return any(boxes for _, boxes in self._boxes[query][1])

    # Narrowing ---------------------------------------------------------------------------------------

    def get(self, box: Box, batch: int, backend, compute: bool | None = None) -> Narrowing | None:
        """The narrowing of ``batch`` of ``box``: kept; else, if on demand (``compute``), started in the
        background and answered as pending (after waiting ``wait_s`` for it); else None."""
        key = (box.query, box.op, batch)
        found = self.store.get(*key)
        if found is None and (self.on_demand if compute is None else compute):
            failed = self._failed.get(key)
            if failed is not None and time.monotonic() - failed[0] < RETRY_S:
                found = failed[1]
            else:
                found = self._pending(box, batch, backend)
        if found is not None:
            self.narrowings_met[key] = found
        return found

    def _pending(self, box: Box, batch: int, backend) -> Narrowing:
        """The narrowing of a batch that none is kept for: started here unless under way (here, or by
        another narrower: its claim), waited for ``wait_s``; pending if not done by then."""
        key = (box.query, box.op, batch)
        by = "this process"
        with self._locking:
            future = self._started.get(key)
            if (future is None or future.done()) and not self._closed:
                if self.store.claimed(*key):
                    by = "another narrower (headwater narrow --follow)"
                    future = None
                else:
                    if self._background is None:
                        self._background = ThreadPoolExecutor(1, thread_name_prefix="headwater-narrow")
                    future = self._started[key] = self._background.submit(self._narrow_apart, box, batch)
        if future is not None and self.wait_s > 0:
            futures_wait([future], timeout=self.wait_s)
        if future is not None and future.done() and not future.cancelled():
            failure = future.exception()
            if isinstance(failure, NotIndexedYet):
                return Narrowing(box.query, box.op, batch, PENDING, False, f"{failure}; narrowed once they are")
            done = future.result() if failure is None else None
            if done is not None:
                return done
            by = "another narrower (headwater narrow --follow)"  # it claimed the batch first
        if by != "this process" and self.wait_s > 0:
            deadline = time.monotonic() + self.wait_s
            while time.monotonic() < deadline and self.store.claimed(*key):
                time.sleep(0.2)
            kept = self.store.get(*key)
            if kept is not None:
                return kept
        return Narrowing(box.query, box.op, batch, PENDING, False,
                         f"narrowing by re-execution is under way ({by}); this answer keeps the flagged superset")

    def _narrow_apart(self, box: Box, batch: int) -> Narrowing | None:
        """``narrow(exclusive=True)`` in a process of its own (``one.py``), killed by ``close``: what it kept,
        None if another narrower holds the batch; ``NotIndexedYet`` raised; a failure to run answered as
        such until ``RETRY_S`` has passed, as ``narrow`` does."""
        from dataclasses import asdict

        asked = json.dumps({"config": asdict(self.config), "query": box.query, "op": box.op, "batch": batch})
        proc = subprocess.Popen([sys.executable, "-m", "headwater.query.narrow.one"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        self._workers.add(proc)
        try:
            out, err = proc.communicate(asked.encode())
        finally:
            self._workers.discard(proc)
        lines = out.decode(errors="replace").strip().splitlines()
        try:
            said = json.loads(lines[-1]) if lines else {}
        except ValueError:
            said = {}
        if said.get("claimed"):
            return None
        if "not_indexed" in said:
            raise NotIndexedYet(said["not_indexed"], int(said.get("needed") or 0))
        kept = self.store.get(box.query, box.op, batch)
        if kept is not None:
            return kept
        reason = said.get("reason") or said.get("error") or \
            (err.decode(errors="replace").strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        failed = Narrowing(box.query, box.op, batch, "superset", False, reason)
        self._failed[(box.query, box.op, batch)] = (time.monotonic(), failed)
        return failed

    def narrow(self, box: Box, batch: int, backend, exclusive: bool = False) -> Narrowing | None:
        """Re-run ``box`` on batch ``batch`` (a stateful one: on every batch up to it) and keep the result.

        What the function did on its input (narrowed, failed, a superset) is kept; a failure to get there
        (a function not verified here, its input not read back, the broker away, the worker out of time) is
        not, so a later question tries again (after ``RETRY_S``): a key set right, a broker back. Edges not
        all indexed yet (``NotIndexedYet``) are raised, for the caller to try again soon. ``exclusive``: None,
        doing nothing, if another narrower holds the batch's claim (``NarrowStore.claim``)."""
        key = (box.query, box.op, batch)
        with self._locking:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:  # one narrowing of a batch at a time in this process
            claimed = self.store.claim(*key, limit_s=time_limit(MAX_ROWS) + TIMEOUT_S)
            if exclusive and not claimed:
                return None
            started = time.monotonic()
            try:
                found = self._narrow(box, batch, backend)
            except NotIndexedYet:
                raise
            except Exception as exc:  # noqa: BLE001 (whatever fails here, the answer keeps the superset, saying why)
                reason = str(exc) if isinstance(exc, (LineageError, signing.Unverified)) else \
                    f"{type(exc).__name__}: {exc}"
                narrowing = Narrowing(box.query, box.op, batch, "superset", False, reason,
                                      seconds=time.monotonic() - started)
                self._failed[key] = (time.monotonic(), narrowing)
                return narrowing
            finally:
                if claimed:
                    self.store.release(*key)
            self._failed.pop(key, None)
            for narrowing in found.values():
                narrowing.seconds = time.monotonic() - started
                if narrowing.batch == batch or narrowing.narrowed:
                    self.store.put(narrowing)
            return found[batch]

    def _narrow(self, box: Box, batch: int, backend) -> dict[int, Narrowing]:
        signing.verified(box.query, box.op, box.record, self.key)  # refused here before any work
        if box.stateful:
            wanted = [b for b in self.fallback.log.refresh().batches(box.query) if b <= batch]
            if wanted != list(range(batch + 1)):
                raise LineageError("the batch log does not hold every batch of the query up to this one from its "
                                   "first: a stateful black box is replayed from its first batch")
        else:
            wanted = [batch]
        started = time.monotonic()
        entering = self._entering(box, wanted, backend)
        inputs = {b: self._inputs(box, b, entering.get(b, {})) for b in wanted}
        read = time.monotonic()
        rows = sum(t.num_rows for t, _ in inputs.values())
        if rows > MAX_ROWS:
            raise LineageError(f"more than {MAX_ROWS:,} input rows to re-run")
        result = self._run(box, {b: t for b, (t, _) in inputs.items()}, time_limit(rows))
        ran = time.monotonic()
        masks = set(entering.get(batch, {}).values())
        mask = masks.pop() if len(masks) == 1 else -1
        found = {}
        for b, narrowed in result.items():
            failure = narrowed.get("refused") or narrowed.get("failed")
            if failure:
                found[b] = Narrowing(box.query, box.op, b, "superset", False, failure)
                continue
            found[b] = self._edges(box, b, narrowed, inputs, mask, backend)
        for narrowing in found.values():
            narrowing.steps = {"read_back": round(read - started, 3), "rerun": round(ran - read, 3),
                               "checks": round(time.monotonic() - ran, 3)}
        return found

    def entering(self, box: Box, batch: int, backend) -> int:
        """How many edges the store holds into ``box``'s node of ``batch``, one from each row entering it (a
        count: no edge read)."""
        return backend.edges_into(box.node(batch))

    def _entering(self, box: Box, batches: list[int], backend) -> dict[int, dict[int, int]]:
        """Per batch of ``batches``, the rows the store records entering ``box`` (their rid, and the edge's
        column mask); each state node's edges are read once (a stateful black box has one for every batch)."""
        found: dict[int, dict[int, int]] = {}
        for node in {box.node(b) for b in batches}:
            edges = backend.edges_at(node, backward=True)
            src, batch_of, op, cols = (edges[name].to_numpy() for name in ("src", "batch", "op", "cols"))
            ours = (op == box.op) & np.isin(batch_of, batches)
            for b in np.unique(batch_of[ours]).tolist():
                of_b = ours & (batch_of == b)
                found.setdefault(b, {}).update(zip(src[of_b].tolist(), cols[of_b].tolist()))
        return found

    def _inputs(self, box: Box, batch: int, recorded: dict[int, int]) -> tuple[pa.Table, list[list[int]]]:
        """The rows that entered ``box`` in ``batch``, as its function gets them, and each row's source rids;
        checked against those the store records entering it (``recorded``, by rid)."""
        from .inputs import box_inputs

        table, row_rids = box_inputs(self.fallback, box, batch)
        entered = set(recorded)
        rebuilt = {r for row in row_rids for r in row}
        if entered < rebuilt:
            raise NotIndexedYet(f"the store holds {len(entered)} of the {len(rebuilt)} rows the batch's black box "
                                f"read: its edges are not all indexed yet", needed=len(rebuilt))
        if rebuilt != entered:
            raise LineageError(f"the black box's input could not be rebuilt exactly from the log: {len(rebuilt)} "
                               f"source rows read back, {len(entered)} recorded entering it "
                               f"({len(rebuilt - entered)} not recorded, {len(entered - rebuilt)} not read back)")
        return table, row_rids

    def _run(self, box: Box, tables: dict[int, pa.Table], limit_s: float) -> dict[int, dict]:
        """The worker's result per batch (``worker.py``), or its failure for every batch."""
        folder = Path(tempfile.mkdtemp(prefix="headwater-narrow-"))
        try:
            digest = box.record.get("digest") or []
            output = (box.record.get("function") or {}).get("output") or {}
            request = {"query": box.query, "node_id": box.op, "record": box.record, "dataset": box.dataset,
                       "digest": digest, "stateful": box.stateful, "batches": sorted(tables),
                       "complete_digest": len(digest) == len(output.get("fields") or [])}
            (folder / "request.json").write_text(json.dumps(request))
            for b, table in tables.items():
                with pa.OSFile(str(folder / f"{b}.arrow"), "wb") as sink, \
                        pa.ipc.new_file(sink, table.schema) as writer:
                    writer.write_table(table)
            env = {**os.environ, "HEADWATER_NARROWING_KEY": (self.key or b"").decode(),
                   "HEADWATER_NARROWING_MEMORY": str(MEMORY_BYTES), "HEADWATER_NARROWING_CPU_S": str(int(limit_s))}
            # A session of its own, so that whatever the user's code started is killed with it.
            proc = subprocess.Popen([sys.executable, "-m", "headwater.query.narrow.worker", str(folder)], env=env,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    start_new_session=True)
            self._workers.add(proc)
            try:
                _, err = proc.communicate(timeout=limit_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                raise LineageError(f"the function did not finish within {limit_s:.0f} s") from None
            finally:
                self._workers.discard(proc)
            if self._closed:
                raise LineageError("the narrower was closed while the function ran")
            result_file = folder / "result.json"
            if not result_file.exists():
                tail = (err or b"").decode(errors="replace").strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
                return {b: {"failed": f"the narrowing worker died: {tail[0]}"} for b in tables}
            result = json.loads(result_file.read_text())
            if "unavailable" in result:
                raise LineageError(result["unavailable"])
            if "batches" not in result:
                return {b: result for b in tables}
            return {int(b): n for b, n in result["batches"].items()}
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _edges(self, box: Box, batch: int, narrowed: dict, inputs: dict, mask: int, backend) -> Narrowing:
        """The narrowed edges of one batch, once every output row the stream made is among the re-run's."""
        kind, exact, reason = narrowed["kind"], narrowed["exact"], narrowed.get("reason", "")
        if kind == "superset":
            return Narrowing(box.query, box.op, batch, kind, False, reason)
        digests = np.array(narrowed["digests"], dtype=np.int64)
        outs = rids.box_output_rids(digests, box.query, box.op, batch) if len(digests) else digests
        out = backend.edges_at(box.node(batch), backward=False)
        made = set(out["dst"].to_numpy()[out["batch"].to_numpy() == batch].tolist())
        missing = made - {int(o) for o in outs}
        if missing:
            return Narrowing(box.query, box.op, batch, "superset", False,
                             f"{len(missing)} output rows of the stream are not among the re-run's (the function "
                             f"or what it reads differs from the stream's)")
        members, offsets = [], [0]
        for rows in narrowed["sets"]:
            sources = set()
            for row in rows:
                b, position = (row if isinstance(row, list) else (batch, row))
                sources.update(inputs[b][1][position])
            members.extend(sorted(sources))
            offsets.append(len(members))
        return Narrowing(box.query, box.op, batch, kind, bool(exact), reason, outs.astype(np.int64),
                         _ints(narrowed["set_of"]), _ints(offsets), _ints(members), mask,
                         verified=narrowed.get("verified", ""))

    # Walking ----------------------------------------------------------------------------------------

    def overlay(self, step, backward: bool, backend):
        """``step`` (edges adjacent to a frontier) with the black boxes' narrowed batches put in."""
        def narrowed_step(frontier: list[int]) -> pa.Table:
            held = self.held_back if backward else set()
            if held:  # a pending batch too large to list: the walk stops at its node, the answer describes it
                frontier = [r for r in frontier if r not in held]
            return self.apply(step(frontier), frontier, backward, backend)
        return narrowed_step

    def _too_many(self, pending: Narrowing) -> bool:
        """Whether a pending batch read more than ``PENDING_LISTED`` rows; if so, ``pending.superset`` says
        what it read (the batch log's counts and offsets: a stateful black box's batches up to it)."""
        if pending.superset is None:
            log = self.fallback.log.refresh()
            batches = range(pending.batch + 1) if self.boxes(pending.query, pending.batch)[pending.op].stateful \
                else [pending.batch]
            entries = [log.batch(pending.query, b) or {} for b in batches]
            read = [{"topic": t, "partition": p, "from": start, "to": end}
                    for e in entries for (t, p), (start, end) in sorted(offset_ranges(e.get("sources") or []).items())]
            tables = sorted({t for e in entries for t in (e.get("tables") or {})})
            pending.superset = {"rows_read": sum(int(e.get("rows_in") or 0) for e in entries), "read": read,
                                "tables": tables}
        return pending.superset["rows_read"] > PENDING_LISTED

    def apply(self, edges: pa.Table, frontier: list[int], backward: bool, backend) -> pa.Table:
        if not edges.num_rows or not any(self.has_boxes(q) for q in pc.unique(edges["query"]).to_pylist()):
            return edges
        columns = {c: edges[c].to_pylist() for c in ("src", "dst", "query", "op", "batch")}
        drop = np.zeros(edges.num_rows, dtype=bool)
        added: list[tuple] = []  # (src, dst, query, batch, op, exact, mask)
        stateful_from: set[tuple] = set()
        known: dict[tuple, tuple] = {}  # (query, op, batch) -> (box, its node's rid, the batch's narrowing)

        def looked_up(query, op, batch) -> tuple:
            if (query, op, batch) not in known:
                box = self.boxes(query, batch).get(op) if query is not None else None
                known[query, op, batch] = (None, None, None) if box is None else \
                    (box, box.node(batch), self.get(box, batch, backend) if not box.stateful or backward else None)
            return known[query, op, batch]

        for i, (src, dst, query, op, batch) in enumerate(zip(*columns.values())):
            box, node, narrowing = looked_up(query, op, batch)
            if box is None:
                continue
            if src == node:  # the state node to one of its output rows
                narrowing = narrowing if backward or not box.stateful else self.get(box, batch, backend)
                if backward and narrowing is not None and narrowing.kind == PENDING and self._too_many(narrowing):
                    self.held_back.add(node)
                if narrowing is not None and narrowing.narrowed:
                    drop[i] = True
                    if backward:
                        added.extend(_narrowed(narrowing, dst, by="dst"))
            elif dst == node:  # a row entering the black box
                if box.stateful:
                    if not backward and (query, op, src) not in stateful_from:
                        stateful_from.add((query, op, src))
                        for narrowing in self.store.of_box(box.query, box.op):
                            if narrowing.narrowed and narrowing.batch >= batch:
                                self.narrowings_met[(box.query, box.op, narrowing.batch)] = narrowing
                                added.extend(_narrowed(narrowing, src, by="src"))
                    continue
                if narrowing is not None and narrowing.narrowed:
                    drop[i] = True
                    if not backward:
                        added.extend(_narrowed(narrowing, src, by="src"))
        if not drop.any() and not added:
            return edges
        kept = edges.filter(pa.array(~drop))
        if "via" not in kept.column_names:
            kept = kept.append_column("via", pa.nulls(kept.num_rows, pa.string()))
        if not added:
            return kept
        src, dst, query, batch, op, exact, mask = zip(*set(added))
        extra = {"src": pa.array(src, pa.int64()), "dst": pa.array(dst, pa.int64()), "query": pa.array(query),
                 "batch": pa.array(batch, pa.int64()), "op": pa.array(op, pa.int32()), "exact": pa.array(exact),
                 "cols": pa.array(mask, pa.int64()), "via": pa.array([REEXECUTION] * len(src))}
        more = pa.table({name: extra[name].cast(kept.schema.field(name).type) for name in kept.column_names
                         if name in extra})
        missing = [name for name in kept.column_names if name not in extra]
        for name in missing:
            more = more.append_column(kept.schema.field(name), pa.nulls(more.num_rows, kept.schema.field(name).type))
        return pa.concat_tables([kept, more.select(kept.column_names).cast(kept.schema)])


def _narrowed(narrowing: Narrowing, row: int, by: str) -> list[tuple]:
    """The narrowed edges of ``narrowing`` ending at (``by="dst"``) or starting from (``"src"``) ``row``."""
    pairs = [(s, row) for s in narrowing.into(row)] if by == "dst" else [(row, d) for d in narrowing.out_of(row)]
    return [(s, d, narrowing.query, narrowing.batch, narrowing.op, narrowing.exact, narrowing.mask) for s, d in pairs]
