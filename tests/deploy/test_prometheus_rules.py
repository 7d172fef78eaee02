"""The Prometheus rules shipped in deploy/prometheus/: valid for promtool, every alert unit-tested
firing and not firing, and each one documented for whoever it pages."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

PROMETHEUS = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
RULES = PROMETHEUS / "rules.yaml"
UNIT_TESTS = sorted((PROMETHEUS / "tests").glob("*.yaml"))
README = PROMETHEUS.parent / "README.md"


def alerts() -> dict[str, dict]:
    return {rule["alert"]: rule for group in yaml.safe_load(RULES.read_text())["groups"]
            for rule in group["rules"] if "alert" in rule}


def promtool(tools, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(tools("promtool")), *args], capture_output=True, text=True, timeout=300,
                          cwd=PROMETHEUS)


def test_promtool_checks_the_rules(tools):
    done = promtool(tools, "check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {sum(len(g['rules']) for g in yaml.safe_load(RULES.read_text())['groups'])} rules found" \
        in done.stdout


def test_promtool_unit_tests_pass(tools):
    assert UNIT_TESTS
    done = promtool(tools, "test", "rules", *map(str, UNIT_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("SUCCESS") == len(UNIT_TESTS), done.stdout


def test_every_alert_is_unit_tested_firing_and_not_firing():
    """promtool compares the whole list of alerts firing at an evaluation, so an ``exp_alerts`` that
    names some cases also checks the others in its input stay silent; an empty one checks all do."""
    firing, silent = set(), set()
    for path in UNIT_TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                (firing if case.get("exp_alerts") else silent).add(case["alertname"])
    assert set(alerts()) - firing == set(), "alerts never tested firing"
    assert set(alerts()) - silent == set(), "alerts never tested silent"


def test_every_alert_says_how_bad_what_it_means_and_has_a_runbook_entry():
    runbook = README.read_text()
    for name, rule in alerts().items():
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        assert rule["labels"]["part"] in ("capture", "indexer", "query"), name
        assert rule["annotations"]["summary"] and len(rule["annotations"]["description"]) > 100, name
        assert f"`{name}`" in runbook, f"{name} has no entry in deploy/README.md"
