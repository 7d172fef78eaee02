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
   the narrowed edges (input row -> output row, ``via: reexecution``, exact as verified) are kept in
   ``<store_dir>/<log topic>/narrowed/<query, hex>/<op>-<batch>.json`` with the class, and the reason
   when the batch stays a superset (kept too, so it is not re-run for every question).

``overlay`` puts them in a walk: where a batch is narrowed, the edges through ``S`` are replaced by the
narrowed ones; elsewhere the superset stays, never a wrong exact answer.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headwater.core import rid as rids
from headwater.core import signing
from headwater.core.config import Config

from ..errors import LineageError

TIMEOUT_S = 60.0  # wall time of one narrowing's worker
MEMORY_BYTES = 4 << 30  # address space of the worker
MAX_ROWS = 1_000_000  # input rows a narrowing re-runs at most (a stateful one: over all its batches)
REEXECUTION = "reexecution"
REREAD_S = 5.0  # how long the plans' black boxes are kept read
RETRY_S = 60.0  # how long a narrowing that failed to run is answered as such before it is tried again
CACHED = 64  # narrowings a store keeps read


def fsync_dir(path: Path) -> None:
    """A folder's entries made durable (a file renamed into it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
    # Made on first use, by the walks: set indices by output row, output rows by source row.
    _sets_of_out: dict | None = field(default=None, repr=False, compare=False)
    _outs_of_member: dict | None = field(default=None, repr=False, compare=False)

    @property
    def narrowed(self) -> bool:
        return self.kind != "superset"

    def to_dict(self) -> dict:
        return {"query": self.query, "op": self.op, "batch": self.batch, "kind": self.kind, "exact": self.exact,
                "reason": self.reason, "mask": self.mask, "seconds": round(self.seconds, 3), "steps": self.steps,
                "outs": self.outs.tolist(), "out_set": self.out_set.tolist(),
                "set_offsets": self.set_offsets.tolist(), "members": self.members.tolist()}

    @staticmethod
    def from_dict(d: dict) -> "Narrowing":
        return Narrowing(d["query"], d["op"], d["batch"], d["kind"], d["exact"], d.get("reason", ""),
                         _ints(d["outs"]), _ints(d["out_set"]), _ints(d["set_offsets"]), _ints(d["members"]),
                         d.get("mask", -1), d.get("seconds", 0.0), d.get("steps") or {})

    def summary(self) -> dict:
        return {"query": self.query, "op": self.op, "batch": self.batch, "kind": self.kind, "exact": self.exact,
                "reason": self.reason, "seconds": round(self.seconds, 3),
                **({"steps": self.steps} if self.steps else {})}

    def into(self, out: int) -> list[int]:
        """The source rows' rids narrowed lineage gives black box output row ``out``."""
        if self._sets_of_out is None:
            self._sets_of_out = {}
            for o, k in zip(self.outs.tolist(), self.out_set.tolist()):
                self._sets_of_out.setdefault(o, []).append(k)
        bounds = self.set_offsets.tolist()
        members = self.members
        return sorted({int(m) for k in self._sets_of_out.get(out, ()) for m in members[bounds[k]:bounds[k + 1]]})

    def out_of(self, source: int) -> list[int]:
        """The black box output rows narrowed lineage derives (in part) from source row ``source``."""
        if self._outs_of_member is None:
            outs_of_set: dict[int, list[int]] = {}
            for o, k in zip(self.outs.tolist(), self.out_set.tolist()):
                outs_of_set.setdefault(k, []).append(o)
            sets = np.repeat(np.arange(len(self.set_offsets) - 1), np.diff(self.set_offsets))
            self._outs_of_member = {}
            for m, k in zip(self.members.tolist(), sets.tolist()):
                self._outs_of_member.setdefault(m, set()).update(outs_of_set.get(k, ()))
        return sorted(self._outs_of_member.get(source, ()))


class NarrowStore:
    """Narrowings kept as files, written whole (temporary name, fsync, rename)."""

    def __init__(self, config: Config):
        self.root = config.store_path() / config.log_topic / "narrowed"
        self._read: dict[Path, tuple[int, Narrowing]] = {}  # the last files read, by path, with their mtime

    def _path(self, query: str, op: int, batch: int) -> Path:
        return self.root / query.encode().hex() / f"{op}-{batch}.json"

    def get(self, query: str, op: int, batch: int) -> Narrowing | None:
        path = self._path(query, op, batch)
        try:
            stamp = path.stat().st_mtime_ns
        except FileNotFoundError:
            return None
        held = self._read.get(path)
        if held is None or held[0] != stamp:
            held = self._read[path] = (stamp, Narrowing.from_dict(json.loads(path.read_text())))
            while len(self._read) > CACHED:
                self._read.pop(next(iter(self._read)))
        return held[1]

    def put(self, narrowing: Narrowing) -> None:
        path = self._path(narrowing.query, narrowing.op, narrowing.batch)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
        with open(tmp, "w") as f:
            json.dump(narrowing.to_dict(), f)
            f.flush()
            os.fsync(f.fileno())
        tmp.rename(path)
        fsync_dir(path.parent)

    def of_box(self, query: str, op: int) -> list[Narrowing]:
        folder = self.root / query.encode().hex()
        if not folder.is_dir():
            return []
        batches = sorted(int(p.stem.split("-", 1)[1]) for p in folder.glob(f"{op}-*.json"))
        return [n for n in (self.get(query, op, b) for b in batches) if n is not None]


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

    def __init__(self, config: Config, on_demand: bool = True):
        from ..fallback import Fallback

        self.config = config
        self.key = signing.key_of(config)
        self.on_demand = on_demand and self.key is not None
        self.store = NarrowStore(config)
        self.fallback = Fallback(config)
        # By query: when read, and each kept plan's first batch with its black boxes by node id.
        self._boxes: dict[str, tuple[float, list[tuple[int, dict[int, Box]]]]] = {}
        self._locks: dict[tuple[str, int, int], threading.Lock] = {}  # one narrowing of a batch at a time
        self._locking = threading.Lock()
        self._failed: dict[tuple[str, int, int], tuple[float, Narrowing]] = {}  # not kept: tried again later
        self._met = threading.local()  # per thread (a question): the narrowings its walks met

    @property
    def narrowings_met(self) -> dict[tuple[str, int, int], Narrowing]:
        if not hasattr(self._met, "found"):
            self._met.found = {}
        return self._met.found

    def pop_narrowings_met(self) -> list[dict]:
        """The narrowings this thread's walks met since the last call, as an answer's summary lists them."""
        found = [n.summary() for _, n in sorted(self.narrowings_met.items())]
        self._met.found = {}
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
        """The narrowing of ``batch`` of ``box``: kept, else made now if on demand (``compute``), else None."""
        key = (box.query, box.op, batch)
        found = self.store.get(*key)
        if found is None and (self.on_demand if compute is None else compute):
            with self._locking:
                lock = self._locks.setdefault(key, threading.Lock())
            with lock:  # a second question about the batch waits for the first one's narrowing
                found = self.store.get(*key)
                failed = self._failed.get(key)
                if found is None and failed is not None and time.monotonic() - failed[0] < RETRY_S:
                    found = failed[1]
                elif found is None:
                    found = self.narrow(box, batch, backend)
        if found is not None:
            self.narrowings_met[key] = found
        return found

    def narrow(self, box: Box, batch: int, backend) -> Narrowing:
        """Re-run ``box`` on batch ``batch`` (a stateful one: on every batch up to it) and keep the result.

        What the function did on its input (narrowed, failed, a superset) is kept; a failure to get there
        (a function not verified here, its input not read back, the broker away, the worker out of time) is
        not, so a later question tries again (after ``RETRY_S``): a key set right, a broker back."""
        started = time.monotonic()
        try:
            found = self._narrow(box, batch, backend)
        except Exception as exc:  # noqa: BLE001 (whatever fails here, the answer keeps the superset, saying why)
            reason = str(exc) if isinstance(exc, (LineageError, signing.Unverified)) else f"{type(exc).__name__}: {exc}"
            narrowing = Narrowing(box.query, box.op, batch, "superset", False, reason,
                                  seconds=time.monotonic() - started)
            self._failed[(box.query, box.op, batch)] = (time.monotonic(), narrowing)
            return narrowing
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
        if sum(t.num_rows for t, _ in inputs.values()) > MAX_ROWS:
            raise LineageError(f"more than {MAX_ROWS:,} input rows to re-run")
        result = self._run(box, {b: t for b, (t, _) in inputs.items()})
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

    def _entering(self, box: Box, batches: list[int], backend) -> dict[int, dict[int, int]]:
        """Per batch of ``batches``, the rows the store records entering ``box`` (their rid, and the edge's
        column mask); each state node's edges are read once (a stateful black box has one for every batch)."""
        found: dict[int, dict[int, int]] = {}
        for node in {box.node(b) for b in batches}:
            for src, b, op, mask in _edges_of(backend, node, True, ("src", "batch", "op", "cols")):
                if op == box.op and b in batches:
                    found.setdefault(b, {})[int(src)] = int(mask)
        return found

    def _inputs(self, box: Box, batch: int, recorded: dict[int, int]) -> tuple[pa.Table, list[list[int]]]:
        """The rows that entered ``box`` in ``batch``, as its function gets them, and each row's source rids;
        checked against those the store records entering it (``recorded``, by rid)."""
        from .inputs import box_inputs

        table, row_rids = box_inputs(self.fallback, box, batch)
        entered = set(recorded)
        rebuilt = {r for row in row_rids for r in row}
        if rebuilt != entered:
            raise LineageError(f"the black box's input could not be rebuilt exactly from the log: {len(rebuilt)} "
                               f"source rows read back, {len(entered)} recorded entering it "
                               f"({len(rebuilt - entered)} not recorded, {len(entered - rebuilt)} not read back)")
        return table, row_rids

    def _run(self, box: Box, tables: dict[int, pa.Table]) -> dict[int, dict]:
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
                   "HEADWATER_NARROWING_MEMORY": str(MEMORY_BYTES), "HEADWATER_NARROWING_CPU_S": str(int(TIMEOUT_S))}
            # A session of its own, so that whatever the user's code started is killed with it.
            proc = subprocess.Popen([sys.executable, "-m", "headwater.query.narrow.worker", str(folder)], env=env,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    start_new_session=True)
            try:
                _, err = proc.communicate(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                raise LineageError(f"the function did not finish within {TIMEOUT_S:.0f} s") from None
            result_file = folder / "result.json"
            if not result_file.exists():
                tail = (err or b"").decode(errors="replace").strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
                return {b: {"failed": f"the narrowing worker died: {tail[0]}"} for b in tables}
            result = json.loads(result_file.read_text())
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
        made = {int(d) for d, b in _edges_of(backend, box.node(batch), False, ("dst", "batch")) if b == batch}
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
                         _ints(narrowed["set_of"]), _ints(offsets), _ints(members), mask)

    # Walking ----------------------------------------------------------------------------------------

    def overlay(self, step, backward: bool, backend):
        """``step`` (edges adjacent to a frontier) with the black boxes' narrowed batches put in."""
        def narrowed_step(frontier: list[int]) -> pa.Table:
            return self.apply(step(frontier), frontier, backward, backend)
        return narrowed_step

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


def _edges_of(backend, rid: int, backward: bool, names: tuple[str, ...]) -> list[tuple]:
    """``names`` of every edge into (``backward``) or out of ``rid`` the backend's store holds."""
    edges = backend._question(backward).step([rid])
    near = "dst" if backward else "src"
    keep = [i for i, r in enumerate(edges[near].to_pylist()) if r == rid]
    return [tuple(edges[n][i].as_py() for n in names) for i in keep]
