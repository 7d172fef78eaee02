"""capture's JVM part: the journal filter of the hot path (``java/common/headwater/capture/Journal.java``), the
JVM half of the per-batch hook (``Hook.java``) and the listeners (``JobTimes.java``, ``Progress.java``).

Lineage is journaled from the JVM because any Python UDF in a Spark task costs a fixed 50-100 ms a
batch here (a Python worker handed the task, Arrow both ways, the rows held in the JVM meanwhile),
more than the whole overhead budget of a 10,000-row batch (capture/README.md, "The hot path").

One jar per Spark line's Scala version (``headwater.adapters.spark_lines``): ``headwater-capture-spark-3.5.jar``
(Spark 3.5, Scala 2.12) and ``headwater-capture-spark-4.jar`` (Spark 4, Scala 2.13), each compiled from the
common sources (``java/common``) and its line's ``SparkLine`` class (``java/spark-<jar>``, what differs) against
its line's jars: the installed pyspark's, or those of the line's tested release from Maven Central (the tools
cache's ``spark-<minor>``). The wheel ships them all, so neither users nor tests need a JDK, and ``Journals``
adds the one of the session's running Spark. Each records the digest of the sources it was built from, and
``tests/capture/test_journal.py`` fails when they differ. Rebuild them all after changing the sources (javac 17
or newer):

    .venv/bin/python -m headwater.capture.jar

``Journals`` adds the jar to a session (``ADD JAR``) and makes each publisher's filter column: a
nondeterministic call of the journal's ``test`` on one struct column, the publisher's fields, that
reads the struct as Spark holds it (no conversion of rows to Java objects and back). On executors (not the driver's
JVM) the filter starts ``headwater drain`` for its host's folder when none runs (``drain_command``).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tempfile
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from headwater.adapters import spark_lines
from headwater.adapters.spark_lines import SparkLine

from .journal import PROPERTY, Publisher
from .spark_plan import session_gateway

HERE = Path(__file__).parent
SOURCES = HERE / "java"
DIGEST = "headwater/capture/source.sha256"  # inside the jar
CLASS = "headwater.capture.Journal"
JOB_TIMES = "headwater.capture.JobTimes"
HOOK = "headwater.capture.Hook"
PROGRESS = "headwater.capture.Progress"
DRAIN_IDLE_S = 60.0  # an executor's drain process exits after this long with nothing to send
COUNTS = ("rows", "edges", "spilled_edges", "dropped_edges", "bytes", "nanos", "failed")  # Journal's accumulators


def jar_path(line: SparkLine) -> Path:
    """The capture jar that serves ``line``."""
    return HERE / f"headwater-capture-spark-{line.jar}.jar"


def source_roots(line: SparkLine) -> list[Path]:
    """The folders of the Java sources of ``line``'s jar: the common ones and the line's own."""
    return [SOURCES / "common", SOURCES / f"spark-{line.jar}"]


def source_digest(line: SparkLine) -> str:
    """The digest of the Java sources of ``line``'s jar, as the jar records it."""
    digest = hashlib.sha256()
    for root in source_roots(line):
        for path in sorted(root.rglob("*.java")):
            digest.update(path.relative_to(SOURCES).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def built_digest(jar: Path) -> str | None:
    """The digest of the sources ``jar`` was built from; None if it records none."""
    try:
        with zipfile.ZipFile(jar) as archive:
            return archive.read(DIGEST).decode().strip()
    except (FileNotFoundError, KeyError):
        return None


def spark_jars(line: SparkLine) -> Path:
    """The folder of Spark's jars of ``line``: the installed pyspark's if it is of that line, else those of the
    line's tested release from Maven Central (``headwater.deploy.tools.spark_jars``)."""
    from headwater.deploy import tools

    if spark_lines.installed() == line:
        return tools.pyspark_jars()
    return tools.spark_jars(line)


def build(line: SparkLine, out: Path | None = None) -> Path:
    """Compile ``line``'s sources with javac against its Spark's jars into ``out`` (its ``jar_path``)."""
    out = out or jar_path(line)
    javac = shutil.which("javac")
    if javac is None:
        raise RuntimeError("building headwater's capture jar needs javac (a JDK 17 or newer)")
    classpath = str(spark_jars(line) / "*")
    with tempfile.TemporaryDirectory() as tmp:
        classes = Path(tmp)
        sources = [str(p) for root in source_roots(line) for p in sorted(root.rglob("*.java"))]
        subprocess.run([javac, "--release", "17", "-Xlint:all,-path", "-Werror", "-cp", classpath,
                        "-d", str(classes), *sources], check=True)
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
            archive.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\nCreated-By: headwater\r\n\r\n")
            for path in sorted(classes.rglob("*.class")):
                archive.write(path, path.relative_to(classes).as_posix())
            archive.writestr(DIGEST, source_digest(line) + "\n")
    return out


@dataclass(frozen=True)
class Counts:
    """One traced query's accumulators of what its journal filters did (``COUNTS``), read by the hook."""

    accumulators: tuple

    @staticmethod
    def make(spark: SparkSession, query: str) -> "Counts":
        sc = spark.sparkContext._jsc.sc()
        return Counts(tuple(sc.longAccumulator(f"headwater {query} {name}") for name in COUNTS))

    def value(self) -> dict[str, int]:
        return {name: int(acc.sum()) for name, acc in zip(COUNTS, self.accumulators)}

    def nanos(self) -> int:
        """The ``nanos`` accumulator alone: one call into the JVM."""
        return int(self.accumulators[COUNTS.index("nanos")].sum())


def drain_command(spark: SparkSession, env: dict[str, str], idle_s: float = DRAIN_IDLE_S) -> str:
    """What an executor runs to drain its host's journal: ``headwater drain`` under the Python its
    PySpark workers use (``spark.pyspark.python``, else PySpark's ``PYSPARK_PYTHON`` rule), with ``env``
    (``HEADWATER_*`` delivery settings; the executor adds its folder). JSON, as ``Journal`` reads it."""
    python = spark.conf.get("spark.pyspark.python", None) or spark.sparkContext.pythonExec
    command = [python, "-m", "headwater.cli", "drain", "--idle", f"{idle_s:g}"]
    return json.dumps({"command": command, "env": env})


class Journals:
    """A session's journal filters: ``column(publisher, counts)`` makes one, true for every row, that
    journals the publisher's fields from the JVM; build it once per publisher and reuse it. ``drain``:
    ``drain_command``'s JSON, or "" for executors that start no drain.

    ``folder`` is the journal folder on the driver's host; ``destination``, its ``delivery.Destination.key``
    (the folder's name under the spill root), names an executor's folder under its own spill root, and
    with ``writer`` (the tracer) goes into every file's spec. "": a folder of no one destination."""

    def __init__(self, spark: SparkSession, folder: str, max_bytes: int, drain: str = "", destination: str = "",
                 writer: str = ""):
        line = spark_lines.running(spark)
        jar = jar_path(line)
        if built_digest(jar) != source_digest(line):
            raise RuntimeError(f"{jar} was not built from the Java sources beside it: rebuild it with "
                               f"`python -m headwater.capture.jar`")
        self.spark = spark
        self.folder = folder
        self.max_bytes = max_bytes
        self.drain = drain
        self.destination = destination
        self.writer = writer
        loader = spark._jsparkSession.sharedState().jarClassLoader()
        if str(jar) not in {url.getPath() for url in loader.getURLs()}:  # once per session: Spark warns after
            spark.sql(f"ADD JAR '{jar}'")
        self._loader = loader
        self._class = loader.loadClass(CLASS)

    def job_times(self):
        """A new ``JobTimes`` listener of the jar (``jvm_listener.JobTimes`` registers it)."""
        return self._new(JOB_TIMES)

    def progress(self):
        """A new ``Progress`` listener of the jar (``listener.ProgressListener`` registers it)."""
        return self._new(PROGRESS)

    def _new(self, name: str):
        """An instance of the jar's class ``name``, made by its constructor of no arguments."""
        gateway = session_gateway(self.spark)
        return self._loader.loadClass(name).getConstructor(self._classes([])).newInstance(
            gateway.new_array(gateway.jvm.java.lang.Object, 0))

    def hook(self, row_hash: str, rid: str, named: list[Column]):
        """A new ``Hook`` of the jar: the JVM half of one traced query's per-batch hook (``batch_hook.BatchHook``),
        over the output columns ``row_hash`` and ``rid``, the sink's columns ``named``."""
        gateway = session_gateway(self.spark)
        jvm = gateway.jvm
        column = jvm.java.lang.Class.forName("org.apache.spark.sql.Column")
        string = jvm.java.lang.Class.forName("java.lang.String")
        columns = gateway.new_array(jvm.org.apache.spark.sql.Column, len(named))
        for i, c in enumerate(named):
            columns[i] = c._jc
        args = gateway.new_array(jvm.java.lang.Object, 3)
        for i, a in enumerate([row_hash, rid, columns]):
            args[i] = a
        array = jvm.java.lang.reflect.Array.newInstance(column, 0).getClass()
        return self._loader.loadClass(HOOK).getConstructor(self._classes([string, string, array])).newInstance(args)

    def _classes(self, classes: list):
        gateway = session_gateway(self.spark)
        array = gateway.new_array(gateway.jvm.java.lang.Class, len(classes))
        for i, c in enumerate(classes):
            array[i] = c
        return array

    def column(self, publisher: Publisher, counts: Counts, frame: DataFrame, columns: list[Column]) -> Column:
        """``publisher``'s journal filter over ``columns`` of ``frame`` (its fields, in order): a condition
        true for every row. ``frame`` only gives the fields' types; the column applies to any frame
        with those columns."""
        gateway = session_gateway(self.spark)
        jvm = gateway.jvm
        struct = F.struct(*[c.alias(name) for c, name in zip(columns, publisher.fields)])
        schema = frame.select(struct).schema.fields[0].dataType.json()
        inputs = gateway.new_array(jvm.int, len(publisher.inputs))
        for i, name in enumerate(publisher.inputs):
            inputs[i] = publisher.fields.index(name)
        accumulators = gateway.new_array(jvm.org.apache.spark.util.LongAccumulator, len(COUNTS))
        for i, acc in enumerate(counts.accumulators):
            accumulators[i] = acc
        late = publisher.fields.index(publisher.late) if publisher.late is not None else -1
        spec = replace(publisher, destination=self.destination or None, writer=self.writer or None).to_json()
        args = [spec, self.folder, self.destination, PROPERTY, self.max_bytes, publisher.mode, inputs, late,
                str(publisher.op), self.drain, accumulators]
        string = jvm.java.lang.Class.forName("java.lang.String")
        types = [string, string, string, string, string, jvm.java.lang.Long.TYPE, string,
                 jvm.java.lang.Class.forName("[I"), jvm.java.lang.Integer.TYPE, string, string,
                 jvm.java.lang.Class.forName("[Lorg.apache.spark.util.LongAccumulator;")]
        column_class = jvm.java.lang.Class.forName("org.apache.spark.sql.Column")
        values = gateway.new_array(jvm.java.lang.Object, len(args) + 2)
        for i, a in enumerate([struct._jc, schema, *args]):
            values[i] = a
        method = self._class.getMethod("column", self._classes([column_class, *types]))
        return Column(method.invoke(None, values))


if __name__ == "__main__":
    for built in {line.jar: line for line in spark_lines.LINES}.values():
        print(build(built))
