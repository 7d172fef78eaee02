"""OpenLineage events checked against OpenLineage's own JSON schemas.

The event against the spec's ``OpenLineage.json`` (its ``RunEvent``), and each facet against the schema of its
facet, found by the file its ``_schemaURL`` names (``…/facets/1-2-0/SchemaDatasetFacet.json#/$defs/…``): those
OpenLineage publishes (``headwater.deploy.tools``' ``openlineage-schemas``: the facets its Spark agent and headwater
send, but not every one), and headwater's own ``headwater_rowLineage`` (``capture/RowLineageRunFacet.json``). A
facet of a newer minor version than the file is checked against the file's (they add optional fields). A facet
whose schema is not there is checked by the core schema alone (its ``_producer`` and ``_schemaURL``), and named in
``Check.unchecked``; one that names the core's own definitions (``OpenLineage.json#/$defs/RunFacet``, as custom
facets do) is checked against those.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from . import tools

CORE = "https://openlineage.io/spec/2-0-2/OpenLineage.json"


@dataclass
class Check:
    problems: list[str] = field(default_factory=list)  # where an event breaks a schema, and how
    checked: set[str] = field(default_factory=set)  # the facet schemas events were checked against
    unchecked: set[str] = field(default_factory=set)  # facets whose schema is not at hand


class OpenLineageSchemas:
    """The schemas, loaded once: ``check(event)`` for each event (a dict, as sent)."""

    def __init__(self, folder: Path | None = None):
        from jsonschema import Draft202012Validator
        from referencing import Registry, Resource

        from headwater.capture.openlineage import ROW_LINEAGE_SCHEMA

        folder = folder or tools.path("openlineage-schemas")
        documents = [json.loads((folder / "OpenLineage.json").read_text())]
        documents += [json.loads(p.read_text()) for p in sorted((folder / "facets").glob("*.json"))]
        documents.append(json.loads(ROW_LINEAGE_SCHEMA.read_text()))
        self.registry = Registry().with_resources((d["$id"], Resource.from_contents(d)) for d in documents)
        self.facets = {d["$id"].rsplit("/", 1)[1]: d["$id"] for d in documents}  # file name → its $id
        self._validator = Draft202012Validator
        self.check_all = Check()

    def check(self, event: dict) -> list[str]:
        """What in ``event`` breaks its schemas (empty: nothing); also gathered in ``check_all``."""
        found = self._problems({"$ref": f"{CORE}#/$defs/RunEvent"}, event, "event")
        for where, facet in _facets(event):
            url = str(facet.get("_schemaURL") or "") if isinstance(facet, dict) else ""
            document, _, definition = url.partition("#")
            name = document.rsplit("/", 1)[-1]
            if name not in self.facets:
                self.check_all.unchecked.add(name or where)
                continue
            self.check_all.checked.add(name)
            found += self._problems({"$ref": f"{self.facets[name]}#{definition}"}, facet, where)
        self.check_all.problems += found
        return found

    def _problems(self, schema: dict, instance, where: str) -> list[str]:
        validator = self._validator(schema, registry=self.registry)
        return [f"{where}{''.join(f'/{p}' for p in error.absolute_path)}: {error.message}"
                for error in validator.iter_errors(instance)]


def _facets(event: dict) -> Iterator[tuple[str, dict]]:
    """Every facet of an event, with where it is."""
    places = [("run", (event.get("run") or {}).get("facets")), ("job", (event.get("job") or {}).get("facets"))]
    for side in ("inputs", "outputs"):
        for i, dataset in enumerate(event.get(side) or []):
            places.append((f"{side}/{i}", dataset.get("facets")))
            places.append((f"{side}/{i}/{'input' if side == 'inputs' else 'output'}Facets",
                           dataset.get("inputFacets" if side == "inputs" else "outputFacets")))
    for where, facets in places:
        for key, facet in (facets or {}).items():
            yield f"{where}/facets/{key}", facet
