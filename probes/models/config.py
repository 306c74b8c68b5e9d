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


def config_from_hf(hf: dict[str, Any], name: str = "") -> ModelConfig:
    """Translate a HF ``config.json`` dict of the BERT or Llama family.

    Raises :class:`~headscope.probes.errors.ModelIncompatibleError` for other families.
    """
    from headscope.probes.errors import ModelIncompatibleError

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


# -- checking a config.json's sizes before anything is built -------------------------------

# keys that hold a size, per family: (required, optional); any of _ANY_SIZE_KEYS present is checked too
_SIZE_KEYS = {
    "bert": (
        (
            "num_hidden_layers",
            "hidden_size",
            "num_attention_heads",
            "intermediate_size",
            "vocab_size",
            "max_position_embeddings",
        ),
        ("type_vocab_size",),
    ),
    "llama": (
        ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size"),
        ("num_key_value_heads", "head_dim", "max_position_embeddings"),
    ),
}
_ANY_SIZE_KEYS = (
    "num_hidden_layers",
    "n_layer",
    "hidden_size",
    "n_embd",
    "d_model",
    "num_attention_heads",
    "n_head",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "n_inner",
    "vocab_size",
    "max_position_embeddings",
    "n_positions",
)
_NULL_MEANS_UNSET = ("num_key_value_heads", "head_dim", "n_inner")  # HF derives these when null
_MAX_SIZE = 2**63  # torch indexes with int64


def check_hf_config(hf: dict[str, Any], where: str) -> None:
    """Refuse a config whose sizes cannot describe a model: a size missing (for the BERT and
    Llama families), null, not an integer, not positive, or heads that do not divide.
    ``where`` (the config file) starts every message.

    Raises :class:`~headscope.probes.errors.CheckpointError`.

    >>> try:
    ...     check_hf_config({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
    ...         "num_attention_heads": 4, "intermediate_size": 1.5, "vocab_size": 10}, "m/config.json")
    ... except Exception as e:  # CheckpointError
    ...     print(e)
    m/config.json: intermediate_size must be a positive integer; got 1.5
    """
    from headscope.probes.errors import CheckpointError

    family = hf.get("model_type")
    required, optional = _SIZE_KEYS.get(family, ((), _ANY_SIZE_KEYS))
    for key in required:
        if key not in hf:
            raise CheckpointError(f"{where}: {key} is missing (a {family!r} config needs it); add it to the config")
    for key in dict.fromkeys((*required, *optional, *_ANY_SIZE_KEYS)):
        if key not in hf or (hf[key] is None and key in _NULL_MEANS_UNSET):
            continue
        v = hf[key]
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise CheckpointError(f"{where}: {key} must be a positive integer; got {v!r}")
        if v >= _MAX_SIZE:
            raise CheckpointError(f"{where}: {key}={v} is past 2**63, more than any tensor can index")
    n_heads = hf.get("num_attention_heads") or hf.get("n_head")
    d_model = hf.get("hidden_size") or hf.get("n_embd") or hf.get("d_model")
    n_kv = hf.get("num_key_value_heads") if family != "bert" else None  # BERT has no KV heads of its own
    if n_heads and n_kv and n_heads % n_kv:
        raise CheckpointError(
            f"{where}: num_key_value_heads={n_kv} does not divide num_attention_heads={n_heads} "
            "(each KV head serves an equal group of query heads)"
        )
    if family == "bert" and d_model % n_heads:
        raise CheckpointError(
            f"{where}: hidden_size={d_model} is not divisible by num_attention_heads={n_heads}; fix one of them"
        )
    if family == "llama":
        d_head = hf.get("head_dim") or d_model // n_heads
        if d_head < 1:
            raise CheckpointError(
                f"{where}: num_attention_heads={n_heads} exceeds hidden_size={d_model} (d_head would be 0); "
                "fix one of them or set head_dim"
            )
        if d_head % 2:
            raise CheckpointError(f"{where}: head_dim {d_head} is odd; RoPE rotates pairs of dimensions")


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
