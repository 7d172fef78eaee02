"""The Spark lines headwater supports, and each difference between them that headwater meets, in one place.

A line is a Spark minor release that headwater is proven on: its tests pass on it, and the wheel carries a
capture jar built against it (Scala 2.12 for Spark 3.5, 2.13 for Spark 4). ``line_of(version)`` is the line of
a Spark version; a version of no line is refused with ``UnsupportedSpark``, which names the supported ones.
``running(spark)`` is the line of a session's Spark (what ``attach`` asks), ``installed()`` that of the
installed pyspark.

Code elsewhere asks the line for what differs (a JVM class's name, a plan constructor's arguments, how a Scala
collection is made), never compares version numbers; tests of an API that came with a later line ask ``has``.
To support another line: one ``SparkLine`` in ``LINES``, its jar's sources (``capture/java/spark-<jar>/``, if a
jar of the lines so far does not serve it), and its tested release in the dev script's ``SPARK_RELEASES``
(``./dev test`` runs the tests of every line on it).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class UnsupportedSpark(RuntimeError):
    """A Spark release headwater has no line for."""


@dataclass(frozen=True)
class SparkLine:
    """One supported Spark minor release and how headwater meets it; a subclass per jar (``Spark35``, ``Spark4``)
    holds what differs, each difference one method or field, the same in every subclass.

    - ``minor``: ``"3.5"``; ``tested``: the release the tests and the jar's build use (its pyspark on PyPI and its
      Kafka connector on Maven Central);
    - ``scala``: the Scala version of its jars; ``jar``: which of capture's jars serves it
      (``capture/java/spark-<jar>/``, built into ``capture/headwater-capture-spark-<jar>.jar``);
    - ``streaming_sinks``: the package of Spark's file sink (``FileStreamSink``, ``FileStreamSinkLog``).
    """

    minor: str
    tested: str
    streaming_sinks: str
    scala: ClassVar[str]
    jar: ClassVar[str]

    def has(self, since: str) -> bool:
        """Whether this line is the minor release ``since`` (``"4.2"``) or a later one: what a test of an API that
        came with ``since`` asks."""
        return _minor(self.minor) >= _minor(since)

    def scala_seq(self, jvm, java_list):
        """A Java list as a Scala ``Seq`` (an immutable ``List``), as Catalyst's constructors take one."""
        raise NotImplementedError

    def column_of(self, jvm, expression):
        """The JVM ``Column`` of a Catalyst expression."""
        raise NotImplementedError

    def dataset_of(self, jvm, jspark, plan):
        """The JVM ``Dataset`` of a logical plan in the JVM session ``jspark`` (``Dataset.ofRows``)."""
        raise NotImplementedError

    def aggregate(self, jvm, original, grouping, aggregates, child):
        """An ``Aggregate`` of ``grouping`` and ``aggregates`` (Scala ``Seq``s) over ``child``, with ``original``'s
        hint where the line's aggregates carry one."""
        raise NotImplementedError

    def to_pandas(self, batch, timezone: str):
        """A Python worker's view of ``batch`` (one struct column: a black box's input rows): the pandas
        DataFrame a pandas function gets, converted as the line's worker converts it."""
        raise NotImplementedError

    def from_pandas(self, df, wrapped, timezone: str):
        """A pandas function's output ``df`` as the line's worker sends it back: a record batch of one struct
        column, ``wrapped`` (a ``StructType`` of that one field, the function's return type)."""
        raise NotImplementedError

    def v2_relation(self, jvm, table, catalog, identifier, options):
        """``DataSourceV2Relation.create`` of a table (``catalog``, ``identifier``: Scala options) with ``options``
        (a ``CaseInsensitiveStringMap``)."""
        raise NotImplementedError

    def write_to_micro_batch(self, jvm, relation, plan, query_id: str, options, mode):
        """Spark's plan that writes ``plan`` into a V2 table's ``relation`` as a micro-batch of ``query_id``
        (``WriteToMicroBatchDataSource``, its batch id still to set), with ``options`` (a Scala map) in ``mode``."""
        raise NotImplementedError

    def data_source(self, jvm, jspark, source: str, partition_by, options):
        """Spark's ``DataSource`` of format ``source`` (a V1 sink's), partitioned by ``partition_by`` (a Scala
        ``Seq``), with ``options`` (a Scala map), as ``DataStreamWriter`` makes it."""
        raise NotImplementedError


@dataclass(frozen=True)
class Spark35(SparkLine):
    """Spark 3.5: Scala 2.12; the classic ``Dataset`` and ``Column`` in ``org.apache.spark.sql``; an aggregate carries
    no hint; the Python worker converts pandas rows with its UDF serializer."""

    scala = "2.12"
    jar = "3.5"

    def scala_seq(self, jvm, java_list):
        return jvm.scala.collection.JavaConverters.asScalaBuffer(java_list).toList()

    def column_of(self, jvm, expression):
        return jvm.org.apache.spark.sql.Column(expression)

    def dataset_of(self, jvm, jspark, plan):
        return jvm.org.apache.spark.sql.Dataset.ofRows(jspark, plan)

    def aggregate(self, jvm, original, grouping, aggregates, child):
        return jvm.org.apache.spark.sql.catalyst.plans.logical.Aggregate(grouping, aggregates, child)

    def to_pandas(self, batch, timezone):
        return _udf_serializer(timezone).arrow_to_pandas(batch.column(0))

    def from_pandas(self, df, wrapped, timezone):
        from pyspark.sql.pandas.types import to_arrow_type

        return _udf_serializer(timezone)._create_batch([(df, to_arrow_type(wrapped.fields[0].dataType))])

    def v2_relation(self, jvm, table, catalog, identifier, options):
        return jvm.org.apache.spark.sql.execution.datasources.v2.DataSourceV2Relation.create(
            table, catalog, identifier, options)

    def write_to_micro_batch(self, jvm, relation, plan, query_id, options, mode):
        return jvm.org.apache.spark.sql.execution.streaming.sources.WriteToMicroBatchDataSource(
            jvm.scala.Some(relation), relation.table(), plan, query_id, options, mode, jvm.scala.Option.empty())

    def data_source(self, jvm, jspark, source, partition_by, options):
        none = jvm.scala.Option.empty()
        factory = getattr(jvm.org.apache.spark.sql.execution.datasources, "DataSource$").__getattr__("MODULE$")
        return factory.apply(jspark, source, self.scala_seq(jvm, jvm.java.util.ArrayList()), none, partition_by,
                             none, options, none)


@dataclass(frozen=True)
class Spark4(SparkLine):
    """Spark 4: Scala 2.13; the classic ``Dataset`` and the conversions between expressions and columns in
    ``org.apache.spark.sql.classic``; an aggregate carries a hint; a relation may travel in time; a ``DataSource``
    says whether its schema was given; the Python worker converts pandas rows with ``pyspark.sql.conversion``."""

    scala = "2.13"
    jar = "4"

    def scala_seq(self, jvm, java_list):
        return jvm.scala.jdk.javaapi.CollectionConverters.asScala(java_list).toList()

    def column_of(self, jvm, expression):
        return jvm.org.apache.spark.sql.classic.ExpressionUtils.column(expression)

    def dataset_of(self, jvm, jspark, plan):
        return jvm.org.apache.spark.sql.classic.Dataset.ofRows(jspark, plan)

    def aggregate(self, jvm, original, grouping, aggregates, child):
        return jvm.org.apache.spark.sql.catalyst.plans.logical.Aggregate(grouping, aggregates, child, original.hint())

    def to_pandas(self, batch, timezone):
        from pyspark.sql.conversion import ArrowBatchTransformer

        return ArrowBatchTransformer.to_pandas(batch, timezone=timezone, df_for_struct=True)[0]

    def from_pandas(self, df, wrapped, timezone):
        from pyspark.sql.conversion import PandasToArrowConversion

        return PandasToArrowConversion.convert([df], wrapped, timezone=timezone, safecheck=True, arrow_cast=True,
                                               assign_cols_by_name=True)

    def v2_relation(self, jvm, table, catalog, identifier, options):
        return jvm.org.apache.spark.sql.execution.datasources.v2.DataSourceV2Relation.create(
            table, catalog, identifier, options, jvm.scala.Option.empty())

    def write_to_micro_batch(self, jvm, relation, plan, query_id, options, mode):
        return jvm.org.apache.spark.sql.execution.streaming.sources.WriteToMicroBatchDataSource(
            relation, plan, query_id, options, mode, jvm.scala.Option.empty())

    def data_source(self, jvm, jspark, source, partition_by, options):
        none = jvm.scala.Option.empty()
        factory = getattr(jvm.org.apache.spark.sql.execution.datasources, "DataSource$").__getattr__("MODULE$")
        return factory.apply(jspark, source, self.scala_seq(jvm, jvm.java.util.ArrayList()), none, partition_by,
                             none, options, none, none)


LINES: tuple[SparkLine, ...] = (
    Spark35("3.5", tested="3.5.7", streaming_sinks="org.apache.spark.sql.execution.streaming"),
    Spark4("4.2", tested="4.2.0", streaming_sinks="org.apache.spark.sql.execution.streaming.sinks"),
)
DEFAULT = LINES[-1]  # the line `./dev test` installs, unless HEADWATER_SPARK names another


def _udf_serializer(timezone: str):
    """Spark 3.5's serializer of a pandas function's rows, as its Python worker makes it for ``mapInPandas`` and
    ``applyInPandas``: struct columns as DataFrames, results assigned by column name, Arrow casts allowed."""
    from pyspark.sql.pandas.serializers import ArrowStreamPandasUDFSerializer

    # Spark 3.5's signature: the type checker reads the default line's pyspark, whose serializer takes others.
    return ArrowStreamPandasUDFSerializer(timezone, safecheck=True, assign_cols_by_name=True,  # type: ignore[call-arg]
                                          df_for_struct=True, arrow_cast=True)


def _minor(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def supported() -> str:
    """The supported releases, as an error message names them."""
    return ", ".join(f"{line.minor}.x" for line in LINES)


def line_of(version: str) -> SparkLine:
    """The line of Spark ``version`` (``"3.5.7"``, ``"4.2.0"``, ``"3.5.7-SNAPSHOT"``)."""
    minor = ".".join(version.split(".")[:2])
    for line in LINES:
        if line.minor == minor:
            return line
    raise UnsupportedSpark(f"headwater supports Spark {supported()}; this is Spark {version}. Install headwater "
                           f"with a pyspark of a supported line, matching the cluster's Spark")


def running(spark: SparkSession) -> SparkLine:
    """The line of the Spark that ``spark`` runs."""
    return line_of(spark.version)


@functools.cache
def installed() -> SparkLine:
    """The line of the installed pyspark."""
    from importlib.metadata import version

    return line_of(version("pyspark"))


def recent_progress(query) -> list:
    """``query.recentProgress`` as ``StreamingQueryProgress`` objects on every line: Spark 3.5's PySpark gives
    dicts, whose sources' offsets are dicts, not Spark's JSON text."""
    return [_progress(p) for p in query.recentProgress]


def last_progress(query):
    """``query.lastProgress`` as a ``StreamingQueryProgress`` (``recent_progress``), or None before any."""
    return _progress(query.lastProgress)


def _progress(progress):
    from pyspark.sql.streaming.listener import StreamingQueryProgress

    if progress is None or isinstance(progress, StreamingQueryProgress):
        return progress
    sources = [{**s, **{k: _json_text(s.get(k)) for k in ("startOffset", "endOffset", "latestOffset")}}
               for s in progress["sources"]]
    return StreamingQueryProgress.fromJson({**progress, "sources": sources})


def _json_text(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)
