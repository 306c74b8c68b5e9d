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
    def from_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        d = dict(d)
        if d.get("heads_kept") is not None:
            d["heads_kept"] = tuple(tuple(h) for h in d["heads_kept"])
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown ModelConfig fields {unknown}; valid fields: {sorted(known)}")
        return cls(**d)

    def replace(self, **changes) -> "ModelConfig":
        return replace(self, **changes)


def config_from_hf(hf: dict[str, Any], name: str = "") -> ModelConfig:
    """Translate a HF ``config.json`` dict of the BERT or Llama family.

    Raises :class:`~headscope.probes.errors.ModelIncompatibleError` for other families.
    """
    from .errors import ModelIncompatibleError

    mtype = hf.get("model_type")
    if mtype == "bert":
        if hf.get("position_embedding_type", "absolute") != "absolute":
            raise ModelIncompatibleError(
                f"BERT position_embedding_type={hf['position_embedding_type']!r} is not covered in-house; "
                "use --backend bridge."
            )
        return ModelConfig(
            family="bert",
            n_layers=hf["num_hidden_layers"],
            d_model=hf["hidden_size"],
            n_heads=hf["num_attention_heads"],
            d_mlp=hf["intermediate_size"],
            vocab_size=hf["vocab_size"],
            max_positions=hf["max_position_embeddings"],
            norm_eps=hf.get("layer_norm_eps", 1e-12),
            type_vocab_size=hf.get("type_vocab_size", 2),
            pad_token_id=hf.get("pad_token_id"),
            tie_embeddings=True,
            name=name or hf.get("_name_or_path", "bert"),
            extra={"hidden_act": hf.get("hidden_act", "gelu")},
        )
    if mtype == "llama":
        rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", None):
            raise ModelIncompatibleError(
                f"Llama rope_type={rope_type!r} is not covered in-house (only 'default'); use --backend bridge."
            )
        theta = rope.get("rope_theta", hf.get("rope_theta", 10_000.0))
        n_heads = hf["num_attention_heads"]
        return ModelConfig(
            family="llama",
            n_layers=hf["num_hidden_layers"],
            d_model=hf["hidden_size"],
            n_heads=n_heads,
            n_kv_heads=hf.get("num_key_value_heads") or n_heads,
            d_head=hf.get("head_dim") or hf["hidden_size"] // n_heads,
            d_mlp=hf["intermediate_size"],
            vocab_size=hf["vocab_size"],
            max_positions=hf.get("max_position_embeddings", 2048),
            rope_theta=float(theta),
            norm_eps=hf.get("rms_norm_eps", 1e-6),
            attention_bias=bool(hf.get("attention_bias", False)),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            pad_token_id=hf.get("pad_token_id"),
            name=name or hf.get("_name_or_path", "llama"),
        )
    raise ModelIncompatibleError(
        f"model_type {mtype!r} is not covered by the in-house backend (bert, llama); "
        "use the transformer-lens bridge backend (--backend bridge)."
    )
