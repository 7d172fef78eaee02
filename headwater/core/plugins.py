"""Other packages' additions, found through their entry points: query backends (``headwater.backends``) and
capture sinks (``headwater.sinks``).

An entry point names a module whose classes register themselves when it is imported (``@register("NAME")`` for a
backend, ``@register_sink("FORMAT")`` for a sink); the entry point's own name is the name it registers, which the
CLI offers before any plugin is imported. A plugin that fails to import is skipped with a warning naming it: one
broken package must not take headwater's own backends and sinks down with it.
"""

from __future__ import annotations

import logging
from importlib.metadata import entry_points
from typing import Callable, Container, Mapping, MutableMapping, TypeVar

log = logging.getLogger("headwater.plugins")

_loaded: set[str] = set()
T = TypeVar("T", bound=type)


def registrar(registry: MutableMapping[str, T], name: str, what: str,
              reserved: Container[str] = ()) -> Callable[[T], T]:
    """A class decorator putting its class in ``registry`` under ``name``; a name taken already (or ``reserved``)
    is refused, in the words ``what`` gives (e.g. "a backend named 'x'")."""
    def add(cls: T) -> T:
        if name in reserved or registry.get(name, cls) is not cls:
            raise ValueError(f"{what} is registered already")
        registry[name] = cls
        return cls
    return add


def load_plugins(group: str, registry: Mapping[str, object]) -> None:
    """Import the modules of ``group``'s entry points, once a process; ``registry``: what they register into."""
    if group in _loaded:
        return
    _loaded.add(group)
    for point in entry_points(group=group):
        try:
            point.load()
        except Exception as exc:
            log.warning("skipping the %s plugin %r (%s): it failed to import: %r", group, point.name, point.value,
                        exc)
            continue
        if point.name not in registry:
            log.warning("the %s plugin %r (%s) registered no %r: name its entry point as it registers itself",
                        group, point.name, point.value, point.name)


def forget(group: str) -> None:
    """Have the next ``load_plugins`` of ``group`` look at the entry points again (a package installed since)."""
    _loaded.discard(group)
