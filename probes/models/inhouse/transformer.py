"""The in-house transformer: every covered family (BERT-style encoders, Llama-, Gemma- and
GPT-2-style decoders) in one file, its differences set by :class:`ModelConfig`'s options.

Read top to bottom: embeddings → blocks (attention + MLP) → final norm → unembedding.
Every activation passes a named :class:`~headscope.probes.models.inhouse.hooks.HookPoint`
(``blocks.{layer}.attn.hook_pattern``, ``blocks.{layer}.hook_resid_post``, …).

>>> import torch
>>> from headscope.probes.models.config import ModelConfig
>>> model = Transformer(ModelConfig(family="llama", n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, vocab_size=50))
>>> out = model(torch.tensor([[1, 2, 3]]))
>>> tuple(out.shape), len(model.hook_points)
((1, 3, 50), 30)
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from headscope.probes.models.config import ModelConfig
from headscope.probes.models.inhouse.attention import Attention, RMSNorm, additive_mask, rope_cos_sin
from headscope.probes.models.inhouse.hooks import HookPoint, name_hook_points

__all__ = ["MLP", "Block", "NoNorm", "RMSNorm", "Transformer", "activation_fn", "make_norm", "soft_capped"]


def _gelu_new(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's tanh approximation of GELU, written as HF's ``NewGELUActivation``."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def activation_fn(name: str):
    """The activation function of an HF activation name (``ACT2FN`` spelling)."""
    return {
        "gelu": F.gelu,
        "gelu_new": _gelu_new,
        "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
        "silu": F.silu,
        "relu": F.relu,
    }[name]


class NoNorm(nn.Module):
    """``norm="none"`` (compiled tracr models have no layer norm): no normalisation, only the
    per-feature ``weight`` (ones) as a scale, so the weight readers fold it like any norm's."""

    def __init__(self, d: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


def make_norm(cfg: ModelConfig, d: int) -> nn.Module:
    """The family's norm over ``d`` features: LayerNorm, RMSNorm (Gemma's ``(1 + w)`` when ``rms_offset``)
    or :class:`NoNorm` (``norm="none"``)."""
    if cfg.norm == "layernorm":
        return nn.LayerNorm(d, eps=cfg.norm_eps)
    if cfg.norm == "none":
        return NoNorm(d)
    return RMSNorm(d, cfg.norm_eps, offset=cfg.rms_offset)


def soft_capped(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """Gemma 2's final soft cap ``cap · tanh(logits / cap)``; ``logits`` as they are where ``cap`` is None."""
    return logits if cap is None else torch.tanh(logits / cap) * cap


class MLP(nn.Module):
    """``mlp="plain"``: ``down(act(up(x)))`` (BERT, GPT-2); ``mlp="gated"``:
    ``down(act(gate(x)) * up(x))`` (SwiGLU for Llama, GELU(tanh) for Gemma)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gated = cfg.mlp == "gated"
        self.act = activation_fn(cfg.activation)
        self.up = nn.Linear(cfg.d_model, cfg.d_mlp, bias=cfg.mlp_bias)
        self.down = nn.Linear(cfg.d_mlp, cfg.d_model, bias=cfg.mlp_bias)
        if self.gated:
            self.gate = nn.Linear(cfg.d_model, cfg.d_mlp, bias=cfg.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            return self.down(self.act(self.gate(x)) * self.up(x))
        return self.down(self.act(self.up(x)))


class Block(nn.Module):
    """One layer, in one of three layouts:

    * ``post_norm`` (BERT): ``x = ln1(x + attn(x)); x = ln2(x + mlp(x))``;
    * pre-norm (Llama, GPT-2): ``x = x + attn(ln1(x)); x = x + mlp(ln2(x))``;
    * ``sandwich_norm`` (Gemma): ``x = x + ln1_post(attn(ln1(x))); x = x + ln2_post(mlp(ln2(x)))``.
    """

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.post_norm = cfg.post_norm
        self.sandwich_norm = cfg.sandwich_norm
        self.window = cfg.window(layer)  # sliding window of this layer (None: global)
        self.rope_theta = cfg.layer_rope_theta(layer)
        self.rope_scaling = cfg.layer_rope_scaling(layer)
        kept = cfg.heads_kept[layer] if cfg.heads_kept is not None else tuple(range(cfg.n_heads))
        kv_kept = sorted({cfg.kv_head_of(h) for h in kept})
        kv_index = [kv_kept.index(cfg.kv_head_of(h)) for h in kept]
        self.heads = kept  # original indices of the query heads this layer holds
        self.attn = Attention(
            cfg.d_model,
            len(kept),
            len(kv_kept),
            cfg.d_head,
            bias=cfg.attention_bias,
            kv_index=kv_index,
            o_bias=cfg.o_bias,
            qk_norm=cfg.qk_norm,
            norm_eps=cfg.norm_eps,
            norm_offset=cfg.rms_offset,
            scale=cfg.query_scale,
            softcap=cfg.attn_softcap,
        )
        self.ln1 = make_norm(cfg, cfg.d_model)
        self.ln2 = make_norm(cfg, cfg.d_model)
        if self.sandwich_norm:  # HF Gemma: post_attention_layernorm, post_feedforward_layernorm
            self.ln1_post = make_norm(cfg, cfg.d_model)
            self.ln2_post = make_norm(cfg, cfg.d_model)
        self.mlp = MLP(cfg)
        self.hook_resid_pre = HookPoint()
        self.hook_resid_mid = HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(self, x, mask, rope=None, need_pattern=False):
        """``x [batch, pos, d_model]``; ``mask`` additive ``[batch, 1, query_pos, key_pos]``
        (already windowed for a sliding layer); ``rope`` this layer's (cos, sin) or None."""
        x = self.hook_resid_pre(x)
        if len(self.heads) == 0:
            attn_out = torch.zeros_like(x)
            if self.attn.o_proj.bias is not None:
                attn_out = attn_out + self.attn.o_proj.bias
        elif self.post_norm:
            attn_out = self.attn(x, mask, rope=rope, need_pattern=need_pattern)
        else:
            attn_out = self.attn(self.ln1(x), mask, rope=rope, need_pattern=need_pattern)
        if self.post_norm:
            x = self.hook_resid_mid(self.ln1(x + attn_out))
            return self.hook_resid_post(self.ln2(x + self.mlp(x)))
        if self.sandwich_norm:
            x = self.hook_resid_mid(x + self.ln1_post(attn_out))
            return self.hook_resid_post(x + self.ln2_post(self.mlp(self.ln2(x))))
        x = self.hook_resid_mid(x + attn_out)
        return self.hook_resid_post(x + self.mlp(self.ln2(x)))


class Transformer(nn.Module):
    """The stack of every family (see :mod:`~headscope.probes.models.config`).

    ``forward(input_ids [batch, pos], attention_mask [batch, pos]) ->`` logits
    ``[batch, pos, vocab]`` for a decoder (final soft cap applied where configured), final
    hidden states ``[batch, pos, d_model]`` for an encoder (HF ``AutoModel``'s
    ``last_hidden_state``; no MLM head is loaded).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        if cfg.positional == "learned":
            self.pos_embed = nn.Embedding(cfg.max_positions, cfg.d_model)
        if cfg.encoder and cfg.type_vocab_size:
            self.type_embed = nn.Embedding(cfg.type_vocab_size, cfg.d_model)
        if cfg.post_norm:
            self.embed_ln = make_norm(cfg, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, layer) for layer in range(cfg.n_layers))
        if not cfg.post_norm:
            self.ln_final = make_norm(cfg, cfg.d_model)
        if not cfg.encoder:
            self.unembed = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
            if cfg.tie_embeddings:
                self.unembed.weight = self.embed.weight
        self.hook_embed = HookPoint()
        self.hook_final = HookPoint()
        self.hook_points = name_hook_points(self)
        self.init_weights()

    def init_weights(self, std: float = 0.02, seed: int | None = None):
        """Random normal weights (std 0.02), unit norms (Gemma's ``(1 + w)`` norms: w = 0):
        a fresh model for planted or trained studies."""
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        for name, p in self.named_parameters():
            if name.endswith("gate"):
                continue
            if p.dim() == 1:
                nn.init.ones_(p) if ("ln" in name or "norm" in name) and name.endswith("weight") else nn.init.zeros_(p)
            else:
                with torch.no_grad():
                    p.copy_(torch.randn(p.shape, generator=gen) * std)
        for m in self.modules():
            if isinstance(m, RMSNorm) and m.offset:
                nn.init.zeros_(m.weight)

    @property
    def gates(self) -> list[torch.nn.Parameter]:
        """Per-layer head gates ``[head]`` (see :class:`~headscope.probes.models.inhouse.attention.Attention`)."""
        return [b.attn.gate for b in self.blocks]

    @contextmanager
    def gates_set(self, mask: torch.Tensor, *, requires_grad: bool = False, ablation: torch.Tensor | None = None):
        """For the ``with`` block, the built-in gates hold ``mask [layer, head]`` (and, where
        given, the ablation values ``ablation [layer, head, d_head]``), with ``requires_grad``;
        yields :attr:`gates`. The previous gates, ablation values and ``requires_grad`` come
        back on exit, whatever happens, and the gates' gradients are cleared."""
        saved = [
            (b.attn.gate.detach().clone(), b.attn.gate.requires_grad, b.attn.ablation_value.clone())
            for b in self.blocks
        ]
        try:
            for l, b in enumerate(self.blocks):
                with torch.no_grad():
                    b.attn.gate.copy_(mask[l].to(b.attn.gate.dtype))
                    if ablation is not None:
                        b.attn.ablation_value.copy_(ablation[l].to(b.attn.ablation_value.dtype))
                b.attn.gate.requires_grad_(requires_grad)
            yield self.gates
        finally:
            for b, (g, rg, av) in zip(self.blocks, saved):
                with torch.no_grad():
                    b.attn.gate.copy_(g)
                    b.attn.ablation_value.copy_(av)
                b.attn.gate.requires_grad_(rg)
                b.attn.gate.grad = None

    @contextmanager
    def kv_windows_set(self, windows: dict[tuple[int, int], tuple[int, int]]):
        """For the ``with`` block, the KV cache of each ``(layer, kv_head)`` of ``windows`` holds only
        ``(sink, window)``: its first ``sink`` and last ``window`` positions for every query (all the
        query heads reading that KV head alike; ``kv_head`` as in :meth:`ModelConfig.kv_head_of`).
        Every layer's restriction is cleared on exit, whatever happens. ``ValueError`` for a layer or
        KV head the model does not hold, ``sink < 0`` or ``window < 1``."""
        per_layer: dict[int, dict[int, tuple[int, int]]] = {}
        for (layer, group), (sink, window) in windows.items():
            if not 0 <= layer < len(self.blocks):
                raise ValueError(f"kv window: layer must be in [0, {len(self.blocks)}); got {layer}")
            kept = sorted({self.cfg.kv_head_of(h) for h in self.blocks[layer].heads})
            if group not in kept:
                raise ValueError(f"kv window: layer {layer} holds KV heads {kept}; got {group}")
            if sink < 0 or window < 1:
                raise ValueError(f"kv window: sink must be >= 0 and window >= 1; got sink={sink}, window={window}")
            per_layer.setdefault(layer, {})[kept.index(group)] = (int(sink), int(window))
        try:
            for layer, w in per_layer.items():
                self.blocks[layer].attn.kv_window = w
            yield self
        finally:
            for b in self.blocks:
                b.attn.kv_window = None

    def positions(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Position ids ``[batch, pos]``: ``0, 1, …``; RoBERTa (``pad_aware_positions``):
        ``pad_token_id + 1, …`` counting only non-pad tokens, pad tokens at ``pad_token_id``
        (HF ``create_position_ids_from_input_ids``)."""
        if self.cfg.pad_aware_positions:
            real = input_ids.ne(self.cfg.pad_token_id).int()
            return (torch.cumsum(real, dim=1).type_as(real) * real).long() + self.cfg.pad_token_id
        return torch.arange(input_ids.shape[1], device=input_ids.device)[None].expand_as(input_ids)

    def embed_tokens(self, input_ids, token_type_ids=None, positions=None):
        x = self.embed(input_ids)
        if self.cfg.embed_scale is not None:  # Gemma: × sqrt(d_model), rounded to the model dtype as HF does
            x = x * torch.tensor(self.cfg.embed_scale, dtype=torch.float32).to(x.dtype)
        if positions is None:
            positions = self.positions(input_ids)
        if self.cfg.positional == "learned":
            x = x + self.pos_embed(positions)
        if hasattr(self, "type_embed"):
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(input_ids)
            x = x + self.type_embed(token_type_ids)
        if self.cfg.post_norm:
            x = self.embed_ln(x)
        return self.hook_embed(x), positions

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        token_type_ids: torch.Tensor | None = None,
        stop_at_layer: int | None = None,
        start_at_layer: int | None = None,
        resid: torch.Tensor | None = None,
        need_pattern: bool = False,
    ) -> torch.Tensor:
        """Logits / final hidden states (see class doc), or the residual stream.

        ``stop_at_layer=l`` returns the residual stream entering block ``l``
        ``[batch, pos, d_model]``; ``start_at_layer=l`` with that ``resid`` runs blocks
        ``l..`` only (``input_ids`` still give the shape and positions), so a prefix
        shared by many runs (e.g. ablations of later heads) is computed once.
        """
        cfg = self.cfg
        batch, pos = input_ids.shape
        offset = cfg.pad_token_id + 1 if cfg.pad_aware_positions else 0
        if pos + offset > cfg.max_positions:
            raise ValueError(
                f"input has {pos} tokens; the model's context is {cfg.max_positions - offset} positions. "
                "Shorten the text or split it."
            )
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        start = start_at_layer or 0
        if start:
            if resid is None or tuple(resid.shape[:2]) != (batch, pos):
                raise ValueError(
                    f"start_at_layer={start} needs resid [batch={batch}, pos={pos}, d_model]; "
                    f"got {None if resid is None else tuple(resid.shape)}"
                )
            x = resid
            positions = self.positions(input_ids)
        else:
            x, positions = self.embed_tokens(input_ids, token_type_ids)
        masks: dict = {}  # window -> additive mask [batch, 1, query_pos, key_pos]
        ropes: dict = {}  # (theta, scaled) -> (cos, sin) [batch, 1, pos, d_head]
        for layer in range(start, len(self.blocks)):
            if stop_at_layer is not None and layer >= stop_at_layer:
                return x
            block = self.blocks[layer]
            if block.window not in masks:
                masks[block.window] = additive_mask(attention_mask, cfg.causal, dtype=x.dtype, window=block.window)
            rope = None
            if cfg.positional == "rope":
                key = (block.rope_theta, block.rope_scaling is not None)
                if key not in ropes:
                    ropes[key] = rope_cos_sin(positions, cfg.d_head, block.rope_theta, block.rope_scaling)
                rope = ropes[key]
            x = block(x, masks[block.window], rope=rope, need_pattern=need_pattern)
        if not cfg.post_norm:
            x = self.ln_final(x)
        x = self.hook_final(x)
        if cfg.encoder:
            return x
        return soft_capped(self.unembed(x), cfg.final_softcap)
