"""The in-house transformer's configuration: one flat, frozen dataclass.

``family`` names the checkpoint family (HF ``model_type``) and sets the defaults of every
architectural option; each option can also be set on its own. What each family is (its
defaults, fixed options, tensor names) lives in its module under
:mod:`headscope.probes.models.families`; the in-house ones are :data:`INHOUSE_MODEL_TYPES`
(encoders, :data:`ENCODER_FAMILIES`, return final hidden states; decoders return logits).

>>> cfg = ModelConfig(family="llama", n_layers=2, d_model=64, n_heads=4, n_kv_heads=2)
>>> cfg.d_head, cfg.attention_kind, cfg.group_size
(16, 'GQA', 2)
>>> g = ModelConfig(family="gemma2", n_layers=2, d_model=64, n_heads=4, n_kv_heads=1, d_head=32)
>>> g.norm, g.rms_offset, g.sandwich_norm, g.mlp, g.activation, g.embed_scale
('rmsnorm', True, True, 'gated', 'gelu_pytorch_tanh', 8.0)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from headscope.probes.models.arch import ArchSpec, check_hf_config
from headscope.probes.models.families import ENCODER_FAMILIES, FAMILIES, INHOUSE_MODEL_TYPES, Family, family_of
from headscope.probes.models.inhouse.attention import ROPE_SCALINGS

__all__ = [
    "ENCODER_FAMILIES",
    "INHOUSE_MODEL_TYPES",
    "ModelConfig",
    "check_hf_config",
    "config_from_arch",
    "config_from_hf",
    "param_counts",
]

#: activation names (HF ``ACT2FN`` spelling) the MLP knows
ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "silu", "relu")
#: the norms the in-house stack has ("none": a per-feature scale of ones, no normalisation)
NORMS = ("layernorm", "rmsnorm", "none")


#: the parameters of Llama 3's RoPE scaling (besides its rope_theta)
LLAMA3_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def _positive(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Sizes and architectural options. Options left ``None`` take ``family``'s default
    (:meth:`Family.options <headscope.probes.models.families.Family.options>`); a field's comment
    says what it does."""

    family: str = "llama"
    n_layers: int = 2
    d_model: int = 64
    n_heads: int = 4
    n_kv_heads: int | None = None  # None: same as n_heads (MHA)
    d_head: int | None = None  # None: d_model // n_heads (Gemma's is independent of d_model)
    d_mlp: int | None = None  # None: 4 * d_model
    vocab_size: int = 128
    max_positions: int = 512
    causal: bool | None = None  # attention sees only earlier positions (decoders)
    positional: str | None = None  # "learned" | "rope" | "none"
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-5
    type_vocab_size: int = 2  # token-type embeddings of an encoder; 0: none (DistilBERT)
    tie_embeddings: bool = True
    attention_bias: bool | None = None  # biases on q, k, v (and o unless o_bias says otherwise)
    pad_token_id: int | None = None
    heads_kept: tuple[tuple[int, ...], ...] | None = None  # physical pruning: query heads kept per layer
    name: str = "in-house"
    # -- architectural options (None: the family's default) ---------------------------
    norm: str | None = None  # "layernorm" | "rmsnorm" | "none" (no normalisation: compiled tracr models)
    rms_offset: bool | None = None  # RMSNorm scales by (1 + w) and starts at w = 0 (Gemma)
    post_norm: bool | None = None  # BERT: x = norm(x + sublayer(x)), embeddings normed; else pre-norm + final norm
    sandwich_norm: bool | None = None  # Gemma: pre-norm plus a norm on the attention and MLP outputs
    mlp: str | None = None  # "plain": down(act(up x)); "gated": down(act(gate x) * up x)
    activation: str | None = None  # one of ACTIVATIONS (HF names)
    mlp_bias: bool | None = None  # biases on the MLP's linear maps
    o_bias: bool | None = None  # bias on the output projection; None: attention_bias
    qk_norm: bool | None = None  # RMSNorm over d_head on each query and key head, before RoPE (Qwen3, Gemma 3)
    sliding_window: tuple[int | None, ...] | None = None  # per layer: keys fewer than w back are seen; None: global
    rope_local_theta: float | None = None  # RoPE base of the sliding layers (Gemma 3); None: rope_theta
    # RoPE scaling of the layers at rope_theta: {"rope_type": "linear" | "llama3", "factor": ..., ...}
    # (attention.scaled_inv_freq); None: plain RoPE. Gemma 3 scales its global layers only.
    rope_scaling: dict[str, Any] | None = field(default=None, hash=False)
    attn_softcap: float | None = None  # scores -> c·tanh(scores / c) before the mask (Gemma 2)
    final_softcap: float | None = None  # logits -> c·tanh(logits / c) (Gemma 2/3)
    query_scale: float | None = None  # scores = q·k × query_scale; None: d_head ** -0.5
    embed_scale: float | None = (
        None  # token embeddings × embed_scale, in the model dtype; None: 1 (Gemma: sqrt(d_model))
    )
    pad_aware_positions: bool | None = None  # RoBERTa: positions from pad_token_id + 1, padding at pad_token_id
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def _default(self, key: str, value) -> None:
        if getattr(self, key) is None:
            object.__setattr__(self, key, value)

    def __post_init__(self):
        if self.family not in INHOUSE_MODEL_TYPES:
            raise ValueError(
                f"The 'family' parameter of ModelConfig must be one of {INHOUSE_MODEL_TYPES}; got {self.family!r}."
            )
        for k in ("n_layers", "d_model", "n_heads", "vocab_size", "max_positions"):
            v = getattr(self, k)
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"The {k!r} parameter of ModelConfig must be a positive int; got {v!r}.")
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        if self.d_head is None:
            if self.d_model % self.n_heads:
                raise ValueError(
                    f"d_model ({self.d_model}) is not divisible by n_heads ({self.n_heads}); pass d_head explicitly."
                )
            object.__setattr__(self, "d_head", self.d_model // self.n_heads)
        if self.d_mlp is None:
            object.__setattr__(self, "d_mlp", 4 * self.d_model)
        family = FAMILIES[self.family]
        for key, value in family.options().items():
            self._default(key, value)
        self._default("o_bias", self.attention_bias)
        if family.scaled_embeddings:
            self._default("embed_scale", math.sqrt(self.d_model))
        if self.positional not in ("learned", "rope", "none"):
            raise ValueError(f"positional must be 'learned', 'rope' or 'none'; got {self.positional!r}.")
        if self.norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}; got {self.norm!r}.")
        if self.mlp not in ("plain", "gated"):
            raise ValueError(f"mlp must be 'plain' or 'gated'; got {self.mlp!r}.")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}; got {self.activation!r}.")
        if self.post_norm and self.sandwich_norm:
            raise ValueError("post_norm and sandwich_norm exclude each other.")
        if self.pad_aware_positions and self.pad_token_id is None:
            raise ValueError("pad_aware_positions (RoBERTa) needs pad_token_id.")
        if self.n_kv_heads < 1 or self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_kv_heads must divide n_heads (GQA groups are equal); got n_heads={self.n_heads}, "
                f"n_kv_heads={self.n_kv_heads}."
            )
        if self.positional == "rope" and self.d_head % 2:
            raise ValueError(f"RoPE needs an even d_head; got {self.d_head}.")
        if self.sliding_window is not None:
            windows = tuple(None if w is None else int(w) for w in self.sliding_window)
            if len(windows) != self.n_layers or any(w is not None and w < 1 for w in windows):
                raise ValueError(
                    f"sliding_window needs one positive window or None per layer ({self.n_layers}); "
                    f"got {self.sliding_window!r}."
                )
            object.__setattr__(self, "sliding_window", windows if any(windows) else None)
        for k in ("attn_softcap", "final_softcap", "query_scale", "embed_scale", "rope_local_theta"):
            v = getattr(self, k)
            if v is not None and not (isinstance(v, (int, float)) and v > 0):
                raise ValueError(f"The {k!r} parameter of ModelConfig must be a positive number or None; got {v!r}.")
        if self.rope_scaling is not None:
            need = {"linear": ("factor",), "llama3": LLAMA3_ROPE_KEYS}.get(self.rope_scaling.get("rope_type"))
            if need is None or any(not _positive(self.rope_scaling.get(k)) for k in need):
                raise ValueError(
                    f"rope_scaling must be linear (factor) or llama3 ({', '.join(LLAMA3_ROPE_KEYS)}), every value "
                    f"positive; got {self.rope_scaling!r}."
                )
        if self.heads_kept is not None:
            if len(self.heads_kept) != self.n_layers:
                raise ValueError(f"heads_kept needs one entry per layer ({self.n_layers}); got {len(self.heads_kept)}.")
            kept = tuple(tuple(int(h) for h in hs) for hs in self.heads_kept)
            for layer, hs in enumerate(kept):
                if list(hs) != sorted(set(hs)) or any(not 0 <= h < self.n_heads for h in hs):
                    raise ValueError(
                        f"heads_kept[{layer}] must list distinct query heads in 0..{self.n_heads - 1} in increasing "
                        f"order; got {list(hs)}"
                    )
            object.__setattr__(self, "heads_kept", kept)

    # -- derived facts ---------------------------------------------------------------
    @property
    def group_size(self) -> int:
        """Query heads per KV head (1 for MHA, n_heads for MQA)."""
        return self.n_heads // self.n_kv_heads

    @property
    def attention_kind(self) -> str:
        if self.n_kv_heads == self.n_heads:
            return "MHA"
        if self.n_kv_heads == 1:
            return "MQA"
        return "GQA"

    @property
    def encoder(self) -> bool:
        """Whether the model returns final hidden states (an encoder family) rather than logits."""
        return self.family in ENCODER_FAMILIES

    def window(self, layer: int) -> int | None:
        """The sliding window of ``layer`` (None: it attends to the whole context)."""
        return None if self.sliding_window is None else self.sliding_window[layer]

    def layer_rope_theta(self, layer: int) -> float:
        """RoPE base of ``layer``: ``rope_local_theta`` on a sliding layer where set, else ``rope_theta``."""
        if self.rope_local_theta is not None and self.window(layer) is not None:
            return self.rope_local_theta
        return self.rope_theta

    def layer_rope_scaling(self, layer: int) -> dict[str, Any] | None:
        """RoPE scaling of ``layer``: ``rope_scaling`` on the layers at ``rope_theta`` (all but
        Gemma 3's sliding ones), else None."""
        if self.rope_local_theta is not None and self.window(layer) is not None:
            return None
        return self.rope_scaling

    def kv_head_of(self, head: int) -> int:
        """KV head read by query head ``head`` (HF ``repeat_kv``: ``head // group_size``)."""
        return head // self.group_size

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("extra", None)
        if d["heads_kept"] is not None:
            d["heads_kept"] = [list(h) for h in d["heads_kept"]]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        d = dict(d)
        if d.get("heads_kept") is not None:
            d["heads_kept"] = tuple(tuple(h) for h in d["heads_kept"])
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown ModelConfig fields {unknown}; valid fields: {sorted(known)}")
        return cls(**d)

    def replace(self, **changes) -> ModelConfig:
        return replace(self, **changes)


def config_from_hf(hf: dict[str, Any], name: str = "", where: str = "config") -> ModelConfig:
    """The in-house configuration of an HF ``config.json`` dict of a covered family
    (:data:`INHOUSE_MODEL_TYPES`), read through
    :func:`~headscope.probes.models.arch.arch_from_hf_config` (``where`` names the config in
    its errors).

    Raises :class:`~headscope.probes.errors.ModelIncompatibleError` for other families.
    """
    from headscope.probes.models.arch import arch_from_hf_config

    return config_from_arch(arch_from_hf_config(hf, where), name)


def _incompatible(what: str, detail: str = ""):
    from headscope.probes.errors import ModelIncompatibleError

    return ModelIncompatibleError(
        f"{what} is not covered by the in-house backend{detail}; use --backend hf (or the transformer-lens "
        "bridge, --backend bridge)."
    )


def config_from_arch(arch: ArchSpec, name: str = "") -> ModelConfig:
    """The in-house :class:`ModelConfig` of a checkpoint's :class:`~headscope.probes.models.arch.ArchSpec`.

    Raises :class:`~headscope.probes.errors.ModelIncompatibleError`, naming the way out
    (``--backend hf``), for a model type outside :data:`INHOUSE_MODEL_TYPES` and for options
    the in-house stack does not implement: RoPE scaling (only the default RoPE), partial
    rotary embeddings, relative positions, a family's alias (the multimodal Gemma 3: its text
    model, ``gemma3_text``, is covered), an activation it does not know, and family options away
    from their default that change the computation (GPT-2's ``scale_attn_weights`` and
    ``scale_attn_by_inverse_layer_idx``, Llama's ``mlp_bias``: ``Family.fixed_options``).
    """
    mtype = arch.model_type
    if arch.per_layer:
        from headscope.probes.errors import ModelIncompatibleError

        raise ModelIncompatibleError(
            f"{arch.name or mtype}: its layers differ in heads, KV heads or MLP width; no backend here builds such a model"
        )
    family = family_of(mtype)
    if family is not None and mtype in family.aliases:
        raise _incompatible(family.aliases[mtype])
    if family is None or not family.inhouse:
        raise _incompatible(f"model_type {mtype!r}", f" ({', '.join(INHOUSE_MODEL_TYPES)})")
    label = family.label
    if family.positional == "learned" and arch.positional != "learned":
        raise _incompatible(f"{label} position_embedding_type={arch.positional!r}")
    rope_scaling = _rope_scaling(arch, label) if family.positional == "rope" else None
    if arch.bidirectional_attention:
        raise _incompatible(f"{label} with use_bidirectional_attention")
    if arch.off_default:
        raise _incompatible(f"{label} with {', '.join(arch.off_default)}")
    activation = _activation(arch, family)
    sizes = dict(
        family=mtype,
        n_layers=arch.n_layers,
        d_model=arch.d_model,
        n_heads=arch.n_heads,
        d_mlp=arch.d_mlp,
        vocab_size=arch.vocab_size,
        max_positions=arch.max_positions or family.default_max_positions,
        norm_eps=arch.norm_eps if arch.norm_eps is not None else family.default_norm_eps,
        pad_token_id=arch.pad_token_id,
        activation=activation,
        name=name or arch.name or mtype,
    )
    if family.encoder:
        return ModelConfig(**sizes, **_encoder_options(family, arch, activation))
    return ModelConfig(**sizes, **_decoder_options(family, arch, rope_scaling))


def _encoder_options(family: Family, arch: ArchSpec, activation: str) -> dict[str, Any]:
    """An encoder family's :class:`ModelConfig` fields beyond the sizes (MHA, tied embeddings,
    token types where it has them)."""
    type_vocab = arch.type_vocab_size if arch.type_vocab_size is not None else 2
    return dict(
        causal=arch.causal,
        type_vocab_size=type_vocab if family.token_types else 0,
        tie_embeddings=True,
        extra={"hidden_act": activation},
    )


def _decoder_options(family: Family, arch: ArchSpec, rope_scaling: dict | None) -> dict[str, Any]:
    """A decoder family's :class:`ModelConfig` fields beyond the sizes: the checkpoint's facts
    the family reads (``Family.reads``: attention biases, soft-caps, query scale, the sliding
    layers' RoPE base) over its fixed ones."""
    reads = family.reads
    attention_bias = family.attention_bias
    if arch.attention_bias is not None and "attention_bias" in reads:
        attention_bias = bool(arch.attention_bias)
    scalar = arch.query_pre_attn_scalar if "query_pre_attn_scalar" in reads else None
    return dict(
        n_kv_heads=arch.n_kv_heads,
        d_head=arch.d_head,
        rope_theta=arch.rope_theta if arch.rope_theta is not None else 10_000.0,
        rope_local_theta=arch.rope_local_theta if "rope_local_theta" in reads else None,
        rope_scaling=rope_scaling,
        attention_bias=attention_bias,
        tie_embeddings=arch.tie_embeddings,
        sliding_window=arch.sliding_window,
        attn_softcap=arch.attn_softcap if "attn_softcap" in reads else None,
        final_softcap=arch.final_softcap if "final_softcap" in reads else None,
        query_scale=scalar**-0.5 if scalar else None,
    )


def _rope_scaling(arch: ArchSpec, label: str) -> dict | None:
    """The in-house ``rope_scaling`` of a RoPE family's ``arch`` (None: plain RoPE); refuses
    (:func:`_incompatible`) a RoPE type, missing parameters, sliding-layer RoPE or partial
    rotation that the in-house stack does not implement."""
    rope_scaling = None
    if arch.rope_type not in ("default", None, *ROPE_SCALINGS):
        raise _incompatible(f"{label} rope_type={arch.rope_type!r}", f" (only 'default', {', '.join(ROPE_SCALINGS)})")
    if arch.rope_type in ROPE_SCALINGS:
        rope_scaling = {"rope_type": arch.rope_type, **dict(arch.rope_scaling or ())}
        need = ("factor",) if arch.rope_type == "linear" else LLAMA3_ROPE_KEYS
        missing = [k for k in need if not _positive(rope_scaling.get(k))]
        if missing:
            raise _incompatible(f"{label} rope_type={arch.rope_type!r} without {', '.join(missing)}")
    if arch.rope_local_type not in ("default", None):
        raise _incompatible(f"{label} rope_type={arch.rope_local_type!r} on the sliding layers", " (only 'default')")
    if arch.rotary_fraction not in (None, 1.0):
        raise _incompatible(f"{label} partial_rotary_factor={arch.rotary_fraction}", " (only 1.0)")
    return rope_scaling


def _activation(arch: ArchSpec, family: Family) -> str:
    """The activation the in-house stack runs for ``arch`` (``gelu_fast`` is ``gelu_new``); refuses
    one it does not know."""
    label = family.label
    activation = arch.activation or family.activation
    if activation == "gelu_fast":
        activation = "gelu_new"  # the same tanh approximation of GELU
    if activation not in ACTIVATIONS:
        raise _incompatible(f"{label} activation {activation!r}", f" ({', '.join(ACTIVATIONS)})")
    return activation


def _norm_params(cfg: ModelConfig, d: int) -> int:
    return 2 * d if cfg.norm == "layernorm" else d


def param_counts(cfg: ModelConfig) -> tuple[int, int]:
    """``(attention params, total params)`` of the in-house model of ``cfg``, by arithmetic
    (the same counts as the built model's parameters, per-head gates excluded; a tied
    unembedding counted once). Nothing is allocated, whatever the sizes.

    >>> param_counts(ModelConfig(family="llama", n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, vocab_size=128))
    (24576, 131392)
    """
    d, dh, m = cfg.d_model, cfg.d_head, cfg.d_mlp
    q, kv = cfg.n_heads * dh, cfg.n_kv_heads * dh
    attn = d * q + 2 * d * kv + q * d
    attn += (q + 2 * kv if cfg.attention_bias else 0) + (d if cfg.o_bias else 0)
    attn += 2 * _norm_params(cfg, dh) if cfg.qk_norm else 0
    n_in = 3 if cfg.mlp == "gated" else 2  # weight matrices: (gate,) up, down
    mlp = n_in * d * m + ((n_in - 1) * m + d if cfg.mlp_bias else 0)
    norms = (4 if cfg.sandwich_norm else 2) * _norm_params(cfg, d)
    embed = cfg.vocab_size * d
    if cfg.positional == "learned":
        embed += cfg.max_positions * d
    if cfg.encoder and cfg.type_vocab_size:
        embed += cfg.type_vocab_size * d
    embed += _norm_params(cfg, d)  # the embeddings' LayerNorm (post-norm) or the final norm (pre-norm)
    if not cfg.encoder and not cfg.tie_embeddings:
        embed += cfg.vocab_size * d
    return cfg.n_layers * attn, cfg.n_layers * (attn + mlp + norms) + embed
