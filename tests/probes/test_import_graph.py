"""The import graph of ``headscope.probes`` has no cycle, and analyses leave models' internals to probes.

The graph is built with :mod:`ast` from the source files, so it sees what Python would import,
without importing anything. Every import counts, module-level and function-level alike: a
function-level import is a lazy import (of an optional or heavy dependency, or to keep the CLI's
start fast), never a way round a cycle, so a cycle through one is still a cycle. Only imports
under ``if TYPE_CHECKING:`` are left out: they never run (annotations only).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBES = ROOT / "probes"
ANALYSES = ROOT / "analyses"

#: attributes through which only probes may reach a model's internals (the in-house
#: ``Transformer.blocks``, a backend's ``.module`` and ``.unembedding``)
INTERNALS = ("module", "blocks", "unembedding")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["headscope", *parts])


def _type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (
        isinstance(test, ast.Name | ast.Attribute) and getattr(test, "id", getattr(test, "attr", "")) == "TYPE_CHECKING"
    )


def _runtime_nodes(tree: ast.AST):
    """Every node of ``tree`` except the bodies of ``if TYPE_CHECKING:`` blocks."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        todo.extend(node.orelse if _type_checking(node) else ast.iter_child_nodes(node))


def import_graph(root: Path) -> dict[str, set[str]]:
    """``{module: modules of the same package tree it imports}``; ``from pkg import mod`` counts
    as an import of ``pkg.mod`` when that is a module, else of ``pkg``."""
    files = {_module_name(p): p for p in root.rglob("*.py")}
    prefix = _module_name(root)
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                bases = [(a.name, []) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                bases = [(base, [a.name for a in node.names])]
            else:
                continue
            for base, names in bases:
                if base != prefix and not base.startswith(prefix + "."):
                    continue
                subs = [f"{base}.{n}" for n in names if f"{base}.{n}" in files]
                targets.update(subs or [base])
        graph[name] = targets - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as ``[a, b, ..., a]``, or None (depth-first search, white/grey/black)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_find_cycle_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_import_graph_sees_models():
    graph = import_graph(PROBES)
    assert "headscope.probes.models.config" in graph["headscope.probes.models.checkpoints"]
    assert "headscope.probes.models.inhouse.attention" in graph["headscope.probes.models.inhouse.transformer"]
    # a function-level import counts; one under `if TYPE_CHECKING:` does not
    assert "headscope.probes.models.inhouse.attention" in graph["headscope.probes.models.gguf.metadata"]
    assert "headscope.probes.models.gguf.metadata" not in graph["headscope.probes.models.gguf.tensors"]


def test_probes_import_graph_has_no_cycle():
    cycle = find_cycle(import_graph(PROBES))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def _internals_reached(root: Path, *, root_of_names: Path = ROOT) -> list[str]:
    """``path:line .attr`` of every attribute in :data:`INTERNALS` read under ``root``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in INTERNALS:
                found.append(f"{path.relative_to(root_of_names)}:{node.lineno} .{node.attr}")
    return sorted(set(found), key=found.index)


def test_internals_reached_sees_a_planted_reach(tmp_path):
    (tmp_path / "a.py").write_text("def f(model):\n    return model.module.blocks[0], model.unembedding\n")
    (tmp_path / "b.py").write_text("def g(model):\n    return model.network, model.hook_points\n")
    found = sorted(_internals_reached(tmp_path, root_of_names=tmp_path))
    assert found == ["a.py:2 .blocks", "a.py:2 .module", "a.py:2 .unembedding"]


def test_analyses_leave_model_internals_to_probes():
    assert _internals_reached(ANALYSES) == []
