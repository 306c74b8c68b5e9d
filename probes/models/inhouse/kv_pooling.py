"""Grouping an in-house model's K/V heads: MHA → GQA by mean-pooling (Ainslie et al. 2023).

:func:`convert_to_gqa` builds a NEW in-house model with fewer KV heads: consecutive KV heads
``[j·r, (j+1)·r)`` (``r = n_kv_heads / n_groups``) become KV head ``j``, whose ``W_K``,
``W_V`` (and biases) are the mean of theirs. Query and output projections, gates and
ablation values are copied as they are. What the conversion costs a model is measured by
:func:`~headscope.analyses.pruning.gqa_conversion.gqa_study`.

>>> from headscope.probes.models.inhouse.transformer import Transformer
>>> m = InHouseModel(Transformer(ModelConfig(family="bert", n_layers=1, n_heads=4)))
>>> g = convert_to_gqa(m, 2)
>>> g.spec.n_kv_heads, g.spec.n_heads, g.spec.name
(2, 4, 'in-house-gqa2')
"""

from __future__ import annotations

import torch

from headscope.probes.models.backends.inhouse import InHouseModel
from headscope.probes.models.backends.protocol import Backend
from headscope.probes.models.config import ModelConfig

__all__ = ["check_groups", "convert_to_gqa"]


def check_groups(cfg: ModelConfig, n_groups) -> int:
    """``n_groups`` when it is an int dividing ``cfg.n_kv_heads``; ``TypeError`` /
    ``ValueError`` listing the valid counts otherwise."""
    if isinstance(n_groups, bool) or not isinstance(n_groups, int):
        raise TypeError(f"n_groups must be an int; got {type(n_groups).__name__}.")
    if n_groups < 1 or cfg.n_kv_heads % n_groups:
        divisors = [d for d in range(1, cfg.n_kv_heads + 1) if cfg.n_kv_heads % d == 0]
        raise ValueError(
            f"n_groups must divide the model's {cfg.n_kv_heads} KV heads (groups of consecutive heads); "
            f"got {n_groups}. Valid: {divisors}."
        )
    return n_groups


def convert_to_gqa(model: InHouseModel, n_groups: int) -> InHouseModel:
    """A new in-house model with ``n_kv_heads = n_groups``: the K/V projections of each group
    of consecutive KV heads are mean-pooled (Ainslie et al. 2023). The input is untouched.

    ``n_groups`` must divide the model's current ``n_kv_heads`` (so an existing GQA model can
    be grouped further). ``n_groups == n_kv_heads`` returns an exact copy.

    Raises ``TypeError`` for a model that is not in-house, ``ValueError`` for a bad
    ``n_groups`` or a physically pruned model (its layers hold different head sets).
    """
    if not (isinstance(model, Backend) and model.has_gates):
        raise TypeError(f"convert_to_gqa needs an in-house model (backend='inhouse'); got {type(model).__name__}.")
    cfg = model.module.cfg
    if cfg.heads_kept is not None:
        raise ValueError("convert_to_gqa needs an unpruned model (heads_kept is set); convert first, then prune.")
    g = check_groups(cfg, n_groups)
    r, d_head = cfg.n_kv_heads // g, cfg.d_head
    new_cfg = cfg.replace(n_kv_heads=g)
    from headscope.probes.models.inhouse.transformer import Transformer

    param = next(model.module.parameters())
    new = Transformer(new_cfg).to(dtype=param.dtype, device=param.device)
    state = {k: v for k, v in model.module.state_dict().items() if not k.endswith(".gate")}
    for layer in range(cfg.n_layers):
        for proj in ("k_proj", "v_proj"):
            w = state[f"blocks.{layer}.attn.{proj}.weight"]  # [n_kv * d_head, d_model]
            state[f"blocks.{layer}.attn.{proj}.weight"] = w.view(g, r, d_head, -1).mean(1).reshape(g * d_head, -1)
            bname = f"blocks.{layer}.attn.{proj}.bias"
            if bname in state:
                state[bname] = state[bname].view(g, r, d_head).mean(1).reshape(g * d_head)
    missing, unexpected = new.load_state_dict(state, strict=False)
    if [m for m in missing if not m.endswith(".gate")] or unexpected:  # pragma: no cover - same config but n_kv_heads
        raise RuntimeError(f"internal: GQA state mismatch {missing[:3]} {unexpected[:3]}")
    with torch.no_grad():
        for old_b, new_b in zip(model.module.blocks, new.blocks):
            new_b.attn.gate.copy_(old_b.attn.gate)
            new_b.attn.ablation_value.copy_(old_b.attn.ablation_value)
    return InHouseModel(new.eval(), model.tokenizer, name=f"{model.spec.name}-gqa{g}")
