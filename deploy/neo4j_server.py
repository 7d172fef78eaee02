"""Neo4j 5 Community, the graph server of the local stack, the tests and the benches.

``Neo4jServer(folder, bolt_port, http_port, password)`` writes ``folder/conf/neo4j.conf`` and, before the
first start, sets the initial password with Neo4j's own admin tool (``dbms set-initial-password``, as
``neo4j-admin`` does); ``command()`` is what starts Neo4j's own server (``org.neo4j.server.CommunityEntryPoint``,
what Neo4j's ``bin/neo4j console`` runs) with the jars ``headwater.deploy.tools.neo4j()`` fetched from Maven
Central into the tools cache: no Neo4j install, no scripts. Bolt and HTTP listen on ``host`` only, auth is on
(user ``neo4j``), the database is ``database`` (Community holds one beside ``system``; it is made on the first
start), usage reports are off. The data lives in ``folder/data`` and outlives the process. ``import_full``
loads a database from CSV files with Neo4j's own bulk importer before the first start (the benches' large
graphs); the page cache is ``HEADWATER_GRAPH_PAGE_CACHE`` where set.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from .kafka_server import java

MAIN_CLASS = "org.neo4j.server.CommunityEntryPoint"
ADMIN_CLASS = "org.neo4j.cli.AdminTool"
HEAP = "-Xmx1g"  # beside Spark and Kafka on 2 cores and 24 GiB; a production server sizes its own
PAGE_CACHE = "512m"
# A larger page cache for a larger graph (Neo4j's advice: the store's size), e.g. ``4g``: the stack's own
# server takes it from the environment, as ``server.memory.pagecache.size`` (Neo4j refuses a malformed one).
PAGE_CACHE_ENV = "HEADWATER_GRAPH_PAGE_CACHE"
# What Neo4j's own launcher gives its JVM on Java 17 and newer (its netty and page cache reach into java.nio).
JVM_OPTIONS = ("-XX:+UseG1GC", "-XX:-OmitStackTraceInFastThrow", "-XX:+DisableExplicitGC",
               "-Djdk.nio.maxCachedBufferSize=1024", "-Dio.netty.tryReflectionSetAccessible=true",
               "-Dlog4j2.disable.jmx=true", "-Djava.awt.headless=true",
               "--add-opens=java.base/java.nio=ALL-UNNAMED", "--add-opens=java.base/java.io=ALL-UNNAMED",
               "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED", "--enable-native-access=ALL-UNNAMED")


@dataclass
class Neo4jServer:
    folder: Path
    bolt_port: int
    http_port: int
    password: str = field(repr=False)
    host: str = "127.0.0.1"
    database: str = "lineage"
    page_cache: str = field(default_factory=lambda: os.environ.get(PAGE_CACHE_ENV) or PAGE_CACHE)

    def __post_init__(self):
        self.folder = Path(self.folder)

    @property
    def conf_dir(self) -> Path:
        return self.folder / "conf"

    @property
    def marker(self) -> str:
        """What tells this server's process in /proc/PID/cmdline from any other."""
        return f"{MAIN_CLASS} --home-dir={self.folder}"

    def settings(self) -> dict[str, str]:
        return {
            "server.default_listen_address": self.host,
            "server.default_advertised_address": self.host,
            "server.bolt.enabled": "true",
            "server.bolt.listen_address": f"{self.host}:{self.bolt_port}",
            "server.bolt.advertised_address": f"{self.host}:{self.bolt_port}",
            "server.http.enabled": "true",
            "server.http.listen_address": f"{self.host}:{self.http_port}",
            "server.http.advertised_address": f"{self.host}:{self.http_port}",
            "server.https.enabled": "false",
            "dbms.security.auth_enabled": "true",
            "initial.dbms.default_database": self.database,
            "server.directories.data": str(self.folder / "data"),
            "server.directories.logs": str(self.folder / "logs"),
            "server.directories.run": str(self.folder / "run"),
            "server.directories.import": str(self.folder / "import"),
            "server.directories.plugins": str(self.folder / "plugins"),
            "server.memory.pagecache.size": self.page_cache,
            "dbms.usage_report.enabled": "false",
        }

    def prepare(self, neo4j_jars: Path) -> None:
        """Write the config and, before the first start only, set the initial password (the data survives)."""
        self._write_config()
        if self._started_before():
            return  # the password is the system database's now
        self._admin(neo4j_jars, ["dbms", "set-initial-password", "--", self.password], "setting Neo4j's initial "
                    "password", timeout_s=120)

    def import_full(self, neo4j_jars: Path, nodes: dict[str, list[Path]], relationships: dict[str, list[Path]],
                    timeout_s: float = 7200) -> str:
        """Bulk-load CSV files into ``database`` before the server's first start, with Neo4j's own
        ``neo4j-admin database import full``; ``nodes`` and ``relationships`` by label and type, each a header
        file then data files. Far faster than transactions, for building a large graph at once (the benches); no
        constraints or indexes are made (the indexer's ``ensure_schema`` makes them on the running server).
        Returns the tool's report (its last lines)."""
        if self._started_before():
            raise RuntimeError(f"{self.folder} has been started: a full import needs a server never started")
        self._write_config()
        args = ["database", "import", "full", self.database, "--overwrite-destination=true",
                "--skip-bad-entries-logging=true", "--high-parallel-io=on",
                f"--report-file={self.folder / 'logs' / 'import.report'}"]  # not the working directory
        args += [f"--nodes={label}={','.join(map(str, files))}" for label, files in nodes.items()]
        args += [f"--relationships={kind}={','.join(map(str, files))}" for kind, files in relationships.items()]
        return self._admin(neo4j_jars, args, "neo4j-admin database import full", timeout_s=timeout_s)

    def _write_config(self) -> None:
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        (self.conf_dir / "neo4j.conf").write_text("".join(f"{k}={v}\n" for k, v in self.settings().items()))

    def _started_before(self) -> bool:
        return (self.folder / "data" / "databases" / "system").exists()

    def _admin(self, neo4j_jars: Path, args: list[str], what: str, timeout_s: float) -> str:
        """Run Neo4j's admin tool (what ``neo4j-admin`` runs) with ``args``; its output's last lines."""
        done = subprocess.run(self._java(neo4j_jars) + [ADMIN_CLASS, *args], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self._tool_environment(),
                              timeout=timeout_s)
        tail = done.stdout.decode(errors="replace").strip().splitlines()[-12:]
        if done.returncode != 0:
            raise RuntimeError(f"{what} in {self.folder} failed: {' | '.join(tail[-5:])}")
        return "\n".join(tail)

    def command(self, neo4j_jars: Path) -> list[str]:
        return self._java(neo4j_jars) + [MAIN_CLASS, f"--home-dir={self.folder}", f"--config-dir={self.conf_dir}",
                                         "--console-mode"]

    def _tool_environment(self) -> dict[str, str]:
        """The environment Neo4j's admin tool runs in: it finds the home and config by it (the server is told
        them by its arguments)."""
        return {**os.environ, "NEO4J_HOME": str(self.folder), "NEO4J_CONF": str(self.conf_dir)}

    def _java(self, neo4j_jars: Path) -> list[str]:
        return [java(), HEAP, *JVM_OPTIONS, "-cp", f"{neo4j_jars}/*"]
