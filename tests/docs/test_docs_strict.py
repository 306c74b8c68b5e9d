"""The strict docs build fails on bad input, saying where: a tutorial cell that raises (the
tutorial's file, the cell's source and the error) and a docstring cross-reference to an object
that does not exist (the docstring's file and line); a reference to an object that exists but has
no page of its own (``headscope.load``) passes. A tiny site with docs/conf.py and docs/_ext."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"

NOTEBOOK = """---
file_format: mystnb
kernelspec:
  name: python3
  display_name: Python 3
---
# bad tutorial

```{code-cell} ipython3
x = 1
```

```{code-cell} ipython3
x / 0
```
"""


@pytest.mark.slow  # a Sphinx build and a Jupyter kernel: ~20 s, more on a loaded machine
def test_a_failing_cell_and_a_missing_reference_fail_the_build_saying_where(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    shutil.copy(DOCS / "conf.py", site / "conf.py")
    shutil.copytree(DOCS / "_ext", site / "_ext")
    (site / "_static").mkdir()
    (site / "mod_with_refs.py").write_text(
        'def f():\n    """Calls :func:`headscope.probes.models.loading.no_such_loader` after :func:`headscope.load`."""\n',
        encoding="utf-8",
    )
    (site / "index.md").write_text("# t\n\n```{toctree}\nbad\napi\n```\n", encoding="utf-8")
    (site / "api.md").write_text("# api\n\n```{eval-rst}\n.. autofunction:: mod_with_refs.f\n```\n", encoding="utf-8")
    (site / "bad.md").write_text(NOTEBOOK, encoding="utf-8")
    cmd = [
        sys.executable,
        "-m",
        "sphinx",
        "-W",
        "--keep-going",
        "-n",
        "-E",
        "-q",
        "-b",
        "html",
        str(site),
        str(site / "_build"),
    ]
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert f"{site / 'bad.md'}: WARNING: Executing notebook failed" in out
    assert "x / 0" in out and "ZeroDivisionError" in out
    assert (
        f"{site / 'mod_with_refs.py'}:docstring of mod_with_refs.f:1: WARNING: py:func reference target not found: headscope.probes.models.loading.no_such_loader"
        in out
    )
    assert "target not found: headscope.load" not in out
