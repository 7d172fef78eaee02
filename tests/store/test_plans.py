"""The store's plans (store/plans.py): the plan a batch ran, committed whole."""

from __future__ import annotations

import pytest

from headwater.store.plans import PlanStore


def test_the_plan_of_a_batch_is_the_latest_that_started_at_or_before_it(tmp_path):
    plans = PlanStore(tmp_path, "log")
    assert plans.plan_for("q", 5) is None
    plans.write("q", 0, "aa11", {"optimized": [{"n": 1}]})
    plans.write("q", 7, "bb22", {"optimized": [{"n": 2}]})
    plans.write("other/query ü", 3, "cc33", {"optimized": [{"n": 3}]})
    assert plans.plan_for("q", 0)["optimized"] == [{"n": 1}]
    assert plans.plan_for("q", 6)["fingerprint"] == "aa11"
    assert plans.plan_for("q", 7)["optimized"] == [{"n": 2}] and plans.plan_for("q", 10**6)["from_batch"] == 7
    assert plans.plan_for("other/query ü", 2) is None and plans.plan_for("other/query ü", 3)["query"] == "other/query ü"
    # Indexed twice (a replay after a crash): read as one; another reader sees them all.
    plans.write("q", 7, "bb22", {"optimized": [{"n": 2}]})
    again = PlanStore(tmp_path, "log")
    assert [(q, start) for q, start, _ in again.kept()] == [("other/query ü", 3), ("q", 0), ("q", 7)]
    assert again.starts("q") == [0, 7] and again.queries() == ["other/query ü", "q"]
    assert plans.stamp() == again.stamp() != PlanStore(tmp_path, "other").stamp()


def test_a_fingerprint_cannot_name_another_path(tmp_path):
    with pytest.raises(ValueError):
        PlanStore(tmp_path, "log").write("q", 0, "../../etc", {"optimized": []})
