"""Parquet and ORC files read as Spark reads them, through pyarrow.

Spark matches a file's columns to the relation's by name, ignoring case, and reads a column a
file lacks as NULL; pyarrow reads the files, and this module picks, matches and casts the
columns. Two things pyarrow does not do as Spark does: it reads Spark's INT96 Parquet
timestamps (instants) zone-less and in nanoseconds, and ORC's zone-less timestamps are wall
clocks in the writer's zone, which pyarrow does not tell.
"""

from __future__ import annotations

from datetime import timezone
from typing import Callable

import pyarrow as pa
import pyarrow.parquet as pq

from .listing import DataFile
from .location import TableUnreadable
from .types import spark_type


def read_parquet(path: str, data: list, options: dict) -> pa.Table:
    # Spark writes timestamps as INT96 by default; pyarrow would read them as nanoseconds,
    # which overflow before year 1677 and after 2262.
    file = pq.ParquetFile(path, coerce_int96_timestamp_unit="us")
    return _typed_columns(path, file.schema_arrow, lambda names: file.read(columns=names), data)


def read_orc(path: str, data: list, options: dict) -> pa.Table:
    from pyarrow import orc

    file = orc.ORCFile(path)
    return _typed_columns(path, file.schema, lambda names: file.read(columns=names), data, wall_clock=True)


def _typed_columns(path: str, schema: pa.Schema, read: Callable, data: list, wall_clock: bool = False) -> pa.Table:
    """The columns ``data`` names, matched by name as Spark does (ignoring case), cast to their
    types; a column the file lacks is NULL. ``wall_clock``: the file's zone-less timestamps
    are wall clocks, not UTC."""
    by_name: dict[str, str] = {}
    for name in schema.names:
        by_name.setdefault(name.lower(), name)
    wanted = {name: by_name.get(name.lower()) for name, _ in data}
    table = read([n for n in dict.fromkeys(wanted.values()) if n is not None])
    arrays = []
    for name, t in data:
        found = wanted[name]
        if found is None:
            arrays.append(pa.nulls(table.num_rows, t))
            continue
        column = table.column(found)
        if wall_clock and pa.types.is_timestamp(t) and t.tz is not None and column.type.tz is None:
            column = _local_to_utc(column)
        try:
            arrays.append(column.cast(t))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise TableUnreadable(f"{path}: column {found} ({table.column(found).type}) cannot be read "
                                  f"as {t}: {e}") from None
    return pa.table(arrays, names=[name for name, _ in data]) if data else table.select([])


def _local_to_utc(column: pa.ChunkedArray) -> pa.Array:
    """Wall clocks as instants. ORC keeps a timestamp as its wall clock in the writer's zone,
    which pyarrow does not tell: this machine's zone stands in for it (Spark writes in its
    JVM's zone, which is this machine's when Spark ran here)."""
    values = column.cast(pa.timestamp("us")).to_pylist()
    return pa.array([None if v is None else v.astimezone(timezone.utc) for v in values], pa.timestamp("us", tz="UTC"))


def file_schema_columns(fmt: str, files: list[DataFile]) -> list[tuple[str, str]]:
    """Without the relation's columns: the first file's, as Spark types them."""
    if not files:
        return []
    path = files[0].path
    try:
        if fmt == "parquet":
            file = pq.ParquetFile(path, coerce_int96_timestamp_unit="us")
            schema = file.schema_arrow
            # INT96 (Spark's default) holds instants, though pyarrow reads them zone-less.
            instants = {column.path for column in file.schema if column.physical_type == "INT96"}
        else:
            from pyarrow import orc
            schema = orc.ORCFile(path).schema
            instants = set(schema.names)  # ORC's zone-less timestamp is Spark's timestamp
    except (OSError, pa.ArrowException) as e:
        raise TableUnreadable(f"{path}: cannot be read as {fmt}: {e}") from None
    # Spark notes its type beside an ORC column whose ORC type does not say it (timestamp_ntz is a long).
    said = {field.name: (field.metadata or {}).get(b"spark.sql.catalyst.type") for field in schema}
    return [(field.name, noted.decode() if (noted := said[field.name]) else
             spark_type(field.type, field.name in instants)) for field in schema]
