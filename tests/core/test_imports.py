"""The packages' import graph, read from the source (every ``import``, function-level ones too): the query tier
reads the store through ``headwater.store`` and never through the indexer's modules."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def modules() -> dict[str, Path]:
    """Every module of the distribution by its dotted name, from pyproject's ``package-dir``."""
    # (read with a pattern, not tomllib: Python 3.10 has none)
    mapping = re.search(r"^package-dir = \{(.*)\}$", (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    package_dir = dict(re.findall(r'"([\w.]+)" = "(\w+)"', mapping))
    assert "headwater.query" in package_dir, mapping
    found = {}
    for package, folder in package_dir.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


def _run_time(tree: ast.AST):
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:``, which never run (annotations only)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The distribution's modules ``name`` imports, wherever in it the import stands (in a function too), but
    for the imports of type annotations (``if TYPE_CHECKING:``)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in _run_time(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            submodules = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in known]
            targets = submodules or [base]  # ``from package import module``: the module, not the package
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports_of(name, path, set(found)) for name, path in found.items()}


def test_the_graph_is_read():
    edges = graph()
    assert "headwater.store.graph" in edges["headwater.query.cypher"]
    assert "headwater.store.batch_log" in edges["headwater.query.explain"]  # a function-level import


def test_the_query_tier_never_imports_the_indexer():
    crossing = sorted((name, target) for name, targets in graph().items() if name.startswith("headwater.query")
                      for target in targets if target.startswith("headwater.indexer"))
    assert crossing == []


def test_the_store_imports_neither_the_indexer_nor_the_query_tier():
    crossing = sorted((name, target) for name, targets in graph().items() if name.startswith("headwater.store")
                      for target in targets if target.startswith(("headwater.indexer", "headwater.query")))
    assert crossing == []


def test_spark_semantics_import_none_of_their_readers():
    """Capture, the query tier and the indexer all read Spark's plans through ``headwater.spark``: it imports none of
    them, nor the store, nor the plan IR built on it; its package imports none of its modules (importing one loads
    only what that one needs)."""
    edges = graph()
    services = ("headwater.query", "headwater.capture", "headwater.store", "headwater.indexer", "headwater.core.plan")
    crossing = sorted((name, target) for name, targets in edges.items() if name.startswith("headwater.spark")
                      for target in targets if target.startswith(services))
    assert crossing == []
    assert edges["headwater.spark"] == set()
    assert "headwater.spark.plan_json" in edges["headwater.query.explain"]


def test_one_expression_evaluator():
    """``--where`` and inference evaluate expressions through ``headwater.spark.evaluate``, and its modules import
    neither pandas nor sqlglot but where ``--where`` needs its parser (``--where`` must not pay pandas' import)."""
    edges = graph()
    assert "headwater.spark.evaluate" in edges["headwater.query.where"]
    assert "headwater.spark.evaluate" in edges["headwater.query.infer.evaluate"]
    found = modules()
    for name in ("headwater.spark.evaluate", "headwater.spark.semantics", "headwater.spark.arrow_values",
                 "headwater.spark.sql"):
        imported = imports_of(name, found[name], set(found) | {"pandas", "sqlglot", "numpy"})
        assert "pandas" not in imported and "sqlglot" not in imported, (name, imported)
    # the scan sees third-party imports: numpy, which semantics does import
    assert "numpy" in imports_of("headwater.spark.semantics", found["headwater.spark.semantics"], {"numpy"})


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles: each strongly connected part of the graph of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        for target in sorted(edges.get(name, ())):
            if target not in index:
                visit(target)
                low[name] = min(low[name], low[target])
            elif target in stack:
                low[name] = min(low[name], index[target])
        if low[name] == index[name]:
            part = []
            while not part or part[-1] != name:
                part.append(stack.pop())
            if len(part) > 1:
                found.append(sorted(part))

    for name in sorted(edges):
        if name not in index:
            visit(name)
    return found


def test_cycles_are_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle():
    assert cycles(graph()) == []


def test_only_the_cli_imports_the_demo():
    assert sorted(n for n, targets in graph().items() if not n.startswith(("headwater.demo", "headwater.cli"))
                  for t in targets if t.startswith("headwater.demo")) == []
