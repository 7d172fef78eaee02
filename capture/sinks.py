"""Writing one micro-batch of the user's output to the user's sink, idempotently.

The traced query runs as a ``foreachBatch`` query, so the user's ``format(...)`` sink is
written here. File sinks are written to a staging folder and then moved in under names
that carry the batch id (``part-hw-<batch>-…``), replacing any files an earlier attempt
of the same batch left: a retried batch leaves the sink as one attempt would.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyspark.sql import DataFrame

FILE_FORMATS = {"parquet", "json", "csv", "orc", "text"}
STAGING = "_hw_staging"


@dataclass
class SinkSpec:
    format: str | None = None
    options: dict = field(default_factory=dict)
    table: str | None = None
    foreach_batch: object = None  # the user's own foreachBatch function, if any

    def describe(self) -> str:
        if self.table:
            return f"table:{self.table}"
        if self.foreach_batch is not None:
            return "foreachBatch"
        return f"{self.format}:{self.options.get('path', '')}"


class SinkError(ValueError):
    """The traced query's sink is not configured in a way headwater can write."""


def _fs(df: DataFrame, path: str):
    jvm = df.sparkSession._jvm
    conf = df.sparkSession._jsc.hadoopConfiguration()
    jpath = jvm.org.apache.hadoop.fs.Path(path)
    return jpath.getFileSystem(conf), jpath, jvm


def _write_files(df: DataFrame, spec: SinkSpec, batch_id: int, retry: bool) -> None:
    path = spec.options["path"]
    fs, root, jvm = _fs(df, path)
    staging = f"{path.rstrip('/')}/{STAGING}/batch-{batch_id}"
    writer = df.write.format(spec.format).mode("overwrite")
    writer.options(**{k: v for k, v in spec.options.items() if k not in ("path", "checkpointLocation")}).save(staging)
    prefix = f"part-hw-{batch_id:010d}-"
    if retry:  # an earlier attempt may have moved some files in
        for status in fs.listStatus(root):
            if status.getPath().getName().startswith(prefix):
                fs.delete(status.getPath(), False)
    staged = {p.getName(): p for p in (s.getPath() for s in fs.listStatus(jvm.org.apache.hadoop.fs.Path(staging)))}
    parts = sorted(name for name in staged if name.startswith("part-"))
    for i, name in enumerate(parts):
        suffix = name.split(".", 1)[1] if "." in name else spec.format
        fs.rename(staged[name], jvm.org.apache.hadoop.fs.Path(root, f"{prefix}{i:05d}.{suffix}"))
    fs.delete(jvm.org.apache.hadoop.fs.Path(staging), True)


def write_batch(df: DataFrame, spec: SinkSpec, batch_id: int, retry: bool = True) -> None:
    """Write one batch; ``retry=False`` when no earlier attempt of it can have written files."""
    if spec.foreach_batch is not None:
        spec.foreach_batch(df, batch_id)
    elif spec.table:
        df.write.mode("append").saveAsTable(spec.table)
    elif spec.format in FILE_FORMATS:
        if not spec.options.get("path"):
            raise SinkError(f"a {spec.format} sink needs a path: .start(path) or .option('path', …)")
        _write_files(df, spec, batch_id, retry)
    elif spec.format == "console":
        df.show(int(spec.options.get("numRows", 20)), truncate=spec.options.get("truncate", "true") == "true")
    elif spec.format == "noop":
        df.write.format("noop").mode("overwrite").save()
    elif spec.format:
        df.write.format(spec.format).options(**spec.options).mode("append").save()
    else:
        raise SinkError("the traced query has no sink: call .format(…).start(path), .toTable(…) or .foreachBatch(…)")
