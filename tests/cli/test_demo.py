"""The README's demo command, run as a user would, on a stack of its own (``conftest.demo_home``, which the
explorer's and the HTTP load tests share: ``headwater stack up`` on free ports, then ``headwater demo``)."""

import json

import pytest

from headwater.core.rid import kafka_rid

pytestmark = pytest.mark.every_line  # runs on every supported Spark line (./dev test)


def test_demo_runs_end_to_end_in_under_three_minutes_and_prints_lineage(demo_home):
    _, run = demo_home
    assert run.seconds < 180, f"demo took {run.seconds:.0f}s"
    out = run.stdout
    assert "batch 0:" in out and "indexed" in out
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    answers = [x for x in lines if "summary" not in x]
    (summary,) = [x["summary"] for x in lines if "summary" in x]
    assert summary["complete"] and summary["records"] == len(answers)  # every batch on the way fully captured
    assert {a["dataset"].split(":")[0] for a in answers} == {"kafka", "customers"}
    assert all(a["payload"] and "error" not in a["payload"] for a in answers)
    # The rid scheme is the same on every Spark line: a Kafka record's rid, which capture's Spark computed, is
    # the one headwater's own hashing gives its coordinates.
    records = [a for a in answers if a["topic"]]
    assert records and all(a["rid"] == kafka_rid(a["topic"], a["partition"], a["offset"]) for a in records)
