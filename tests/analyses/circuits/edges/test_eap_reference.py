"""headscope's EAP and EAP-IG edge scores against the reference implementation's
(github.com/hannamw/EAP-IG at 795f5607, run by ``make eap-reference`` into
data/figures/eap_reference.json): the same random GPT-2, items, metric and interpolation points,
rebuilt here without transformer-lens.

Tolerance: ``|ours - reference| <= 1e-6`` per edge, with scores up to ~0.14. Both sides run in
float32 and differ only in the order of summation (the reference sums each receiver's product
over batch, positions and ``d_model`` in one einsum per hook and accumulates the EAP-IG steps into
its score matrix; headscope averages the gradients over steps first, then takes one einsum), so
each score carries a few float32 roundings (unit roundoff 6e-8) of terms of order 0.1-1: measured
at most 1.7e-7 (EAP) and 1.9e-7 (EAP-IG), and the bound is 5x that. A real disagreement moves
scores by 1e-3 and more: 4 or 6 steps instead of 5 are off by 2.2e-3 and 1.5e-3 (while their
rank correlation stays above 0.999: the value check is the one that bites).
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import tiny_models
import torch

from headscope.analyses.circuits.edges.attribution import EdgeConfig, edge_scores
from headscope.analyses.patching.items import PairItem, Task
from headscope.probes.models.backends.inhouse import InHouseModel
from headscope.probes.models.config import ModelConfig
from headscope.probes.models.inhouse.transformer import Transformer
from headscope.probes.models.loading import load_model
from headscope.reports.tools.experiments import eap_reference as ref
from tests.analyses.patching.patching_cases import gap_items

ATOL = 1e-6
TOP = 50


@pytest.fixture(scope="module")
def reference():
    return json.loads(ref.OUT.read_text())


@pytest.fixture(scope="module")
def ours(reference):
    """headscope's scores ``{method: {edge name: score}}`` on the rebuilt model and the file's items."""
    hf = ref.reference_model()
    assert ref.weights_checksum(hf) == pytest.approx(reference["model"]["weights_checksum"], rel=1e-12)
    assert reference["items"] == ref.reference_items()
    # the tests' shared decoder tokenizer (cached per session): the same training, vocabulary 600, as
    # ref.reference_tokenizer(); the items are ids, the tokenizer only satisfies the loader
    model = load_model(hf, backend="inhouse", tokenizer=tiny_models.tokenizer(False))
    items = [PairItem(tuple(i["clean"]), tuple(i["corrupted"]), i["answer"], i["wrong"]) for i in reference["items"]]
    task = Task(name="eap-reference", items=items, metric=reference["metric"])
    out = {}
    for method in ("eap", "eap-ig"):
        graph, scores = edge_scores(
            model, task, EdgeConfig(method=method, steps=reference["steps"], batch_size=len(items))
        )
        out[method] = {
            f"{graph.senders[s]}->{graph.receivers[r][0]} {graph.receivers[r][1]}": float(scores[s, r])
            for s, r in graph.valid.nonzero().tolist()
        }
    return out


def _ranks(x: torch.Tensor) -> torch.Tensor:
    return torch.argsort(torch.argsort(x)).double()


def _spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.corrcoef(torch.stack([_ranks(a), _ranks(b)]))[0, 1])


def _top(scores: dict[str, float], n: int) -> set[str]:
    return set(sorted(scores, key=lambda k: -abs(scores[k]))[:n])


def test_the_reference_file_says_what_was_run(reference):
    assert reference["reference"]["commit"] == ref.EAP_IG_COMMIT
    assert reference["steps"] == ref.STEPS and reference["alphas"] == [k / ref.STEPS for k in range(ref.STEPS)]
    assert reference["model"]["config"] == ref.MODEL_CONFIG
    assert reference["n_edges"] == 110  # 2 layers of 4 heads: 12 + 5 + 72 + 10 + 11


@pytest.mark.parametrize("method", ["eap", "eap-ig"])
def test_headscope_scores_equal_the_reference(reference, ours, method):
    theirs, mine = reference[method], ours[method]
    assert set(mine) == set(theirs)  # the same 110 edges under the stated name mapping
    names = sorted(theirs)
    a = torch.tensor([mine[k] for k in names], dtype=torch.float64)
    b = torch.tensor([theirs[k] for k in names], dtype=torch.float64)
    assert b.abs().max() > 0.05  # scores large enough for the tolerance to mean something
    assert _spearman(a, b) >= 0.99
    assert _top(mine, min(TOP, len(names))) == _top(theirs, min(TOP, len(names)))
    worst = (a - b).abs().max().item()
    assert worst <= ATOL, f"largest difference {worst:.3g} (edge {names[int((a - b).abs().argmax())]})"


def test_eap_ig_moves_away_from_eap_on_this_model(reference):
    """The reference's EAP and EAP-IG disagree enough here that matching both is two checks."""
    eap, ig = reference["eap"], reference["eap-ig"]
    assert max(abs(eap[k] - ig[k]) for k in eap) > 100 * ATOL


def _ungrouped(net: Transformer) -> Transformer:
    """``net`` with each KV head's k and v weights repeated per query head (transformer-lens's
    ``ungroup_grouped_query_attention``: ``repeat_interleave`` over heads, query head ``h`` gets
    KV head ``h // group``): the same function, one k and v receiver per query head."""
    cfg = net.cfg
    group, dh = cfg.n_heads // cfg.n_kv_heads, cfg.d_head
    out = Transformer(dataclasses.replace(cfg, n_kv_heads=cfg.n_heads))
    state = net.state_dict()
    for name, w in state.items():
        if name.endswith(("k_proj.weight", "v_proj.weight", "k_proj.bias", "v_proj.bias")):
            state[name] = w.view(cfg.n_kv_heads, dh, *w.shape[1:]).repeat_interleave(group, 0).reshape(-1, *w.shape[1:])
    out.load_state_dict(state)
    return out.eval()


def test_a_kv_heads_score_is_the_sum_of_the_references_ungrouped_copies():
    """On GQA the reference ungroups K/V into per-query-head copies; headscope scores each KV
    head once. The KV head's input feeds every copy, so its score is the copies' sum (chain rule),
    and every other edge's score is the same on both models."""
    cfg = ModelConfig(family="llama", n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, vocab_size=50, max_positions=32)
    net = Transformer(cfg)
    net.init_weights(std=0.1, seed=1)
    grouped, ungrouped = InHouseModel(net.eval()), InHouseModel(_ungrouped(net))
    task = Task(name="gap", items=gap_items(grouped, 8, 6, 0), metric="logit_diff")
    for method in ("eap", "eap-ig"):
        g, s = edge_scores(grouped, task, EdgeConfig(method=method, steps=3))
        u, t = edge_scores(ungrouped, task, EdgeConfig(method=method, steps=3))
        for r, (name, via) in enumerate(g.receivers):
            if via in ("k", "v"):
                layer, kv = name[1:].split("KV")
                heads = [u.receivers.index((f"L{layer}KV{h}", via)) for h in range(int(kv) * 2, int(kv) * 2 + 2)]
                expected = t[:, heads].sum(1)
            else:
                expected = t[:, u.receivers.index((name, via))]
            torch.testing.assert_close(s[:, r], expected, rtol=1e-4, atol=1e-6)
        assert s.abs().max() > 1e-2
