"""Per-head circuits from the weights: OV copying score and OV/QK Frobenius norms, each against
Gaussian heads of the same shapes and norms.

* ``ov_copying``: Elhage et al. (2021)'s copying score of the full OV circuit
  ``W_E W_V W_O W_U [vocab, vocab]``: the share of its eigenvalue mass that is positive real,
  ``Σ max(Re λ, 0) / Σ |λ|`` (1: the head copies the tokens it attends to; NaN: the circuit
  is exactly zero). Where the vocabulary exceeds :data:`FULL_VOCAB_MAX`, the eigenvalues come
  from the ``d_head × d_head`` factor ``W_O W_U W_E W_V``, which has the same nonzero spectrum
  (a cyclic permutation of the product); the ``method`` column says which.
* ``ov_norm`` ``‖W_V W_O‖_F``, ``qk_norm`` ``‖W_Q W_K^T‖_F``.
* ``qk_positional_share`` is omitted on every model, with the reason in ``note``.

Baselines: ``n_draws`` Gaussian replacements of ``W_V, W_O`` (resp. ``W_Q, W_K``) with each
matrix's own norm; the embedding and unembedding stay the real ones. ``p_value`` is one-sided
(upper), BH-adjusted over the heads of each statistic.

>>> from headscope.probes.models.inhouse.planted import planted_model, writing_induction
>>> from headscope.probes.models.inhouse.head_weights import head_weights
>>> df = head_circuits(head_weights(writing_induction(planted_model())), n_draws=20)
>>> row = df[(df.statistic == "ov_copying") & (df.layer == 1) & (df["head"] == 1)].iloc[0]
>>> round(float(row.value), 6), row.method, row.verdict
(1.0, 'full', 'above baseline')
"""

from __future__ import annotations

import pandas as pd
import torch

from headscope.analyses.circuits.baselines import bh_adjust, empirical_p, gaussian_like
from headscope.analyses.circuits.frames import ABOVE, HEAD_COLUMNS, NO_CIRCUIT, NOT_ABOVE, OMITTED, tidy

#: vocabularies up to this size get the eigenvalues of the full ``[vocab, vocab]`` OV circuit
FULL_VOCAB_MAX = 2048

_POSITIONAL_REASON = {
    "rope": "RoPE rotates q and k by position inside q·k: W_QK has no additive positional/content part",
    "learned": "learned positions: the split needs W_pos through the norms, not read by this analysis yet",
    "none": "no positional embedding",
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


def ov_factor(W_V: torch.Tensor, W_O: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """``W_O G W_V``: ``W_V [..., d_model, d_head]``, ``W_O [..., d_head, d_model]``, ``G = W_U W_E
    [d_model, d_model]`` -> ``[..., d_head, d_head]`` (nonzero spectrum of ``W_E W_V W_O W_U``)."""
    return W_O.double() @ G.double() @ W_V.double()


def _frob_product(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """``‖A B^T‖_F`` for ``A, B [..., d_model, d_head]`` through ``d_head × d_head`` Gram matrices."""
    A, B = A.double(), B.double()
    return ((A.transpose(-1, -2) @ A) * (B.transpose(-1, -2) @ B)).sum((-1, -2)).clamp_min(0).sqrt()


def _copying(lw, G, W_E, W_U, n_draws, gen):
    """``(value [head], method, null [n, head])`` of the copying score of one layer."""
    W_V = lw.W_V[lw.kv_index]  # [head, d_model, d_head]
    if W_E.shape[0] <= FULL_VOCAB_MAX:
        full = W_E.double() @ W_V.double() @ lw.W_O.double() @ W_U.double()  # [head, vocab, vocab]
        value, method = copying_score(torch.linalg.eigvals(full)), "full"
    else:
        value, method = copying_score(torch.linalg.eigvals(ov_factor(W_V, lw.W_O, G))), "factor W_O W_U W_E W_V"
    # Gaussian W_O', W_V' are rotation-invariant, so W_O' G W_V' has the law of W_O' diag(svd(G)) W_V'
    # (d_model² fewer flops per draw); S is G's singular values
    S = torch.linalg.svdvals(G.double()).float()
    null_factor = (gaussian_like(lw.W_O, n_draws, gen) * S) @ gaussian_like(W_V, n_draws, gen)
    null = copying_score(torch.linalg.eigvals(null_factor))
    return value.float(), method, null.float()


def _norms(lw, n_draws, gen):
    """``{statistic: (value [head], null [n, head])}`` of the OV and QK norms of one layer."""
    W_V, W_K = lw.W_V[lw.kv_index], lw.W_K[lw.kv_index]
    O_t = lw.W_O.transpose(-1, -2)  # [head, d_model, d_head]: ‖W_V W_O‖ = ‖W_V (O^T)^T‖
    return {
        "ov_norm": (
            _frob_product(W_V, O_t).float(),
            _frob_product(gaussian_like(W_V, n_draws, gen), gaussian_like(O_t, n_draws, gen)).float(),
        ),
        "qk_norm": (
            _frob_product(lw.W_Q, W_K).float(),
            _frob_product(gaussian_like(lw.W_Q, n_draws, gen), gaussian_like(W_K, n_draws, gen)).float(),
        ),
    }


def _layer_rows(lw, stats: dict, n_draws: int) -> list[dict]:
    rows = []
    for statistic, (value, method, null) in stats.items():
        p = empirical_p(value, null)
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
                    baseline_mean=float(null[:, i].mean()),
                    baseline_sd=float(null[:, i].std()),
                    margin=v - float(null[:, i].mean()),
                    p_value=float(p[i]),
                    n=n_draws,
                    note="" if v == v else "the OV circuit is exactly zero",
                )
            )
    return rows


def head_circuits(weights, *, n_draws: int = 200, seed: int = 0, alpha: float = 0.05) -> pd.DataFrame:
    """Per-head OV copying score, OV and QK norms of ``weights`` (a
    :class:`~headscope.probes.models.inhouse.head_weights.ModelWeights`), read one layer at a time,
    each against ``n_draws`` Gaussian heads (seed ``seed + layer``). Frame: :data:`HEAD_COLUMNS`;
    ``verdict``: ``above baseline`` where the BH-adjusted p is ≤ ``alpha``, ``no circuit`` for a
    zero OV circuit, ``omitted`` for ``qk_positional_share`` (reason in ``note``).
    ``ValueError`` for ``n_draws < 1``."""
    if n_draws < 1:
        raise ValueError(f"n_draws must be >= 1; got {n_draws}")
    W_E, W_U = weights.W_E, weights.W_U
    G = W_U @ W_E  # [d_model, d_model], once per model
    rows: list[dict] = []
    for lw in weights.layers():
        gen = torch.Generator().manual_seed(seed + lw.layer)
        value, method, null = _copying(lw, G, W_E, W_U, n_draws, gen)
        stats = {"ov_copying": (value, method, null)}
        stats.update({k: (v, "frobenius", nl) for k, (v, nl) in _norms(lw, n_draws, gen).items()})
        rows += _layer_rows(lw, stats, n_draws)
    df = tidy(rows, HEAD_COLUMNS)
    df["p_adjusted"] = float("nan")
    for _statistic, idx in df.groupby("statistic", observed=True).groups.items():
        df.loc[idx, "p_adjusted"] = bh_adjust(torch.tensor(df.loc[idx, "p_value"].to_numpy())).numpy()
    verdict = df["p_adjusted"].le(alpha).map({True: ABOVE, False: NOT_ABOVE})
    verdict[df["value"].isna()] = NO_CIRCUIT
    df["verdict"] = verdict
    omitted = _omitted_rows(weights, df)
    return tidy(pd.concat([df, omitted], ignore_index=True).to_dict("records"), HEAD_COLUMNS)


def _omitted_rows(weights, df: pd.DataFrame) -> pd.DataFrame:
    """One ``qk_positional_share`` row per head, value NaN, verdict ``omitted``, the reason in ``note``."""
    heads = df[df.statistic == "ov_copying"][["layer", "head", "kv_head"]]
    reason = _POSITIONAL_REASON.get(weights.positional, f"positional kind {weights.positional!r}: no clean split")
    return heads.assign(
        statistic="qk_positional_share", value=float("nan"), method="", verdict=OMITTED, note=reason, n=0
    )
