"""One black-box batch narrowed in a process of its own: what a question that meets a batch not narrowed yet
starts (``Narrower._pending``), so that reading the batch's input back, the Python-heavy part, never holds
the interpreter of the process answering questions.

``python -m headwater.query.narrow.one`` reads ``{"config": {...every setting, secrets too}, "query": ...,
"op": ..., "batch": ...}`` on stdin (never in its arguments or environment), narrows the batch unless
another narrower holds it (``Narrower.narrow(exclusive=True)``) and prints one JSON line: the narrowing's
summary, ``{"claimed": true}`` (another narrower runs it), ``{"not_indexed": why}`` (its edges are still on
their way to the store) or ``{"error": why}``.
"""

from __future__ import annotations

import json
import signal
import sys

from headwater.core.config import Config

from ..errors import LineageError
from .narrower import NotIndexedYet


def main() -> int:
    from ..api import LineageClient

    # Stopped by the process that asked (SIGTERM): the client closes, stopping the worker, releasing the claim.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    asked = json.loads(sys.stdin.read())
    with LineageClient(Config.from_dict(asked["config"])) as client:
        narrower = client.narrower()
        try:
            if narrower is None:
                raise LineageError("no narrowing key is set")
            box = narrower.boxes(asked["query"], asked["batch"]).get(asked["op"])
            if box is None:
                raise LineageError(f"query {asked['query']!r} has no black box {asked['op']} at batch {asked['batch']}")
            found = narrower.narrow(box, asked["batch"], client._backend(client.names[0]), exclusive=True)
            said = {"claimed": True} if found is None else found.summary()
        except NotIndexedYet as exc:
            said = {"not_indexed": str(exc), "needed": exc.needed}
        except Exception as exc:  # noqa: BLE001 (said to the process that asked, which keeps the superset)
            said = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(said))
    return 0


if __name__ == "__main__":
    sys.exit(main())
