"""Backends are registered by name: the query tier's own by ``@register``, another package's through its entry
points (group ``headwater.backends``), and every route (LineageClient, the HTTP API's backend= and its OpenAPI
enum) takes them alike."""

from __future__ import annotations

import sys

import pytest

from headwater.core import plugins
from headwater.query import api
from headwater.query import backend as backends_module
from headwater.query.backend import WalkingBackend, register
from headwater.query.errors import UnknownRow

PLUGIN = '''

from headwater.core.schema import EDGE_SCHEMA
from headwater.query.backend import WalkingBackend, register


@register("empty-plugin")
class EmptyBackend(WalkingBackend):
    """Holds no rows: every question is about an unknown row."""

    def __init__(self, config):
        self.config = config

    def _step(self, backward):
        return lambda frontier: EDGE_SCHEMA.empty_table()

    def _records(self, rids):
        return {}

    def batch_statuses(self, pairs):
        return {}
'''


def installed(folder, module: str, source: str, entry_point: str) -> None:
    """A package of another's, installed on sys.path: a module and its distribution's entry point."""
    (folder / f"{module}.py").write_text(source)
    info = folder / f"{module}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[headwater.backends]\n{entry_point} = {module}\n")


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    installed(tmp_path, "hw_empty_plugin", PLUGIN, "empty-plugin")
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins.forget(backends_module.ENTRY_POINTS)  # the entry points looked at again, this plugin's among them
    kept = dict(backends_module.BACKENDS)
    yield "empty-plugin"
    backends_module.BACKENDS.clear()
    backends_module.BACKENDS.update(kept)
    sys.modules.pop("hw_empty_plugin", None)


def test_the_query_tiers_own_backends():
    assert api.choices()[:4] == ["cypher", "csprov", "rq", "auto"]


def test_a_name_is_registered_once():
    class Another(WalkingBackend):
        pass

    for name in ("cypher", "auto"):
        with pytest.raises(ValueError, match="registered already"):
            register(name)(Another)


def test_a_backend_of_another_package_is_found_by_its_entry_point(plugin, tmp_path):
    from headwater.core.config import Config
    from headwater.query import http

    assert plugin not in backends_module.BACKENDS
    assert plugin in api.choices() and api.choices()[-1] == "auto"
    config = Config().with_overrides(store_dir=str(tmp_path / "store"), graph_uri="bolt://127.0.0.1:9")
    with api.LineageClient(config, backend=plugin) as client:
        with pytest.raises(UnknownRow):
            client.backward(5)
    backward = http.openapi("csprov", secured=False)["paths"]["/v1/lineage/backward"]["get"]["parameters"]
    assert plugin in next(p for p in backward if p["name"] == "backend")["schema"]["enum"]
    (route,) = [r for r in http.ROUTES if r.method == "backward"]
    assert http.parse_query(route, f"rid=5&backend={plugin}")[0] == plugin


def test_the_cli_takes_a_backend_of_another_package(plugin, tmp_path):
    from tests.cli.test_cli import error_of, invoke

    found = error_of(invoke(tmp_path, "lineage", "backward", "--rid", "5", "--backend", plugin, "--in-process"))
    assert found["error"].startswith("rid 5 is not in the lineage store (not captured, or not indexed yet)")
    assert "'nope' is not one of 'auto', 'cypher', 'csprov', 'rq', 'empty-plugin'" in \
        error_of(invoke(tmp_path, "lineage", "backward", "--rid", "5", "--backend", "nope"))["error"]


def test_a_plugin_that_fails_to_import_is_skipped_with_a_warning(plugin, tmp_path, caplog):
    """One broken package does not take the query tier's backends, nor another package's, down with it; nor does
    an entry point named otherwise than what its module registers go unsaid."""
    installed(tmp_path, "hw_broken_plugin", "raise ImportError('a dependency of the plugin is missing')\n", "broken")
    installed(tmp_path, "hw_misnamed_plugin", PLUGIN.replace("empty-plugin", "other-name"), "misnamed")
    with caplog.at_level("WARNING", logger="headwater.plugins"):
        found = api.choices()
    assert found[:3] == ["cypher", "csprov", "rq"] and "empty-plugin" in found and "broken" not in found
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "skipping the headwater.backends plugin 'broken'" in said and "a dependency of the plugin is missing" in said
    assert "plugin 'misnamed' (hw_misnamed_plugin) registered no 'misnamed'" in said
    for module in ("hw_broken_plugin", "hw_misnamed_plugin"):
        sys.modules.pop(module, None)
