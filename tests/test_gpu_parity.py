"""CPU and CUDA give the same tables; 16-bit dtypes run every path.

Tests marked ``gpu`` run the roles and a quick pruning study on a tiny random Llama and
BERT (built from config classes, :mod:`tests.tiny_models`) on the CPU and on CUDA, and
compare the tables: verdicts identical, scores within 1e-4 in fp32. Without CUDA they are
skipped with the reason (``tests/conftest.py``); ``.ci/gpu-check`` runs them on a GPU.

The unmarked tests run the same code on the CPU with the device given explicitly and with
the model in bf16/fp16, which catches dtype mismatches (a float32 mask meeting bf16
activations) on a machine without a GPU.
"""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest
import torch

from headscope.analyses.pruning.study import PruneConfig, pruning_study
from headscope.analyses.roles.config import RolesConfig
from headscope.analyses.roles.pipeline import TEXT_GROUPS, head_roles
from headscope.probes.models.loading import load_model
from tests.tiny_models import tiny_hf_model

TEXTS = [
    "The cat sat on the mat, and the dog slept by the door.",
    "Grouped-query attention lets several query heads share one key-value head.",
    "A small model reads a short sentence about the weather.",
    "Where did the old man put the red book yesterday?",
    "She said that the river was too cold to swim in.",
    "Two birds flew over the quiet village at dawn.",
] * 2
QUICK = PruneConfig(quick=True, seed=0, ablation_modes=("zero",), studies=("ablation", "importance", "curves"))


def assert_tables_close(a: pd.DataFrame, b: pd.DataFrame, *, atol: float, what: str) -> None:
    """Same rows and columns; float columns within ``atol`` (NaN where NaN); every other column equal."""
    assert list(a.columns) == list(b.columns), what
    assert len(a) == len(b), f"{what}: {len(a)} rows vs {len(b)}"
    a, b = a.reset_index(drop=True), b.reset_index(drop=True)
    for col in a.columns:
        x, y = a[col], b[col]
        if pd.api.types.is_float_dtype(x) and pd.api.types.is_float_dtype(y):
            xv, yv = x.to_numpy(dtype=float), y.to_numpy(dtype=float)
            assert np.array_equal(np.isnan(xv), np.isnan(yv)), f"{what}.{col}: NaN in different rows"
            ok = ~np.isnan(xv)
            worst = float(np.max(np.abs(xv[ok] - yv[ok]), initial=0.0))
            assert worst <= atol, f"{what}.{col}: differs by {worst:.3g} > {atol}"
        else:
            pd.testing.assert_series_equal(x, y, check_names=False, obj=f"{what}.{col}")


def _model(family: str, backend: str = "inhouse", dtype: str = "fp32"):
    hf, tok = tiny_hf_model(family)
    if backend == "hf":
        return load_model(hf, "hf", tokenizer=tok)
    return load_model(hf, "inhouse", tokenizer=tok, dtype=dtype)


def _roles(model, roles=None):
    return head_roles(model, text=TEXTS, roles=roles, cfg=RolesConfig(seed=0), examples=False)


# ----------------------------------------------------------------------------- CPU vs CUDA


@pytest.mark.gpu
@pytest.mark.parametrize(("family", "backend"), [("llama", "inhouse"), ("bert", "inhouse"), ("llama", "hf")])
def test_roles_on_cuda_equal_roles_on_cpu(family, backend):
    cpu = _model(family, backend)
    cuda = copy.deepcopy(cpu).to("cuda")
    assert cuda.device.type == "cuda"
    a, b = _roles(cpu), _roles(cuda)
    assert a.frame.verdict.tolist() == b.frame.verdict.tolist()
    assert_tables_close(a.frame, b.frame, atol=1e-4, what="roles")
    assert_tables_close(a.stats, b.stats, atol=1e-4, what="head_stats")


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["llama", "bert"])
def test_pruning_tables_on_cuda_equal_those_on_cpu(family):
    cpu = _model(family)
    cuda = copy.deepcopy(cpu).to("cuda")
    a, b = pruning_study(cpu, QUICK).tables.by_file(), pruning_study(cuda, QUICK).tables.by_file()
    assert sorted(a) == sorted(b) and a
    for name in a:
        assert_tables_close(a[name], b[name], atol=1e-4, what=name)


@pytest.mark.gpu
def test_bf16_on_cuda_stays_near_fp32():
    fp32 = _model("llama").to("cuda")
    bf16 = _model("llama", dtype="bf16").to("cuda")
    a, b = _roles(fp32, TEXT_GROUPS), _roles(bf16, TEXT_GROUPS)
    assert_tables_close(a.frame[["layer", "head"]], b.frame[["layer", "head"]], atol=0, what="rows")
    assert np.abs(a.frame.score.to_numpy() - b.frame.score.to_numpy()).max() < 0.05


# ----------------------------------------------------------------------------- on the CPU


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_sixteen_bit_roles_on_cpu_run_and_stay_near_fp32(dtype):
    fp32 = _model("llama", dtype="fp32")
    low = _model("llama", dtype=dtype)
    assert next(low.module.parameters()).dtype == {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    a, b = _roles(fp32, TEXT_GROUPS), _roles(low, TEXT_GROUPS)
    assert_tables_close(a.frame[["role", "layer", "head"]], b.frame[["role", "layer", "head"]], atol=0, what="rows")
    worst = float(np.abs(a.frame.score.to_numpy() - b.frame.score.to_numpy()).max())
    assert 0 < worst < 0.05, worst  # rounded, not broken (and not silently fp32)


def test_bf16_pruning_study_on_cpu_runs_every_study_near_fp32():
    ref = pruning_study(_model("llama"), QUICK).tables
    low = pruning_study(_model("llama", dtype="bf16"), QUICK).tables
    assert len(low.ablation) == len(ref.ablation) == 2 * 2 * 4  # 2 layers x 4 heads, two rows each
    assert low.ablation["value"].notna().all() and low.importance["value"].abs().sum() > 0
    gap = np.abs(low.ablation["value"].to_numpy() - ref.ablation["value"].to_numpy()).max()
    assert 0 < gap < 0.05, gap


def test_explicit_cpu_device_gives_the_default_tables_bit_for_bit():
    default = _model("bert")
    explicit = load_model(copy.deepcopy(default), "inhouse", device="cpu")
    a, b = _roles(default, TEXT_GROUPS), _roles(explicit, TEXT_GROUPS)
    pd.testing.assert_frame_equal(a.frame, b.frame)
    pd.testing.assert_frame_equal(a.stats, b.stats)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["inhouse", "hf"])
def test_patching_on_cuda_equals_patching_on_cpu(backend):
    from headscope.analyses.patching.study import StudyConfig, patching_study
    from headscope.analyses.patching.tasks import induction_task

    cpu = _model("llama", backend)
    cuda = copy.deepcopy(cpu).to("cuda")
    task = induction_task(cpu.tokenizer, n_items=8, seq_len=6, seed=0)
    cfg = StudyConfig(methods=("activation", "attribution"))
    a, b = patching_study(cpu, task, cfg), patching_study(cuda, task, cfg)
    assert_tables_close(a.frame, b.frame, atol=1e-4, what="patch")


def test_bf16_patching_on_cpu_runs_near_fp32():
    from headscope.analyses.patching.activation import PatchConfig
    from headscope.analyses.patching.study import StudyConfig, patching_study
    from headscope.analyses.patching.tasks import induction_task

    ref_model, low_model = _model("llama"), _model("llama", dtype="bf16")
    task = induction_task(ref_model.tokenizer, n_items=8, seq_len=6, seed=0)
    cfg = StudyConfig(methods=("activation", "attribution"), patch=PatchConfig(n_boot=50, n_perm=200))
    ref, low = patching_study(ref_model, task, cfg), patching_study(low_model, task, cfg)
    d = np.abs(ref.summary["metric_clean"] - low.summary["metric_clean"])
    assert low.frame["n"].eq(ref.frame["n"]).all() and 0 < d < 0.5, d
