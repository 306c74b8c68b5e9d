"""The import graph of headscope: its layers are only imported downwards, ``headscope.probes`` has
no cycle, and analyses leave models' internals to probes.

The graph is built with :mod:`ast` from the source files, so it sees what Python would import,
without importing anything. Every import counts, module-level and function-level alike: a
function-level import is a lazy import (of an optional or heavy dependency, or to keep the CLI's
start fast), never a way round a cycle or a layer, so a cycle or an upward import through one
still counts. Only imports under ``if TYPE_CHECKING:`` are left out: they never run (annotations only).

The layers, lowest first (:data:`LAYERS`): probes (and the shipped data) < analyses < reports (the
run, its sections and writers) < reports/tools (bench, sweep, experiments: what measures the product)
< reports/cli and the public API (``headscope``, from ``reports/api/``). A module imports its own
layer and those below, never one above.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBES = ROOT / "probes"
ANALYSES = ROOT / "analyses"
#: the top-level folders of the package (each ``headscope.<folder>``)
TOPS = ("probes", "analyses", "reports", "data")

#: attributes through which only probes may reach a model's internals (the in-house
#: ``Transformer.blocks``, a backend's ``.module`` and ``.unembedding``)
INTERNALS = ("module", "blocks", "unembedding")

#: (layer, module prefixes), lowest first; a module's layer is that of its longest matching prefix
LAYERS = (
    ("probes", ("headscope.probes", "headscope.data")),
    ("analyses", ("headscope.analyses",)),
    ("reports", ("headscope.reports",)),
    ("reports.tools", ("headscope.reports.tools",)),
    ("reports.cli", ("headscope.reports.cli", "headscope.reports.api", "headscope")),
)


def _module_name(path: Path, root: Path = ROOT) -> str:
    """``headscope.<dotted path>``; ``reports/api/`` is the top-level ``headscope`` (the public API)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    if parts[:2] == ["reports", "api"]:
        parts = parts[2:]
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


def _imports(files: dict[str, Path], prefix: str):
    """``(module, path, line, imported module)`` for every runtime import of a module under ``prefix``;
    ``from pkg import mod`` counts as an import of ``pkg.mod`` when that is a module, else of ``pkg``."""
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
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
                for target in subs or [base]:
                    yield name, path, node.lineno, target


def import_graph(root: Path) -> dict[str, set[str]]:
    """``{module: modules of the same package tree it imports}`` of the tree at ``root`` (a top-level folder)."""
    files = {_module_name(p): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, _, _, target in _imports(files, _module_name(root)):
        if target != name:
            graph[name].add(target)
    return graph


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of ``module``'s layer (its longest matching prefix)."""
    best, index = "", None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best):
                best, index = prefix, i
    if index is None:
        raise ValueError(f"{module!r} is in no layer of LAYERS; add its prefix there")
    return index


def upward_imports(root: Path = ROOT) -> list[str]:
    """``path:line module -> imported (layer < layer)`` for every import of a higher layer, in the
    package whose top-level folders (:data:`TOPS`) are under ``root``."""
    files = {_module_name(p, root): p for top in TOPS for p in sorted((root / top).rglob("*.py"))}
    found = []
    for name, path, line, target in _imports(files, "headscope"):
        low, high = layer_of(name), layer_of(target)
        if high > low:
            where = f"{path.relative_to(root)}:{line}"
            found.append(f"{where} {name} -> {target} ({LAYERS[low][0]} < {LAYERS[high][0]})")
    return found


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


def test_upward_imports_sees_planted_ones(tmp_path):
    """Module- and function-level upward imports are found with their line, relative ones too;
    downward imports and those under ``if TYPE_CHECKING:`` are not."""
    files = {
        "probes/__init__.py": "",
        "probes/a.py": "import headscope.analyses.b\n",
        "analyses/__init__.py": "",
        "analyses/b.py": (
            "from typing import TYPE_CHECKING\n"
            "from headscope.probes import a\n"
            "if TYPE_CHECKING:\n"
            "    from headscope.reports import c\n"
            "def f():\n"
            "    from headscope.reports.tools import t\n"
        ),
        "reports/__init__.py": "",
        "reports/c.py": "from .cli import app\nfrom headscope.analyses.b import f\n",
        "reports/tools/__init__.py": "",
        "reports/tools/t.py": "from headscope.reports import c\nfrom ..cli.app import main\n",
        "reports/cli/__init__.py": "",
        "reports/cli/app.py": "from headscope.reports.tools import t\nimport headscope\n",
        "reports/api/__init__.py": "from headscope.reports.cli import app\n",
        "data/__init__.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert sorted(upward_imports(tmp_path)) == [
        "analyses/b.py:6 headscope.analyses.b -> headscope.reports.tools.t (analyses < reports.tools)",
        "probes/a.py:1 headscope.probes.a -> headscope.analyses.b (probes < analyses)",
        "reports/c.py:1 headscope.reports.c -> headscope.reports.cli.app (reports < reports.cli)",
        "reports/tools/t.py:2 headscope.reports.tools.t -> headscope.reports.cli.app (reports.tools < reports.cli)",
    ]


def test_every_layer_imports_only_its_own_and_lower_ones():
    found = upward_imports()
    assert found == [], "imports of a higher layer:\n" + "\n".join(found)
