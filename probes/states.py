"""What the contextualisation measurements read from a model, per sentence.

:func:`batch_states` runs an in-house model over a batch of texts in one padded forward and
returns a :class:`SentenceStates` per text, cut to its own tokens (:func:`sentence_states`:
one text): the static embedding rows of its tokens, the residual stream
entering the first layer and leaving every layer, and each layer's attention pattern, raw
``q·k``, values and per-head output matrices, so :mod:`headscope.analyses.context` never
touches a model.

Shapes::

    static   [pos, d_model]                 (the token-embedding row alone: no position, type or norm)
    states   [layer + 1, pos, d_model]      (states[0]: input to layer 0; states[l + 1]: layer l's output)
    pattern  [layer][head, query_pos, key_pos]
    raw      [layer][head, query_pos, key_pos]  (q·k before any scale, cap or mask)
    v        [layer][head, key_pos, d_head]     (x W_V + b_V, repeated to one slice per query head)
    W_O      [layer][head, d_head, d_model]
    out      [layer][pos, d_model]              (the attention block's output, o_proj bias included)

For a decoder, ``states[-1]`` is the last block's output *before* the final norm
(transformers' last ``hidden_states`` entry is after it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from headscope.probes.capture import capture
from headscope.probes.errors import ModelIncompatibleError
from headscope.probes.models.inhouse.attention import repeat_kv
from headscope.probes.models.inhouse.head_weights import head_weights
from headscope.probes.tokens import TokenBatch


@dataclass(frozen=True)
class SentenceStates:
    """One sentence's tensors (float32, CPU; see the module doc for shapes)."""

    tokens: TokenBatch
    static: torch.Tensor
    states: torch.Tensor
    pattern: list[torch.Tensor]
    raw: list[torch.Tensor]
    v: list[torch.Tensor]
    W_O: list[torch.Tensor]
    out: list[torch.Tensor]
    o_bias: list[torch.Tensor | None]
    scale: list[float]  # the factor raw q·k is multiplied by, per layer
    softcap: list[float | None]
    causal: bool
    special: torch.Tensor  # [pos] bool: [CLS]/[SEP]/BOS/EOS

    @property
    def n_pos(self) -> int:
        return self.static.shape[0]


def attention_scales(model) -> list[tuple[float, float | None, str]]:
    """``(scale, softcap, source)`` per layer as the in-house forward applies them: the scale
    is ``1/sqrt(d_head)`` unless the family sets another (``query_pre_attn_scalar``)."""
    net = _network(model)
    out = []
    for block in net.blocks:
        s = block.attn.scale
        src = "1/sqrt(d_head)" if s is None else "query_pre_attn_scalar ** -0.5 (not 1/sqrt(d_head))"
        out.append((float(s) if s is not None else 1.0 / math.sqrt(block.attn.d_head), block.attn.softcap, src))
    return out


def _network(model):
    net = getattr(model, "network", None)
    if net is None or not hasattr(net, "blocks") or not hasattr(net, "embed"):
        raise ModelIncompatibleError(
            f"contextualisation reads the in-house transformer; got a {type(model).__name__}. "
            "Load the model with backend='inhouse' (--backend inhouse)."
        )
    return net


def output_matrices(model, weights=None) -> list[torch.Tensor]:
    """Every layer's per-head ``W_O [head, d_head, d_model]`` (unfolded), read once."""
    w = weights if weights is not None else head_weights(model, fold_norms=False)
    return [w.layer(l).W_O for l in range(w.n_layers)]


def sentence_states(model, text: str, *, weights=None) -> SentenceStates:
    """Run ``model`` (in-house backend) over ``text``; see :class:`SentenceStates`.
    ``weights``: a :func:`head_weights` view, or the list of every layer's ``W_O`` already read
    (:func:`output_matrices`), to reuse across sentences. One sentence of :func:`batch_states`."""
    return batch_states(model, [text], weights=weights)[0]


def batch_states(model, texts: list[str], *, weights=None) -> list[SentenceStates]:
    """Run ``model`` (in-house backend) over ``texts`` in one right-padded forward and return one
    :class:`SentenceStates` per text, each cut to its own tokens: a padded key is masked out of
    every real query's attention, so nothing of the padding enters a sentence's tensors (equal
    to a forward of that sentence alone up to float rounding). ``weights``: as
    :func:`sentence_states`. Each sentence's tensors are views of the batch's (no copies)."""
    if not texts:
        raise ValueError("texts must hold at least one sentence; got none")
    net = _network(model)
    W_Os = weights if isinstance(weights, list) else output_matrices(model, weights)
    rope = net.cfg.positional == "rope"
    qs = ("pattern", "v", "out", "resid_post", "q_rot" if rope else "q", "k_rot" if rope else "k")
    cap = capture(model, list(texts), quantities=qs, memory_budget=None)
    ids = cap.tokens.input_ids.to(net.embed.weight.device)
    with torch.inference_mode():
        first = net(ids, cap.tokens.attention_mask.to(ids.device), stop_at_layer=0).float().cpu()
        static = net.embed.weight[ids].float().cpu()  # [batch, pos, d_model]
    layers = range(net.cfg.n_layers)
    states = torch.stack([first] + [cap["resid_post", l].float().cpu() for l in layers], 1)  # [batch, depth, pos, d]
    raw, v = [], []
    for l in layers:
        idx = net.blocks[l].attn.kv_index.to(cap["v", l].device)
        q, k = cap[qs[-2], l].float(), repeat_kv(cap[qs[-1], l], idx).float()
        raw.append((q @ k.transpose(-1, -2)).cpu())  # [batch, head, query_pos, key_pos]
        v.append(repeat_kv(cap["v", l], idx).float().cpu())
    pattern = [cap["pattern", l].float().cpu() for l in layers]
    out = [cap["out", l].float().cpu() for l in layers]
    o_bias = [None if (b := net.blocks[l].attn.o_proj.bias) is None else b.detach().float().cpu() for l in layers]
    scales = attention_scales(model)
    result = []
    for r in range(len(texts)):
        n = cap.tokens.lengths[r]
        result.append(
            SentenceStates(
                tokens=cap.tokens.select([r]),
                static=static[r, :n],
                states=states[r, :, :n],
                pattern=[p[r, :, :n, :n] for p in pattern],
                raw=[x[r, :, :n, :n] for x in raw],
                v=[x[r, :, :n] for x in v],
                W_O=list(W_Os),
                out=[x[r, :n] for x in out],
                o_bias=o_bias,
                scale=[s for s, _, _ in scales],
                softcap=[c for _, c, _ in scales],
                causal=bool(net.cfg.causal),
                special=torch.tensor(cap.tokens.special[r], dtype=torch.bool),
            )
        )
    return result
