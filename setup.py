"""headscope's packages, computed (its metadata is in pyproject.toml).

setuptools' ``find`` cannot add the ``headscope.`` prefix to the top-level folders, so: every
folder with an ``__init__.py`` under probes/, analyses/, reports/ and data/ is the package
``headscope.<its path with dots>``, and reports/api/, where it exists, is ``headscope`` itself
(the short public API, ``import headscope as hs``; its sub-folders ``headscope.<rest>``).
``tests/test_packaging.py`` checks the install against it.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent
TOPS = ("probes", "analyses", "reports", "data")
API = ("reports", "api")


def package_dirs(root: Path = ROOT) -> dict[str, str]:
    """``{package name: its folder, relative to root, with /}`` for every package folder under TOPS."""
    found = {}
    for top in TOPS:
        for init in sorted((root / top).rglob("__init__.py")):
            parts = init.parent.relative_to(root).parts
            rest = parts[len(API) :] if parts[: len(API)] == API else parts
            found[".".join(("headscope", *rest))] = "/".join(parts)
    return found


if __name__ == "__main__":
    from setuptools import setup

    dirs = package_dirs()
    setup(packages=sorted(dirs), package_dir=dirs)
