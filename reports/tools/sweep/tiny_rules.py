"""Rules of the tiny config (:mod:`~headscope.reports.tools.sweep.tiny_config`) for what a family's default
config leaves unset, or sizes under names of their own, that its model cannot be built without at the
tiny sizes. Each is a rule by attribute name, for whichever family has the key:

* ``head_dim`` None (HunYuan, Ministral: their attention reads ``config.head_dim``): the tiny head width;
* ``layer_types`` None after creation (LFM2-MoE, whose model indexes it): every layer full attention;
* ``rope_parameters`` empty where layers have kinds (Cohere Compass reads ``rope_parameters[kind]``):
  the default rotary embedding for each kind;
* an expert count left None (Dots1's ``n_routed_experts``): the tiny count;
* a vocabulary of its own (``*_vocab_size``, ``vocab_size_*``: LUKE's entities, RoCBert's shapes and pronunciations,
  Gemma 3n/4's per-layer inputs, Inkling 2's unpadded head) past the tiny one: the tiny vocabulary;
* ``embedding_size`` equal to the hidden size by default (SqueezeBERT cannot run them apart): the tiny
  hidden size, else the small factorised width;
* a list of widths summing to the hidden size (Reformer's ``axial_pos_embds_dim``): scaled to the tiny one;
* Mamba-2's ``expand``, where its heads span ``hidden_size * expand``: as the tiny heads span the tiny width;
* ``num_kv_shared_layers`` (Gemma 3n: its last 15 layers reuse earlier caches) past the tiny depth: none;
* a base-model class picked from ``architectures`` (Funnel's two): the list empty, not None.

:func:`sub_config_parts` names the sub-configs that are parts of one text model (DBRX's and MPT's
``attn_config``/``ffn_config``, T5Gemma's ``encoder``/``decoder``), shrunk by the same rules.
"""

from __future__ import annotations

__all__ = [
    "FAMILY_FIELDS",
    "NOT_STANDALONE",
    "TEXT_PARTS",
    "UNSHRUNK",
    "family_fields",
    "fill_unset",
    "sub_config_parts",
]

#: sub-configs that hold a text model's own parts (its attention, its FFN, its encoder and decoder)
TEXT_PARTS = ("attn_config", "ffn_config", "encoder", "decoder")
#: expert counts a default may leave None (the model cannot be built without one)
_EXPERT_COUNTS = {"n_routed_experts": 4, "n_shared_experts": 1}
#: family -> what its tiny config sets that no rule by name can (the default config of each cannot
#: build its own model): a value, a sub-config's fields merged into it, or ``f(n_layers)``
FAMILY_FIELDS = {
    # DbrxAttention reads attn_config.rope_theta, a field DbrxAttentionConfig no longer has (only stored:
    # the rotary embedding reads rope_parameters), and clamps Q, K, V to clip_qkv, which torch refuses
    # at its default None: the released DBRX's 8
    "dbrx": {"attn_config": {"rope_theta": 10000.0, "clip_qkv": 8.0}},
    # its default layers are indexed (QSA) attention, whose indexer sizes all default to None
    "qwen4_exp_text": {
        "indexer_n_heads": 4,
        "indexer_kv_heads": 1,
        "indexer_head_dim": 16,
        "indexer_budget": 64,
        "indexer_compress_ratio": 4,
    },
    # its hybrid layers share one attention block, tied from the first into the others: with one
    # hybrid layer there is none to tie into and the model refuses to build
    "zamba": {"layers_block_type": lambda n: ["linear_attention"] * max(0, n - 2) + ["hybrid"] * min(n, 2)},
}
#: family -> why the tiny config cannot shrink it, where the generic reason would be wrong (BLT's
#: ``patch_size`` is of bytes, not of an image: a text model, but not one stack of layers)
UNSHRUNK = {
    "blt": "a byte-level text model of four transformers of their own sizes (an entropy patcher, a local "
    "byte encoder, a global transformer over patches, a local decoder) joined by cross-attention; the tiny "
    "config shrinks one stack of layers",
}
#: family -> why it is no text model of its own, where the generic reason would say less (its default
#: config failing, or a text_config): Gemma 4's drafters run on their target model's states
_DRAFTER = (
    "a speculative-decoding drafter: its forward needs its target model's inputs_embeds and shared_kv_states "
    "(ValueError without them)"
)
NOT_STANDALONE = {"gemma4_assistant": _DRAFTER, "gemma4_unified_assistant": _DRAFTER}
#: rotary settings given to a layer kind that has none
_DEFAULT_ROPE = {"rope_type": "default", "rope_theta": 10000.0}


def sub_config_parts(cls, defaults: dict) -> list[str] | None:
    """The sub-config names of ``cls`` when every one is a part of its text model (:data:`TEXT_PARTS`),
    ``[]`` for a config without any, None when one is not (a vision, audio or text tower's). A sub-config
    left None by default is no part of the default model (ESM's ``esmfold_config``: ESMFold's alone)."""
    subs = sorted(s for s in getattr(cls, "sub_configs", None) or {} if defaults.get(s) is not None)
    return subs if all(s in TEXT_PARTS for s in subs) else None


def fill_unset(defaults: dict, kw: dict, sizes: dict, n_layers: int) -> dict:
    """What the module's rules set for this config (``defaults``: its default values, ``kw``: the tiny
    sizes set so far, ``sizes``: ``d_model``, ``d_head``, ``vocab``, ``small_embed``)."""
    out = {}
    if "head_dim" in defaults and defaults["head_dim"] is None and "head_dim" not in kw:
        out["head_dim"] = sizes["d_head"]
    if "layer_types" in defaults and defaults["layer_types"] is None and "layer_types" not in kw:
        out["layer_types"] = ["full_attention"] * n_layers
    kinds = kw.get("layer_types") or out.get("layer_types") or defaults.get("layer_types")
    if defaults.get("rope_parameters") == {} and isinstance(kinds, list) and kinds:
        out["rope_parameters"] = {kind: dict(_DEFAULT_ROPE) for kind in dict.fromkeys(kinds)}
    for key, value in _EXPERT_COUNTS.items():
        if key in defaults and defaults[key] is None and key not in kw:
            out[key] = value
    for key, value in defaults.items():
        big = isinstance(value, int) and not isinstance(value, bool) and value > sizes["vocab"]
        if (key.endswith("_vocab_size") or key.startswith("vocab_size_")) and big and key not in kw:
            out[key] = sizes["vocab"]
    embed = defaults.get("embedding_size")
    if isinstance(embed, int) and embed == next((defaults[k] for k in sizes["hidden_keys"]), None):
        out["embedding_size"] = sizes["d_model"]
    out.update(_hidden_splits(defaults, kw, sizes))
    hidden = next((defaults[k] for k in sizes["hidden_keys"]), None)
    heads, width = kw.get("num_heads"), kw.get("head_dim")
    expand = defaults.get("expand")
    if isinstance(expand, int) and all(isinstance(v, int) for v in (hidden, heads, width)) and "expand" not in kw:
        if defaults.get("num_heads", 0) * (defaults.get("head_dim") or 0) == hidden * expand:  # Mamba-2's heads
            out["expand"] = max(1, heads * width // sizes["d_model"])
    shared = defaults.get("num_kv_shared_layers")
    if isinstance(shared, int) and shared >= n_layers:
        out["num_kv_shared_layers"] = 0
    if "architectures" in defaults and defaults["architectures"] is None and sizes.get("picks_architecture"):
        out["architectures"] = []
    return out


def _hidden_splits(defaults: dict, kw: dict, sizes: dict) -> dict:
    """A list of widths summing to the hidden size (Reformer's ``axial_pos_embds_dim``: its axial
    position embeddings are concatenated into one of d_model) scaled to the tiny hidden size."""
    hidden = next((defaults[k] for k in sizes["hidden_keys"]), None)
    out = {}
    for key, value in defaults.items():
        ints = isinstance(value, (list, tuple)) and len(value) > 1 and all(type(v) is int and v > 0 for v in value)
        if key in kw or not ints or not isinstance(hidden, int) or sum(value) != hidden or hidden == sizes["d_model"]:
            continue
        scaled = [max(1, v * sizes["d_model"] // hidden) for v in value]
        scaled[-1] += sizes["d_model"] - sum(scaled)
        if scaled[-1] > 0:
            out[key] = scaled
    return out


def family_fields(model_type: str, kw: dict, n_layers: int) -> dict:
    """:data:`FAMILY_FIELDS` of ``model_type`` on the tiny sizes ``kw`` (a sub-config's merged into it)."""
    out = {}
    for key, value in FAMILY_FIELDS.get(model_type, {}).items():
        if callable(value):
            out[key] = value(n_layers)
        elif isinstance(value, dict) and isinstance(kw.get(key), dict):
            out[key] = {**kw[key], **value}
        else:
            out[key] = value
    return out
