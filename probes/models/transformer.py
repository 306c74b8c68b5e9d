"""The in-house transformer: BERT-family encoder and Llama-family decoder, one file.

Read top to bottom: embeddings → blocks (attention + MLP) → final norm → unembedding.
Every activation passes a named :class:`~headscope.probes.models.hooks.HookPoint`
(``blocks.{layer}.attn.hook_pattern``, ``blocks.{layer}.hook_resid_post``, …).

>>> import torch
>>> from headscope.probes.models.config import ModelConfig
>>> model = Transformer(ModelConfig(family="llama", n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, vocab_size=50))
>>> out = model(torch.tensor([[1, 2, 3]]))
>>> tuple(out.shape), len(model.hook_points)
((1, 3, 50), 26)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from headscope.probes.models.attention import Attention, additive_mask, rope_cos_sin
from headscope.probes.models.config import ModelConfig
from headscope.probes.models.hooks import HookPoint, name_hook_points


class RMSNorm(nn.Module):
    """Llama's RMSNorm, in float32 like HF."""

    def __init__(self, d: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class MLP(nn.Module):
    """GELU MLP (BERT) or SwiGLU (Llama)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gated = cfg.family == "llama"
        bias = cfg.family == "bert"
        self.up = nn.Linear(cfg.d_model, cfg.d_mlp, bias=bias)
        self.down = nn.Linear(cfg.d_mlp, cfg.d_model, bias=bias)
        if self.gated:
            self.gate = nn.Linear(cfg.d_model, cfg.d_mlp, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    """One layer. BERT: post-LayerNorm ``x = LN(x + attn(x)); x = LN(x + mlp(x))``.
    Llama: pre-RMSNorm ``x = x + attn(norm(x)); x = x + mlp(norm(x))``."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.post_norm = cfg.family == "bert"
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
        )
        if cfg.family == "bert":
            self.ln1 = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
            self.ln2 = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        else:
            self.ln1 = RMSNorm(cfg.d_model, cfg.norm_eps)
            self.ln2 = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MLP(cfg)
        self.hook_resid_pre = HookPoint()
        self.hook_resid_mid = HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(self, x, mask, rope=None, need_pattern=False):
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
            x = self.ln2(x + self.mlp(x))
        else:
            x = self.hook_resid_mid(x + attn_out)
            x = x + self.mlp(self.ln2(x))
        return self.hook_resid_post(x)


class Transformer(nn.Module):
    """Encoder (``family="bert"``) or decoder (``family="llama"``) stack.

    ``forward(input_ids [batch, pos], attention_mask [batch, pos]) ->``
    logits ``[batch, pos, vocab]`` for Llama, final hidden states ``[batch, pos, d_model]``
    for BERT (HF ``BertModel.last_hidden_state``; no MLM head is shipped with MiniLM).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        if cfg.positional == "learned":
            self.pos_embed = nn.Embedding(cfg.max_positions, cfg.d_model)
        if cfg.family == "bert":
            self.type_embed = nn.Embedding(cfg.type_vocab_size, cfg.d_model)
            self.embed_ln = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.blocks = nn.ModuleList(Block(cfg, layer) for layer in range(cfg.n_layers))
        if cfg.family == "llama":
            self.ln_final = RMSNorm(cfg.d_model, cfg.norm_eps)
            self.unembed = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
            if cfg.tie_embeddings:
                self.unembed.weight = self.embed.weight
        self.hook_embed = HookPoint()
        self.hook_final = HookPoint()
        self.hook_points = name_hook_points(self)
        self.init_weights()

    def init_weights(self, std: float = 0.02, seed: int | None = None):
        """Random normal weights (std 0.02), unit norms: a fresh model for planted or trained studies."""
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        for name, p in self.named_parameters():
            if name.endswith("gate"):
                continue
            if p.dim() == 1:
                nn.init.ones_(p) if ("ln" in name or "norm" in name) and name.endswith("weight") else nn.init.zeros_(p)
            else:
                with torch.no_grad():
                    p.copy_(torch.randn(p.shape, generator=gen) * std)

    @property
    def gates(self) -> list[torch.nn.Parameter]:
        """Per-layer head gates ``[head]`` (see :class:`~headscope.probes.models.attention.Attention`)."""
        return [b.attn.gate for b in self.blocks]

    def embed_tokens(self, input_ids, token_type_ids=None, positions=None):
        x = self.embed(input_ids)
        if positions is None:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None].expand_as(input_ids)
        if self.cfg.positional == "learned":
            x = x + self.pos_embed(positions)
        if self.cfg.family == "bert":
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(input_ids)
            x = self.embed_ln(x + self.type_embed(token_type_ids))
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
        batch, pos = input_ids.shape
        if pos > self.cfg.max_positions:
            raise ValueError(
                f"input has {pos} tokens; the model's context is {self.cfg.max_positions} positions. "
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
            positions = torch.arange(pos, device=input_ids.device)[None].expand_as(input_ids)
        else:
            x, positions = self.embed_tokens(input_ids, token_type_ids)
        mask = additive_mask(attention_mask, self.cfg.causal, dtype=x.dtype)
        rope = None
        if self.cfg.positional == "rope":
            rope = rope_cos_sin(positions, self.cfg.d_head, self.cfg.rope_theta)
        for layer in range(start, len(self.blocks)):
            if stop_at_layer is not None and layer >= stop_at_layer:
                return x
            x = self.blocks[layer](x, mask, rope=rope, need_pattern=need_pattern)
        if self.cfg.family == "llama":
            x = self.hook_final(self.ln_final(x))
            return self.unembed(x)
        return self.hook_final(x)
