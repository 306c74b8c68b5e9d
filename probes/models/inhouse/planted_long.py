"""A planted in-house model for the long-context roles and the KV-cache study: one copy head,
one local-window head, every other head random and silent.

:func:`planted_long_model` returns an :class:`~headscope.probes.models.backends.inhouse.InHouseModel`:
a 2-layer, 4-head Llama-family :class:`~headscope.probes.models.inhouse.transformer.Transformer`
with learned absolute positions (:data:`N_POS` = 384 of them, so items of a few hundred tokens
run on CPU in a test), and a lower-casing word-level tokenizer over the bench grammar's
words (:data:`~headscope.probes.corpora.bench_sentences.WORDS`), the needle words
and cue of :mod:`~headscope.probes.corpora.needle_words`, so every needle item is known words.
The residual stream is laid out in blocks: token one-hot ``[0, V)``, position one-hot
``[V, V + N_POS)``, "recent tokens" ``[V + N_POS, 2V + N_POS)``. MLPs are zero.

Heads (``planted_long_roles()`` returns this map):

=============  =====================================================================
``(0, 0)``     local window (:data:`LOCAL_HEAD`): query ``i`` attends keys ``i - WINDOW + 1 ..
               i - 1`` only (itself at ``i = 0``), with weights ``∝ exp(-DECAY (i - 1 - j))``
               (95 % on ``i - 1``); it writes their tokens into the "recent" block
``(1, 1)``     copy (:data:`COPY_HEAD`): a query matches the keys whose "recent" block holds
               its own token (the key after an earlier copy of the query's token: the
               needle token to copy at the answer), and writes that key's token
               ``COPY_STRENGTH`` times into the token block, read by the tied unembedding
others         random ``W_Q``/``W_K`` (seeded), zero ``W_V``/``W_O``: they write nothing
=============  =====================================================================

So the model copies the needle (at ``answer[i] - 1`` it predicts ``needle[i]``'s token), and
without the copy head it predicts the current token instead (copy accuracy 0). The copy
head needs the local head's "recent" block; no other head changes any logit.

>>> m = planted_long_model()
>>> m.encode(texts=["The secret words are apple"]).tokens
[['[BOS]', 'the', 'secret', 'words', 'are', 'apple']]
"""

from __future__ import annotations

import math

import torch

from headscope.probes.models.backends.inhouse import InHouseModel
from headscope.probes.models.config import ModelConfig
from headscope.probes.models.inhouse.transformer import Transformer

SPECIALS = ["[PAD]", "[BOS]", "[UNK]"]
PUNCT = [".", ",", ";", "!", "?", ":"]
N_POS = 384
N_HEADS = 4
D_HEAD = N_POS  # a head's Q/K hold a position one-hot
LOCAL_HEAD, COPY_HEAD = (0, 0), (1, 1)
WINDOW = 4  # the local head's keys: the query's WINDOW - 1 predecessors
DECAY = 3.0  # logit step per position back inside the window
OUTSIDE = -60.0  # logit of a key outside the window
MATCH = 30.0  # copy head: logit of a key holding the query's token in its "recent" block
COPY_STRENGTH = 4.0


def _vocab() -> list[str]:
    from headscope.probes.corpora.bench_sentences import WORDS
    from headscope.probes.corpora.needle_words import NEEDLE_WORDS, PREFIX, SUFFIX

    words = [w.lower() for ws in WORDS.values() for w in ws] + [w.lower() for w in NEEDLE_WORDS]
    words += PREFIX.lower().split() + SUFFIX.split() + PUNCT
    out = list(SPECIALS)
    for w in words:
        if w not in out:
            out.append(w)
    return out


VOCAB = _vocab()


def planted_long_tokenizer():
    """Lower-casing word-level tokenizer over :data:`VOCAB` (split on whitespace and
    punctuation), ``[BOS]`` in front; a ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(VOCAB)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tk.normalizer = normalizers.Lowercase()
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.post_processor = processors.TemplateProcessing(single="[BOS] $A", special_tokens=[("[BOS]", vocab["[BOS]"])])
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="[BOS]", pad_token="[PAD]", unk_token="[UNK]")


def planted_long_roles() -> dict[tuple[int, int], str]:
    """``{(layer, head): planted behaviour}``: ``"local"``, ``"copy"``, the rest ``"random"``."""
    roles = {(l, h): "random" for l in range(2) for h in range(N_HEADS)}
    roles[LOCAL_HEAD], roles[COPY_HEAD] = "local", "copy"
    return roles


def _layout() -> tuple[int, int, int, int]:
    """``(V, POS, RECENT, d_model)``: the vocabulary size, where the position and "recent"
    blocks start, and the residual width (a multiple of 64 holding the three blocks)."""
    v = len(VOCAB)
    return v, v, v + N_POS, 64 * math.ceil((2 * v + N_POS) / 64)


def planted_long_model(*, seed: int = 0, random_std: float = 0.05) -> InHouseModel:
    """Build the model of the module docstring. ``random_std``: std of the random heads'
    ``W_Q``/``W_K`` entries (0.05: attention logits of std ~1, no role)."""
    V, _POS, _RECENT, d_model = _layout()
    cfg = ModelConfig(
        family="llama",
        n_layers=2,
        d_model=d_model,
        n_heads=N_HEADS,
        d_head=D_HEAD,
        d_mlp=32,
        vocab_size=V,
        max_positions=N_POS,
        causal=True,
        positional="learned",
        tie_embeddings=True,
        pad_token_id=0,
        name="planted-long",
    )
    module = Transformer(cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        _plant_residual(module, d_model)
        _plant_heads(module, gen=gen, random_std=random_std)
    return InHouseModel(module, planted_long_tokenizer(), name=cfg.name)


def _plant_residual(module: Transformer, d_model: int) -> None:
    """Zero every weight, embed token and position one-hot, and set the norms: layer 0 reads
    its input unscaled (token + position: norm² 2), layer 1 nearly so (+ the "recent"
    block, norm² about 0.9)."""
    V, POS, _RECENT, _ = _layout()
    for p in module.parameters():
        if p.requires_grad:
            p.zero_()
    module.embed.weight[:, :V] = torch.eye(V)
    module.pos_embed.weight[:, POS : POS + N_POS] = torch.eye(N_POS)
    module.ln_final.weight.fill_(1.0)
    for layer, block in enumerate(module.blocks):
        block.ln1.weight.fill_(((2.0 + 0.9 * layer) / d_model) ** 0.5)
        block.ln2.weight.fill_(1.0)


def _local_logits() -> torch.Tensor:
    """``[query_pos, key_pos]`` logits of the local head: ``-DECAY (i - 1 - j)`` for the
    ``WINDOW - 1`` keys before ``i``, :data:`OUTSIDE` elsewhere (key 0 for query 0: 0)."""
    i = torch.arange(N_POS)[:, None]
    j = torch.arange(N_POS)[None, :]
    back = i - j
    inside = (back >= 1) & (back < WINDOW)
    out = torch.where(inside, -DECAY * (back - 1).float(), torch.full((N_POS, N_POS), OUTSIDE))
    out[0, 0] = 0.0
    return out


def _plant_heads(module: Transformer, *, gen: torch.Generator, random_std: float) -> None:
    V, POS, RECENT, _ = _layout()
    root = math.sqrt(D_HEAD)  # undoes the 1/sqrt(d_head) scale

    def head(layer, h):
        a = module.blocks[layer].attn
        s = slice(h * D_HEAD, (h + 1) * D_HEAD)
        return a.q_proj.weight[s], a.k_proj.weight[s], a.v_proj.weight[s], a.o_proj.weight[:, s]

    # local window: q_i = root * e_i, k_j[i] = logit(i, j); writes its keys' tokens into RECENT
    wq, wk, wv, wo = head(*LOCAL_HEAD)
    wq[:, POS : POS + N_POS] = root * torch.eye(N_POS)
    wk[:, POS : POS + N_POS] = _local_logits()
    wv[:V, :V] = torch.eye(V)
    wo[RECENT : RECENT + V, :V] = torch.eye(V)
    # copy: query token == a token in the key's RECENT block; writes the key's token
    wq, wk, wv, wo = head(*COPY_HEAD)
    wq[:V, :V] = MATCH * root * torch.eye(V)
    wk[:V, RECENT : RECENT + V] = torch.eye(V)
    wv[:V, :V] = torch.eye(V)
    wo[:V, :V] = COPY_STRENGTH * torch.eye(V)
    for layer in range(2):
        for h in range(N_HEADS):
            if (layer, h) in (LOCAL_HEAD, COPY_HEAD):
                continue
            wq, wk, _, _ = head(layer, h)
            wq.copy_(torch.randn(wq.shape, generator=gen) * random_std)
            wk.copy_(torch.randn(wk.shape, generator=gen) * random_std)
