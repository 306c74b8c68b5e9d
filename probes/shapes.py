"""The shape vocabulary of headscope's tensors, once, as jaxtyping annotations.

Dimensions: ``batch, layer, head, kv_head, query_pos, key_pos, pos, d_head, d_model``
(``pos`` where queries and keys are the same positions). A public function states its
tensors with these aliases, e.g. ``def attention_pattern(q: Queries, k: Keys, ...) -> Pattern``;
within one call a name binds one size (``batch`` of ``q`` is ``batch`` of ``k``), which
``jaxtyping.jaxtyped(typechecker=beartype)`` checks at run time (tests/probes/test_shapes.py
does on the in-house stack). The aliases are plain annotations: nothing is checked unless a
caller asks.

>>> import torch
>>> from jaxtyping import jaxtyped
>>> from beartype import beartype
>>> @jaxtyped(typechecker=beartype)
... def rows(p: Pattern) -> Float[Tensor, "batch head query_pos"]:
...     return p.sum(-1)
>>> rows(torch.ones(1, 2, 3, 4)).shape
torch.Size([1, 2, 3])
"""

from __future__ import annotations

from jaxtyping import Float, Int, Shaped
from torch import Tensor

__all__ = [
    "AdditiveMask",
    "Float",
    "HeadKeys",
    "Int",
    "KVIndex",
    "KeyMask",
    "Keys",
    "PerHead",
    "Positions",
    "Pattern",
    "Queries",
    "Residual",
    "Rotary",
    "Scores",
    "Shaped",
    "Tensor",
    "TokenIds",
    "Z",
]

#: the residual stream (a block's input and output)
Residual = Float[Tensor, "batch pos d_model"]
#: token ids of a padded batch
TokenIds = Int[Tensor, "batch pos"]
#: positions of a batch's tokens (any integer dtype)
Positions = Shaped[Tensor, "batch pos"]
#: 1 where a key position holds a real token, 0 on padding (any integer or bool dtype)
KeyMask = Shaped[Tensor, "batch key_pos"]
#: one row per query head
Queries = Float[Tensor, "batch head query_pos d_head"]
#: K or V as a model computes them: one row per KV head (GQA/MQA: fewer than query heads;
#: MHA, or after ``repeat_kv``: as many)
Keys = Float[Tensor, "batch kv_head key_pos d_head"]
#: K or V repeated to one slice per query head (``repeat_kv``)
HeadKeys = Float[Tensor, "batch head key_pos d_head"]
#: a per-head tensor whose head axis may be query or KV heads (what RoPE rotates)
PerHead = Float[Tensor, "batch _ pos d_head"]
#: scaled (soft-capped) dot products, before the mask
Scores = Float[Tensor, "batch head query_pos key_pos"]
#: softmax over key_pos: each row sums to 1 over the keys a query may see
Pattern = Float[Tensor, "batch head query_pos key_pos"]
#: additive mask, broadcast over heads: 0 where a query may look, dtype-min where not
AdditiveMask = Float[Tensor, "batch 1 query_pos key_pos"]
#: rotary cos or sin table, broadcast over heads
Rotary = Float[Tensor, "batch 1 pos d_head"]
#: which KV head each query head reads
KVIndex = Int[Tensor, "head"]
#: pattern @ V, per head, before the output projection
Z = Float[Tensor, "batch head query_pos d_head"]
