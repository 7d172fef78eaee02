"""The narrowing worker: one process per narrowing, run by ``narrower.py`` with limits, never in the query tier.

``python -m headwater.query.narrow.worker FOLDER``: reads ``FOLDER/request.json`` (the black box's logged
record, signed by capture) and ``FOLDER/<batch>.arrow`` (each batch's input rows), checks the function's
signature with the key in ``HEADWATER_NARROWING_KEY`` before anything is unpickled, caps its own address
space and CPU time (``HEADWATER_NARROWING_MEMORY``, ``HEADWATER_NARROWING_CPU_S``), re-runs the function
(``reexecute.py``) and writes ``FOLDER/result.json``. Anything that goes wrong is written there as an error:
``unavailable`` where the function cannot be loaded in this environment (not kept: tried again later, or
elsewhere), ``failed`` where running it failed on the batch (kept, as what it did).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import traceback
from pathlib import Path

import pyarrow as pa

from headwater.core import signing

from . import reexecute


def limit() -> None:
    memory = int(os.environ.get("HEADWATER_NARROWING_MEMORY", 0))
    cpu = int(float(os.environ.get("HEADWATER_NARROWING_CPU_S", 0)))
    if memory:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    if cpu:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))


def run(folder: Path) -> dict:
    request = json.loads((folder / "request.json").read_text())
    key = os.environ.get("HEADWATER_NARROWING_KEY", "").encode() or None
    try:
        function = signing.verified(request["query"], request["node_id"], request["record"], key)
    except signing.Unverified as exc:
        return {"refused": str(exc)}
    try:
        fn = reexecute.Function(function, request["dataset"], request["digest"])
    except (ImportError, AttributeError) as exc:  # the function's module, or a name in it, missing here
        return {"unavailable": f"the function cannot be loaded here ({type(exc).__name__}: {exc}): its module must "
                               f"be importable where narrowing runs, as on Spark's executors"}
    tables = [(b, _read(folder / f"{b}.arrow")) for b in request["batches"]]
    if request["stateful"]:
        found = reexecute.narrow_stateful(fn, tables, request["complete_digest"])
        return {"batches": {str(b): n.to_dict() for b, n in found.items()}}
    (batch, table), = tables
    return {"batches": {str(batch): reexecute.narrow_stateless(fn, table, request["complete_digest"]).to_dict()}}


def _read(path: Path) -> pa.Table:
    with pa.OSFile(str(path)) as f:
        return pa.ipc.open_file(f).read_all()


def main() -> int:
    folder = Path(sys.argv[1])
    try:
        limit()
        result = run(folder)
    except MemoryError:
        result = {"failed": "the function ran out of the narrowing worker's memory limit"}
    except BaseException as exc:  # the user's code: anything it raises keeps the superset, with the reason
        last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
        where = f" ({last[0].filename}:{last[0].lineno})" if last else ""
        result = {"failed": f"{type(exc).__name__}: {exc}{where}"}
    tmp = folder / "result.json.tmp"
    tmp.write_text(json.dumps(result))
    tmp.rename(folder / "result.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
