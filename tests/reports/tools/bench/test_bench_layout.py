"""The bench's code stays in small pieces: no module of ``reports/tools/bench`` over 600 lines,
no function over 80 lines unless a ``# long:`` comment right above its ``def`` says why."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[4] / "reports" / "tools" / "bench"
MODULES = sorted(BENCH.glob("*.py"))


def long_functions(source: str, limit: int = 80) -> list[str]:
    """``name (n lines)`` of each function of ``source`` longer than ``limit`` lines with no
    ``# long:`` comment on the line above its ``def`` (or its first decorator)."""
    lines = source.splitlines()
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            reason = first >= 2 and lines[first - 2].strip().startswith("# long:")
            if n > limit and not reason:
                out.append(f"{node.name} ({n} lines)")
    return out


def test_the_check_finds_a_long_function_and_accepts_a_stated_reason():
    body = "".join(f"    x{i} = {i}\n" for i in range(81))
    assert long_functions(f"def f():\n{body}") == ["f (82 lines)"]
    assert long_functions(f"# long: one table, read top to bottom\ndef f():\n{body}") == []


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_bench_modules_and_functions_stay_small(path):
    source = path.read_text(encoding="utf-8")
    assert len(source.splitlines()) <= 600, f"{path.name}: {len(source.splitlines())} lines"
    assert long_functions(source) == [], path.name
