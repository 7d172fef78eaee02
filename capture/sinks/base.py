"""What every sink shares: the user's ``writeStream`` settings (``SinkSpec``), the ``Sink`` each kind subclasses,
the guarantees a sink gives and ``SinkError``. ``headwater.capture.sinks`` re-exports them; its ``open_sink`` picks
the kind."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from headwater.core.plugins import load_plugins, registrar

EXACTLY_ONCE = "exactly-once"
AT_LEAST_ONCE = "at-least-once"
NONE = "none"  # nothing is kept (console, noop)

FOREACH, FOREACH_BATCH, MEMORY, CONSOLE, NOOP = "foreach", "foreachBatch", "memory", "console", "noop"
CONTINUOUS_TRIGGERS = ("continuous", "realTime")


class SinkError(ValueError):
    """The traced query's sink is set up in a way headwater cannot write as Spark would."""


@dataclass
class SinkSpec:
    """What the user asked of ``writeStream``: the sink's source name (a format, ``foreach`` or
    ``foreachBatch``, as ``DataStreamWriter`` keeps it), options, table and columns."""

    format: str | None = None  # None: spark.sql.sources.default, resolved at start()
    options: dict = field(default_factory=dict)
    table: str | None = None
    function: object = None  # the user's foreach writer or foreachBatch function
    partition_by: list[str] | None = None
    cluster_by: list[str] | None = None

    @property
    def foreach_batch(self):
        return self.function if self.format == FOREACH_BATCH else None

    @property
    def path(self) -> str | None:
        return option(self.options, "path")

    def describe(self) -> str:
        if self.table:
            return f"table:{self.table}"
        if self.format in (FOREACH, FOREACH_BATCH):
            return self.format
        if self.format == MEMORY:
            return f"memory:{option(self.options, 'queryName') or ''}"
        if (self.format or "").lower() == "kafka":  # its topic; a topic named by each row, none
            return f"kafka:{option(self.options, 'topic') or ''}"
        return f"{self.format}:{self.path or ''}"


def option(options: dict, key: str) -> str | None:
    """An option by its name in any case, as Spark's ``CaseInsensitiveMap`` finds it."""
    for name, value in options.items():
        if name.lower() == key.lower():
            return value
    return None


# The sinks by the format name ``writeStream.format`` gives (``register_sink``): capture's own, then those of other
# packages' entry points (group ``headwater.sinks``: ``NAME = "package.module"``, a module whose classes register
# themselves). A format none names is written by Spark's own code (``spark_sinks.spark_sink``).
SINKS: dict[str, type[Sink]] = {}
ENTRY_POINTS = "headwater.sinks"


def register_sink(format: str) -> Callable[[type[Sink]], type[Sink]]:
    """A class decorator: the ``Sink`` a traced query with ``writeStream.format(format)`` writes through (its
    ``open``). A name taken already is refused."""
    return registrar(SINKS, format, f"a sink for format {format!r}")


def registered_sinks() -> dict[str, type[Sink]]:
    """Every registered sink by format, once the modules other packages name in their entry points are imported
    (``plugins.load_plugins``: one that fails to import is skipped with a warning)."""
    load_plugins(ENTRY_POINTS, SINKS)
    return SINKS


class Sink:
    """One kind of sink: ``write`` puts one micro-batch's rows in it; ``open`` makes one, for a registered sink."""

    guarantee = AT_LEAST_ONCE  # what a batch retried after a crash leaves in the sink
    # Whether writing a batch reads every row of it, so its lineage can be published by the
    # tasks that write it; not where code may skip rows (the user's, a V1 sink's own).
    reads_every_row = True

    @classmethod
    def open(cls, spark: SparkSession, spec: SinkSpec, schema: StructType, output_mode: str) -> Sink:
        """The sink for the writer's settings (``output_mode`` in lower case: append, update or complete), built
        as Spark would build it at ``start()``: what a registered sink (``register_sink``) says how to do."""
        raise NotImplementedError(f"{cls.__name__} is registered as a sink and says not how to open one")

    def write(self, df: DataFrame, batch_id: int) -> None:
        raise NotImplementedError

    def latest_batch(self) -> int:
        """The last batch the sink's own commit log holds (-1: none, or the sink keeps no log).
        Spark runs a batch again only if its commit did not follow the write: the log may end
        with the batch, which ``write`` then leaves as it is; a later batch is another run's."""
        return -1

    def started(self, query_name: str) -> None:
        """Called once the traced query has started."""

    def files(self, batch_id: int) -> list[str] | None:
        """The files the batch added to the sink, for sinks of files; None for others."""
        return None

    def offsets(self, batch_id: int) -> dict | None:
        """Where the batch's records went, for Kafka: ``{topic: {partition: [first, end)}}``; None for others."""
        return None
