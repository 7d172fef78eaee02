"""Black boxes' narrowed lineage, kept in the store beside the edges (``query/narrow/``, query/README.md).

A local folder or S3 (``tables.Location``), so that every backend and every host finds it:

    <store>/<log topic>/narrowed/<query, hex>/<op>-<batch>.parquet   one row (``SCHEMA``), written whole
                                                                       (locally: a temporary name, fsync,
                                                                       rename; in S3 one PUT)
    <store>/<log topic>/narrowed/<query, hex>/<op>-<batch>.claim     while a narrower runs the batch

Each black box output row (``outs``, its rid) points at a set of source rows (``out_set``), each distinct
set held once (``set_offsets`` into ``members``, the rows' rids).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from .tables import Location

SCHEMA = pa.schema([
    pa.field("query", pa.string()), pa.field("op", pa.int64()), pa.field("batch", pa.int64()),
    pa.field("kind", pa.string()), pa.field("exact", pa.bool_()), pa.field("reason", pa.string()),
    pa.field("mask", pa.int64()), pa.field("seconds", pa.float64()), pa.field("steps", pa.string()),
    pa.field("verified", pa.string()),
    *(pa.field(name, pa.list_(pa.int64())) for name in ("outs", "out_set", "set_offsets", "members")),
])
CLAIM_SLACK_S = 30.0  # a claim older than its narrowing's time limit by this much is a dead narrower's


def fsync_dir(path: Path) -> None:
    """A folder's entries made durable (a file renamed into it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class NarrowedFiles:
    """The narrowed lineage of one log topic's queries: a batch's one-row table read and written whole, and
    the claims of the batches being narrowed."""

    def __init__(self, store: "str | os.PathLike | Location", log_topic: str):
        self.location = Location.of(store).child(log_topic, "narrowed")
        self.fs, self.root = self.location.filesystem()
        self.local = not self.location.is_s3

    def _folder(self, query: str) -> str:
        return f"{self.root}/{query.encode().hex()}"

    def _path(self, query: str, op: int, batch: int, suffix: str = ".parquet") -> str:
        return f"{self._folder(query)}/{op}-{batch}{suffix}"

    def stamp(self, query: str, op: int, batch: int) -> tuple | None:
        """What changes when the batch's file is written again (its time and size); None: none is kept."""
        info = self.fs.get_file_info(self._path(query, op, batch))
        return None if info.type == pafs.FileType.NotFound else (info.mtime_ns, info.size)

    def read(self, query: str, op: int, batch: int) -> pa.Table:
        with self.fs.open_input_file(self._path(query, op, batch)) as f:
            return pq.read_table(f)

    def write(self, table: pa.Table) -> None:
        query, op, batch = (table[name][0].as_py() for name in ("query", "op", "batch"))
        path = self._path(query, op, batch)
        table = table.cast(SCHEMA)
        if not self.local:
            with self.fs.open_output_stream(path) as f:  # one PUT: a reader sees it whole or not at all
                pq.write_table(table, f)
            return
        folder = Path(self._folder(query))
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{Path(path).name}.{uuid.uuid4().hex}"
        with open(tmp, "wb") as f:
            pq.write_table(table, f)
            f.flush()
            os.fsync(f.fileno())
        tmp.rename(path)
        fsync_dir(folder)

    def remove(self, query: str) -> None:
        """Forget every narrowing of ``query``."""
        self.fs.delete_dir_contents(self._folder(query), missing_dir_ok=True)

    def batches(self, query: str, op: int) -> list[int]:
        """The batches of black box ``op`` of ``query`` a narrowing is kept for, in order."""
        found = self.fs.get_file_info(pafs.FileSelector(self._folder(query), allow_not_found=True))
        return sorted(int(Path(f.path).stem.split("-", 1)[1]) for f in found
                      if Path(f.path).name.startswith(f"{op}-") and f.path.endswith(".parquet"))

    def claim(self, query: str, op: int, batch: int, limit_s: float) -> bool:
        """Take the narrowing of a batch, so that one narrower runs it: False if another holds it. Locally
        a file created only if absent; in S3 an object written if none is (two narrowers that look at the
        same moment may both run it, harmlessly: the result is the same). ``limit_s``: how long this narrower
        may take; a claim older than its narrower's and ``CLAIM_SLACK_S`` is a dead narrower's, taken over."""
        path = self._path(query, op, batch, ".claim")
        claim = json.dumps({"pid": os.getpid(), "host": os.uname().nodename, "limit_s": limit_s}).encode()
        for _ in range(2):
            if self.local:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                try:
                    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
                except FileExistsError:
                    if not self._stale(path):
                        return False
                    Path(path).unlink(missing_ok=True)
                    continue
                with os.fdopen(fd, "wb") as f:
                    f.write(claim)
                return True
            if self._live(path):
                return False
            with self.fs.open_output_stream(path) as f:
                f.write(claim)
            return True
        return False

    def claimed(self, query: str, op: int, batch: int) -> bool:
        """Whether a live narrower holds the batch's narrowing."""
        path = self._path(query, op, batch, ".claim")
        return self._live(path)

    def release(self, query: str, op: int, batch: int) -> None:
        try:
            self.fs.delete_file(self._path(query, op, batch, ".claim"))
        except FileNotFoundError:
            pass

    def _live(self, path: str) -> bool:
        """Whether a claim is there and not stale (one look at the file for both)."""
        info = self.fs.get_file_info(path)
        return info.type != pafs.FileType.NotFound and not self._stale(path, info)

    def _stale(self, path: str, info: pafs.FileInfo | None = None) -> bool:
        """Whether a claim is older than the time limit its narrower gave, and ``CLAIM_SLACK_S``."""
        try:
            info = info or self.fs.get_file_info(path)
            if info.type == pafs.FileType.NotFound:
                return False  # just released
            age = time.time() - info.mtime_ns / 1e9
            with self.fs.open_input_file(path) as f:
                limit_s = float(json.loads(f.read())["limit_s"])
        except (OSError, ValueError, KeyError):
            return False  # being written, or just released
        return age > limit_s + CLAIM_SLACK_S
