"""Whether the stores a service needs answer now: what its ``/readyz`` reports.

Each check returns None when the store answers, else one line saying which store and
why, fit for an unauthenticated endpoint: addresses without user info, error classes
and their first line, never a credential.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from urllib.parse import urlsplit

from neo4j import Driver, Query

from headwater.core.config import Config

from .graph import driver

TIMEOUT_S = 2.0  # a probe answers within a Kubernetes probe's default timeout (1 s) plus a margin


def _first_line(exc: BaseException, limit: int = 200) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:limit]}" if lines else type(exc).__name__


def address(uri: str) -> str:
    """A store's URI as shown: scheme, host and port, no user info."""
    parts = urlsplit(uri)
    try:
        port = parts.port
    except ValueError:
        port = None
    return f"{parts.scheme}://{parts.hostname or ''}" + (f":{port}" if port else "")


class GraphProbe:
    """Asks the graph store ``RETURN 1`` on the configured database, over a driver of its own with
    short timeouts (a query's driver waits for a connection far longer than a probe may)."""

    def __init__(self, config: Config, timeout_s: float = TIMEOUT_S):
        self.config = config
        self.timeout_s = timeout_s
        self._driver: Driver | None = None
        self._making = threading.Lock()  # probes come from the HTTP server's threads

    def problem(self) -> str | None:
        with self._making:
            if self._driver is None:
                self._driver = driver(self.config, connection_timeout=self.timeout_s,
                                      connection_acquisition_timeout=self.timeout_s, max_connection_pool_size=2)
            probe = self._driver
        try:
            with probe.session(database=self.config.graph_database) as session:
                session.run(Query("RETURN 1 AS ok", timeout=self.timeout_s)).consume()  # a hung graph too
        except Exception as exc:  # whatever the reason, the graph does not answer
            return (f"graph store {address(self.config.graph_uri)} (database {self.config.graph_database}) "
                    f"does not answer: {_first_line(exc)}")
        return None

    def close(self) -> None:
        with self._making:
            if self._driver is not None:
                self._driver.close()
                self._driver = None


def store_problem(store: str, writable: bool = False) -> str | None:
    """Whether the store can be read (and written, for its writer) now: a local folder as ``folder_problem``
    says; a store in S3 whose bucket answers, with the environment's credentials (never quoted)."""
    if not store.startswith("s3://"):
        return folder_problem(Path(store), writable)
    import pyarrow.fs as pafs

    from headwater.store.tables import Location

    filesystem, path = Location.of(store).filesystem()
    bucket = path.split("/", 1)[0]
    try:
        if filesystem.get_file_info(bucket).type == pafs.FileType.NotFound:
            return f"store {store}: bucket {bucket} does not exist"
    except OSError as exc:
        return f"store {store} cannot be reached: {_first_line(exc)}"
    return None


def folder_problem(path: Path, writable: bool = False) -> str | None:
    """Whether a store folder can be read (and written, for its writer) now: it is there, a folder,
    listable. A writer's folder may be missing yet, if it can be made where it would be."""
    path = Path(path)
    try:
        if not path.exists():
            if not writable:
                return f"store folder {path} does not exist (nothing indexed into it yet, or not mounted)"
            parent = next(p for p in path.parents if p.exists())
            if not os.access(parent, os.W_OK | os.X_OK):
                return f"store folder {path} does not exist and cannot be made in {parent}"
            return None
        if not path.is_dir():
            return f"store folder {path} is not a folder"
        os.listdir(path)  # a mount that went away fails here, not on exists()
        if writable and not os.access(path, os.W_OK | os.X_OK):
            return f"store folder {path} is not writable"
    except OSError as exc:
        return f"store folder {path} cannot be read: {_first_line(exc)}"
    return None
