"""Per-head weight matrices, read one layer at a time, for the weights-only circuit analyses
(:mod:`headscope.analyses.circuits.weights`), so analyses never reach into a model or a file.

A :class:`ModelWeights` reads its tensors through a small :class:`TensorSource` by in-house
name (``blocks.3.attn.q_proj.weight``): from a loaded in-house model (:func:`head_weights`) or
lazily from a checkpoint on disk, one tensor at a time
(:func:`headscope.probes.models.lazy_weights.lazy_weights`); the same code folds and splits
both, so the two give the same matrices.

Convention (transformer-lens's ``x @ W``): a residual row vector ``x [d_model]`` gives head
``h``'s query ``x @ W_Q[h]``, key ``x @ W_K[kv]``, value ``x @ W_V[kv]``, and the head writes
``z @ W_O[h]``; tokens embed as ``W_E[token]`` and unembed as ``x @ W_U``.

Shapes::

    W_Q  [head, d_model, d_head]        W_O  [head, d_head, d_model]
    W_K  [kv_head, d_model, d_head]     W_V  [kv_head, d_model, d_head]
    W_E  [vocab, d_model]               W_U  [d_model, vocab]
    kv_index [head]: query head h reads KV head kv_index[h]

Norm folding (``fold_norms=True``, as transformer-lens's ``fold_ln`` does for the scales): on a
pre-norm model each block's input-norm scale ``w`` (Gemma: ``1 + w``) multiplies the rows of
``W_Q``, ``W_K``, ``W_V`` (``diag(w) @ W``) and the final norm's scale the rows of ``W_U``;
Gemma's embedding scale multiplies ``W_E``. LayerNorm's centring and every bias are *not* folded,
nor Gemma's post-attention (sandwich) norms; a post-norm model (BERT) is not folded at all.
:attr:`ModelWeights.folding` says which applied.

>>> from headscope.probes.models.inhouse.planted import planted_model
>>> w = head_weights(planted_model())
>>> tuple(w.layer(1).W_Q.shape), tuple(w.W_U.shape), w.unembedding
((4, 128, 64), (128, 35), 'unembed (tied to the embedding)')
>>> [tuple(e.shape) for e, u in w.vocab_chunks(20)], w.reader
([(20, 128), (15, 128)], 'in-house model (in memory)')
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import torch

from headscope.probes.errors import ModelIncompatibleError
from headscope.probes.models.config import ModelConfig
from headscope.probes.models.inhouse.transformer import Transformer


@dataclass(frozen=True)
class LayerWeights:
    """One layer's attention weights (float32, CPU, copies the caller owns; see module doc)."""

    layer: int
    heads: tuple[int, ...]  # original query-head indices this layer holds (a pruned model holds fewer)
    kv_index: torch.Tensor  # [head] -> KV head
    W_Q: torch.Tensor  # [head, d_model, d_head]
    W_K: torch.Tensor  # [kv_head, d_model, d_head]
    W_V: torch.Tensor  # [kv_head, d_model, d_head]
    W_O: torch.Tensor  # [head, d_head, d_model]
    #: biases where the provider reads them (the hf backend's); None: none read
    b_Q: torch.Tensor | None = None  # [head, d_head]
    b_K: torch.Tensor | None = None  # [kv_head, d_head]
    b_V: torch.Tensor | None = None  # [kv_head, d_head]
    b_O: torch.Tensor | None = None  # [d_model]

    @property
    def nbytes(self) -> int:
        """Bytes of the five matrices (float32)."""
        return sum(t.numel() * t.element_size() for t in (self.W_Q, self.W_K, self.W_V, self.W_O))


class TensorSource(Protocol):
    """Where a :class:`ModelWeights` reads tensors, by in-house name, as float32 CPU tensors."""

    #: one line saying where the tensors come from (``run.json``'s ``reader``)
    description: str

    def tensor(self, name: str) -> torch.Tensor:
        """The whole tensor ``name`` (float32; the caller may keep it)."""

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows ``[start, stop)`` of the 2-D tensor ``name`` (float32)."""

    def has(self, name: str) -> bool:
        """Whether the source holds ``name``."""

    def layout(self, layer: int) -> tuple[tuple[int, ...], list[int]]:
        """``(query heads held, kv_index)`` of ``layer`` (:func:`layer_heads` of a checkpoint's config)."""


class _ModuleSource:
    """The tensors of a loaded :class:`Transformer` (``.detach().float().cpu()`` of its parameters)."""

    description = "in-house model (in memory)"

    def __init__(self, module: Transformer):
        self._p = dict(module.named_parameters())
        self._blocks = module.blocks

    def has(self, name: str) -> bool:
        return name in self._p

    def layout(self, layer: int) -> tuple[tuple[int, ...], list[int]]:
        block = self._blocks[layer]
        return tuple(block.heads), block.attn.kv_index.detach().cpu().tolist()

    def tensor(self, name: str) -> torch.Tensor:
        return self._p[name].detach().float().cpu()

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        return self._p[name].detach()[start:stop].float().cpu()


def layer_heads(cfg: ModelConfig, layer: int) -> tuple[tuple[int, ...], list[int]]:
    """``(query heads kept, kv_index)`` of ``layer``, as the in-house ``Block`` builds them
    (``heads_kept`` of a physically pruned model; KV heads renumbered among those kept)."""
    kept = cfg.heads_kept[layer] if cfg.heads_kept is not None else tuple(range(cfg.n_heads))
    kv_kept = sorted({cfg.kv_head_of(h) for h in kept})
    return tuple(kept), [kv_kept.index(cfg.kv_head_of(h)) for h in kept]


#: rows of the embedding or unembedding read at once by :meth:`ModelWeights.W_E_rows` / ``W_U_columns``
ROW_BLOCK = 4096


class ModelWeights:
    """Lazy view of a model's head weights; :meth:`layer` builds one layer's matrices when asked,
    :meth:`vocab_chunks` the embedding and unembedding a block of tokens at a time (nothing is
    read up front)."""

    def __init__(self, cfg: ModelConfig, source: TensorSource, *, fold_norms: bool = True, name: str | None = None):
        self.cfg = cfg
        self.source = source
        self._src = source
        self.reader: str = source.description
        self.n_layers: int = cfg.n_layers
        self.d_model: int = cfg.d_model
        self.d_head: int = cfg.d_head
        self.vocab_size: int = cfg.vocab_size
        self.positional: str = cfg.positional
        self.name: str = name or cfg.name or cfg.family
        self._fold = fold_norms and not cfg.post_norm
        if not fold_norms:
            self.folding = "not folded"
        elif cfg.post_norm:
            self.folding = "not folded (post-norm model: the norms act after the residual sums)"
        else:
            extra = "; Gemma's post-attention norms not folded" if cfg.sandwich_norm else ""
            self.folding = (
                "input-norm scales folded into W_Q/W_K/W_V, the final norm's into W_U; centring and biases not folded"
                + extra
            )
        if cfg.encoder:
            self.unembedding = "W_E transposed (encoder: no unembedding loaded; BERT's MLM head ties it)"
        elif cfg.tie_embeddings:
            self.unembedding = "unembed (tied to the embedding)"
        else:
            self.unembedding = "unembed"

    def reading(self) -> dict[str, str]:
        """How the matrices were read, in words: ``reader``, ``folding``, ``unembedding`` (run.json's)."""
        return {"reader": self.reader, "folding": self.folding, "unembedding": self.unembedding}

    def _norm_scale(self, name: str) -> torch.Tensor:
        """The multiplicative scale ``[d_model]`` of the norm ``name`` (Gemma's ``1 + w``)."""
        w = self._src.tensor(f"{name}.weight")
        return 1.0 + w if (self.cfg.norm != "layernorm" and self.cfg.rms_offset) else w

    def _unembed_name(self) -> str:
        tied = self.cfg.encoder or self.cfg.tie_embeddings or not self._src.has("unembed.weight")
        return "embed.weight" if tied else "unembed.weight"

    def _fold_embed(self, w: torch.Tensor) -> torch.Tensor:
        scale = self.cfg.embed_scale
        return w * scale if (scale is not None and self._fold) else w.clone()

    def _fold_unembed(self, u: torch.Tensor, final: torch.Tensor | None) -> torch.Tensor:
        """``u [rows, d_model]`` (the stored unembedding rows) -> ``[d_model, rows]``, final norm folded."""
        w = u.T.clone()
        return final[:, None] * w if final is not None else w

    @property
    def W_E(self) -> torch.Tensor:
        """``[vocab, d_model]`` (Gemma's embedding scale folded where norms are)."""
        return self._fold_embed(self._src.tensor("embed.weight"))

    @property
    def W_U(self) -> torch.Tensor:
        """``[d_model, vocab]``; the final norm's scale folded into its rows where norms are."""
        final = self._norm_scale("ln_final") if self._fold else None
        return self._fold_unembed(self._src.tensor(self._unembed_name()), final)

    def W_E_rows(self, ids) -> torch.Tensor:
        """``W_E[ids]`` ``[len(ids), d_model]``, equal to it, reading the embedding :data:`ROW_BLOCK`
        rows at a time: the whole vocabulary's copy (:attr:`W_E`) is never made."""
        return self._fold_embed(self._take(self._src, "embed.weight", ids))

    def W_U_columns(self, ids) -> torch.Tensor:
        """``W_U[:, ids]`` ``[d_model, len(ids)]``, equal to it, read as :meth:`W_E_rows` (:attr:`W_U`
        makes two copies of the whole unembedding: 297 MiB for a 151,936-entry vocabulary at d_model 256)."""
        final = self._norm_scale("ln_final") if self._fold else None
        return self._fold_unembed(self._take(self._src, self._unembed_name(), ids), final)

    def _take(self, src, name: str, ids) -> torch.Tensor:
        # every tensor here on the rows' own device, never the default one (tests/test_device_hygiene.py)
        ids = torch.as_tensor(list(ids), dtype=torch.long, device="cpu")
        out = None
        for block in sorted({int(i) // ROW_BLOCK for i in ids.tolist()}):
            a = block * ROW_BLOCK
            rows = src.rows(name, a, min(a + ROW_BLOCK, self.vocab_size))
            if out is None:
                out = rows.new_empty((len(ids), self.d_model), dtype=torch.get_default_dtype())
            hit = ((ids >= a) & (ids < a + ROW_BLOCK)).to(rows.device)
            out[hit] = rows[(ids.to(rows.device)[hit] - a)].to(out.dtype)
        return out if out is not None else torch.empty(0, self.d_model, device="cpu")

    @property
    def W_pos(self) -> torch.Tensor:
        """``[n_pos, d_model]``: the learned position embeddings a model uses (RoBERTa's from
        ``pad_token_id + 1`` on); ``ValueError`` for a model without them."""
        if self.positional != "learned":
            raise ValueError(f"{self.name} has no learned position embeddings (positional: {self.positional!r})")
        start = self.cfg.pad_token_id + 1 if self.cfg.pad_aware_positions else 0
        return self._src.tensor("pos_embed.weight")[start:].clone()

    def vocab_chunks(self, size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``(W_E[a:b] [c, d_model], W_U[:, a:b] [d_model, c])`` for consecutive blocks of ``size``
        tokens, folded as :attr:`W_E`/:attr:`W_U` (values equal; no copy beyond the fold, so treat
        them as read-only): the whole vocabulary is never held at once."""
        if size < 1:
            raise ValueError(f"size must be >= 1; got {size}")
        final = self._norm_scale("ln_final") if self._fold else None
        scale = self.cfg.embed_scale if self._fold else None
        unembed = self._unembed_name()
        for a in range(0, self.vocab_size, size):
            b = min(a + size, self.vocab_size)
            raw = self._src.rows("embed.weight", a, b)
            u = raw if unembed == "embed.weight" else self._src.rows(unembed, a, b)
            yield (raw * scale if scale is not None else raw), (u * final if final is not None else u).T
            del raw, u

    def layer(self, layer: int) -> LayerWeights:
        """Layer ``layer``'s :class:`LayerWeights`; ``ValueError`` outside ``[0, n_layers)``."""
        if not 0 <= layer < self.n_layers:
            raise ValueError(f"layer must be in [0, {self.n_layers}); got {layer}")
        p, d = f"blocks.{layer}.", self.d_head
        heads, kv_index = self._src.layout(layer)
        ln = self._norm_scale(p + "ln1") if self._fold else None

        def split_in(name: str, n: int):  # nn.Linear weight [n * d_head, d_model] -> [n, d_model, d_head]
            w = self._src.tensor(p + f"attn.{name}.weight").view(n, d, -1).transpose(1, 2)
            if ln is not None:
                w = ln[None, :, None] * w
            return w.contiguous()

        n, n_kv = len(heads), len(set(kv_index))
        W_O = self._src.tensor(p + "attn.o_proj.weight").view(-1, n, d).permute(1, 2, 0).contiguous()
        return LayerWeights(
            layer=layer,
            heads=heads,
            kv_index=torch.tensor(kv_index, dtype=torch.long),
            W_Q=split_in("q_proj", n),
            W_K=split_in("k_proj", n_kv),
            W_V=split_in("v_proj", n_kv),
            W_O=W_O,
        )

    def layers(self) -> Iterator[LayerWeights]:
        """Every layer's :class:`LayerWeights` in order, built one at a time."""
        for layer in range(self.n_layers):
            yield self.layer(layer)


def head_weights(model, *, fold_norms: bool = True) -> ModelWeights:
    """A :class:`ModelWeights` view of an in-house model (an ``InHouseModel`` or its
    :class:`Transformer`). Other backends raise :class:`ModelIncompatibleError` (load with
    ``backend="inhouse"``, or read the checkpoint lazily:
    :func:`~headscope.probes.models.lazy_weights.lazy_weights`)."""
    module = model if isinstance(model, Transformer) else getattr(model, "network", None)
    if not isinstance(module, Transformer):
        raise ModelIncompatibleError(
            f"weights-only analyses read the in-house transformer; got a {type(model).__name__}. "
            "Load the model with backend='inhouse' (--backend inhouse)."
        )
    return ModelWeights(module.cfg, _ModuleSource(module), fold_norms=fold_norms)
