"""An OpenLineage consumer for benches and tests: an HTTP server on loopback that keeps each event POSTed to it, as
Marquez's ``/api/v1/lineage`` takes them (no Marquez can run here). ``with Receiver() as receiver:`` starts it on a
free port; ``receiver.url`` is what ``OPENLINEAGE_URL`` names, ``receiver.events()`` what came."""

from __future__ import annotations

import gzip
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ENDPOINT = "/api/v1/lineage"


class Receiver:
    def __init__(self):
        self._events: list[dict] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the standard library's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path.split("?")[0] != ENDPOINT:
                    self.send_response(404)
                else:
                    with receiver._lock:
                        receiver._events.append(json.loads(body))
                    self.send_response(201)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="openlineage-receiver", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def events(self) -> list[dict]:
        with self._lock:
            return list(self._events)

    def wait_for(self, test, timeout_s: float = 30.0) -> list[dict]:
        """The events once ``test(events)`` holds; AssertionError with what came if it does not in time."""
        deadline = time.monotonic() + timeout_s
        while not test(self.events()):
            if time.monotonic() > deadline:
                raise AssertionError(f"no such events in {timeout_s} s: {[e.get('eventType') for e in self.events()]}")
            time.sleep(0.1)
        return self.events()

    def __enter__(self) -> "Receiver":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
