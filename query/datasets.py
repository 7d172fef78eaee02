"""Static tables as people name them: short, and told apart only where two share a name.

A static table's rows carry the dataset ``table:<identity>`` (``rid.table_dataset``), the
identity being where the table lives (``plan.static_table``: ``file:/data/v1/sites.parquet``,
``catalog:spark_catalog.prod.customers``). That is exact but long. An answer shows each
table by its short name (``sites``: the file or table name) and keeps the identity in the
record's ``table``; where one answer holds rows of two tables of one short name, each is
shown with the shortest end of its identity that the other's does not end with:
``sites@v1/sites.parquet`` and ``sites@v2/sites.parquet``. The names depend only on the
answer's rows, so every backend names them alike.

People may give any of these forms back (``--to``, ``table:NAME:KEY``), or the alias the
query gave the table; a short name two tables share is refused for an address, with the
names that tell them apart.

Pure: the backends give the tables' descriptions (``WalkingBackend.datasets``).
"""

from __future__ import annotations

import re
from typing import Iterable

from headwater.core import rid as rids

from .errors import LineageError

# Where an identity may be cut to tell it apart from another: after a path, name or list separator.
_BOUNDARY = re.compile(r"[/.,]")
_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:/*")


def _body(table: str) -> str:
    """An identity without its scheme: ``/data/v1/sites.parquet``, ``spark_catalog.prod.customers``."""
    return _SCHEME.sub("", table)


def short_name(dataset: str) -> str:
    """A static table's short name: its file's or catalog table's name (tables read together: joined by ``+``)."""
    table = rids.dataset_table(dataset) or dataset
    names = []
    for place in table.split(","):
        if place.startswith("catalog:"):
            names.append(place.rsplit(".", 1)[-1])
        elif place.startswith("query:"):  # rows made in memory: the name the query gave them
            names.append(place.rsplit("/", 1)[-1].split("#", 1)[0])
        else:
            names.append(place.rstrip("/").rsplit("/", 1)[-1].split(".", 1)[0])
    return "+".join(n for n in names if n) or table


def _ends(table: str) -> list[str]:
    """The ends of an identity that start after a boundary, shortest first; its body (no scheme) last."""
    body = _body(table)
    ends = sorted({body[m.end():] for m in _BOUNDARY.finditer(body) if body[m.end():]}, key=len)
    return ends + [body]


def _ends_with(table: str, end: str) -> bool:
    body = _body(table)
    return end in (body, table) or body.endswith(end) and _BOUNDARY.match(body[-len(end) - 1]) is not None


def display_names(datasets: Iterable[str | None]) -> dict[str, str]:
    """The name to show for each static table's dataset among ``datasets`` (others are left out)."""
    tables: dict[str, str] = {}  # dataset -> its table
    for dataset in datasets:
        table = rids.dataset_table(dataset)
        if dataset is not None and table:
            tables[dataset] = table
    by_short: dict[str, list[str]] = {}
    for dataset in sorted(tables):
        by_short.setdefault(short_name(dataset), []).append(dataset)
    names = {}
    for short, sharing in by_short.items():
        for dataset in sharing:
            if len(sharing) == 1:
                names[dataset] = short
                continue
            table = tables[dataset]
            rivals = [tables[d] for d in sharing if d != dataset]
            # The whole identity, where a rival's path holds this one's whole.
            end = next((e for e in _ends(table) if not any(_ends_with(r, e) for r in rivals)), table)
            names[dataset] = f"{short}@{end}"
    return names


def names_table(name: str, dataset: str | None, alias: str | None = None) -> bool:
    """Whether ``name`` names the static table of ``dataset``: as stored, its identity, its short name,
    ``short@end`` (an end of its identity), or ``alias`` (the name a query gave it)."""
    table = rids.dataset_table(dataset)
    if dataset is None or not table:
        return False
    short = short_name(dataset)
    if name in (dataset, table, short, alias):
        return True
    head, at, end = name.partition("@")
    return bool(at) and head in (short, alias) and _ends_with(table, end)


class Tables:
    """The static tables a store describes (``{dataset: description}``), to find one by a name people give."""

    def __init__(self, described: dict[str, dict]):
        self.described = {d: p or {} for d, p in described.items() if rids.dataset_table(d)}

    def find(self, name: str) -> str | None:
        """The dataset of the one table ``name`` names (``names_table``); None if it names none;
        ``LineageError`` if it names several, with the names that tell them apart."""
        found = [d for d, p in self.described.items() if names_table(name, d, p.get("short_name"))]
        if len(found) > 1:
            apart = display_names(found)
            raise LineageError(f"{len(found)} static tables are called {name!r}: name one of "
                               f"{', '.join(sorted(apart[d] for d in found))}")
        return found[0] if found else None

    def split(self, text: str) -> tuple[str, str] | None:
        """``NAME:KEY`` as ``(dataset, key)`` for the longest NAME that names a table (names and keys may
        hold colons); None if no prefix of ``text`` does."""
        for cut in sorted((m.start() for m in re.finditer(":", text)), reverse=True):
            if cut + 1 < len(text):
                dataset = self.find(text[:cut])
                if dataset is not None:
                    return dataset, text[cut + 1:]
        return None
