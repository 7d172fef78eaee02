"""Where headwater's parts find each other: broker, topics, graph store, state folder.

Settings come, strongest first, from explicit arguments, ``HEADWATER_*`` environment
variables, the running local stack's state file (``headwater stack up`` writes it), and
the defaults below.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

STACK_FILE = "stack.json"
CAPTURE_LEVELS = ("full", "log-only")


def default_home() -> Path:
    return Path(os.environ.get("HEADWATER_HOME", Path.home() / ".headwater"))


@dataclass(frozen=True)
class Config:
    bootstrap: str = "127.0.0.1:9092"
    edges_topic: str = "headwater.edges"
    log_topic: str = "headwater.log"
    dlq_topic: str = "headwater.dlq"
    topic_partitions: int = 2
    graph_uri: str = "bolt://127.0.0.1:7687"
    graph_user: str = "root"
    graph_password: str = ""
    graph_database: str = "lineage"
    metrics_port: int = 0  # capture's Prometheus endpoint on 127.0.0.1; 0: none
    spill_dir: str = ""  # where capture keeps messages while the broker is away; "": <home>/spill
    spill_max_bytes: int = 1 << 30  # beyond it, edges are dropped (counted, their batch logged as a gap)
    buffer_bytes: int = 32 << 20  # bytes a capture process may have unacknowledged by the broker
    send_timeout_s: float = 10.0  # longest wait for the broker's acknowledgements before spilling
    breaker_cooldown_s: float = 5.0  # after a failed send, how long everyone spills without trying
    overhead_budget: float = 0.0  # capture time over the batch's own time allowed per query; 0: no limit
    store_dir: str = ""  # the indexer's Parquet edge store, one folder per edges partition; "": <home>/store
    capture: str = "full"  # "log-only": traced queries log their batches (the gap map) but publish no edges

    def __post_init__(self):
        if self.capture not in CAPTURE_LEVELS:
            raise ValueError(f"capture={self.capture!r}: expected one of {', '.join(CAPTURE_LEVELS)}")

    @classmethod
    def from_dict(cls, values: dict) -> "Config":
        known = {f.name for f in fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"unknown headwater settings {sorted(unknown)}; known: {sorted(known)}")
        return cls(**values)

    def to_dict(self) -> dict:
        return asdict(self)

    def store_path(self) -> Path:
        """The Parquet edge store's folder."""
        return Path(self.store_dir) if self.store_dir else default_home() / "store"

    def with_overrides(self, **values) -> "Config":
        return replace(self, **{k: v for k, v in values.items() if v is not None})


_CASTS = {"int": int, int: int, "float": float, float: float}


def _from_env() -> dict:
    found = {}
    for f in fields(Config):
        value = os.environ.get(f"HEADWATER_{f.name.upper()}")
        if value is not None:
            found[f.name] = _CASTS.get(f.type, str)(value)
    return found


def _from_stack(home: Path) -> dict:
    path = home / STACK_FILE
    if not path.exists():
        return {}
    return json.loads(path.read_text()).get("config", {})


def load(home: Path | None = None, **overrides) -> Config:
    """The effective config: overrides, then environment, then stack state, then defaults."""
    home = home or default_home()
    values = {**_from_stack(home), **_from_env()}
    return Config.from_dict(values).with_overrides(**overrides)
