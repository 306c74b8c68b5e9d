"""Small real report runs the stage tests share: MiniLM-L6 with every stage's settings cut down
(the same frames, columns and dtypes as the default run, a fraction of its time), and a tiny
random Llama, whose KV-cache stage runs (MiniLM, an encoder, has none). Each runs once a session."""

from __future__ import annotations

import json

import pytest
from stage_cases import small_config
from tiny_models import tiny_model_dir


def _report(model, out, **kw):
    from headscope.reports.pipeline import build_report

    result = build_report(model, small_config(**kw), out_dir=out, quiet=True)
    return result, json.loads(result.paths["run_json"].read_text())


@pytest.fixture(scope="session")
def minilm_report(tmp_path_factory):
    """``(ReportResult, run.json)`` of MiniLM-L6 with every stage (its KV stage blocked: an encoder)."""
    return _report("minilm-l6", tmp_path_factory.mktemp("stages") / "minilm")


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("tiny"), "llama")


@pytest.fixture(scope="session")
def llama_report(tiny_llama_dir, tmp_path_factory):
    """``(ReportResult, run.json)`` of a tiny random Llama with every stage (its KV stage runs)."""
    return _report(tiny_llama_dir, tmp_path_factory.mktemp("stages") / "llama")
