"""The Python API of the query tier.

    from headwater.query.api import LineageClient
    with LineageClient() as lineage:
        for row in lineage.backward(rid):
            print(row.dataset, row.topic, row.partition, row.offset, row.key)
"""

from __future__ import annotations

from headwater.core import config as configuration
from headwater.core.config import Config

from .backend import Lineage
from .cypher import CypherBackend
from .parquet import CSProvBackend, RecursiveBackend
from .payload import attach_payload

# cypher: the graph store; csprov: the Parquet store, reading only the sets that matter;
# rq: the Parquet store scanned whole at every level (the baseline CSProv is measured against).
BACKENDS = {"cypher": CypherBackend, "csprov": CSProvBackend, "rq": RecursiveBackend}


class LineageClient:
    def __init__(self, config: Config | None = None, backend: str = "cypher"):
        self.config = config or configuration.load()
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; choose one of {sorted(BACKENDS)}")
        self.backend = BACKENDS[backend](self.config)

    def __enter__(self) -> "LineageClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.backend.close()

    def with_payload(self, found: list[Lineage]) -> list[Lineage]:
        """``found`` with each row's original source record added (what ``payload=True`` does)."""
        datasets: dict = {}
        for item in found:
            if item.dataset and item.topic is None and item.dataset not in datasets:
                datasets[item.dataset] = self.backend.dataset(item.dataset)
            attach_payload(item, self.config.bootstrap, datasets.get(item.dataset))
        return found

    def backward(self, rid: int, to: str = "source", depth: int = 16, payload: bool = False) -> list[Lineage]:
        found = self.backend.backward(rid, to=to, depth=depth)
        return self.with_payload(found) if payload else found

    def forward(self, rid: int, to: str = "output", depth: int = 16, payload: bool = False) -> list[Lineage]:
        found = self.backend.forward(rid, to=to, depth=depth)
        return self.with_payload(found) if payload else found
