"""The wheel holds every sub-package: pyproject lists its packages by hand (the top-level
folders map onto ``headscope.*``), so a new folder with an ``__init__.py`` that is not listed
would import from a source checkout (the editable install) and be missing from a built wheel."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _listed() -> tuple[set[str], dict[str, str]]:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return set(setuptools["packages"]), setuptools["package-dir"]


def _on_disk(root: Path, package_dir: dict[str, str]) -> set[str]:
    found = set()
    for name, folder in package_dir.items():
        for init in (root / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(root / folder).parts
            found.add(".".join([name, *parts]))
    return found


def test_every_package_folder_is_listed_in_pyproject():
    listed, package_dir = _listed()
    on_disk = _on_disk(ROOT, package_dir)
    assert on_disk - listed == set(), "folders with an __init__.py missing from [tool.setuptools] packages"
    assert listed - on_disk == set(), "packages listed in pyproject with no folder"


def test_the_check_sees_a_nested_package(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "__init__.py").write_text("")
    (tmp_path / "a" / "b" / "__init__.py").write_text("")
    (tmp_path / "a" / "c").mkdir()  # a folder without __init__.py is data, not a package
    assert _on_disk(tmp_path, {"x": "a"}) == {"x", "x.b"}
