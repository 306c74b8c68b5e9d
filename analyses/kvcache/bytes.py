"""KV-cache bytes per KV group, from the card's arithmetic
(:func:`~headscope.probes.models.card.kv_cache_bytes`): a group of a global layer holds every
token, one of a sliding layer at most its window, one restricted to sink + window at most
``sink + window``; × 2 (K and V) × ``d_head`` × bytes per value.

>>> group_bytes(2048, None, 64, 2), group_bytes(2048, None, 64, 2, kept=260)
(524288, 66560)
"""

from __future__ import annotations

from headscope.probes.models.card import kv_cache_bytes
from headscope.probes.models.spec import ArchSpec

#: bytes per cached value: the card's 16-bit table (``kv_cache_16bit_bytes_by_context``)
KV_BYTES_PER_VALUE = 2


def _one_group(d_head: int, layer_window: int | None) -> ArchSpec:
    """One layer holding one KV head of ``d_head`` (sliding ``layer_window`` or global): the
    architecture whose :func:`kv_cache_bytes` is one group's share of the model's."""
    return ArchSpec(
        model_type="kv-group",
        name="one KV group",
        n_layers=1,
        d_model=d_head,
        n_heads=1,
        n_kv_heads=1,
        d_head=d_head,
        d_mlp=None,
        vocab_size=None,
        max_positions=None,
        encoder=False,
        positional=None,
        rope_theta=None,
        rope_type=None,
        norm=None,
        norm_eps=None,
        activation=None,
        attention_bias=None,
        sliding_window=None if layer_window is None else (layer_window,),
        qk_norm=False,
        attn_softcap=None,
        final_softcap=None,
        tie_embeddings=False,
        type_vocab_size=None,
        pad_token_id=None,
        bos_token_id=None,
    )


def group_bytes(
    context: int, layer_window: int | None, d_head: int, bytes_per_value: int = KV_BYTES_PER_VALUE, *, kept=None
) -> int:
    """Bytes one KV group caches at ``context`` tokens: every token (at most ``layer_window``
    on a sliding layer), or at most ``kept`` (sink + window) when restricted."""
    tokens = context if kept is None else min(context, kept)
    return kv_cache_bytes(_one_group(d_head, layer_window), tokens, bytes_per_value)


def groups_bytes(groups, windows: dict[int, int | None], d_head: int, context: int, kept: int) -> dict:
    """``{(layer, kv_group): (full bytes, restricted bytes)}`` at ``context`` for each of
    ``groups`` (``windows``: layer -> its sliding window or None)."""
    return {
        (l, g): (group_bytes(context, windows[l], d_head), group_bytes(context, windows[l], d_head, kept=kept))
        for l, g in groups
    }
