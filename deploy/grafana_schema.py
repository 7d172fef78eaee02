"""Dashboards and Grafana alert rules checked offline against Grafana's published types.

No Grafana server runs here, and Grafana publishes its dashboard schema as TypeScript
(``@grafana/schema``, generated from the CUE kinds Grafana itself validates with); panel
options per plugin are there too, and Prometheus queries, alert rules and server-side
expressions are typed by ``@grafana/grafana-foundation-sdk``. ``errors()`` writes each object
as a TypeScript literal of its type and runs ``tsc``: unknown fields (TypeScript's excess
property check on literals), wrong types, missing required fields and values outside an enum
are all errors. The tools come from ``headwater.deploy.tools`` (``grafana-schema``).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from . import tools

# Panel plugins this checks, by ``type``: the module of their ``Options`` type, and whether it has a
# ``FieldConfig`` (the panel's ``fieldConfig.defaults.custom``; without one, custom must be absent).
PANEL_TYPES = {
    "timeseries": ("@grafana/schema/dist/esm/raw/composable/timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen", True),
    "stat": ("@grafana/schema/dist/esm/raw/composable/stat/panelcfg/x/StatPanelCfg_types.gen", False),
}

_PRELUDE = """\
import type * as schema from "@grafana/schema";
import type * as prometheus from "@grafana/grafana-foundation-sdk/prometheus";
import type * as alerting from "@grafana/grafana-foundation-sdk/alerting";
import type * as expr from "@grafana/grafana-foundation-sdk/expr";
{panel_imports}

// JSON has no enums: a string enum is checked as the union of its values.
type Json<T> = T extends string ? `${{T}}` : T extends (infer U)[] ? Json<U>[]
  : T extends object ? {{ [K in keyof T]: Json<T[K]> }} : T;
// The SDK's query types carry a marker method no JSON has.
type Plain<T> = T extends unknown ? Omit<T, "_implementsDataqueryVariant"> : never;
type Target = Json<Plain<prometheus.Dataquery>>;
type Panel<Options, Custom> = Json<Omit<schema.Panel, "options" | "fieldConfig" | "targets"> & {{
  options: Options;
  fieldConfig: {{ defaults: Omit<schema.FieldConfig, "custom"> & {{ custom?: Custom }};
                 overrides: schema.FieldConfigSource["overrides"] }};
  targets: Target[];
}}>;
type Row = Json<Omit<schema.RowPanel, "panels"> & {{ type: "row"; panels: [] }}>;
// Grafana's alert provisioning file: the group is the file format's; each rule is the API's rule
// less what the group gives it (folder, group name, organisation).
type AlertQuery = Json<Omit<alerting.Query, "model"> & {{ model: Plain<prometheus.Dataquery> | Plain<expr.expr> }}>;
type AlertRule = Json<Omit<alerting.Rule, "folderUID" | "ruleGroup" | "orgID" | "data"> & {{ data: AlertQuery[] }}>;
type AlertFile = {{ apiVersion: 1; groups: {{ orgId: number; name: string; folder: string; interval: string;
                                              rules: AlertRule[] }}[] }};
"""


class SchemaErrors(RuntimeError):
    """tsc could not run; the message says what it said."""


def errors(dashboards: dict[str, dict] | None = None, alert_files: dict[str, dict] | None = None) -> list[str]:
    """Every schema error of the named dashboards and alert provisioning files, as
    ``name: what`` (a panel's errors name it by id and title); [] when all conform."""
    checks: list[tuple[str, str, object]] = []  # (what it is, the TypeScript type, the value)
    unknown = []
    for name, dashboard in (dashboards or {}).items():
        checks.append((name, "Json<schema.Dashboard>", dashboard))
        for panel in dashboard.get("panels", []):
            what = f"{name}: panel {panel.get('id')} {panel.get('title')!r}"
            if panel.get("type") == "row":
                checks.append((what, "Row", panel))
            elif panel.get("type") in PANEL_TYPES:
                module, custom = _alias(panel["type"]), PANEL_TYPES[panel["type"]][1]
                field_config = f"{module}.FieldConfig" if custom else "never"
                checks.append((what, f"Panel<{module}.Options, {field_config}>", panel))
            else:
                unknown.append(f"{what}: panel type {panel.get('type')!r} has no schema here (PANEL_TYPES)")
    for name, alert_file in (alert_files or {}).items():
        checks.append((name, "AlertFile", alert_file))
    return unknown + _tsc(checks)


def _alias(panel_type: str) -> str:
    return f"panel_{panel_type}"


def _tsc(checks: list[tuple[str, str, object]]) -> list[str]:
    imports = "\n".join(f'import type * as {_alias(t)} from "{module}";' for t, (module, _) in PANEL_TYPES.items())
    source = [_PRELUDE.format(panel_imports=imports)]
    starts = []  # (first line, what) of each check, to name tsc's errors
    for number, (what, type_name, value) in enumerate(checks):
        starts.append((sum(part.count("\n") for part in source) + 1, what))
        source.append(f"export const check{number}: {type_name} = {json.dumps(value, indent=1)};\n")
    folder = tools.grafana_schema()
    # Inside the tool's folder, so that its node_modules resolve; a folder of its own per call.
    work = Path(tempfile.mkdtemp(prefix="check-", dir=folder))
    try:
        (work / "check.ts").write_text("".join(source))
        done = subprocess.run(
            ["node", str(folder / "node_modules" / "typescript" / "bin" / "tsc"), "--noEmit", "--strict",
             "--target", "es2022", "--module", "esnext", "--moduleResolution", "bundler", "--skipLibCheck",
             "--pretty", "false", "check.ts"],
            cwd=work, capture_output=True, text=True, timeout=300)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    found: list[str] = []
    for line in done.stdout.splitlines():
        match = re.match(r"check\.ts\((\d+),\d+\): error (TS\d+: .*)", line)
        if match is None:  # a continuation of the previous error's message
            if found and line.startswith(" "):
                found[-1] += " " + line.strip()
            continue
        at = int(match.group(1))
        what = next((w for first, w in reversed(starts) if first <= at), "the checks' own types")
        found.append(f"{what}: {match.group(2)}")
    if done.returncode != 0 and not found:
        raise SchemaErrors(f"tsc failed ({done.returncode}): {done.stdout.strip()} {done.stderr.strip()}")
    return found
