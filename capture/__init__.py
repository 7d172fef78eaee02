"""Capture: thread rids through a streaming query and publish its lineage.

Consumes a user's streaming DataFrame (only the final one is wrapped); produces
lineage payloads on the edges topic and plan/batch records on the log topic.

The names below are imported on first use, so that importing one light module of
this package (``headwater.capture.journal``, say, in a drain process) does not import
the tracer, pyarrow and the plan rewriter.
"""

from importlib import import_module

_EXPORTS = {
    "attach": "tracer",
    "Tracer": "tracer",
    "Traced": "tracer",
    "SinkError": "sinks",
    "UnsupportedPlanError": "rewrite",
    "UnsupportedSpark": "headwater.adapters.spark_lines",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = _EXPORTS[name]
    value = getattr(import_module(module if module.startswith("headwater.") else f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
