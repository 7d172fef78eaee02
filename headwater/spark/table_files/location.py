"""A static table's location as capture logs it: its format and its reader options.

The location is ``{"paths": [...], "format": ..., "options": {...}}`` from Spark's
``HadoopFsRelation``; this module checks the format is one read here and gives the options
as Spark holds them. ``TableUnreadable`` lives here too, as every other module raises it.
"""

from __future__ import annotations

FORMATS = ("parquet", "csv", "json", "text", "orc")


class TableUnreadable(ValueError):
    """A static table's files cannot be read here; the message names the path and why."""


def format_of(location: dict) -> str:
    fmt = str(location.get("format", "")).lower()
    if fmt not in FORMATS:
        raise TableUnreadable(f"{location.get('paths')}: the {fmt or 'missing'} format is not supported here "
                              f"(only {', '.join(FORMATS)})")
    return fmt


def options_of(location: dict) -> dict[str, str]:
    # Spark's reader options are case-insensitive and its values strings.
    return {str(k).lower(): str(v) for k, v in (location.get("options") or {}).items()}


def flag(options: dict, name: str) -> bool:
    return options.get(name, "false").strip().lower() == "true"
