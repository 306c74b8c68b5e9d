"""The main job on every family: ``report DIR`` with the default backend (``auto``) on a tiny
random checkpoint, with roles for every head, pruning curves, gradient importance for every head and
the HTML report; the backend chosen is the in-house one where it covers the family, else HF, and
run.json says which and why.

The in-process report of each family of :mod:`tiny_models` ran here; it is now part of the registry
sweep's sample (``tests/reports/tools/sweep/test_sweep.py::test_report_on_every_tiny_models_family``, the
same checks on the sweep's report of each family). Here: two families run the full CLI command as a
user types it (marked slow), and a report that cannot reach the heads says what is missing."""

from __future__ import annotations

import json

import pytest
from tiny_models import check_tiny_report, tiny_model_dir

from headscope.analyses.roles.pipeline import default_text
from headscope.reports.pipeline import build_report
from headscope.reports.tools.sweep.run import by_design

FIXTURE_CONLLU = "tests/fixtures/ud_sample.conllu"


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return lambda family: tiny_model_dir(root, family)


def _check_report(out, family, n_layers=2, n_heads=4):
    return check_tiny_report(out, family, n_layers, n_heads)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gpt2", "olmo2"])  # one in-house family new this round, one through HF
def test_report_cli_default_backend(family, family_dirs, tmp_path):
    from headscope.reports.cli.app import main

    out = tmp_path / "report"
    assert main(["report", str(family_dirs(family)), "--out", str(out), "--quiet"]) == 0
    run = _check_report(out, family)
    assert {k: v for k, v in run["absent"].items() if not by_design(k, v, run["backend"])} == {}  # weights: in-house
    assert run["config"]["pruning"]["quick"] is True


def test_report_says_why_pruning_is_absent(family_dirs, tmp_path, monkeypatch):
    """A backend that cannot reach the heads: everything else is written, and the report
    says what is missing and why (checked before the roles stage spends any time)."""
    import headscope.probes.models.hf_layout as layout

    monkeypatch.setattr(layout, "ATTN_OUT", ("no.such.module",))
    monkeypatch.setattr(layout, "ATTENTION_WORDS", ("no-such-attention",))  # nor found by shape
    monkeypatch.setattr(layout, "attention_classes", lambda blocks: set())  # nor by an attention class
    monkeypatch.setattr(layout, "is_attention", lambda module: False)
    out = tmp_path / "report"
    build_report(
        str(family_dirs("olmo2")),
        backend="hf",
        out_dir=out,
        quiet=True,
        role_groups=("positional",),
        role_inputs={"text": str(default_text())},
    )
    run = json.loads((out / "run.json").read_text())
    assert "cannot find the attention output projection" in run["absent"]["pruning"]
    assert (out / "tables" / "roles.csv").exists() and not (out / "tables" / "prune_curves.csv").exists()
    html = (out / "report.html").read_text(encoding="utf-8")
    assert "The pruning studies did not run on this model: " in html
