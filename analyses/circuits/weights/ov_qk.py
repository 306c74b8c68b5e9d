"""Per-head circuits from the weights: OV copying score, OV/QK Frobenius norms and the QK
positional share, each against Gaussian heads of the same shapes and norms.

* ``ov_copying``: Elhage et al. (2021)'s copying score of the full OV circuit
  ``W_E W_V W_O W_U [vocab, vocab]``: the share of its eigenvalue mass that is positive real,
  ``Σ max(Re λ, 0) / Σ |λ|`` (1: the head copies the tokens it attends to; NaN: the circuit
  is exactly zero). Where the vocabulary exceeds :data:`FULL_VOCAB_MAX`, the eigenvalues come
  from the ``d_head × d_head`` factor ``W_O (W_U W_E) W_V``, which has the same nonzero spectrum
  (a cyclic permutation of the product: the circuit has rank ≤ d_head); the ``method`` column
  says which. ``W_U W_E [d_model, d_model]`` is summed over blocks of :data:`VOCAB_CHUNK_BYTES` of rows,
  so the embedding is never held whole.
* ``ov_norm`` ``‖W_V W_O‖_F``, ``qk_norm`` ``‖W_Q W_K^T‖_F``.
* ``qk_positional_share`` (learned absolute positions only: GPT-2, BERT): the QK circuit of the
  direct path from the embeddings, ``(e + p) W_Q W_K^T (e + p)^T``, has a purely positional
  term ``W_pos W_Q W_K^T W_pos^T`` and a purely content one ``W_E W_Q W_K^T W_E^T`` (and two
  cross terms); the share is ``r_pos / (r_pos + r_content)`` with ``r`` the RMS of each term's
  entries (``‖·‖_F / rows``: positions and tokens weigh alike whatever their counts). 1: the
  head looks for positions only (a previous-token head); 0: for tokens only; NaN: neither pure
  term (only cross terms). Norms' centring is not applied (as for the copying score). With RoPE
  (and no position embedding) it is omitted, the reason in ``note``: RoPE rotates ``q`` and
  ``k`` by their positions inside ``q·k``, so the score is ``x_i W_Q R(j - i) W_K^T x_j``, one
  content-dependent term per offset and no additive positional part to compare with content.

Baselines: the statistic on Gaussian heads: ``W_V, W_O`` (resp. ``W_Q, W_K``) replaced by i.i.d.
Gaussian matrices with each matrix's own norm; the embedding and unembedding stay the real ones.
The copying score and the positional share do not change when a matrix is scaled, and a norm
scales with its matrices' norms, so one set of ``n_draws`` Gaussian draws of the model's shapes
serves every head (a norm's draws scaled by the head's two matrix norms): the same law as a
per-head draw, drawn once. ``p_value`` is one-sided (upper), BH-adjusted over the heads of each
statistic.

>>> from headscope.probes.models.inhouse.planted import planted_model, writing_induction
>>> from headscope.probes.models.inhouse.head_weights import head_weights
>>> df = head_circuits(head_weights(writing_induction(planted_model())), n_draws=20)
>>> row = df[(df.statistic == "ov_copying") & (df.layer == 1) & (df["head"] == 1)].iloc[0]
>>> round(float(row.value), 6), row.method, row.verdict
(1.0, 'full', 'above baseline')
>>> prev = df[(df.statistic == "qk_positional_share") & (df.layer == 0) & (df["head"] == 0)].iloc[0]
>>> float(prev.value)  # the previous-token head reads positions only
1.0
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

from headscope.analyses.circuits.weights.baselines import bh_adjust, empirical_p
from headscope.analyses.circuits.weights.frames import ABOVE, HEAD_COLUMNS, NO_CIRCUIT, NOT_ABOVE, OMITTED, tidy

#: vocabularies up to this size get the eigenvalues of the full ``[vocab, vocab]`` OV circuit
FULL_VOCAB_MAX = 2048
#: float32 bytes of the block of embedding (and unembedding) rows read at a time
VOCAB_CHUNK_BYTES = 4 << 20
#: bytes of one block of Gaussian draws (float64); more draws are made a block at a time
DRAW_BLOCK_BYTES = 8 << 20

_POSITIONAL_REASON = {
    "rope": "RoPE rotates q and k by position inside q·k: W_QK has no additive positional/content part",
    "none": "no positional embedding",
}
_NAN_NOTE = {
    "ov_copying": "the OV circuit is exactly zero",
    "qk_positional_share": "no pure positional or content term (the QK circuit reads tokens and positions only across)",
}


def copying_score(eigenvalues: torch.Tensor) -> torch.Tensor:
    """``Σ max(Re λ, 0) / Σ |λ|`` over the last dimension (complex ``[..., k]``) -> ``[...]``;
    NaN where every eigenvalue is 0.

    >>> copying_score(torch.tensor([[2.0, 1.0], [1.0, -1.0]], dtype=torch.complex64)).tolist()
    [1.0, 0.5]
    """
    mass = eigenvalues.abs().sum(-1)
    pos = eigenvalues.real.clamp_min(0).sum(-1)
    return torch.where(mass > 0, pos / torch.where(mass > 0, mass, torch.ones_like(mass)), float("nan"))


def _frob_product(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """``‖A B^T‖_F`` for ``A, B [..., d_model, d_head]`` through ``d_head × d_head`` Gram matrices."""
    A, B = A.double(), B.double()
    return ((A.transpose(-1, -2) @ A) * (B.transpose(-1, -2) @ B)).sum((-1, -2)).clamp_min(0).sqrt()


@dataclass(frozen=True)
class _Embeddings:
    """What every layer needs of the (un)embedding, read once a block of tokens at a time."""

    G: torch.Tensor  # W_U W_E [d_model, d_model]
    S: torch.Tensor  # singular values of G [d_model]
    full: tuple[torch.Tensor, torch.Tensor] | None  # (W_E, W_U) where the vocabulary is small
    C_E: torch.Tensor | None  # W_E^T W_E / vocab [d_model, d_model] (learned positions only)
    C_P: torch.Tensor | None  # W_pos^T W_pos / n_pos


def _embeddings(weights) -> _Embeddings:
    learned = weights.positional == "learned"
    G = torch.zeros(weights.d_model, weights.d_model)
    C_E = torch.zeros(weights.d_model, weights.d_model, dtype=torch.float64) if learned else None
    for e, u in weights.vocab_chunks(max(1, VOCAB_CHUNK_BYTES // (4 * weights.d_model))):
        G += u @ e
        if learned:
            C_E += e.double().T @ e.double()
        del e, u  # before the next block is read
    full = (weights.W_E, weights.W_U) if weights.vocab_size <= FULL_VOCAB_MAX else None
    C_P = None
    if learned:
        P = weights.W_pos.double()
        C_E, C_P = C_E / weights.vocab_size, P.T @ P / P.shape[0]
    return _Embeddings(G=G, S=torch.linalg.svdvals(G.double()).float(), full=full, C_E=C_E, C_P=C_P)


def positional_share(W_Q: torch.Tensor, W_K: torch.Tensor, C_P: torch.Tensor, C_E: torch.Tensor) -> torch.Tensor:
    """``r_pos / (r_pos + r_content)`` (module doc) for ``W_Q, W_K [..., d_model, d_head]`` and the
    scaled Grams ``C = X^T X / rows`` of ``W_pos`` and ``W_E``: ``r² = Σ (W_Q^T C W_Q) ∘ (W_K^T C W_K)``.
    NaN where both terms are 0."""
    Q, K = W_Q.double(), W_K.double()

    def rms(C):
        return ((Q.transpose(-1, -2) @ C @ Q) * (K.transpose(-1, -2) @ C @ K)).sum((-1, -2)).clamp_min(0).sqrt()

    pos, content = rms(C_P), rms(C_E)
    tot = pos + content
    return torch.where(tot > 0, pos / torch.where(tot > 0, tot, torch.ones_like(tot)), float("nan"))


def _draw_blocks(n: int, numel: int) -> list[int]:
    """Sizes of consecutive blocks of ``n`` draws of ``numel`` float64 numbers each, every block
    of at most :data:`DRAW_BLOCK_BYTES` (one draw at least): memory stays bounded on any model."""
    step = max(1, DRAW_BLOCK_BYTES // (8 * numel))
    return [min(step, n - a) for a in range(0, n, step)]


def _gaussian_nulls(weights, emb: _Embeddings, n: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """``{statistic: [n]}``: each scale-free statistic on ``n`` Gaussian heads of the model's shapes
    (the norms' ``‖A B^T‖ / (‖A‖ ‖B‖)``)."""
    d, k = weights.d_model, weights.d_head
    out: dict[str, list[torch.Tensor]] = {"ov_copying": [], "ov_norm": [], "qk_norm": []}
    if emb.C_P is not None:
        out["qk_positional_share"] = []
    for m in _draw_blocks(n, d * k):

        def g(*shape, m=m):
            return torch.randn((m, *shape), generator=gen, dtype=torch.float64)

        out["ov_copying"].append(copying_score(torch.linalg.eigvals((g(k, d) * emb.S.double()) @ g(d, k))))
        for stat in ("ov_norm", "qk_norm"):
            A, B = g(d, k), g(d, k)
            out[stat].append(_frob_product(A, B) / (A.flatten(1).norm(dim=-1) * B.flatten(1).norm(dim=-1)))
        if emb.C_P is not None:
            out["qk_positional_share"].append(positional_share(g(d, k), g(d, k), emb.C_P, emb.C_E))
    return {s: torch.cat(v).float() for s, v in out.items()}


def _layer_stats(lw, emb: _Embeddings, nulls: dict[str, torch.Tensor]) -> dict:
    """``{statistic: (value [head], method, null [n, head])}`` of one layer."""
    W_V, W_K = lw.W_V[lw.kv_index], lw.W_K[lw.kv_index]  # [head, d_model, d_head]
    n_heads = len(lw.heads)
    if emb.full is not None:
        W_E, W_U = emb.full
        full = W_E.double() @ W_V.double() @ lw.W_O.double() @ W_U.double()  # [head, vocab, vocab]
        copying, method = copying_score(torch.linalg.eigvals(full)), "full"
    else:
        GV = emb.G.double() @ lw.W_V.double()  # [kv_head, d_model, d_head]: once per KV group
        factor = lw.W_O.double() @ GV[lw.kv_index]  # W_O (W_U W_E) W_V [head, d_head, d_head]
        copying, method = copying_score(torch.linalg.eigvals(factor)), "factor W_O W_U W_E W_V"
    O_t = lw.W_O.transpose(-1, -2)  # [head, d_model, d_head]: ‖W_V W_O‖ = ‖W_V (O^T)^T‖

    def scale(A, B):  # a norm's Gaussian draws, scaled by the head's own two matrix norms
        return A.flatten(1).norm(dim=-1) * B.flatten(1).norm(dim=-1)

    stats = {
        "ov_copying": (copying.float(), method, nulls["ov_copying"][:, None].expand(-1, n_heads)),
        "ov_norm": (_frob_product(W_V, O_t).float(), "frobenius", nulls["ov_norm"][:, None] * scale(W_V, O_t)),
        "qk_norm": (_frob_product(lw.W_Q, W_K).float(), "frobenius", nulls["qk_norm"][:, None] * scale(lw.W_Q, W_K)),
    }
    if emb.C_P is not None:
        share = positional_share(lw.W_Q, W_K, emb.C_P, emb.C_E).float()
        stats["qk_positional_share"] = (
            share,
            "rms pure terms",
            nulls["qk_positional_share"][:, None].expand(-1, n_heads),
        )
    return stats


def _layer_rows(lw, stats: dict, n_draws: int) -> list[dict]:
    rows = []
    for statistic, (value, method, null) in stats.items():
        p = empirical_p(value, null)
        mean, sd = null.mean(0), null.std(0)
        for i, h in enumerate(lw.heads):
            v = float(value[i])
            rows.append(
                dict(
                    layer=lw.layer,
                    head=h,
                    kv_head=int(lw.kv_index[i]),
                    statistic=statistic,
                    value=v,
                    method=method,
                    baseline_mean=float(mean[i]),
                    baseline_sd=float(sd[i]),
                    margin=v - float(mean[i]),
                    p_value=float(p[i]),
                    n=n_draws,
                    note="" if v == v else _NAN_NOTE.get(statistic, "undefined"),
                )
            )
    return rows


def head_circuits(weights, *, n_draws: int = 200, seed: int = 0, alpha: float = 0.05) -> pd.DataFrame:
    """Per-head OV copying score, OV and QK norms and QK positional share of ``weights`` (a
    :class:`~headscope.probes.models.inhouse.head_weights.ModelWeights`), read one layer at a time,
    each against ``n_draws`` Gaussian heads (seeded by ``seed``). Frame: :data:`HEAD_COLUMNS`;
    ``verdict``: ``above baseline`` where the BH-adjusted p is ≤ ``alpha``, ``no circuit`` where
    the statistic is undefined (a zero OV circuit; no pure QK term), ``omitted`` for
    ``qk_positional_share`` without learned positions (reason in ``note``).
    ``ValueError`` for ``n_draws < 1``. The same as :func:`head_verdicts` of the
    :func:`head_rows` of every layer (a sharded run computes the rows by layer, then the verdicts)."""
    return head_verdicts(weights, head_rows(weights, n_draws=n_draws, seed=seed), alpha=alpha)


def head_rows(weights, *, n_draws: int = 200, seed: int = 0, layers=None) -> pd.DataFrame:
    """The per-head rows of :func:`head_circuits` for ``layers`` (None: all), before the
    multiple-comparison adjustment: ``p_adjusted`` and ``verdict`` empty. Each head's value and
    p-value depend on its layer and on the null (drawn from ``seed`` for the whole model) alone,
    so the rows of disjoint layer sets, concatenated in layer order, are those of all layers."""
    if n_draws < 1:
        raise ValueError(f"n_draws must be >= 1; got {n_draws}")
    emb = _embeddings(weights)  # [d_model, d_model] summaries, once per model
    nulls = _gaussian_nulls(weights, emb, n_draws, torch.Generator().manual_seed(seed))
    wanted = range(weights.n_layers) if layers is None else sorted(set(layers))
    rows: list[dict] = []
    for layer in wanted:
        lw = weights.layer(layer)
        rows += _layer_rows(lw, _layer_stats(lw, emb, nulls), n_draws)
    return tidy(rows, HEAD_COLUMNS)


def head_verdicts(weights, rows: pd.DataFrame, *, alpha: float = 0.05) -> pd.DataFrame:
    """:func:`head_rows` of every layer (concatenated in layer order) -> :func:`head_circuits`'
    frame: the BH adjustment over all heads per statistic, the verdicts, the omitted rows."""
    df = tidy(rows.to_dict("records"), HEAD_COLUMNS)
    df["p_adjusted"] = float("nan")
    for _statistic, idx in df.groupby("statistic", observed=True).groups.items():
        df.loc[idx, "p_adjusted"] = bh_adjust(torch.tensor(df.loc[idx, "p_value"].to_numpy())).numpy()
    verdict = df["p_adjusted"].le(alpha).map({True: ABOVE, False: NOT_ABOVE})
    verdict[df["value"].isna()] = NO_CIRCUIT
    df["verdict"] = verdict
    if weights.positional != "learned":  # no C_P (see _embeddings): no clean positional split
        df = pd.concat([df, _omitted_rows(weights, df)], ignore_index=True)
    return tidy(df.to_dict("records"), HEAD_COLUMNS)


def _omitted_rows(weights, df: pd.DataFrame) -> pd.DataFrame:
    """One ``qk_positional_share`` row per head, value NaN, verdict ``omitted``, the reason in ``note``."""
    heads = df[df.statistic == "ov_copying"][["layer", "head", "kv_head"]]
    reason = _POSITIONAL_REASON.get(weights.positional, f"positional kind {weights.positional!r}: no clean split")
    return heads.assign(
        statistic="qk_positional_share", value=float("nan"), method="", verdict=OMITTED, note=reason, n=0
    )
