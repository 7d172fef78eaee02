"""Capture: thread rids through a streaming query and publish its lineage.

Consumes a user's streaming DataFrame (only the final one is wrapped); produces
lineage payloads on the edges topic and plan/batch records on the log topic.
"""

from .rewrite import UnsupportedPlanError
from .sinks import SinkError
from .tracer import Traced, Tracer, attach

__all__ = ["attach", "Tracer", "Traced", "SinkError", "UnsupportedPlanError"]
