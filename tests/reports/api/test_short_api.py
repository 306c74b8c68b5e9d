"""The short API (``import headscope as hs``, ``reports/api/__init__.py``): every documented name
is the library's own object at its module path, the three-line example of the README gives the
role table ``head_roles`` gives, and importing ``headscope`` loads none of the heavy modules."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pandas as pd
import pytest

import headscope as hs
from headscope.analyses.frames import ROLE_COLUMNS


def test_every_short_name_is_the_object_at_its_module_path():
    assert set(hs.__all__) == set(hs._EXPORTS) | {"roles"}
    for name, (module, attr) in hs._EXPORTS.items():
        assert getattr(hs, name) is getattr(importlib.import_module(module), attr), name
    from headscope.analyses.pruning.study import pruning_study
    from headscope.probes.models.loading import load_model
    from headscope.reports.pipeline import build_report
    from headscope.reports.runs import load_run

    assert (hs.load, hs.prune, hs.report, hs.load_run) == (load_model, pruning_study, build_report, load_run)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'lod'"):
        hs.lod  # noqa: B018


def test_the_package_is_reports_api_and_installed_once():
    from pathlib import Path

    assert Path(hs.__file__).parent.name == "api" and Path(hs.__file__).parent.parent.name == "reports"
    assert "roles" in dir(hs) and "load_run" in dir(hs)


def test_import_headscope_loads_no_heavy_module():
    code = "import sys, headscope; print(','.join(m for m in ('torch', 'pandas', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


def test_three_lines_to_a_roles_frame(minilm):
    from headscope.analyses.roles.pipeline import head_roles

    roles = hs.roles(minilm, roles=["positional"])
    assert list(roles.columns) == ROLE_COLUMNS
    assert (roles["role"] == "positional:previous").any()
    expected = head_roles(minilm, roles=["positional"], examples=False).frame
    pd.testing.assert_frame_equal(roles.reset_index(drop=True), expected.reset_index(drop=True))
    # MiniLM-L6's previous-token head (docs/guide/findings.md): L0H2, a verdict
    best = roles[roles["role"] == "positional:previous"].sort_values("score", ascending=False).iloc[0]
    assert (int(best["layer"]), int(best["head"]), bool(best["verdict"])) == (0, 2, True)


def test_roles_passes_head_roles_errors_on():
    with pytest.raises(ValueError, match="unknown role group 'nope'"):
        hs.roles(None, roles=["nope"])
