"""Path patching through K or V on GQA: a KV head is read by a group of query heads, so
"the receiver's keys" can mean the receiver's own read of them (``reads="head"``, the
default) or the KV head itself, which the whole group reads (``reads="kv_group"``).

The per-head figure is checked against a brute force that never shares a K/V: the same
weights expanded to one KV head per query head (an MHA copy, same function), where path
patching into the receiver's K/V touches nothing but the receiver."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from patching_cases import gap_items
from safetensors.torch import load_file, save_file
from tiny_models import tiny_model_dir

from headscope.analyses.patching import PatchConfig, path_patching
from headscope.analyses.patching.items import Task
from headscope.analyses.patching.study import StudyConfig
from headscope.probes.models.loading import load_model

CFG = PatchConfig(n_perm=200, n_boot=50)


def _expanded_to_mha(folder, out):
    """The GQA checkpoint at ``folder`` with each KV head's k/v rows repeated for every query
    head of its group: an MHA model computing the same function."""
    import json
    import shutil

    shutil.copytree(folder, out)
    cfg = json.loads((out / "config.json").read_text())
    n_heads, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d_head = cfg.get("head_dim") or cfg["hidden_size"] // n_heads
    group = n_heads // n_kv
    state = load_file(out / "model.safetensors")
    for key in list(state):
        if key.endswith(("k_proj.weight", "v_proj.weight", "k_proj.bias", "v_proj.bias")):
            t = state[key].view(n_kv, d_head, *state[key].shape[1:])
            state[key] = t.repeat_interleave(group, 0).reshape(n_heads * d_head, *state[key].shape[1:]).contiguous()
    save_file(state, out / "model.safetensors", metadata={"format": "pt"})
    cfg["num_key_value_heads"] = n_heads
    (out / "config.json").write_text(json.dumps(cfg))
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("reads")
    gqa = tiny_model_dir(root, "llama")  # 4 query heads, 2 KV heads
    mha = _expanded_to_mha(gqa, root / "llama-mha")
    return load_model(str(gqa), "inhouse"), load_model(str(mha), "inhouse")


@pytest.fixture(scope="module")
def task(models):
    return Task(name="random", items=gap_items(models[0], 8, 9, seed=0), metric="logit_diff")


def test_the_expanded_copy_computes_the_same_function(models, task):
    gqa, mha = models
    assert (gqa.spec.n_heads, gqa.spec.n_kv_heads, mha.spec.n_kv_heads) == (4, 2, 4)
    ids = torch.tensor([it.clean for it in task.items])
    with torch.inference_mode():
        a, b = gqa.forward(ids, torch.ones_like(ids)), mha.forward(ids, torch.ones_like(ids))
    assert (a - b).abs().max() < 1e-5


@pytest.mark.parametrize("via", ["k", "v"])
@pytest.mark.parametrize("receiver", [(1, 1), (1, 2)])
def test_a_receivers_own_read_equals_the_brute_force_on_the_mha_copy(models, task, via, receiver):
    gqa, mha = models
    own, _ = path_patching(gqa, task, receiver=receiver, via=via, cfg=CFG)
    group, _ = path_patching(gqa, task, receiver=receiver, via=via, reads="kv_group", cfg=CFG)
    brute, _ = path_patching(mha, task, receiver=receiver, via=via, cfg=CFG)
    assert set(own["receiver_reads"]) == {"head"} and set(group["receiver_reads"]) == {"kv_group"}
    assert set(brute["receiver_reads"]) == {"head"}  # nothing is shared on the MHA copy
    # measured: k moves this random model's receivers by ≤ 4e-4 of the gap (near-uniform
    # attention), v by ≤ 0.08; the per-head figure equals the brute force to 0.0
    big = 1e-4 if via == "k" else 1e-2
    assert own["effect"].abs().max() > big  # the senders move the receiver: there is something to compare
    np.testing.assert_allclose(own["effect"].to_numpy(), brute["effect"].to_numpy(), rtol=1e-4, atol=1e-6)
    # the group's figure adds what the other query head of the group makes of the patched K/V
    assert np.abs(own["effect"].to_numpy() - group["effect"].to_numpy()).max() > big


def test_via_q_is_one_query_head_either_way(models, task):
    gqa, _ = models
    own, _ = path_patching(gqa, task, receiver=(1, 1), via="q", cfg=CFG)
    group, _ = path_patching(gqa, task, receiver=(1, 1), via="q", reads="kv_group", cfg=CFG)
    assert own["effect"].equals(group["effect"]) and set(group["receiver_reads"]) == {"head"}


def test_an_unknown_reading_is_refused(models, task):
    with pytest.raises(ValueError, match="reads must be one of"):
        path_patching(models[0], task, receiver=(1, 1), via="k", reads="all", cfg=CFG)
    with pytest.raises(ValueError, match="path_reads must be one of"):
        StudyConfig(methods=("path",), receiver=(1, 1), path_reads="group")
