"""Per-head weight matrices of an in-house model, read one layer at a time, for the weights-only
circuit analyses (:mod:`headscope.analyses.circuits`), so analyses never reach into the model.

Convention (transformer-lens's ``x @ W``): a residual row vector ``x [d_model]`` gives head
``h``'s query ``x @ W_Q[h]``, key ``x @ W_K[kv]``, value ``x @ W_V[kv]``, and the head writes
``z @ W_O[h]``; tokens embed as ``W_E[token]`` and unembed as ``x @ W_U``.

Shapes::

    W_Q  [head, d_model, d_head]        W_O  [head, d_head, d_model]
    W_K  [kv_head, d_model, d_head]     W_V  [kv_head, d_model, d_head]
    W_E  [vocab, d_model]               W_U  [d_model, vocab]
    kv_index [head]: query head h reads KV head kv_index[h]

Norm folding (``fold_norms=True``, as transformer-lens's ``fold_ln`` does for the scales): on a
pre-norm model each block's input-norm scale ``w`` (Gemma: ``1 + w``) multiplies the rows of
``W_Q``, ``W_K``, ``W_V`` (``diag(w) @ W``) and the final norm's scale the rows of ``W_U``;
Gemma's embedding scale multiplies ``W_E``. LayerNorm's centring and every bias are *not* folded,
nor Gemma's post-attention (sandwich) norms; a post-norm model (BERT) is not folded at all.
:attr:`ModelWeights.folding` says which applied.

>>> from headscope.probes.models.inhouse.planted import planted_model
>>> w = head_weights(planted_model())
>>> tuple(w.layer(1).W_Q.shape), tuple(w.W_U.shape), w.unembedding
((4, 128, 64), (128, 35), 'unembed (tied to the embedding)')
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from headscope.probes.errors import ModelIncompatibleError
from headscope.probes.models.inhouse.attention import RMSNorm
from headscope.probes.models.inhouse.transformer import Transformer


@dataclass(frozen=True)
class LayerWeights:
    """One layer's attention weights (float32, CPU, detached copies; see module doc)."""

    layer: int
    heads: tuple[int, ...]  # original query-head indices this layer holds (a pruned model holds fewer)
    kv_index: torch.Tensor  # [head] -> KV head
    W_Q: torch.Tensor  # [head, d_model, d_head]
    W_K: torch.Tensor  # [kv_head, d_model, d_head]
    W_V: torch.Tensor  # [kv_head, d_model, d_head]
    W_O: torch.Tensor  # [head, d_head, d_model]


def _norm_scale(norm) -> torch.Tensor:
    """The multiplicative scale ``[d_model]`` of a norm module (Gemma's ``1 + w``)."""
    w = norm.weight.detach().float().cpu()
    return 1.0 + w if isinstance(norm, RMSNorm) and norm.offset else w


class ModelWeights:
    """Lazy view of a :class:`Transformer`'s head weights; :meth:`layer` builds one layer's
    matrices when asked (nothing is copied up front except ``W_E``/``W_U`` on first use)."""

    def __init__(self, module: Transformer, *, fold_norms: bool = True):
        self._m = module
        cfg = module.cfg
        self.n_layers: int = cfg.n_layers
        self.d_model: int = cfg.d_model
        self.d_head: int = cfg.d_head
        self.vocab_size: int = cfg.vocab_size
        self.positional: str = cfg.positional
        self.name: str = cfg.name or cfg.family
        self._fold = fold_norms and not cfg.post_norm
        if not fold_norms:
            self.folding = "not folded"
        elif cfg.post_norm:
            self.folding = "not folded (post-norm model: the norms act after the residual sums)"
        else:
            extra = "; Gemma's post-attention norms not folded" if cfg.sandwich_norm else ""
            self.folding = (
                "input-norm scales folded into W_Q/W_K/W_V, the final norm's into W_U; centring and biases not folded"
                + extra
            )
        if cfg.encoder:
            self.unembedding = "W_E transposed (encoder: no unembedding loaded; BERT's MLM head ties it)"
        elif cfg.tie_embeddings:
            self.unembedding = "unembed (tied to the embedding)"
        else:
            self.unembedding = "unembed"

    @property
    def W_E(self) -> torch.Tensor:
        """``[vocab, d_model]`` (Gemma's embedding scale folded where norms are)."""
        w = self._m.embed.weight.detach().float().cpu()
        scale = self._m.cfg.embed_scale
        return w * scale if (scale is not None and self._fold) else w.clone()

    @property
    def W_U(self) -> torch.Tensor:
        """``[d_model, vocab]``; the final norm's scale folded into its rows where norms are."""
        cfg = self._m.cfg
        w = (self._m.embed.weight if cfg.encoder else self._m.unembed.weight).detach().float().cpu().T.clone()
        if self._fold:
            w = _norm_scale(self._m.ln_final)[:, None] * w
        return w

    def layer(self, layer: int) -> LayerWeights:
        """Layer ``layer``'s :class:`LayerWeights`; ``ValueError`` outside ``[0, n_layers)``."""
        if not 0 <= layer < self.n_layers:
            raise ValueError(f"layer must be in [0, {self.n_layers}); got {layer}")
        block = self._m.blocks[layer]
        attn, d = block.attn, self.d_head

        def split_in(linear, n):  # nn.Linear weight [n * d_head, d_model] -> [n, d_model, d_head]
            w = linear.weight.detach().float().cpu().view(n, d, -1).transpose(1, 2)
            if self._fold:
                w = _norm_scale(block.ln1)[None, :, None] * w
            return w.contiguous()

        n, n_kv = attn.n_heads, attn.n_kv_heads
        W_O = attn.o_proj.weight.detach().float().cpu().view(-1, n, d).permute(1, 2, 0).contiguous()
        return LayerWeights(
            layer=layer,
            heads=tuple(block.heads),
            kv_index=attn.kv_index.detach().cpu().clone(),
            W_Q=split_in(attn.q_proj, n),
            W_K=split_in(attn.k_proj, n_kv),
            W_V=split_in(attn.v_proj, n_kv),
            W_O=W_O,
        )

    def layers(self) -> Iterator[LayerWeights]:
        """Every layer's :class:`LayerWeights` in order, built one at a time."""
        for layer in range(self.n_layers):
            yield self.layer(layer)


def head_weights(model, *, fold_norms: bool = True) -> ModelWeights:
    """A :class:`ModelWeights` view of an in-house model (an ``InHouseModel`` or its
    :class:`Transformer`). Other backends raise :class:`ModelIncompatibleError` (load with
    ``backend="inhouse"``)."""
    module = model if isinstance(model, Transformer) else getattr(model, "network", None)
    if not isinstance(module, Transformer):
        raise ModelIncompatibleError(
            f"weights-only analyses read the in-house transformer; got a {type(model).__name__}. "
            "Load the model with backend='inhouse' (--backend inhouse)."
        )
    return ModelWeights(module, fold_norms=fold_norms)
