"""Composition scores between every pair of heads in different layers, through Q, K and V
(Elhage et al. 2021), GQA-aware, against Gaussian matrices of the same shapes.

The score of sender head ``A`` (earlier layer) into receiver ``B`` is transformer-lens's
(``TransformerBridge.all_composition_scores`` / ``utilities.matrix.composition_scores``):
``‖OV_A R_B‖_F / (‖OV_A‖_F ‖R_B‖_F)`` with the sender's OV circuit on the left,
``OV_A = W_V[kv(A)] W_O[A] [d_model, d_model]`` (``x @ W`` convention), and on the right

* ``Q``: ``R_B = W_Q[B] W_K[kv(B)]^T``; ``K``: ``R_B = W_K[kv(B)] W_Q[B]^T`` (the QK circuit
  transposed); ``V``: ``R_B = W_V[kv(B)] W_O[B]``.

``level = "head"`` rows give that score per query head ``B`` (K/V expanded to query heads, as
transformer-lens's ``_expand_kv_heads``). On GQA/MQA a KV head's key and value inputs are shared
by its whole group, so ``level = "kv_group"`` rows give K- and V-composition per KV group ``g``
through the shared input alone: ``R_g = W_K[g]`` (K) or ``W_V[g]`` (V), the same score for every
query head of the group (``receiver_head`` is empty there). Q has head rows only.

Products are never formed at ``d_model × d_model``: with ``W_V = Q R`` (reduced QR),
``‖W_V W_O X Y^T‖ = ‖(R W_O) (X R_Y^T)‖`` where ``Y = Q_Y R_Y``.

Baseline: the score is invariant to each matrix's scale, so one null distribution per
``(mode, level)`` serves every pair: ``n_null`` draws of Gaussian ``W_V, W_O, X, Y`` of the
model's shapes. ``p_value`` is one-sided (upper), BH-adjusted over all pairs of a
``(mode, level)``; ``verdict`` ``above baseline`` where the adjusted p is ≤ ``alpha``. The
Gaussian null ignores the real weights' anisotropy (a trained model's matrices share
directions, so many pairs beat it); rank pairs by ``value`` or ``margin`` too.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from headscope.analyses.circuits.baselines import bh_adjust, empirical_p
from headscope.analyses.circuits.frames import ABOVE, COMPOSITION_COLUMNS, NOT_ABOVE

#: (mode, level) of every score family, in frame order
FAMILIES = (("Q", "head"), ("K", "head"), ("K", "kv_group"), ("V", "head"), ("V", "kv_group"))


def _r_factor(Y: torch.Tensor) -> torch.Tensor:
    """``R`` of the reduced QR ``Y = Q R`` (``[..., d_model, d_head]`` -> ``[..., k, d_head]``)."""
    return torch.linalg.qr(Y.double(), mode="reduced").R


def sender_factors(lw) -> torch.Tensor:
    """``R_V W_O [head, k, d_model]`` of one layer's senders: ``‖OV_A M‖ = ‖(R_V W_O) M‖``."""
    return _r_factor(lw.W_V[lw.kv_index]) @ lw.W_O.double()


def receiver_factors(lw, mode: str, level: str) -> tuple[torch.Tensor, list[int | None], list[int]]:
    """``(X R_Y^T [unit, d_model, k], query heads (None per group), kv heads)`` of one layer's
    receivers for ``(mode, level)`` (see module doc)."""
    kv = lw.kv_index
    if level == "kv_group":
        X = {"K": lw.W_K, "V": lw.W_V}[mode].double()
        return X, [None] * X.shape[0], list(range(X.shape[0]))
    X, Y = {
        "Q": (lw.W_Q, lw.W_K[kv]),
        "K": (lw.W_K[kv], lw.W_Q),
        "V": (lw.W_V[kv], lw.W_O.transpose(-1, -2)),
    }[mode]
    return X.double() @ _r_factor(Y).transpose(-1, -2), list(lw.heads), [int(g) for g in kv]


def pair_scores(P: torch.Tensor, XR: torch.Tensor) -> torch.Tensor:
    """``‖P_a XR_b‖ / (‖P_a‖ ‖XR_b‖)`` for ``P [a, k, d_model]``, ``XR [b, d_model, k']`` ->
    ``[a, b]`` (NaN where a norm is 0)."""
    num = (P[:, None] @ XR[None]).flatten(2).norm(dim=-1)
    den = P.flatten(1).norm(dim=-1)[:, None] * XR.flatten(1).norm(dim=-1)[None]
    return torch.where(den > 0, num / torch.where(den > 0, den, torch.ones_like(den)), float("nan"))


def null_scores(d_model: int, d_head: int, mode: str, level: str, n: int, gen: torch.Generator) -> torch.Tensor:
    """``[n]`` scores of Gaussian sender/receiver matrices of the model's shapes."""

    def g(*shape):
        return torch.randn((n, *shape), generator=gen, dtype=torch.float64)

    P = _r_factor(g(d_model, d_head)) @ g(d_head, d_model)
    XR = g(d_model, d_head)
    if level == "head":
        XR = XR @ _r_factor(g(d_model, d_head)).transpose(-1, -2)
    num = (P @ XR).flatten(1).norm(dim=-1)
    return num / (P.flatten(1).norm(dim=-1) * XR.flatten(1).norm(dim=-1))


def _family_rows(senders, receivers, mode, level) -> dict[str, list]:
    """Columns of every (sender, receiver) pair in different layers for one ``(mode, level)``."""
    cols: dict[str, list] = {k: [] for k in ("sl", "sh", "rl", "rh", "rk", "value")}
    for la, (heads_a, P) in enumerate(senders):
        for lb in range(la + 1, len(receivers)):
            XR, r_heads, r_kv = receivers[lb][(mode, level)]
            s = pair_scores(P.double(), XR.double()).float().numpy()  # [a, b]
            na, nb = s.shape
            cols["sl"] += [la] * (na * nb)
            cols["sh"] += [h for h in heads_a for _ in range(nb)]
            cols["rl"] += [lb] * (na * nb)
            cols["rh"] += r_heads * na
            cols["rk"] += r_kv * na
            cols["value"].append(s.reshape(-1))
    return cols


def composition_scores(weights, *, n_null: int = 1000, seed: int = 0, alpha: float = 0.05) -> pd.DataFrame:
    """Every composition score of ``weights`` (a
    :class:`~headscope.probes.models.inhouse.head_weights.ModelWeights`, read one layer at a time),
    frame :data:`~headscope.analyses.circuits.frames.COMPOSITION_COLUMNS`, sorted by
    ``(mode, level)`` then pair. ``ValueError`` for ``n_null < 1``.

    >>> from headscope.probes.models.inhouse.planted import planted_model
    >>> from headscope.probes.models.inhouse.head_weights import head_weights
    >>> df = composition_scores(head_weights(planted_model()), n_null=200)
    >>> top = df[(df["mode"] == "K") & (df.level == "head")].nlargest(1, "value").iloc[0]
    >>> [int(top[c]) for c in ("sender_layer", "sender_head", "receiver_layer", "receiver_head")], top.verdict
    ([0, 0, 1, 1], 'above baseline')
    """
    if n_null < 1:
        raise ValueError(f"n_null must be >= 1; got {n_null}")
    senders, receivers = [], []
    for lw in weights.layers():  # factors are d_head-sized: the layer's full matrices are dropped
        senders.append((list(lw.heads), sender_factors(lw).float()))
        receivers.append({fam: _as_float(receiver_factors(lw, *fam)) for fam in FAMILIES})
    gen = torch.Generator().manual_seed(seed)
    frames = []
    for mode, level in FAMILIES:
        cols = _family_rows(senders, receivers, mode, level)
        value = np.concatenate(cols["value"]) if cols["value"] else np.zeros(0, dtype=np.float32)
        null = null_scores(weights.d_model, weights.d_head, mode, level, n_null, gen).float()
        p = empirical_p(torch.from_numpy(value), null)
        df = pd.DataFrame(
            {
                "sender_layer": cols["sl"],
                "sender_head": cols["sh"],
                "receiver_layer": cols["rl"],
                "receiver_head": pd.array(cols["rh"], dtype="Int64"),
                "receiver_kv_head": cols["rk"],
                "mode": mode,
                "level": level,
                "value": value,
                "baseline_mean": float(null.mean()),
                "baseline_sd": float(null.std()),
                "p_value": p.numpy(),
                "n": n_null,
            }
        )
        df["margin"] = df["value"] - df["baseline_mean"]
        df["p_adjusted"] = bh_adjust(p).numpy()
        df["verdict"] = np.where(df["p_adjusted"] <= alpha, ABOVE, NOT_ABOVE)
        frames.append(df)
    out = pd.concat(frames, ignore_index=True)[COMPOSITION_COLUMNS]
    for col in ("mode", "level", "verdict"):
        out[col] = out[col].astype("category")
    return out


def _as_float(fam):
    XR, heads, kv = fam
    return XR.float(), heads, kv
