"""Per-example gradient importance (Michel et al. 2019's E_x |∂L_x/∂ξ|) on the real MiniLM.

``cosine_to_unpruned``'s loss used to retrieve a sentence among its unit's sentences only:
on a one-sentence unit that is a softmax over one logit, the constant 0, so every
per-example importance was exactly 0 and importance orders fell back to head-index order.
A one-sentence unit now retrieves among all the metric's sentences (larger units keep
retrieving among their own, so batch importances are unchanged).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from scipy.stats import spearmanr

from headscope.analyses.pruning.gates import gates_as
from headscope.analyses.pruning.importance import ImportanceTieWarning, head_importance
from headscope.analyses.pruning.metric_functions import mean_pool
from headscope.analyses.pruning.metrics import build_metric
from headscope.probes.models.backends.inhouse import InHouseModel


def test_retrieval_among_a_one_sentence_unit_has_zero_gradient(minilm):
    """The old loss, on the unit per_example uses: the gradient is exactly 0 for every head."""
    metric = build_metric("cosine_to_unpruned", minilm, n_items=16)
    unit = metric.single_item_units()[0]
    spec = minilm.spec
    with (
        gates_as(minilm.module, torch.ones(spec.n_layers, spec.n_heads), requires_grad=True) as gates,
        torch.enable_grad(),
    ):
        emb = mean_pool(minilm.module(unit.batch.input_ids, unit.batch.attention_mask), unit.batch.attention_mask)
        old = F.cross_entropy(emb @ unit.extra["ref"].T / metric.temperature, torch.arange(unit.rows))  # [1, 1] logits
        g_old = torch.autograd.grad(old, gates)
        new = metric.loss(minilm.module(unit.batch.input_ids, unit.batch.attention_mask), unit)
        g_new = torch.autograd.grad(new, gates)
    assert float(old.detach()) == 0.0 and all(bool((g == 0).all()) for g in g_old)
    assert all(bool((g != 0).all()) for g in g_new)


def test_per_example_importance_on_minilm(minilm):
    metric = build_metric("cosine_to_unpruned", minilm, n_items=16)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ImportanceTieWarning)  # no zeros, no ties
        batch = head_importance(minilm, metric)
        per_ex = head_importance(minilm, metric, per_example=True)
    assert bool((per_ex > 0).all())
    # 16 sentences in one batch of 32: the batch unit retrieves among the same 16 sentences as each one-sentence unit,
    # so |mean_x g_x| <= mean_x |g_x|: the batch loss is the mean of the per-example losses. Equality where a head's
    # per-example gradients share a sign; the two sides come from a 16-row and 1-row forwards, so float32 rounding
    # (measured 2.4e-7 relative) is allowed for, 1e-5 relative.
    assert bool((batch <= per_ex * (1 + 1e-5)).all())
    # measured on these 16 sentences: Spearman 0.747 with the batch importance; both put L3H3 first (0.007905)
    rho = spearmanr(batch.flatten().numpy(), per_ex.flatten().numpy())[0]
    assert rho > 0.7
    top = int(per_ex.flatten().argmax())
    assert (top // 12, top % 12) == (3, 3) and float(per_ex[3, 3]) == pytest.approx(0.007905, rel=1e-3)


def test_cosine_loss_on_one_sentence_is_refused(minilm):
    metric = build_metric("cosine_to_unpruned", minilm, n_items=1)
    with pytest.raises(ValueError, match="at least 2 texts"):
        head_importance(minilm, metric, per_example=True)


def test_tied_importances_warn(minilm):
    """Heads whose output projection is zero have importance exactly 0: an order cannot rank them."""
    module = copy.deepcopy(minilm.module)
    d_head = minilm.spec.d_head
    with torch.no_grad():
        module.blocks[5].attn.o_proj.weight[:, : 2 * d_head] = 0.0  # L5H0 and L5H1 write nothing
    model = InHouseModel(module, minilm.tokenizer, name="minilm-l6")
    metric = build_metric("cosine_to_unpruned", model, n_items=4)
    with pytest.warns(ImportanceTieWarning, match="2 of 72 importances tie: L5H0 = L5H1 = 0"):
        imp = head_importance(model, metric)
    assert float(imp[5, :2].abs().max()) == 0.0 and bool((imp[5, 2:] > 0).all())
