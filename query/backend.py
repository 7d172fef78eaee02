"""The lineage query interface every backend implements.

To add a backend: one module with a class implementing ``LineageBackend`` (``backward``
and ``forward``), returning ``Lineage`` records; register it in ``BACKENDS`` in
``headwater.query.api``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Protocol

MAX_DEPTH = 64


class LineageError(ValueError):
    """A lineage question that cannot be answered as asked (unknown rid, bad bound…)."""


class UnknownRow(LineageError):
    """The row asked about is not in the store: not captured, or not indexed yet."""


@dataclass
class Lineage:
    """One row found by a lineage query, relative to the row asked about."""

    of: int  # the rid the query started from
    rid: int
    kind: str
    dataset: str | None
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None
    key: str | None = None
    path: str | None = None
    position: int | None = None
    ops: list[int] = field(default_factory=list)  # operators on the paths to it (plan IR ids), sorted
    # Attribute mask: bit i set when column i of the output row at the path's end
    # derives from this input (TensProv), over all paths; -1 (every column) when unknown.
    cols: int | None = None
    batches: list[int] = field(default_factory=list)
    exact: bool = True
    via: str = "edges"
    payload: object = None

    def to_dict(self) -> dict:
        found = asdict(self)
        if self.payload is None:
            found.pop("payload")
        return found


def ordered(found) -> list[Lineage]:
    """An answer's records in the order every backend gives them: by dataset, then source coordinates."""
    return sorted(found, key=lambda x: (x.dataset or "", x.topic or "", x.partition or 0, x.offset or 0,
                                        x.key or "", x.rid))


def check_depth(depth: int) -> int:
    if not isinstance(depth, int) or not 1 <= depth <= MAX_DEPTH:
        raise LineageError(f"depth must be an integer from 1 to {MAX_DEPTH}, not {depth!r}")
    return depth


class LineageBackend(Protocol):
    def backward(self, rid: int, to: str = "source", depth: int = 16) -> list[Lineage]: ...

    def forward(self, rid: int, to: str = "output", depth: int = 16) -> list[Lineage]: ...
