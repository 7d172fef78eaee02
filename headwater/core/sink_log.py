"""Which files one batch added to a streaming file sink, from the sink's commit log.

Spark's file sink logs each batch in ``_spark_metadata`` as an entry listing the files it
added, and every few batches writes a compaction instead (``<batch>.compact``), which
lists every file so far. A compaction batch's own files are those its entry lists and the
entries since the compaction before it do not. Capture reads the log through Spark, the
query tier from local files; both ask this module.
"""

from __future__ import annotations

from typing import Callable, Iterable


def batch_files(batch: int, entry: Callable[[int], Iterable[str] | None],
                compactions: Iterable[int]) -> list[str] | None:
    """The files ``batch`` added: ``entry(b)`` gives the files log entry ``b`` lists (None if the log
    has no such entry, or Spark deleted it), ``compactions`` the batches up to ``batch`` whose entries
    are compactions. None where the entries that takes are gone."""
    files = entry(batch)
    compactions = set(compactions)
    if files is None or batch not in compactions:
        return None if files is None else sorted(files)
    before: set[str] = set()
    for earlier in range(max((c for c in compactions if c < batch), default=0), batch):
        listed = entry(earlier)
        if listed is None:
            return None
        before.update(listed)
    return sorted(set(files) - before)
