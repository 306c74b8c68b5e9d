"""run.json comes from one writer (:mod:`headscope.analyses.run_json`): every command's holds its common keys.

``roles``, ``patch`` and ``prune`` run as a user types them, and the report in process, on
the same tiny random Llama checkpoint (:mod:`tiny_models`); each run.json must hold
:data:`~headscope.analyses.run_json.COMMON_KEYS` with the loaded model's record, the same in
all four but for the output's kind.
"""

from __future__ import annotations

import json

import pytest
from tiny_models import tiny_model_dir

from headscope.analyses.pruning.study import PruneConfig
from headscope.analyses.roles.pipeline import default_text
from headscope.analyses.run_json import COMMON_KEYS, MODEL_KEYS
from headscope.reports.cli.app import main
from headscope.reports.pipeline import build_report
from headscope.reports.stages.config import RunConfig


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("run_json")
    src = str(tiny_model_dir(root, "llama"))
    text = root / "text.txt"
    text.write_text("".join(open(default_text(), encoding="utf-8").readlines()[:8]), encoding="utf-8")
    argv = {
        "roles": ["roles", src, "--roles", "positional", "--text", str(text), "--quiet"],
        "patch": ["patch", src, "--task", "induction", "--n-items", "2", "--seq-len", "4", "--method", "activation"],
        "prune": ["prune", src, "--quick", "--studies", "ablation", "--n-items", "2"],
    }
    out = {}
    for kind, args in argv.items():
        out[kind] = root / kind
        assert main([*args, "--out", str(out[kind])]) == 0, kind
    out["report"] = root / "report"
    config = RunConfig(
        role_groups=("positional",),
        role_inputs={"text": str(text)},
        prune_config=PruneConfig(quick=True, n_items=2, ablation_modes=("zero",), studies=("ablation",)),
        patching=False,
    )
    build_report(src, config, out_dir=out["report"], quiet=True)
    return {kind: json.loads((folder / "run.json").read_text()) for kind, folder in out.items()}


def test_every_command_writes_the_common_keys(runs):
    for kind, run in runs.items():
        assert set(COMMON_KEYS) <= set(run), (kind, sorted(set(COMMON_KEYS) - set(run)))
        assert run["output"]["kind"] == kind
    records = {kind: {k: run[k] for k in MODEL_KEYS if k != "model"} for kind, run in runs.items()}
    assert records["roles"] == records["patch"] == records["prune"] == records["report"], records
    assert records["roles"]["backend"] == "inhouse" and records["roles"]["backend_choice"].startswith("auto: inhouse")
    assert records["roles"]["device"] == "cpu" and records["roles"]["dtype"] == "fp32"
    assert records["roles"]["trust_remote_code"] is False
    # the roles, patch and prune commands name the model as loaded; the report as its card does
    assert runs["roles"]["model"] == runs["patch"]["model"] == runs["prune"]["model"]
    assert isinstance(runs["report"]["model"], str) and runs["report"]["model"]
