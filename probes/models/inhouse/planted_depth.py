"""A planted model whose attention is local in some layers and global in others: ground truth
for the trend test of attention distance against depth (:mod:`headscope.analyses.context.trend`).

:func:`depth_planted_model` builds a 4-layer, 2-head model on the planted vocabulary and
residual layout of :mod:`~headscope.probes.models.inhouse.planted`: a *local* layer's heads
attend the previous token (``q_i = β e_i``, ``k_j = e_{j+1}`` on the position block), a
*global* layer's heads have ``W_Q = 0`` and so attend uniformly over every visible key. With
``local_first=True`` layers 0-1 are local and 2-3 global; ``False`` reverses them. Each head
copies the token block into the (otherwise unused) previous-token block with a small weight, so
its norm-based weights are defined too.

>>> m = depth_planted_model()
>>> m.spec.n_layers, m.spec.n_heads
(4, 2)
"""

from __future__ import annotations

import torch

from headscope.probes.models.backends.inhouse import InHouseModel
from headscope.probes.models.config import ModelConfig
from headscope.probes.models.inhouse.planted import D_HEAD, D_MODEL, N_POS, SHARP, VOCAB, _layout, planted_tokenizer
from headscope.probes.models.inhouse.transformer import Transformer

N_LAYERS = 4
N_HEADS = 2


def depth_planted_model(*, local_first: bool = True, causal: bool = True) -> InHouseModel:
    """Local heads in the first half and global ones in the second (``local_first``), or the reverse."""
    V, POS, PREV = _layout()
    cfg = ModelConfig(
        family="llama",
        n_layers=N_LAYERS,
        d_model=D_MODEL,
        n_heads=N_HEADS,
        d_head=D_HEAD,
        d_mlp=32,
        vocab_size=V,
        max_positions=N_POS,
        causal=causal,
        positional="learned",
        tie_embeddings=True,
        pad_token_id=0,
        name="planted-depth-" + ("local-first" if local_first else "global-first"),
    )
    module = Transformer(cfg)
    with torch.no_grad():
        for p in module.parameters():
            if p.requires_grad:
                p.zero_()
        module.embed.weight[:, :V] = torch.eye(V)
        module.pos_embed.weight[:, POS : POS + N_POS] = torch.eye(N_POS)
        module.ln_final.weight.fill_(1.0)
        for layer, block in enumerate(module.blocks):
            block.ln1.weight.fill_((2.0 / D_MODEL) ** 0.5)  # reads token + position one-hots unscaled
            block.ln2.weight.fill_(1.0)
            local = (layer < N_LAYERS // 2) == local_first
            a = block.attn
            for h in range(N_HEADS):
                s = slice(h * D_HEAD, (h + 1) * D_HEAD)
                wq, wk, wv, wo = a.q_proj.weight[s], a.k_proj.weight[s], a.v_proj.weight[s], a.o_proj.weight[:, s]
                if local:
                    for i in range(min(N_POS, D_HEAD)):
                        wq[i, POS + i] = SHARP
                        if i + 1 < D_HEAD:
                            wk[i + 1, POS + i] = 1.0
                wv[: min(V, D_HEAD), : min(V, D_HEAD)] = torch.eye(min(V, D_HEAD))
                wo[PREV : PREV + min(V, D_HEAD), : min(V, D_HEAD)] = 0.01 * torch.eye(min(V, D_HEAD))
    return InHouseModel(module, planted_tokenizer(), name=cfg.name)


__all__ = ["depth_planted_model", "VOCAB"]
