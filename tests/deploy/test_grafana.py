"""The Grafana provisioning in deploy/grafana/ against Grafana's published types (offline: no
Grafana server here); their PromQL runs against a live Prometheus in test_prometheus_live.py."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from headwater.deploy import grafana_schema

GRAFANA = Path(__file__).resolve().parents[2] / "deploy" / "grafana"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))
ALERT_FILES = sorted((GRAFANA / "provisioning" / "alerting").glob("*.yaml"))


def dashboards() -> dict[str, dict]:
    return {path.name: json.loads(path.read_text()) for path in DASHBOARDS}


def alert_files() -> dict[str, dict]:
    return {path.name: yaml.safe_load(path.read_text()) for path in ALERT_FILES}


@pytest.fixture(scope="module")
def schema(tools):
    tools("grafana-schema")  # fetched once, before the checks time themselves out


def test_dashboards_and_alert_rules_conform_to_grafanas_types(schema):
    assert DASHBOARDS and ALERT_FILES
    assert grafana_schema.errors(dashboards(), alert_files()) == []


def test_the_check_catches_a_wrong_field_value_or_type(schema):
    """The check is worth its name: each of these is one mistake Grafana would reject or ignore."""
    name, dashboard = next(iter(dashboards().items()))
    panel = next(i for i, p in enumerate(dashboard["panels"]) if p["type"] == "timeseries")
    title = dashboard["panels"][panel]["title"]

    def broken(change) -> list[str]:
        changed = copy.deepcopy(dashboard)
        change(changed["panels"][panel])
        return grafana_schema.errors({name: changed})

    assert any("'\"gridpos\"' does not exist" in e for e in broken(lambda p: p.update(gridpos=p.pop("gridPos"))))
    assert any(title in e and "'\"exp\"' does not exist" in e
               for e in broken(lambda p: p["targets"][0].update(exp=p["targets"][0].pop("expr"))))
    assert any(title in e and '"lists"' in e
               for e in broken(lambda p: p["options"]["legend"].update(displayMode="lists")))
    assert any(title in e and "'tooltip' is missing" in e for e in broken(lambda p: p["options"].pop("tooltip")))

    alert_name, alerts = next(iter(alert_files().items()))
    alerts = copy.deepcopy(alerts)
    alerts["groups"][0]["rules"][0]["noDataState"] = "Nodata"
    assert any(alert_name in e and '"Nodata"' in e for e in grafana_schema.errors(alert_files={alert_name: alerts}))


def test_every_panel_and_alert_queries_prometheus_by_the_provisioned_datasource():
    datasource = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yaml").read_text())
    (uid,) = [d["uid"] for d in datasource["datasources"] if d["type"] == "prometheus"]
    for dashboard in dashboards().values():
        variable = next(v for v in dashboard["templating"]["list"] if v["type"] == "datasource")
        assert variable["current"]["value"] == uid
        chosen = {"type": "prometheus", "uid": f"${{{variable['name']}}}"}
        for panel in dashboard["panels"]:
            assert panel["type"] == "row" or panel["datasource"] == chosen
    for alerts in alert_files().values():
        for group in alerts["groups"]:
            for rule in group["rules"]:
                assert {q["datasourceUid"] for q in rule["data"]} <= {uid, "__expr__"}
                assert rule["annotations"]["__dashboardUid__"] in {d["uid"] for d in dashboards().values()}
