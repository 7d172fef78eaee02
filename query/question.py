"""A lineage question, read and checked in one place: the CLI, the HTTP API and ``LineageClient`` ask through it.

A ``Question`` is a direction (``DIRECTIONS``: backward, forward, co_contributors, co_dependents), the row asked
about (a rid, or an address, which the client that knows the store's tables turns into a rid: address.py) and the
options that direction takes: ``to``, ``via`` (the co- questions), ``depth``, ``cols`` and ``paths`` (the one-way
questions), ``payload``, ``since`` and ``until``. Each option's value has one check (``CHECKS``), and its text, as a
query string or a command line gives it, one reading (``READS``) that ends in the same check: the three callers refuse
the same questions in the same words. Which backend answers is not part of a question: where it is asked says.

Only the standard library and errors.py: the CLI checks a question with this before it asks the query service
(bench/cli_latency.py's 0.3 s bar), long before pyarrow or a backend is imported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, TypeGuard

from .errors import LineageError

MAX_DEPTH = 64  # edges followed at most, each way
MAX_PATHS = 100  # paths kept per answer row at most, for how-provenance
INT64 = range(-(1 << 63), 1 << 63)
_INTEGER = re.compile(r"-?[0-9]{1,19}")

# The options of each direction, as ``LineageClient.<direction>`` takes them.
ONE_WAY = ("to", "depth", "payload", "cols", "paths", "since", "until")
TWO_WAYS = ("to", "via", "depth", "payload", "since", "until")
DIRECTIONS = {"backward": ONE_WAY, "forward": ONE_WAY, "co_contributors": TWO_WAYS, "co_dependents": TWO_WAYS}


def cut(text: str, limit: int = 80) -> str:
    """Input cut short, for an error message."""
    return text if len(text) <= limit else text[:limit] + "…"


def quoted(text: str) -> str:
    return repr(cut(text))


def _integer(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def check_rid(rid: int) -> int:
    if not _integer(rid) or rid not in INT64:
        raise LineageError(f"a rid is a signed 64-bit integer, not {rid!r}")
    return rid


def check_row(row: int | str) -> int | str:
    """A rid, or an address (its form is address.py's to check: it needs the dataset names)."""
    if isinstance(row, str):
        if not row:
            raise LineageError("an address is not empty")
        return row
    return check_rid(row)


def check_depth(depth: object) -> int:
    if not _integer(depth) or not 1 <= depth <= MAX_DEPTH:
        raise LineageError(f"depth must be an integer from 1 to {MAX_DEPTH}, not {depth!r}")
    return depth


def check_cols(cols: int | None) -> int | None:
    if cols is not None and (not _integer(cols) or cols == 0 or cols not in INT64):
        raise LineageError(f"cols is a non-zero 64-bit mask of columns (e.g. 5 or 0b101), not {cols!r}")
    return cols


def check_paths(paths: int) -> int:
    if not _integer(paths) or not 0 <= paths <= MAX_PATHS:
        raise LineageError(f"paths is how many paths to keep per row, 0 to {MAX_PATHS}, not {paths!r}")
    return paths


def check_target(target: str, name: str = "to") -> str:
    """The form of a ``to`` or ``via``: which rows it names is the store's to say (``LineageClient.target``)."""
    if not isinstance(target, str) or not target:
        raise LineageError(f"{name} is source, state, output or a dataset's name, not {target!r}")
    return target


def moment(value, name: str) -> datetime | None:
    """A time bound or a batch's logged time as an aware datetime (naive ones are UTC); None stays None."""
    if value is None or isinstance(value, datetime):
        found = value
    else:
        try:
            found = datetime.fromisoformat(str(value).strip().replace("Z", "+00:00"))
        except ValueError:
            raise LineageError(f"{name} is an ISO 8601 time (e.g. 2026-11-23T18:00:00Z), not {value!r}") from None
    return found.replace(tzinfo=timezone.utc) if found is not None and found.tzinfo is None else found


def time_window(since, until) -> tuple[datetime | None, datetime | None]:
    """The time bounds as aware datetimes; ``since`` after ``until`` is refused."""
    start, end = moment(since, "since"), moment(until, "until")
    if start and end and start > end:
        raise LineageError(f"since ({start.isoformat()}) is after until ({end.isoformat()})")
    return start, end


def _checked_moment(name: str) -> Callable[[Any], Any]:
    def check(value):
        moment(value, name)
        return value
    return check


# Each option's check of its value; the value is kept as given (a time bound as its text: the client reads it).
CHECKS: dict[str, Callable[[Any], Any]] = {
    "to": check_target, "via": lambda v: check_target(v, "via"), "depth": check_depth, "payload": bool,
    "cols": check_cols, "paths": check_paths, "since": _checked_moment("since"), "until": _checked_moment("until"),
}


def read_rid(text: str) -> int:
    if _INTEGER.fullmatch(text) and int(text) in INT64:
        return int(text)
    raise LineageError(f"a rid is a signed 64-bit integer, not {quoted(text)}")


def read_depth(text: str) -> int:
    return check_depth(int(text) if _INTEGER.fullmatch(text) else cut(text))


def read_cols(text: str) -> int:
    """A mask in decimal, ``0x…`` or ``0b…``."""
    try:
        mask = int(text, 0) if len(text) <= 70 else 0
    except ValueError:
        mask = 0
    if not mask or mask not in INT64:
        raise LineageError(f"cols is a non-zero 64-bit mask of columns (e.g. 5 or 0b101), not {quoted(text)}")
    return mask


def read_paths(text: str) -> int:
    if not re.fullmatch(r"[0-9]{1,3}", text) or int(text) > MAX_PATHS:
        raise LineageError(f"paths is how many paths to keep per row, 0 to {MAX_PATHS}, not {quoted(text)}")
    return int(text)


def read_payload(text: str) -> bool:
    if text not in ("true", "false"):
        raise LineageError(f"payload is true or false, not {quoted(text)}")
    return text == "true"


# Each option's reading of its text (a query string's value, a command line's), ending in its check.
READS: dict[str, Callable[[str], Any]] = {
    "to": check_target, "via": CHECKS["via"], "depth": read_depth, "payload": read_payload, "cols": read_cols,
    "paths": read_paths, "since": CHECKS["since"], "until": CHECKS["until"],
}


@dataclass(frozen=True)
class Question:
    """One lineage question, checked: ``LineageClient.<direction>(row, **options)`` answers it.

    ``options`` are those the caller gave (the others take the method's defaults); ``since`` and ``until`` must
    be in order when both are given."""

    direction: str
    row: int | str
    options: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.direction not in DIRECTIONS:
            raise LineageError(f"a question is one of {', '.join(DIRECTIONS)}, not {self.direction!r}")
        check_row(self.row)
        taken = DIRECTIONS[self.direction]
        unknown = [name for name in self.options if name not in taken]
        if unknown:
            raise LineageError(f"{self.direction} takes {', '.join(taken)}, not {', '.join(unknown)}")
        checked = {name: CHECKS[name](value) for name, value in self.options.items() if value is not None}
        time_window(checked.get("since"), checked.get("until"))
        object.__setattr__(self, "options", checked)

    @classmethod
    def read(cls, direction: str, row: int | str, texts: dict[str, str]) -> "Question":
        """A question from its options' texts (``READS``); an empty text is refused, not taken as absent."""
        for name, text in texts.items():
            if name in READS and not text:
                raise LineageError(f"parameter {name} is empty")
        return cls(direction, row, {name: READS[name](text) if name in READS else text
                                    for name, text in texts.items()})
