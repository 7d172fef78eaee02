"""Where headwater's parts find each other: broker, topics, graph store, state folder.

Settings come, strongest first, from explicit arguments, ``HEADWATER_*`` environment
variables, the running local stack's state file (``headwater stack up`` writes it), and
the defaults below.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

STACK_FILE = "stack.json"
CAPTURE_LEVELS = ("full", "log-only")
OPENLINEAGE_MODES = ("auto", "on", "off")
KAFKA_SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
KAFKA_SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
# Never written by ``to_dict``: the stack's state file is written from it, and keeps only the local graph's
# generated password. No password is shown by ``repr`` either (``field(repr=False)``).
SECRETS = ("kafka_sasl_password", "narrowing_key")


def default_home() -> Path:
    return Path(os.environ.get("HEADWATER_HOME", Path.home() / ".headwater"))


@dataclass(frozen=True)
class Config:
    bootstrap: str = "127.0.0.1:9092"
    edges_topic: str = "headwater.edges"
    log_topic: str = "headwater.log"
    dlq_topic: str = "headwater.dlq"
    topic_partitions: int = 2  # of the topics headwater creates (``adapters.kafka.ensure_topics``)
    topic_replication: int = 1  # replication factor of the topics headwater creates; 3 on a production cluster
    # Passed to every Kafka client (``core.kafka_client``); deploy/README.md, "Kafka settings".
    kafka_security_protocol: str = "PLAINTEXT"
    kafka_sasl_mechanism: str = ""  # with a SASL_ protocol: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512
    kafka_sasl_username: str = ""
    kafka_sasl_password: str = field(default="", repr=False)
    kafka_sasl_password_file: str = ""  # read whenever a client is made: a mounted secret may be rotated
    kafka_ssl_cafile: str = ""  # "": the system's CA certificates
    kafka_ssl_certfile: str = ""  # client certificate, for brokers that authenticate clients by TLS
    kafka_ssl_keyfile: str = ""
    graph_uri: str = "bolt://127.0.0.1:7687"
    graph_user: str = "neo4j"
    graph_password: str = field(default="", repr=False)
    graph_database: str = "lineage"
    graph_write_sessions: int = 4  # transactions at once in each indexer write (store/graph.py)
    metrics_port: int = 0  # capture's Prometheus endpoint; 0: none
    # Where every Prometheus endpoint headwater opens listens (capture's, the indexer's): loopback unless
    # a scraper elsewhere must reach it (the Helm chart sets 0.0.0.0).
    metrics_host: str = "127.0.0.1"
    spill_dir: str = ""  # where capture keeps messages while the broker is away; "": <home>/spill
    spill_max_bytes: int = 1 << 30  # beyond it, edges are dropped (counted, their batch logged as a gap)
    buffer_bytes: int = 32 << 20  # bytes a capture process may have unacknowledged by the broker
    send_timeout_s: float = 10.0  # longest wait for the broker's acknowledgements before spilling
    breaker_cooldown_s: float = 5.0  # after a failed send, how long everyone spills without trying
    overhead_budget: float = 0.0  # capture time over the batch's own time allowed per query; 0: no limit
    # The store: the lineage tables (Delta Lake, store/tables.py) and the batch log; a local folder or
    # s3://bucket/prefix (S3's endpoint and credentials from the environment). "": <home>/store
    store_dir: str = ""
    capture: str = "full"  # "log-only": traced queries log their batches (the gap map) but publish no edges
    # The key capture signs black boxes' functions with and the query tier checks before re-running one
    # (``core/signing.py``, ``query/narrow``); without one, lineage through black boxes stays a superset.
    narrowing_key: str = field(default="", repr=False)
    narrowing_key_file: str = ""
    # OpenLineage events of traced queries (capture/openlineage.py), sent by openlineage-python's client as it is
    # configured (openlineage.yml, OPENLINEAGE_URL, OPENLINEAGE__TRANSPORT__…): "auto" sends them where such a
    # configuration is found, "on" always (the client's console transport if none), "off" never.
    openlineage: str = "auto"
    openlineage_namespace: str = ""  # the jobs' namespace; "": $OPENLINEAGE_NAMESPACE, else "headwater"
    openlineage_interval_s: float = 300.0  # a RUNNING event at most this often, with the batches since the last
    # The query service's base URL, which the events' headwater_rowLineage facet tells catalogs to ask
    # (``http://lineage.internal:8080``); "": the local stack's, where it runs.
    query_url: str = ""

    def __post_init__(self):
        if self.capture not in CAPTURE_LEVELS:
            raise ValueError(f"capture={self.capture!r}: expected one of {', '.join(CAPTURE_LEVELS)}")
        if self.openlineage not in OPENLINEAGE_MODES:
            raise ValueError(f"openlineage={self.openlineage!r}: expected one of {', '.join(OPENLINEAGE_MODES)}")
        if not self.openlineage_interval_s > 0:
            raise ValueError(f"openlineage_interval_s must be more than 0 (not {self.openlineage_interval_s})")
        for name in ("topic_partitions", "topic_replication", "graph_write_sessions"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1 (not {getattr(self, name)})")
        _check_kafka_security(self)

    @classmethod
    def from_dict(cls, values: dict) -> "Config":
        known = {f.name for f in fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"unknown headwater settings {sorted(unknown)}; known: {sorted(known)}")
        return cls(**values)

    def to_dict(self) -> dict:
        """The settings, but for the secrets a file or the environment gives (``SECRETS``)."""
        return {k: v for k, v in asdict(self).items() if k not in SECRETS}

    def store_uri(self) -> str:
        """The store's root: a local folder's absolute path, or ``s3://bucket/prefix``."""
        if self.store_dir.startswith("s3://"):
            return self.store_dir.rstrip("/")
        return str(self.store_path())

    def store_path(self) -> Path:
        """A local folder of the store: the store itself, or for a store in S3 ``<home>/store``."""
        if self.store_dir and not self.store_dir.startswith("s3://"):
            return Path(self.store_dir).absolute()
        return default_home() / "store"

    def with_overrides(self, **values) -> "Config":
        return replace(self, **{k: v for k, v in values.items() if v is not None})


def _check_kafka_security(config: Config) -> None:
    """Refuse a security setting Kafka would refuse later, less clearly; never quoting the password."""
    protocol, mechanism = config.kafka_security_protocol, config.kafka_sasl_mechanism
    if protocol not in KAFKA_SECURITY_PROTOCOLS:
        raise ValueError(f"kafka_security_protocol={protocol!r}: expected one of {', '.join(KAFKA_SECURITY_PROTOCOLS)}")
    if not protocol.startswith("SASL_"):
        return
    if mechanism not in KAFKA_SASL_MECHANISMS:
        raise ValueError(f"kafka_security_protocol={protocol} needs kafka_sasl_mechanism, one of "
                         f"{', '.join(KAFKA_SASL_MECHANISMS)} (not {mechanism!r})")
    if not config.kafka_sasl_username:
        raise ValueError(f"kafka_security_protocol={protocol} needs kafka_sasl_username")
    if bool(config.kafka_sasl_password) == bool(config.kafka_sasl_password_file):
        raise ValueError(f"kafka_security_protocol={protocol} needs exactly one of kafka_sasl_password and "
                         f"kafka_sasl_password_file")


_CASTS = {"int": int, int: int, "float": float, float: float}


def _from_env() -> dict:
    found = {}
    for f in fields(Config):
        value = os.environ.get(f"HEADWATER_{f.name.upper()}")
        if value is not None:
            found[f.name] = _CASTS.get(f.type, str)(value)
    return found


def stack_ports(home: Path | None = None) -> dict:
    """The ports the local stack of ``home`` (default: ``HEADWATER_HOME``) was started with: ``broker``, ``query``…;
    empty where none was."""
    try:
        return dict(json.loads(((home or default_home()) / STACK_FILE).read_text()).get("ports") or {})
    except (OSError, ValueError, TypeError):
        return {}


def _from_stack(home: Path) -> dict:
    path = home / STACK_FILE
    if not path.exists():
        return {}
    return json.loads(path.read_text()).get("config", {})


def load(home: Path | None = None, **overrides) -> Config:
    """The effective config: overrides, then environment, then stack state, then defaults."""
    home = home or default_home()
    # Merged before the one check of the whole (``__post_init__``): a SASL protocol from the environment
    # may get its user name from an override.
    values = {**_from_stack(home), **_from_env(), **{k: v for k, v in overrides.items() if v is not None}}
    return at_home(Config.from_dict(values), home)


def at_home(config: Config, home: Path) -> Config:
    """``config`` with its home-relative folders (the store, the spill) in ``home`` where no setting names them,
    so that ``--home`` moves everything, not only the stack's state."""
    return config.with_overrides(store_dir=config.store_dir or str(home / "store"),
                                 spill_dir=config.spill_dir or str(home / "spill"))
