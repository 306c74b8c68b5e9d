"""Which context words shape a token: for one word of one sentence, every context word ranked
by its norm-based contribution per layer (Kobayashi et al. 2020, summed over heads:
``‖Σ_h α^h_ij v^h_j W_O^h‖``), by the raw weight averaged over heads, and through the layers by
rollout (Abnar & Zuidema 2020) of the raw and of the norm-based weights.

Frame columns: ``layer, method`` (norm, raw, rollout_raw, rollout_norm), ``context`` (the
word, or the special token), ``position`` (its first token), ``value`` (share of the
target's row, pieces summed), ``rank`` (1 = largest, per layer and method).
"""

from __future__ import annotations

import pandas as pd
import torch

from headscope.analyses.context import attention as A
from headscope.analyses.context import measures as M
from headscope.probes.states import sentence_states


def target_positions(tokens, word: str, pooling: str, piece: int | None) -> list[int]:
    """The token positions of ``word`` (its first occurrence, case-insensitive) in a one-text
    :class:`~headscope.probes.tokens.TokenBatch`, pooled as ``pooling`` says or the one ``piece``.
    ``ValueError`` listing the sentence's words and tokenizer pieces when ``word`` is none of
    them, or when ``piece`` is not one of its pieces."""
    spans = M.word_spans(tokens)
    hits = [p for w, p in spans if w.lower() == word.lower()]
    if not hits:
        words = [w for w, _ in spans]
        pieces = [t for t, s in zip(tokens.tokens[0], tokens.special[0]) if not s]
        raise ValueError(f"word {word!r} is not in the sentence; its words: {words}; its pieces: {pieces}")
    pos = hits[0]
    if piece is not None:
        if not 0 <= piece < len(pos):
            raise ValueError(f"piece must be in [0, {len(pos)}) for {word!r} ({len(pos)} pieces); got {piece}")
        return [pos[piece]]
    return pos[:1] if pooling == "first" else pos


def check_target(tokenizer, sentence: str, word: str, pooling: str = "mean", piece: int | None = None) -> None:
    """Raise :func:`target_positions`' ``ValueError`` when ``word`` (or its ``piece``) is not in
    ``sentence`` as ``tokenizer`` reads it; nothing runs a model."""
    from headscope.probes.tokens import encode

    target_positions(encode(tokenizer, [sentence]), word, pooling, piece)


def _units(st) -> list[tuple[str, list[int]]]:
    """Context units: each word (pieces together) and each special token alone, in position order."""
    units = [(t, [i]) for i, t in enumerate(st.tokens.tokens[0]) if st.special[i]]
    return sorted(units + M.word_spans(st.tokens), key=lambda u: u[1][0])


def contributions_frame(model, sentence: str, word: str, pooling: str, piece: int | None, weights) -> pd.DataFrame:
    """The ranked context words of ``word`` in ``sentence`` (see the module doc); ``ValueError``
    listing the sentence's words and pieces when ``word`` is not one of them."""
    st = sentence_states(model, sentence, weights=weights)
    rows = target_positions(st.tokens, word, pooling, piece)
    units = _units(st)
    allowed = A.allowed_keys(st.n_pos, st.causal)
    norm_mats, raw_mats = [], []
    for l, pattern in enumerate(st.pattern):
        norm_mats.append(A.layer_contributions(pattern, st.v[l], st.W_O[l]) * allowed)
        raw_mats.append(pattern.float().mean(0))
    by_method = {
        "norm": torch.stack(norm_mats),
        "raw": torch.stack(raw_mats),
        "rollout_raw": A.rollout(raw_mats),
        "rollout_norm": A.rollout(norm_mats),
    }
    out = []
    for method, mats in by_method.items():
        target = mats[:, rows].mean(1)  # [layer, key_pos]
        target = target / target.sum(-1, keepdim=True).clamp_min(1e-30)
        for l in range(target.shape[0]):
            vals = [(name, pos[0], float(target[l, pos].sum())) for name, pos in units]
            ranked = sorted(vals, key=lambda x: -x[2])
            out += [
                {"layer": l, "method": method, "context": n, "position": p, "value": v, "rank": r + 1}
                for r, (n, p, v) in enumerate(ranked)
            ]
    return pd.DataFrame(out)
