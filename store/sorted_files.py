"""Point reads from Parquet files sorted by one key column, through their row groups' statistics.

A compacted generation writes its edges sorted by ``dst_set`` within each bucket's file
and its rows records sorted by ``rid``, in small row groups. Each row group's min and max
of the key are in the file's footer: ``SortedFiles`` reads the footers once, and a
lookup then decodes only the row groups whose key range holds a wanted key, instead of
whole files (a dataset filter would read every footer again on every call). A lookup reads its files at
once, each file's row groups in one coalesced read (``pre_buffer``): in object storage a read is a round trip.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from .tables import READERS


class SortedFiles:
    """Parquet files whose row groups each hold a range of ``key`` (recorded in the footer's statistics)."""

    def __init__(self, files: Sequence[str | Path], key: str, schema: pa.Schema | None = None,
                 filesystem: pafs.FileSystem | None = None):
        self.key = key
        self.schema = schema
        self._files: list[pq.ParquetFile] = []
        lows, highs, where = [], [], []
        for path in files:
            parquet = pq.ParquetFile(str(path), filesystem=filesystem, pre_buffer=True)
            column = parquet.schema_arrow.get_field_index(key)
            for group in range(parquet.metadata.num_row_groups):
                chunk = parquet.metadata.row_group(group)
                if chunk.num_rows == 0:
                    continue
                stats = chunk.column(column).statistics
                if stats is None or not stats.has_min_max:  # no statistics: the group may hold any key
                    lows.append(-(1 << 63))
                    highs.append((1 << 63) - 1)
                else:
                    lows.append(stats.min)
                    highs.append(stats.max)
                where.append((len(self._files), group))
            self._files.append(parquet)
        self._lows = np.array(lows, np.int64)
        self._highs = np.array(highs, np.int64)
        self._where = where

    def read(self, keys, columns: list[str] | None = None) -> pa.Table:
        """The rows whose ``key`` is one of ``keys``, from the row groups that may hold them only."""
        return read_many([(self, keys, columns)])[0]

    def _reads(self, keys, columns: list[str] | None) -> list[Callable[[], pa.Table]]:
        """One read per file with row groups that may hold one of ``keys``."""
        wanted = np.unique(np.asarray(keys, np.int64))
        if not len(wanted) or not self._where:
            return []
        # A group holds a wanted key when some wanted key lies in [low, high].
        hit = np.searchsorted(wanted, self._lows, "left") < np.searchsorted(wanted, self._highs, "right")
        by_file: dict[int, list[int]] = {}
        for i in np.flatnonzero(hit).tolist():
            file, group = self._where[i]
            by_file.setdefault(file, []).append(group)
        needed = columns if columns is None or self.key in columns else columns + [self.key]
        values = pa.array(wanted, pa.int64())

        def reader(file: int, groups: list[int]) -> Callable[[], pa.Table]:
            def read() -> pa.Table:
                table = self._files[file].read_row_groups(groups, columns=needed)
                return table.filter(pc.is_in(table[self.key], values))
            return read
        return [reader(file, groups) for file, groups in by_file.items()]

    def _joined(self, parts: list[pa.Table], columns: list[str] | None) -> pa.Table:
        if not parts:
            return self._empty(columns)
        table = pa.concat_tables(parts, promote_options="permissive") if len(parts) > 1 else parts[0]
        schema = self._schema(columns)
        assert schema is not None  # a file was read, so there is its schema at least
        return table.select(schema.names).cast(schema)

    def _schema(self, columns: list[str] | None) -> pa.Schema | None:
        schema = self.schema if self.schema is not None else (self._files[0].schema_arrow if self._files else None)
        if schema is not None and columns is not None:
            schema = pa.schema([schema.field(c) for c in columns])
        return schema

    def _empty(self, columns: list[str] | None) -> pa.Table:
        schema = self._schema(columns)
        return (schema or pa.schema([(self.key, pa.int64())])).empty_table()


def read_many(lookups: Sequence[tuple[SortedFiles, object, list[str] | None]]) -> list[pa.Table]:
    """Several lookups, ``(files, keys, columns)``, as one round: every file read of all of them at once (in
    object storage each read is a round trip, and they overlap). Their tables, in order."""
    plans = [files._reads(keys, columns) for files, keys, columns in lookups]
    reads = [read for plan in plans for read in plan]
    done = list(READERS.map(lambda read: read(), reads)) if len(reads) > 1 else [read() for read in reads]
    tables, at = [], 0
    for (files, _, columns), plan in zip(lookups, plans):
        tables.append(files._joined(done[at:at + len(plan)], columns))
        at += len(plan)
    return tables
