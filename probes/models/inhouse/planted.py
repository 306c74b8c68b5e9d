"""Tiny in-house models whose heads are built by hand: ground truth for the role classifiers.

:func:`planted_model` returns an :class:`~headscope.probes.models.backends.inhouse.InHouseModel` (a
2-layer, 4-head Llama-family :class:`~headscope.probes.models.inhouse.transformer.Transformer` with
learned absolute positions, d_model 128, d_head 64) and a word-level tokenizer over a
35-word vocabulary with word classes. The residual stream is laid out in blocks:
token one-hot ``[0, V)``, position one-hot ``[V, V + 48)``, "previous token" one-hot
``[V + 48, 2V + 48)``. RMSNorm weights are set so each layer reads its input unscaled
(every residual has a known norm), MLPs are zero, and only the previous-token head
writes to the residual (it copies the previous token's one-hot into the third block),
so every head's pattern is exactly what its hand-set ``W_Q``/``W_K`` say.

Heads (``planted_roles(causal)`` returns this map):

=============  =====================================================================
``(0, 0)``     previous token: ``q_i = β e_i``, ``k_j = e_{j+1}`` (peaked on ``j = i - 1``)
``(0, 1)``     first-token sink: every query matches the BOS key
``(0, 2)``     causal: a noun attends the nearest preceding determiner (class
               feature + recency), other queries attend uniformly;
               bidirectional: next token (``k_j = e_{j-1}``)
``(0, 3)``     random ``W_Q``/``W_K`` (seeded)
``(1, 0)``     random
``(1, 1)``     induction: a query matches keys whose previous token (written by
               head (0, 0)) is the query's own token
``(1, 2)``     punctuation: every query matches the punctuation keys
``(1, 3)``     random
=============  =====================================================================

>>> m = planted_model()
>>> m.encode(texts=["the cat sat ."]).tokens
[['[BOS]', 'the', 'cat', 'sat', '.']]
"""

from __future__ import annotations

import random

import torch

from headscope.probes.models.backends.inhouse import InHouseModel
from headscope.probes.models.config import ModelConfig
from headscope.probes.models.inhouse.transformer import Transformer

SPECIALS = ["[PAD]", "[BOS]", "[UNK]"]
WORD_CLASSES = {
    "punct": [".", ",", "!", "?", ";"],
    "det": ["the", "a", "this", "that", "every"],
    "noun": ["cat", "dog", "bird", "table", "tree", "house", "car", "book", "river", "lamp"],
    "verb": ["sat", "ran", "saw", "ate", "liked"],
    "adj": ["big", "small", "red", "old"],
    "other": ["and", "on", "in"],
}
VOCAB = SPECIALS + [w for ws in WORD_CLASSES.values() for w in ws]
N_POS = 48
D_MODEL = 128
D_HEAD = 64
SHARP = 240.0  # q·k before the 1/sqrt(d_head)=1/8 scale: a logit gap of 30
RANDOM_HEADS = ((0, 3), (1, 0), (1, 3))


def planted_tokenizer():
    """Word-level tokenizer over :data:`VOCAB` (split on whitespace and punctuation),
    adding ``[BOS]`` in front; a ``PreTrainedTokenizerFast`` with offsets and special tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(VOCAB)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.post_processor = processors.TemplateProcessing(single="[BOS] $A", special_tokens=[("[BOS]", vocab["[BOS]"])])
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="[BOS]", pad_token="[PAD]", unk_token="[UNK]")


def planted_roles(causal: bool = True) -> dict[tuple[int, int], str]:
    """``{(layer, head): planted behaviour}``; random heads are ``"random"``."""
    roles = {
        (0, 0): "previous",
        (0, 1): "sink",
        (0, 2): "noun->det" if causal else "next",
        (1, 1): "induction",
        (1, 2): "punctuation",
    }
    roles.update({h: "random" for h in RANDOM_HEADS})
    return dict(sorted(roles.items()))


def _ids(cls: str) -> list[int]:
    return [VOCAB.index(w) for w in WORD_CLASSES[cls]]


def _layout() -> tuple[int, int, int]:
    """``(V, POS, PREV)``: the vocabulary size and where the position and previous-token
    blocks of the residual stream start (the token block starts at 0)."""
    v = len(VOCAB)
    return v, v, v + N_POS


def planted_model(*, causal: bool = True, seed: int = 0, random_std: float = 0.5) -> InHouseModel:
    """Build the planted model (see module docstring). ``random_std``: std of the random
    heads' ``W_Q``/``W_K`` entries (0.5 gives logits of std ~0.5: mildly peaked, no role)."""
    V, _POS, PREV = _layout()
    if PREV + V > D_MODEL:
        raise ValueError(f"the residual layout needs {PREV + V} dims; d_model is {D_MODEL}")
    cfg = ModelConfig(
        family="llama",
        n_layers=2,
        d_model=D_MODEL,
        n_heads=4,
        d_head=D_HEAD,
        d_mlp=32,
        vocab_size=V,
        max_positions=N_POS,
        causal=causal,
        positional="learned",
        tie_embeddings=True,
        pad_token_id=0,
        name="planted" + ("" if causal else "-bidirectional"),
    )
    module = Transformer(cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        _plant_residual(module)
        _plant_heads(module, causal=causal, gen=gen, random_std=random_std)
    return InHouseModel(module, planted_tokenizer(), name=cfg.name)


def _plant_residual(module: Transformer) -> None:
    """Zero every weight, then embed token and position one-hot and set the norms so that
    they keep the residual's scale."""
    V, POS, _PREV = _layout()
    for p in module.parameters():
        if p.requires_grad:
            p.zero_()
    module.embed.weight[:, :V] = torch.eye(V)
    module.pos_embed.weight[:, POS : POS + N_POS] = torch.eye(N_POS)
    module.ln_final.weight.fill_(1.0)
    for layer, block in enumerate(module.blocks):
        # residual norm^2 is 2 in layer 0 (token + position), 3 in layer 1 (+ previous token):
        # RMSNorm multiplies by sqrt(d / norm^2); the weight undoes it
        block.ln1.weight.fill_(((2.0 + layer) / D_MODEL) ** 0.5)
        block.ln2.weight.fill_(1.0)


def _plant_heads(module: Transformer, *, causal: bool, gen: torch.Generator, random_std: float) -> None:
    """Write each planted head's ``W_Q``/``W_K`` (and the previous-token head's ``W_V``/``W_O``),
    then the random heads' ``W_Q``/``W_K`` drawn from ``gen``."""
    V, POS, PREV = _layout()
    bos, dets, nouns, puncts = VOCAB.index("[BOS]"), _ids("det"), _ids("noun"), _ids("punct")

    def head(layer, h):
        a = module.blocks[layer].attn
        s = slice(h * D_HEAD, (h + 1) * D_HEAD)
        return a.q_proj.weight[s], a.k_proj.weight[s], a.v_proj.weight[s], a.o_proj.weight[:, s]

    # (0, 0): previous token, and it writes that token into the PREV block
    wq, wk, wv, wo = head(0, 0)
    for i in range(N_POS):
        wq[i, POS + i] = SHARP
        if i + 1 < D_HEAD:
            wk[i + 1, POS + i] = 1.0
    wv[:V, :V] = torch.eye(V)
    wo[PREV : PREV + V, :V] = torch.eye(V)
    # (0, 1): first-token sink
    wq, wk, _, _ = head(0, 1)
    wq[0, POS : POS + N_POS] = SHARP
    wk[0, bos] = 1.0
    # (0, 2)
    wq, wk, _, _ = head(0, 2)
    if causal:  # noun -> nearest preceding determiner: class match (500) + recency (6 per position)
        for n in nouns:
            wq[0, n] = 8 * 500.0
            wq[1, n] = 8 * 6.0
        for d in dets:
            wk[0, d] = 1.0
        wk[1, POS : POS + N_POS] = torch.arange(N_POS, dtype=torch.float32)
    else:  # next token
        for i in range(N_POS):
            wq[i, POS + i] = SHARP
            if i >= 1:
                wk[i - 1, POS + i] = 1.0
    # (1, 1): induction: query token == key's previous token
    wq, wk, _, _ = head(1, 1)
    wq[:V, :V] = SHARP * torch.eye(V)
    wk[:V, PREV : PREV + V] = torch.eye(V)
    # (1, 2): punctuation
    wq, wk, _, _ = head(1, 2)
    wq[0, POS : POS + N_POS] = 8 * 20.0
    for p in puncts:
        wk[0, p] = 1.0
    # random heads: random W_Q, W_K; they write nothing
    for layer, h in RANDOM_HEADS:
        wq, wk, _, _ = head(layer, h)
        wq.copy_(torch.randn(wq.shape, generator=gen) * random_std)
        wk.copy_(torch.randn(wk.shape, generator=gen) * random_std)


def writing_induction(model: InHouseModel, strength: float = 4.0) -> InHouseModel:
    """Give the planted induction head (1, 1) an output, in place: V reads the token block, O
    writes ``strength`` × that token back into the token block (read by the tied
    unembedding). As built, only (0, 0) writes to the residual, so no head moves the logits;
    with this, the previous-token head (0, 0) → induction head (1, 1) circuit predicts the
    token that followed the query token's earlier occurrence (the patching ground truth)."""
    v = len(VOCAB)
    attn = model.module.blocks[1].attn
    s = slice(1 * D_HEAD, 2 * D_HEAD)
    with torch.no_grad():
        attn.v_proj.weight[s][:v, :v] = torch.eye(v)
        attn.o_proj.weight[:, s][:v, :v] = strength * torch.eye(v)
    return model


def writing_successor(model: InHouseModel, words, *, head: tuple[int, int] = (1, 2), strength: float = 4.0):
    """Make ``head`` (default the punctuation head (1, 2)) a successor head, in place: it attends
    the current position, V reads the token block, O writes ``strength`` × the next word of
    ``words`` (an ordinal chain over the planted vocabulary) into the token block, which the tied
    unembedding reads; a word without a successor writes nothing. Returns ``model``.

    >>> m = writing_successor(planted_model(), ["cat", "dog", "bird"])
    >>> logits = m.module(torch.tensor([[VOCAB.index("[BOS]"), VOCAB.index("cat")]]))
    >>> VOCAB[int(logits[0, -1].argmax())]
    'dog'
    """
    v, pos, _ = _layout()
    layer, h = head
    attn = model.module.blocks[layer].attn
    s = slice(h * D_HEAD, (h + 1) * D_HEAD)
    ids = [VOCAB.index(w) for w in words]
    with torch.no_grad():
        for w in (attn.q_proj.weight[s], attn.k_proj.weight[s], attn.v_proj.weight[s], attn.o_proj.weight[:, s]):
            w.zero_()
        for i in range(N_POS):  # attend the current position
            attn.q_proj.weight[s][i, pos + i] = SHARP
            attn.k_proj.weight[s][i, pos + i] = 1.0
        attn.v_proj.weight[s][:v, :v] = torch.eye(v)
        for a, b in zip(ids, ids[1:]):
            attn.o_proj.weight[:, s][b, a] = strength
    return model


def writing_copy_suppression(model: InHouseModel, *, head: tuple[int, int] = (1, 2), strength: float = 4.0):
    """Make ``head`` (default the punctuation head (1, 2); a layer-1 head) a copy-suppression head
    (McDougall et al. 2023), in place: its query matches keys whose previous token (written by the
    previous-token head (0, 0)) is the query's own token, so after ``A B … A`` it attends the
    earlier ``B``, the token the context predicts next; V reads the token block and O writes
    ``-strength`` × that token into the token block, which the tied unembedding reads: it lowers
    the predicted token's logit. Returns ``model``.

    >>> m = writing_copy_suppression(planted_model())
    >>> ids = [VOCAB.index(w) for w in ["[BOS]", "cat", "dog", "bird", "cat"]]
    >>> logits = m.module(torch.tensor([ids]))
    >>> VOCAB[int(logits[0, -1].argmin())]
    'dog'
    """
    v, _, prev = _layout()
    layer, h = head
    if layer != 1:
        raise ValueError(f"the copy-suppression head reads the previous-token head's output: layer 1; got {head}")
    attn = model.module.blocks[layer].attn
    s = slice(h * D_HEAD, (h + 1) * D_HEAD)
    with torch.no_grad():
        for w in (attn.q_proj.weight[s], attn.k_proj.weight[s], attn.v_proj.weight[s], attn.o_proj.weight[:, s]):
            w.zero_()
        attn.q_proj.weight[s][:v, :v] = SHARP * torch.eye(v)
        attn.k_proj.weight[s][:v, prev : prev + v] = torch.eye(v)
        attn.v_proj.weight[s][:v, :v] = torch.eye(v)
        attn.o_proj.weight[:, s][:v, :v] = -strength * torch.eye(v)
    return model


def planted_sentences(n: int, *, seed: int = 0) -> list[str]:
    """``n`` sentences over the planted vocabulary (seeded), e.g. ``"the big cat saw a dog ,
    this bird sat on the table ."``: one or two clauses ``det [adj] noun verb [on] det
    [adj] noun``, joined by ``,``/``and``/``;``, ended by ``.``/``!``/``?``."""
    rng = random.Random(seed)
    W = WORD_CLASSES

    def np_():
        return [rng.choice(W["det"])] + ([rng.choice(W["adj"])] if rng.random() < 0.4 else []) + [rng.choice(W["noun"])]

    def clause():
        return np_() + [rng.choice(W["verb"])] + (["on"] if rng.random() < 0.3 else []) + np_()

    out = []
    for _ in range(n):
        words = clause()
        for _ in range(rng.choice([0, 1, 1, 2])):
            words += [rng.choice([",", "and", ";"])] + clause()
        words.append(rng.choice([".", ".", "!", "?"]))
        out.append(" ".join(words))
    return out


#: the free residual dimensions :func:`writing_function_vector` writes: a demonstration's "this pair
#: follows the task" mark, and the function-vector head's output
TASK_DIM, FV_DIM = 2 * len(VOCAB) + N_POS, 2 * len(VOCAB) + N_POS + 1
#: the planted function-vector task's template: ``"x y , "`` per demonstration, then ``"x"``
FV_TEMPLATE = ("{x} {y} , ", "{x}")


def writing_function_vector(model: InHouseModel, pairs, *, head: tuple[int, int] = (1, 2), strength: float = 4.0):
    """Make ``head`` (default the punctuation head (1, 2); a layer-1 head) a function-vector head
    (Todd et al. 2024) for the task ``pairs`` (``(input word, output word)`` over the planted
    vocabulary, inputs distinct), in place, with the MLPs that detect and execute the task:

    * layer 0's MLP marks a demonstration: at a token ``y`` whose previous token (written by the
      previous-token head (0, 0)) is ``x`` with ``(x, y)`` in ``pairs``, it writes 1 into
      :data:`TASK_DIM` (one gated unit per pair: ``silu(prev_x) · token_y``; a shuffled label gives 0);
    * ``head`` attends the marked positions (a constant query, the key reads :data:`TASK_DIM`), reads
      the mark and writes it into :data:`FV_DIM`: its output at the last position is the function
      vector, ~1 after demonstrations of the task, 0 without any (it then attends evenly to unmarked
      positions);
    * layer 1's MLP executes the task where :data:`FV_DIM` is on: one unit per pair,
      ``silu(fv) · token_x`` writing ``strength`` × ``y`` into the token block (read by the tied
      unembedding).

    So after demonstrations (:data:`FV_TEMPLATE`, ``"x y , … x_q"``) the model predicts ``y_q``;
    with the labels shuffled it predicts no ``y_q``, unless ``head``'s mean output is patched in.
    Returns ``model``.

    >>> pairs = [("cat", "dog"), ("dog", "bird"), ("bird", "cat")]
    >>> m = writing_function_vector(planted_model(), pairs)
    >>> ids = m.tokenizer("cat dog , dog bird , bird")["input_ids"]
    >>> VOCAB[int(m.module(torch.tensor([ids]))[0, -1].argmax())]
    'cat'
    """
    v, pos, prev = _layout()
    layer, h = head
    if layer != 1:
        raise ValueError(f"the function-vector head reads layer 0's task marks: a layer-1 head; got {head}")
    ids = [(VOCAB.index(x), VOCAB.index(y)) for x, y in pairs]
    if len(ids) > D_MODEL // 4 or len({x for x, _ in ids}) != len(ids):
        raise ValueError(f"function-vector pairs: at most {D_MODEL // 4}, inputs distinct; got {pairs}")
    mlp0, mlp1 = model.module.blocks[0].mlp, model.module.blocks[1].mlp
    attn = model.module.blocks[layer].attn
    s = slice(h * D_HEAD, (h + 1) * D_HEAD)
    # ln2 scales a residual of norm^2 3 (token, position, previous token) by sqrt(128 / 3) ~ 6.53:
    # a matching unit's silu(6.53) · 6.53 ~ 42.6, so 1 / 42.6 writes a mark of ~1
    with torch.no_grad():
        for w in (attn.q_proj.weight[s], attn.k_proj.weight[s], attn.v_proj.weight[s], attn.o_proj.weight[:, s]):
            w.zero_()
        for i, (x, y) in enumerate(ids):
            mlp0.gate.weight[i, prev + x] = 1.0
            mlp0.up.weight[i, y] = 1.0
            mlp0.down.weight[TASK_DIM, i] = 1.0 / 42.6
            mlp1.gate.weight[i, FV_DIM] = 1.0
            mlp1.up.weight[i, x] = 1.0
            mlp1.down.weight[y, i] = strength / 32.0  # silu(5.66) · 5.66 ~ 32 at a residual of norm^2 4
        attn.q_proj.weight[s][0, pos : pos + N_POS] = SHARP
        attn.k_proj.weight[s][0, TASK_DIM] = 1.0
        attn.v_proj.weight[s][0, TASK_DIM] = 1.0
        attn.o_proj.weight[:, s][FV_DIM, 0] = 1.15  # the mark reads ~0.87 through ln1's scale
    return model


#: where the planted IOI circuit's S-inhibition head writes the nouns seen so far (one dim per noun)
NAMES_BLOCK = 2 * len(VOCAB) + N_POS


def writing_ioi(
    model: InHouseModel,
    *,
    mover: tuple[int, int] = (1, 2),
    inhibitor: tuple[int, int] = (0, 2),
    strength: float = 4.0,
) -> InHouseModel:
    """Plant an IOI circuit (Wang et al. 2022) over the nouns as names, in place; returns ``model``.

    * ``inhibitor`` (a layer-0 head; default the noun->det head (0, 2)) is an **S-inhibition** head:
      every query attends the nouns before it uniformly and writes their mean one-hot into the
      residual's free block (:data:`NAMES_BLOCK`, one dim per noun). At the end of an IOI prompt
      (IO once, S twice) that block holds IO at 1/3 and S at 2/3.
    * ``mover`` (a layer-1 head; default the punctuation head (1, 2)) is a **name mover**: its
      query matches noun keys (score 60) minus 90 × the key's share in that block (IO: 30, S: 0,
      any other token 0), so it attends IO; V reads the token block and O writes ``strength`` × the
      attended token there, which the tied unembedding reads: it raises ``logit(IO) - logit(S)``.

    No other head writes into the token block, so the mover's direct effect is the whole logit
    difference; on the ABC corruption (three other nouns, once each) it attends them evenly and
    moves neither IO nor S. The inhibitor's corrupted output, patched into the mover's query, makes
    it attend S twice as much as IO: the S-inhibition ground truth of path patching.

    >>> m = writing_ioi(planted_model())
    >>> ids = [VOCAB.index(w) for w in ["[BOS]", "cat", "and", "dog", "sat", "on", "dog", "in"]]
    >>> logits = m.module(torch.tensor([ids]))[0, -1]
    >>> float(logits[VOCAB.index("cat")] - logits[VOCAB.index("dog")]) > 5
    True
    """
    v, pos, _prev = _layout()
    nouns = _ids("noun")
    if NAMES_BLOCK + len(nouns) > D_MODEL:
        raise ValueError(f"the names block needs {NAMES_BLOCK + len(nouns)} dims; d_model is {D_MODEL}")
    (li, hi), (lm, hm) = inhibitor, mover
    if li != 0 or lm != 1:
        raise ValueError(f"the inhibitor is a layer-0 head and the mover a layer-1 head; got {inhibitor}, {mover}")

    def weights(layer, h):
        a = model.module.blocks[layer].attn
        s = slice(h * D_HEAD, (h + 1) * D_HEAD)
        return a.q_proj.weight[s], a.k_proj.weight[s], a.v_proj.weight[s], a.o_proj.weight[:, s]

    with torch.no_grad():
        wq, wk, wv, wo = weights(li, hi)
        for w in (wq, wk, wv, wo):
            w.zero_()
        wq[0, pos : pos + N_POS] = 8 * 30.0  # every query: nouns score 30, the rest 0
        for i, n in enumerate(nouns):
            wk[0, n] = 1.0
            wv[i, n] = 1.0
            wo[NAMES_BLOCK + i, i] = 1.0
        wq, wk, wv, wo = weights(lm, hm)
        for w in (wq, wk, wv, wo):
            w.zero_()
        wq[0, pos : pos + N_POS] = 8 * 60.0
        for i, n in enumerate(nouns):
            wk[0, n] = 1.0
            wq[1 + i, NAMES_BLOCK + i] = -8 * 90.0
            wk[1 + i, n] = 1.0
        wv[:v, :v] = torch.eye(v)
        wo[:v, :v] = strength * torch.eye(v)
    return model
