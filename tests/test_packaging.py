"""Every package folder is a package of the install: setup.py computes the packages from the folders
(the top-level folders map onto ``headscope.*``, reports/api onto ``headscope``), so a folder with an
``__init__.py`` must import from where it lies (the editable install) and be in a built wheel."""

from __future__ import annotations

import importlib.util
import runpy
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SETUP = runpy.run_path(str(ROOT / "setup.py"), run_name="headscope_setup")


def _folders(root: Path) -> set[str]:
    """Every folder under the top-level folders that holds an ``__init__.py``, relative, with /."""
    return {p.parent.relative_to(root).as_posix() for top in SETUP["TOPS"] for p in (root / top).rglob("__init__.py")}


def test_package_dirs_names_nested_folders_and_the_api(tmp_path):
    for folder in ("probes", "probes/models/gguf", "probes/models", "reports", "reports/api", "reports/api/x", "data"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "data" / "figures").mkdir()  # a folder without __init__.py is data, not a package
    (tmp_path / "analyses").mkdir()
    assert SETUP["package_dirs"](tmp_path) == {
        "headscope": "reports/api",
        "headscope.x": "reports/api/x",
        "headscope.data": "data",
        "headscope.probes": "probes",
        "headscope.probes.models": "probes/models",
        "headscope.probes.models.gguf": "probes/models/gguf",
        "headscope.reports": "reports",
    }


def test_every_package_folder_is_a_package_of_the_install():
    dirs = SETUP["package_dirs"]()
    assert sorted(dirs.values()) == sorted(_folders(ROOT))
    wrong = []
    for name, folder in dirs.items():
        spec = importlib.util.find_spec(name)
        origin = Path(spec.origin).resolve() if spec and spec.origin else None
        if origin != ROOT / folder / "__init__.py":
            wrong.append(f"{folder}: {name} imports from {origin}")
    assert wrong == [], "reinstall (python3 .ci/bootstrap.py): " + "; ".join(wrong)


@pytest.mark.slow
def test_a_built_wheel_holds_every_module_and_data_file(tmp_path):
    src = tmp_path / "src"
    for top in SETUP["TOPS"]:
        shutil.copytree(ROOT / top, src / top, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    cmd = [sys.executable, "-m", "pip", "wheel", str(src), "-w", str(tmp_path / "whl"), "--no-deps"]
    subprocess.run([*cmd, "--no-build-isolation", "-q"], check=True, capture_output=True)
    names = set(zipfile.ZipFile(next((tmp_path / "whl").glob("*.whl"))).namelist())
    expected = {
        "/".join((*name.split("."), f.name))
        for name, folder in SETUP["package_dirs"](src).items()
        for f in (src / folder).glob("*.py")
    }
    data = {f"headscope/{p.relative_to(src).as_posix()}" for p in (src / "data").rglob("*.*") if p.suffix != ".csv"}
    assert expected - names == set() and data - names == set(), sorted((expected | data) - names)
    assert "headscope/reports/tools/bench/harness.py" in names and "headscope/data/figures/patching.json" in names
