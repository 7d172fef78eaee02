"""The overhead budget: how much of each batch capture may take, and what it does when over.

Pure logic, no Spark. After every batch the hook reports its capture time and the
rest of the batch's time; ``OverheadBudget`` answers how to capture the next batch:

- ``full``: every edge;
- ``sampled``: the edges of a deterministic fraction of output rows (by rid, so a
  retried batch samples the same rows), sized so the expected overhead fits;
- ``log-only``: no edges, only the batch log (the query tier infers lineage there).

Over budget, capture steps down one level. Degraded, it probes one level up after a
cool-down of a few batches; a probe that is over budget again steps back down and
doubles the cool-down (up to a limit), so a query that cannot afford capture settles
at the level it can afford and a query whose load drops recovers.
"""

from __future__ import annotations

from dataclasses import dataclass

FULL, SAMPLED, LOG_ONLY = "full", "sampled", "log-only"
LEVELS = (FULL, SAMPLED, LOG_ONLY)
MIN_FRACTION = 0.01


@dataclass(frozen=True)
class Plan:
    """How to capture one batch."""

    level: str = FULL
    fraction: float = 1.0  # of output rows whose edges are published, when sampled


class OverheadBudget:
    """The capture level of one query, adjusted batch by batch to ``budget``.

    ``budget`` is capture time over the rest of the batch's time (0.15: 15% added);
    0 means no limit.
    """

    def __init__(self, budget: float, cooldown_batches: int = 3, max_cooldown_batches: int = 48):
        self.budget = budget
        self.cooldown_batches = cooldown_batches
        self.max_cooldown_batches = max_cooldown_batches
        self._level = 0
        self._fraction = 1.0
        self._full_ratio = 0.0  # overhead full capture would have, as last measured or estimated
        self._cooldown = cooldown_batches
        self._wait = 0  # batches until the next probe one level up
        self._probing = False

    def plan(self) -> Plan:
        return Plan(LEVELS[self._level], self._fraction if LEVELS[self._level] == SAMPLED else 1.0)

    def observe(self, plan: Plan, capture_s: float, rest_s: float) -> Plan:
        """Account for a batch captured by ``plan``; returns the plan for the next batch."""
        if self.budget <= 0:
            return self.plan()
        ratio = capture_s / max(rest_s, 1e-3)
        if plan.level == FULL:
            self._full_ratio = ratio
        elif plan.level == SAMPLED and ratio > 0:  # an empty sample costs nothing and says nothing
            self._full_ratio = ratio / plan.fraction
        if ratio > self.budget:
            self._step_down(plan)
        elif self._probing:  # the level probed fits: stay, and wait before probing further
            self._probing = False
            self._cooldown = self.cooldown_batches
            self._wait = self._cooldown
        elif self._level > 0:
            if self._wait > 0:
                self._wait -= 1
            else:
                self._level -= 1
                self._probing = True
        self._fraction = self._sample_fraction()
        return self.plan()

    def _step_down(self, plan: Plan) -> None:
        level = LEVELS.index(plan.level)
        if plan.level == SAMPLED and plan.fraction > MIN_FRACTION and not self._probing:
            self._level = level  # a smaller sample may fit
        else:
            self._level = min(level + 1, len(LEVELS) - 1)
        self._cooldown = min(self._cooldown * 2, self.max_cooldown_batches) if self._probing \
            else self.cooldown_batches
        self._probing = False
        self._wait = self._cooldown

    def _sample_fraction(self) -> float:
        """The fraction of rows whose edges fit the budget, with a margin."""
        if self._full_ratio <= 0:
            return 0.5
        return min(0.5, max(MIN_FRACTION, 0.8 * self.budget / self._full_ratio))
