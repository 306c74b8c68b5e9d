"""Library-wide rules read from the source (ast): module and function sizes, and no code outside a
role's or a patching task's own module branching on its name (a registry is iterated, never
string-tested: STYLE.md, "One path, one registry")."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = [p for d in ("probes", "analyses", "reports") for p in sorted((ROOT / d).rglob("*.py"))]

MAX_MODULE_LINES, MAX_FUNCTION_LINES = 600, 80


def _names() -> dict[str, set[str]]:
    """name -> the modules allowed to test it: each role group's own module (and the role
    machinery), each patching task's task modules."""
    from headscope.analyses.patching.tasks import TASKS
    from headscope.analyses.roles import shipped  # noqa: F401 - registers the shipped roles
    from headscope.analyses.roles.base import REGISTRY

    out: dict[str, set[str]] = {}
    for name, role in REGISTRY.items():
        module = Path(*role.reducer.__module__.split(".")[1:]).with_suffix(".py").as_posix()
        out.setdefault(name, set()).add(module)
    for name in TASKS:
        out.setdefault(name, set()).update({"analyses/patching/tasks.py", "analyses/patching/generated.py"})
    return out


def _string_tests(tree: ast.AST, names: set[str]):
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                if isinstance(side, ast.Constant) and side.value in names:
                    yield node.lineno, side.value
                if isinstance(side, (ast.Tuple, ast.List, ast.Set)):
                    for e in side.elts:
                        if isinstance(e, ast.Constant) and e.value in names:
                            yield node.lineno, e.value


#: figure generators quote particular findings of particular runs by name (a README figure of
#: SmolLM2's induction heads): tools above the run, not the run
TOOLS = ("analyses/experiments/", "reports/tools/")


def test_no_code_outside_a_roles_or_tasks_module_branches_on_its_name():
    allowed = _names()
    bad = []
    for path in LIBRARY:
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(TOOLS):
            continue
        for line, name in _string_tests(ast.parse(path.read_text(encoding="utf-8")), set(allowed)):
            if rel not in allowed[name]:
                bad.append(f"{rel}:{line}: tests the name {name!r}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_modules_and_functions_stay_small(path):
    text = path.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_MODULE_LINES, f"{path.name}: {len(text.splitlines())} lines"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            assert n <= MAX_FUNCTION_LINES, f"{path.name}:{node.lineno} {node.name}: {n} lines"
