"""The in-house attention's public signatures state their shapes (probes/shapes.py), and the
statements hold: with jaxtyping's run-time check switched on for the pure functions, a padded
GQA forward with RoPE, a sliding window and soft-capping passes every check, and a tensor of the
wrong shape is refused by name."""

from __future__ import annotations

import pytest
import torch
from beartype import beartype
from jaxtyping import TypeCheckError, jaxtyped

from headscope.probes.models.config import ModelConfig
from headscope.probes.models.inhouse import attention
from headscope.probes.models.inhouse import transformer as stack

CHECKED = ("repeat_kv", "rope_cos_sin", "apply_rope", "attention_scores", "attention_pattern", "additive_mask")


@pytest.fixture
def checked(monkeypatch):
    """The attention module's pure functions, run-time checked where the stack calls them."""
    fns = {}
    for name in CHECKED:
        fn = jaxtyped(typechecker=beartype)(getattr(attention, name))
        monkeypatch.setattr(attention, name, fn)
        if hasattr(stack, name):
            monkeypatch.setattr(stack, name, fn)
        fns[name] = fn
    return fns


def test_a_gqa_forward_meets_every_stated_shape(checked):
    cfg = ModelConfig(
        family="gemma2", n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_head=8, vocab_size=50,
        sliding_window=(3, None), attn_softcap=20.0,
    )  # fmt: skip
    model = stack.Transformer(cfg).eval()
    model.init_weights(seed=0)
    ids = torch.randint(0, 50, (2, 6))
    am = torch.ones(2, 6, dtype=torch.long)
    am[1, 4:] = 0
    with torch.no_grad():
        out = model(ids, am)
    assert torch.isfinite(out).all()
    # the pure functions really ran checked: the fixture replaced what the stack calls
    assert attention.attention_pattern is checked["attention_pattern"]


def test_a_wrong_shape_is_refused_by_name(checked):
    q = torch.randn(1, 4, 5, 8)
    k = torch.randn(1, 2, 5, 8)
    assert checked["attention_pattern"](q, k, None).shape == (1, 4, 5, 5)
    with pytest.raises(TypeCheckError, match="d_head"):
        checked["attention_pattern"](q, torch.randn(1, 2, 5, 7), None)  # keys of another d_head
    with pytest.raises(TypeCheckError, match="batch"):
        checked["attention_pattern"](q, torch.randn(2, 2, 5, 8), None)  # keys of another batch
    with pytest.raises(TypeCheckError):
        checked["repeat_kv"](torch.randn(1, 2, 5, 8), torch.zeros(4, 2, dtype=torch.long))  # kv_index not [head]
