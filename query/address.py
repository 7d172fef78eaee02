"""A row's address, as a person writes it, to its rid: ``kafka:orders:0:17`` → rid.

Pure: the CLI's ``--source`` and the HTTP API's ``source=`` both parse with it.
"""

from __future__ import annotations

import re

from headwater.core import rid as rids

from .datasets import Tables
from .errors import LineageError

SOURCE_FORMS = ("kafka:TOPIC:PARTITION:OFFSET, table:NAME:KEY, file:PATH:POSITION, rate:VALUE or "
                "foreachBatch:QUERY:BATCH")

_INT = 1 << 31
_LONG = 1 << 63


def _number(text: str, low: int, high: int) -> int | None:
    """``text`` as an integer in ``low..high-1`` (ASCII digits only, as Spark would hold it), else None."""
    if not re.fullmatch(r"-?[0-9]{1,19}", text):
        return None
    value = int(text)
    return value if low <= value < high else None


def parse_source(text: str, tables: Tables | None = None) -> int:
    """A row's address (``SOURCE_FORMS``) → its rid; ``LineageError`` if it is not one.

    A static table's rows are named by where it lives, not by the short name people
    write: ``tables`` (the store's, ``datasets.Tables``) turns ``table:NAME:KEY`` into its
    table's rid. A NAME it does not know is taken as the table's identity itself.
    """
    kind, _, rest = text.partition(":")
    if kind == "table" and tables is not None:
        found = tables.split(rest)
        if found is not None:
            dataset, key = found
            table = rids.dataset_table(dataset)
            assert table is not None  # Tables keeps static tables' datasets only
            return rids.table_rid(table, key)
    if kind == "kafka":
        place = kafka_place(text)
        if place is not None:
            return rids.kafka_rid(*place)
    elif kind == "table":
        name, _, key = rest.partition(":")
        if name and key:
            return rids.table_rid(name, key)
    elif kind == "file":
        path, _, digits = rest.rpartition(":")
        position = _number(digits, 0, _LONG)
        if path and position is not None:
            return rids.file_rid(path, position)
    elif kind == "rate":
        value = _number(rest, -_LONG, _LONG)
        if value is not None:
            return rids.rate_rid(value)
    elif kind == "foreachBatch":
        query, _, digits = rest.rpartition(":")
        batch = _number(digits, 0, _LONG)
        if query and batch is not None:
            return rids.state_rid(query, rids.FOREACH_BATCH_OP, batch)
    raise LineageError(f"{text!r}: expected {SOURCE_FORMS}")


def kafka_place(text: str) -> tuple[str, int, int] | None:
    """``kafka:TOPIC:PARTITION:OFFSET`` as ``(topic, partition, offset)``; None if ``text`` is not one."""
    kind, _, rest = text.partition(":")
    if kind != "kafka":
        return None
    topic, _, offset_digits = rest.rpartition(":")
    topic, _, partition_digits = topic.rpartition(":")
    partition, offset = _number(partition_digits, 0, _INT), _number(offset_digits, 0, _LONG)
    return (topic, partition, offset) if topic and partition is not None and offset is not None else None


def checked_source(text: str) -> str:
    """``text``, once it has the form of an address (else ``LineageError``): turned into a rid later, by the
    client that knows the store's tables (``LineageClient.rid_of``)."""
    parse_source(text)
    return text
