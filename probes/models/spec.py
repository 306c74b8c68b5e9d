"""A checkpoint's architecture as one frozen record, :class:`ArchSpec`, with the facts derived
from it (``group_size``, ``attention_kind``, ``causal``, ``per_layer``, ``rope_factor``) defined
once here, so every consumer (card, backends, in-house config) reads the same answer.

Built by :func:`~headscope.probes.models.arch.arch_from_hf_config` (an HF config) or
:func:`~headscope.probes.models.gguf.arch_from_gguf` (a GGUF file's metadata).

>>> s = ArchSpec(model_type="llama", name="x", n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_head=16,
...     d_mlp=128, vocab_size=100, max_positions=None, encoder=False, positional="rope", rope_theta=None,
...     rope_type=None, norm="rmsnorm", norm_eps=None, activation="silu", attention_bias=False,
...     sliding_window=None, qk_norm=False, attn_softcap=None, final_softcap=None, tie_embeddings=False,
...     type_vocab_size=None, pad_token_id=None, bos_token_id=None)
>>> s.group_size, s.attention_kind, s.causal, s.per_layer
(2, 'GQA', True, False)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class ArchSpec:
    """What a checkpoint's configuration says about its architecture, one name per fact.

    ``None`` means the configuration does not say (consumers apply their own default:
    the card a context of 2048, the in-house BERT a LayerNorm epsilon of 1e-12, …).
    ``sliding_window`` holds one entry per layer (``None`` for a layer that attends to
    the whole context), or is ``None`` when no layer slides.
    """

    model_type: str
    name: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_mlp: int | None
    vocab_size: int | None
    max_positions: int | None
    encoder: bool
    positional: str | None  # "learned" | "rope" | "relative" | "alibi" | "none"; None: not known
    rope_theta: float | None
    rope_type: str | None
    norm: str | None  # "layernorm" | "rmsnorm"
    norm_eps: float | None
    activation: str | None
    attention_bias: bool | None
    sliding_window: tuple[int | None, ...] | None
    qk_norm: bool
    attn_softcap: float | None
    final_softcap: float | None
    tie_embeddings: bool
    type_vocab_size: int | None
    pad_token_id: int | None
    bos_token_id: int | None
    #: Gemma 2/3: queries are scaled by ``query_pre_attn_scalar ** -0.5`` (not ``d_head ** -0.5``)
    query_pre_attn_scalar: float | None = None
    #: Gemma 3: the RoPE base and type of the sliding (local) layers, when they differ from the
    #: global layers' (``rope_local_base_freq``, or ``rope_parameters["sliding_attention"]``)
    rope_local_theta: float | None = None
    rope_local_type: str | None = None
    #: the numeric parameters of a scaled RoPE (``linear``, ``llama3``, ``yarn``...) on the global
    #: layers (``factor``, ``low_freq_factor``, ...), sorted pairs; None: plain RoPE
    rope_scaling: tuple[tuple[str, float], ...] | None = None

    @property
    def rope_factor(self) -> float | None:
        """The scaling factor of a scaled RoPE (None: plain RoPE)."""
        return dict(self.rope_scaling or ()).get("factor")

    #: fraction of each head's dimensions that RoPE rotates (Phi-3 ``partial_rotary_factor``;
    #: None: the config does not say, i.e. all of them)
    rotary_fraction: float | None = None
    #: a decoder family run with bidirectional attention (``use_bidirectional_attention``:
    #: EmbeddingGemma); ``encoder`` still follows the model type, :attr:`causal` is False
    bidirectional_attention: bool = False
    #: family options set away from their default (``"name=value"``), e.g. GPT-2's
    #: ``scale_attn_by_inverse_layer_idx=True``: see ``Family.fixed_options`` (:mod:`~headscope.probes.models.families`)
    off_default: tuple[str, ...] = ()
    #: query heads, KV heads and MLP width of each layer where a GGUF file's layers differ
    #: (:data:`~headscope.probes.models.arch.PER_LAYER`; the card only: no backend builds such a model); None: the same in every
    #: layer. ``n_heads``/``n_kv_heads``/``d_mlp`` then hold the widest layer's.
    heads_per_layer: tuple[int, ...] | None = None
    kv_heads_per_layer: tuple[int, ...] | None = None
    d_mlp_per_layer: tuple[int, ...] | None = None

    @property
    def per_layer(self) -> bool:
        """Whether the layers differ in heads, KV heads or MLP width."""
        return any(x is not None for x in (self.heads_per_layer, self.kv_heads_per_layer, self.d_mlp_per_layer))

    @property
    def causal(self) -> bool:
        """Whether each position attends to the past only: a decoder family, not run with
        ``use_bidirectional_attention`` (what the attention masks follow; what the checkpoint is
        for is :func:`~headscope.probes.models.purpose.decide_purpose`'s)."""
        return not self.encoder and not self.bidirectional_attention

    @property
    def group_size(self) -> int:
        """Query heads per KV head (1 for MHA, ``n_heads`` for MQA)."""
        return self.n_heads // self.n_kv_heads

    @property
    def attention_kind(self) -> str:
        if self.n_kv_heads == self.n_heads:
            return "MHA"
        return "MQA" if self.n_kv_heads == 1 else "GQA"
