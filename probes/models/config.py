"""The in-house transformer's configuration: one flat, frozen dataclass.

Two families are covered, named after the checkpoints they load:

* ``"bert"``  — encoder: learned absolute positions + token types, post-LayerNorm
  blocks, GELU MLP, bidirectional attention (MiniLM-L6, BERT).
* ``"llama"`` — decoder: RoPE, pre-RMSNorm blocks, SwiGLU MLP, causal attention,
  grouped-query attention when ``n_kv_heads < n_heads`` (SmolLM2, Llama 3).

>>> cfg = ModelConfig(family="llama", n_layers=2, d_model=64, n_heads=4, n_kv_heads=2)
>>> cfg.d_head, cfg.attention_kind, cfg.group_size
(16, 'GQA', 2)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from headscope.probes.models.arch import ArchSpec, check_hf_config

__all__ = ["FAMILIES", "ModelConfig", "check_hf_config", "config_from_arch", "config_from_hf", "param_counts"]

FAMILIES = ("bert", "llama")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    family: str = "llama"
    n_layers: int = 2
    d_model: int = 64
    n_heads: int = 4
    n_kv_heads: int | None = None  # None: same as n_heads (MHA)
    d_head: int | None = None  # None: d_model // n_heads
    d_mlp: int | None = None  # None: 4 * d_model
    vocab_size: int = 128
    max_positions: int = 512
    causal: bool | None = None  # None: True for llama, False for bert
    positional: str | None = None  # "learned" | "rope" | "none"; None: family default
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-5
    type_vocab_size: int = 2
    tie_embeddings: bool = True
    attention_bias: bool | None = None  # None: True for bert, False for llama
    pad_token_id: int | None = None
    heads_kept: tuple[tuple[int, ...], ...] | None = None  # physical pruning: query heads kept per layer
    name: str = "in-house"
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"The 'family' parameter of ModelConfig must be one of {FAMILIES}; got {self.family!r}.")
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
        if self.causal is None:
            object.__setattr__(self, "causal", self.family == "llama")
        if self.positional is None:
            object.__setattr__(self, "positional", "rope" if self.family == "llama" else "learned")
        if self.positional not in ("learned", "rope", "none"):
            raise ValueError(f"positional must be 'learned', 'rope' or 'none'; got {self.positional!r}.")
        if self.attention_bias is None:
            object.__setattr__(self, "attention_bias", self.family == "bert")
        if self.n_kv_heads < 1 or self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_kv_heads must divide n_heads (GQA groups are equal); got n_heads={self.n_heads}, "
                f"n_kv_heads={self.n_kv_heads}."
            )
        if self.positional == "rope" and self.d_head % 2:
            raise ValueError(f"RoPE needs an even d_head; got {self.d_head}.")
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
    """The in-house configuration of an HF ``config.json`` dict of the BERT or Llama family,
    read through :func:`~headscope.probes.models.arch.arch_from_hf_config` (``where`` names
    the config in its errors).

    Raises :class:`~headscope.probes.errors.ModelIncompatibleError` for other families.
    """
    from headscope.probes.models.arch import arch_from_hf_config

    return config_from_arch(arch_from_hf_config(hf, where), name)


def config_from_arch(arch: ArchSpec, name: str = "") -> ModelConfig:
    """The in-house :class:`ModelConfig` of a checkpoint's :class:`~headscope.probes.models.arch.ArchSpec`.

    Raises :class:`~headscope.probes.errors.ModelIncompatibleError` for a family the
    in-house stack does not cover (only ``bert`` with absolute positions and ``llama``
    with the default RoPE are), naming the way out.
    """
    from headscope.probes.errors import ModelIncompatibleError

    if arch.model_type == "bert":
        if arch.positional != "learned":
            raise ModelIncompatibleError(
                f"BERT position_embedding_type={arch.positional!r} is not covered in-house; use --backend bridge."
            )
        return ModelConfig(
            family="bert",
            n_layers=arch.n_layers,
            d_model=arch.d_model,
            n_heads=arch.n_heads,
            d_mlp=arch.d_mlp,
            vocab_size=arch.vocab_size,
            max_positions=arch.max_positions,
            causal=arch.causal,
            norm_eps=arch.norm_eps if arch.norm_eps is not None else 1e-12,
            type_vocab_size=arch.type_vocab_size if arch.type_vocab_size is not None else 2,
            pad_token_id=arch.pad_token_id,
            tie_embeddings=True,
            name=name or arch.name or "bert",
            extra={"hidden_act": arch.activation or "gelu"},
        )
    if arch.model_type == "llama":
        if arch.rope_type not in ("default", None):
            raise ModelIncompatibleError(
                f"Llama rope_type={arch.rope_type!r} is not covered in-house (only 'default'); use --backend bridge."
            )
        return ModelConfig(
            family="llama",
            n_layers=arch.n_layers,
            d_model=arch.d_model,
            n_heads=arch.n_heads,
            n_kv_heads=arch.n_kv_heads,
            d_head=arch.d_head,
            d_mlp=arch.d_mlp,
            vocab_size=arch.vocab_size,
            max_positions=arch.max_positions or 2048,
            rope_theta=arch.rope_theta if arch.rope_theta is not None else 10_000.0,
            norm_eps=arch.norm_eps if arch.norm_eps is not None else 1e-6,
            attention_bias=bool(arch.attention_bias),
            tie_embeddings=arch.tie_embeddings,
            pad_token_id=arch.pad_token_id,
            name=name or arch.name or "llama",
        )
    raise ModelIncompatibleError(
        f"model_type {arch.model_type!r} is not covered by the in-house backend (bert, llama); "
        "use the transformer-lens bridge backend (--backend bridge)."
    )


def param_counts(cfg: ModelConfig) -> tuple[int, int]:
    """``(attention params, total params)`` of the in-house model of ``cfg``, by arithmetic
    (the same counts as the built model's parameters, per-head gates excluded; a tied
    unembedding counted once). Nothing is allocated, whatever the sizes.

    >>> param_counts(ModelConfig(family="llama", n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, vocab_size=128))
    (24576, 131392)
    """
    d, dh, m = cfg.d_model, cfg.d_head, cfg.d_mlp
    q, kv = cfg.n_heads * dh, cfg.n_kv_heads * dh
    attn = d * q + 2 * d * kv + q * d + (q + 2 * kv + d if cfg.attention_bias else 0)
    if cfg.family == "bert":
        rest = 2 * d * m + m + d + 4 * d  # up, down with biases; two LayerNorms
        embed = cfg.vocab_size * d + cfg.type_vocab_size * d + 2 * d
        if cfg.positional == "learned":
            embed += cfg.max_positions * d
    else:
        rest = 3 * d * m + 2 * d  # gate, up, down; two RMSNorms
        embed = cfg.vocab_size * d + d + (0 if cfg.tie_embeddings else cfg.vocab_size * d)
    return cfg.n_layers * attn, cfg.n_layers * (attn + rest) + embed
