"""What a model family is, in one record: :class:`Family` (and :class:`Fused`, one fused HF tensor).

A family is an HF ``model_type``. Its record holds everything headscope knows about it, so that
the readers iterate :data:`~headscope.probes.models.families.FAMILIES` instead of branching on
names: the config reader's facts (:mod:`~headscope.probes.models.arch`), the in-house defaults
and fixed options (:func:`~headscope.probes.models.config.config_from_arch`), the checkpoint's
tensor names (:func:`~headscope.probes.models.checkpoints.hf_to_inhouse_names`) and the module
names the HF backend hooks (:mod:`~headscope.probes.models.hf_layout`).

>>> f = Family(model_type="toy", inhouse=False, attn_out="self_attn.o_proj")
>>> f.label, f.options()["qk_norm"], f.inhouse
('toy', False, False)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from headscope.probes.models.families.gguf_record import GGUF

__all__ = ["OPTIONS", "Family", "Fused"]

#: the :class:`~headscope.probes.models.config.ModelConfig` options a family sets (the fields of
#: the same names below); an option a family leaves ``None`` is set by the config itself
OPTIONS = (
    "causal",
    "positional",
    "norm",
    "post_norm",
    "mlp",
    "activation",
    "attention_bias",
    "mlp_bias",
    "rms_offset",
    "sandwich_norm",
    "qk_norm",
    "pad_aware_positions",
    "o_bias",
)
#: checkpoint facts :func:`~headscope.probes.models.config.config_from_arch` may read from an
#: :class:`~headscope.probes.models.spec.ArchSpec` (the others stay at the family's value)
READABLE = frozenset({"attention_bias", "attn_softcap", "final_softcap", "query_pre_attn_scalar", "rope_local_theta"})


def _frozen(mapping: Mapping | None = None) -> Mapping:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True, kw_only=True)
class Fused:
    """One fused HF tensor and the in-house tensors it becomes.

    ``suffix`` ends the HF module name (``"attn.qkv_proj"``); ``into`` names the parts in the
    order they are stacked along dim 0 (three parts: ``[q, kv, kv]`` rows by the config's heads;
    two: equal halves, as ``chunk(2)``); ``()``: not split, only transposed. ``conv1d``: the
    weight is stored ``[in, out]`` (GPT-2's ``Conv1D``) and is transposed to ``[out, in]``.
    """

    suffix: str
    into: tuple[str, ...] = ()
    conv1d: bool = False

    def __post_init__(self):
        if len(self.into) not in (0, 2, 3) or (not self.into and not self.conv1d):
            raise ValueError(f"a Fused tensor splits into 2 or 3 parts or is a Conv1D; got {self!r}")


@dataclass(frozen=True, kw_only=True)
class Family:
    """One model family (an HF ``model_type``): what each reader needs to know about it.

    Options named in :data:`OPTIONS` are the in-house defaults (``None``: the config's own);
    families that run only through the HF and bridge backends (``inhouse=False``) set only the
    facts the config reader and the HF layout use.
    """

    model_type: str
    #: how messages name the family (``"BERT"``); empty: ``model_type``
    label: str = ""
    #: whether the in-house stack builds it (else ``--backend hf`` / ``bridge``)
    inhouse: bool = True
    #: whether it returns final hidden states (HF ``AutoModel``) rather than logits
    encoder: bool = False
    #: other model types read with this family's facts (QK-norm, sliding pattern) but never
    #: built in-house, each with what it is (the in-house backend's refusal says it)
    aliases: Mapping[str, str] = field(default_factory=_frozen, hash=False)
    # -- the in-house defaults (ModelConfig's options) ---------------------------------------
    causal: bool | None = None
    positional: str | None = None
    norm: str | None = None
    post_norm: bool | None = None
    mlp: str | None = None
    activation: str | None = None
    attention_bias: bool | None = None
    mlp_bias: bool | None = None
    rms_offset: bool = False
    sandwich_norm: bool = False
    qk_norm: bool = False
    pad_aware_positions: bool = False
    o_bias: bool | None = None
    # -- how config_from_arch fills the rest -------------------------------------------------
    #: token embeddings × sqrt(d_model) (Gemma)
    scaled_embeddings: bool = False
    #: LayerNorm / RMSNorm epsilon where the checkpoint gives none
    default_norm_eps: float = 1e-6
    #: context length where the checkpoint gives none (None: the checkpoint must give it)
    default_max_positions: int | None = None
    #: token-type embeddings (an encoder's ``type_vocab_size``; DistilBERT has none)
    token_types: bool = True
    #: the checkpoint facts read (of :data:`READABLE`); the others are fixed by the family's code
    reads: frozenset[str] = frozenset({"attention_bias"})
    # -- what the config reader knows --------------------------------------------------------
    #: config keys the family spells its own way -> the common HF name (DistilBERT's ``dim``)
    config_names: Mapping[str, str] = field(default_factory=_frozen, hash=False)
    #: options whose other values change what the family computes in ways the in-house stack
    #: does not implement, with their default (a checkpoint that sets another value goes to hf)
    fixed_options: Mapping[str, Any] = field(default_factory=_frozen, hash=False)
    #: every n-th layer attends globally, the others slide (Gemma), where the config does not list them
    sliding_pattern: int | None = None
    #: size keys a config of this family must hold, then further ones checked when present
    required_sizes: tuple[str, ...] = ()
    optional_sizes: tuple[str, ...] = ()
    #: the family's own size rule, ``check_sizes(hf, where)`` (raises ``CheckpointError``)
    check_sizes: Callable[[dict, str], None] | None = field(default=None, compare=False)
    # -- the checkpoint's tensor names -------------------------------------------------------
    #: the prefix a head checkpoint (``…ForCausalLM``) puts before the base model's tensors, as
    #: ``hf_names`` expect them (``"model."``); a base-model checkpoint (``AutoModel``) has none, and gets it
    hf_base: str = ""
    #: (old, new) prefixes, each replaced at the start of a tensor name, in order
    hf_prefixes: tuple[tuple[str, str], ...] = ()
    #: HF tensors not used (glob patterns on the prefixed-off name): pooler, MLM heads, buffers
    hf_drop: tuple[str, ...] = ()
    #: (HF, in-house) name pieces, each replaced everywhere in a name, in order
    hf_names: tuple[tuple[str, str], ...] = ()
    #: fused HF tensors split (or transposed) on loading
    hf_fused: tuple[Fused, ...] = ()
    # -- the HF backend's modules (by the end of their names) ----------------------------------
    #: the attention output projection (its input: every head's z, concatenated)
    attn_out: str = "self_attn.o_proj"
    #: the separate query / key / value projections; None where the family fuses them
    qkv: tuple[str, str, str] | None = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
    # -- GGUF ------------------------------------------------------------------------------
    #: how its GGUF files read (None: transformers reads none of this family)
    gguf: GGUF | None = field(default=None, hash=False)

    def __post_init__(self):
        if not self.model_type:
            raise ValueError("The 'model_type' parameter of Family must be a non-empty string; got ''.")
        object.__setattr__(self, "label", self.label or self.model_type)
        if self.gguf is not None and self.gguf.model_type != self.model_type:
            if self.gguf.model_type:
                raise ValueError(f"{self.model_type}: its gguf record names model_type {self.gguf.model_type!r}")
            object.__setattr__(self, "gguf", replace(self.gguf, model_type=self.model_type))
        for name in ("aliases", "config_names", "fixed_options"):
            object.__setattr__(self, name, _frozen(getattr(self, name)))
        if not self.reads <= READABLE:
            raise ValueError(f"{self.model_type}: reads must be a subset of {sorted(READABLE)}; got {set(self.reads)}")
        if self.inhouse and None in (self.causal, self.positional, self.norm, self.mlp, self.activation):
            raise ValueError(f"{self.model_type}: an in-house family sets causal, positional, norm, mlp and activation")

    def options(self) -> dict[str, Any]:
        """The in-house defaults, by :class:`~headscope.probes.models.config.ModelConfig` field name."""
        return {name: getattr(self, name) for name in OPTIONS}
