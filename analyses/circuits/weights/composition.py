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
``‖W_V W_O X Y^T‖ = ‖(R W_O) X R_Y^T‖`` where ``Y = Q_Y R_Y``; the sender factor ``P_A = R W_O
[d_head, d_model]`` meets each KV group's shared ``W_K[g]``/``W_V[g]`` once (``P_A W_K[g]`` serves
the group's K rows and every K head row of the group), so a pair costs about ``d_head² d_model``.

Memory: the sender factors of the layers read so far are held (each the size of the layer's
``W_O``), the receivers are read one layer at a time. With ``max_held_bytes`` the senders are
held a block of layers at a time, and every later layer is read again per block: memory stays
bounded on any model, at the price of re-reading.

Baseline: the score is invariant to each matrix's scale, so one null distribution per
``(mode, level)`` serves every pair: ``n_null`` draws of Gaussian ``W_V, W_O, X, Y`` of the
model's shapes (drawn a block of draws at a time; the numbers are those of one call). ``p_value``
is one-sided (upper), BH-adjusted over all pairs of a ``(mode, level)``; ``verdict`` ``above
baseline`` where the adjusted p is ≤ ``alpha``. The Gaussian null ignores the real weights'
anisotropy (a trained model's matrices share directions, so many pairs beat it); rank pairs by
``value`` or ``margin`` too.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from headscope.analyses.circuits.weights.baselines import bh_adjust, empirical_p
from headscope.analyses.circuits.weights.frames import ABOVE, COMPOSITION_COLUMNS, NOT_ABOVE
from headscope.probes.allocator import trim_heap

#: (mode, level) of every score family, in frame order
FAMILIES = (("Q", "head"), ("K", "head"), ("K", "kv_group"), ("V", "head"), ("V", "kv_group"))
#: float64 bytes of the held senders scored in one product
SENDER_GROUP_BYTES = 64 << 20
#: float64 bytes of one block of one matrix's null draws (four are live at once, with their QR copies and products
#: about ten blocks' worth: the heap is handed back after each block)
NULL_BLOCK_BYTES = 384 << 20


def _r_factor(Y: torch.Tensor) -> torch.Tensor:
    """``R`` of the reduced QR ``Y = Q R`` (``[..., d_model, d_head]`` -> ``[..., k, d_head]``):
    ``mode="r"`` (LAPACK's ``geqrf`` alone, the same ``R`` bit for bit; ``Q`` is never formed,
    which halves the cost)."""
    return torch.linalg.qr(Y.double(), mode="r").R


def sender_factors(lw) -> torch.Tensor:
    """``R_V W_O [head, k, d_model]`` of one layer's senders: ``‖OV_A M‖ = ‖(R_V W_O) M‖`` (``R_V``
    factored once per KV head, then indexed by query head: the same numbers, a group's QR once)."""
    return _r_factor(lw.W_V)[lw.kv_index] @ lw.W_O.double()


def _ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    return torch.where(den > 0, num / torch.where(den > 0, den, torch.ones_like(den)), float("nan"))


def _receiver_side(lw) -> dict:
    """What one receiver layer brings to every sender (float64; module doc): ``X`` of K and V for
    all KV groups as one ``[d_model, kv_head · d_head]`` matrix, each group's heads' ``R_Y^T``
    side by side ``[d_head, heads · k]``, Q's ``XR`` as one ``[d_model, head · k]``, and the norms."""
    kv = lw.kv_index
    side = {"kv": kv, "groups": [torch.nonzero(kv == g).flatten() for g in range(lw.W_K.shape[0])]}
    for mode, X, Y in (("K", lw.W_K, lw.W_Q), ("V", lw.W_V, lw.W_O.transpose(-1, -2))):
        X = X.double()  # [kv_head, d_model, d_head]
        R = _r_factor(Y).transpose(-1, -2)  # [head, d_head, k]: XR_b = X[kv(b)] R_b
        side[mode] = (
            X.permute(1, 0, 2).reshape(X.shape[1], -1),
            X.flatten(1).norm(dim=-1),
            [R[h].permute(1, 0, 2).reshape(R.shape[1], -1) for h in side["groups"]],
            (X[kv] @ R).flatten(1).norm(dim=-1),
        )
    XR = lw.W_Q.double() @ _r_factor(lw.W_K)[kv].transpose(-1, -2)  # [head, d_model, k]
    side["Q"] = (XR.permute(1, 0, 2).reshape(XR.shape[1], -1), XR.flatten(1).norm(dim=-1))
    return side


def _layer_scores(P: torch.Tensor, side: dict) -> dict[tuple[str, str], torch.Tensor]:
    """``{(mode, level): [a, unit]}`` scores of senders ``P [a, k, d_model]`` (float64) into one
    receiver layer (:func:`_receiver_side`), each a few large products: every KV group's
    ``W_K``/``W_V`` meets all senders at once, then its heads' ``R`` factors."""
    a, k, d = P.shape
    P2 = P.reshape(a * k, d)
    p_norm = P.flatten(1).norm(dim=-1)[:, None]  # [a, 1]
    out = {}
    for mode in ("K", "V"):
        X, x_norm, Rs, xr_norm = side[mode]
        e = X.shape[1] // len(Rs)
        PX = (P2 @ X).view(a, k, len(Rs), e)  # [a, k, kv_head, d_head]
        out[(mode, "kv_group")] = _ratio(torch.linalg.vector_norm(PX, dim=(1, 3)), p_norm * x_norm[None])
        num = torch.zeros(a, len(side["kv"]), dtype=P.dtype)
        for g, (heads, R) in enumerate(zip(side["groups"], Rs)):
            M = PX[:, :, g].reshape(a * k, e) @ R  # [a·k, heads·k]
            num[:, heads] = torch.linalg.vector_norm(M.view(a, k, len(heads), -1), dim=(1, 3))
        out[(mode, "head")] = _ratio(num, p_norm * xr_norm[None])
    XR, xr_norm = side["Q"]
    num = torch.linalg.vector_norm((P2 @ XR).view(a, k, len(xr_norm), -1), dim=(1, 3))
    out[("Q", "head")] = _ratio(num, p_norm * xr_norm[None])
    return out


def _null_shapes(d_model: int, d_head: int, level: str) -> list[tuple[int, int]]:
    """The Gaussian matrices of one null draw, in the order the formula reads them."""
    return [(d_model, d_head), (d_head, d_model), (d_model, d_head)] + ([(d_model, d_head)] * (level == "head"))


def _blocks(numel: int, n: int, block_bytes: int) -> tuple[int, list[tuple[int, int]]]:
    """``(step, [(first draw, draws)])``: ``n`` draws of a ``numel``-number matrix in blocks of at most
    ``block_bytes`` (whole blocks of 16 numbers: randn's unit)."""
    step = max(16, block_bytes // (8 * numel) // 16 * 16)
    return step, [(a, min(step, n - a)) for a in range(0, n, step)]


def _step(gen: torch.Generator, shapes, blocks, numel: int) -> list[list]:
    """Step ``gen`` over every block of every matrix of ``shapes`` as :func:`null_scores` draws them
    (one ``randn`` per block), without drawing the normals -> the state where each block starts
    (``[matrix][block]``); ``gen`` is left where the last block ends."""
    starts = [[None] * len(blocks) for _ in shapes]
    skip = torch.empty(max(m for _a, m in blocks) * numel, dtype=torch.float64)
    for i in range(len(shapes)):
        for j, (_a, m) in enumerate(blocks):
            starts[i][j] = gen.get_state()
            if (m * numel) % 16:  # randn redraws a ragged tail: draw it as randn does
                torch.randn(m * numel, generator=gen, dtype=torch.float64)
            else:  # uniform_ steps the stream exactly as randn does (one 64-bit draw per number)
                skip[: m * numel].uniform_(generator=gen)
    return starts


def null_scores(
    d_model: int,
    d_head: int,
    mode: str,
    level: str,
    n: int,
    gen: torch.Generator,
    block_bytes: int = NULL_BLOCK_BYTES,
) -> torch.Tensor:
    """``[n]`` scores of Gaussian sender/receiver matrices of the model's shapes. Each matrix's
    ``n`` draws are those of one ``randn`` call, in the order the formula reads them; beyond
    ``block_bytes`` (:data:`NULL_BLOCK_BYTES`) per matrix they are drawn a block at a time (the
    generator stepped over the other blocks), so memory stays bounded and the numbers do not
    depend on the block size."""
    shapes = _null_shapes(d_model, d_head, level)
    numel = d_model * d_head
    _s, blocks = _blocks(numel, n, block_bytes)
    starts = [[None] * len(blocks) for _ in shapes]  # generator state where each block of each matrix starts
    if len(blocks) > 1:
        starts = _step(gen, shapes, blocks, numel)
        end = gen.get_state()
    out = []
    for j, (_a, m) in enumerate(blocks):

        def g(i, j=j, m=m):  # block j of matrix i, each dropped once used: four blocks are held at most
            # (P, XR's first factor, the last factor and the copy its QR makes)
            if starts[i][j] is not None:
                gen.set_state(starts[i][j])
            return torch.randn((m, *shapes[i]), generator=gen, dtype=torch.float64)

        P = _r_factor(g(0)) @ g(1)
        XR = g(2) if level == "kv_group" else g(2) @ _r_factor(g(3)).transpose(-1, -2)
        num = (P @ XR).flatten(1).norm(dim=-1)
        out.append(num / (P.flatten(1).norm(dim=-1) * XR.flatten(1).norm(dim=-1)))
        del P, XR
        trim_heap()  # the block's float64 pieces sit under glibc's mmap threshold: hand them back
    if len(blocks) > 1:
        gen.set_state(end)
    return torch.cat(out)


def family_null(d_model: int, d_head: int, family: int, n: int, seed: int, block_bytes: int = NULL_BLOCK_BYTES):
    """``[n]`` the null of ``FAMILIES[family]`` exactly as :func:`composition_scores` draws it from
    ``seed`` (one generator, the families in order): the generator stepped over the earlier
    families' draws (no normals drawn, no products), then :func:`null_scores`. One shard of a
    sharded run's nulls."""
    gen = torch.Generator().manual_seed(seed)
    numel = d_model * d_head
    for _mode, level in FAMILIES[:family]:
        _step(gen, _null_shapes(d_model, d_head, level), _blocks(numel, n, block_bytes)[1], numel)
    mode, level = FAMILIES[family]
    return null_scores(d_model, d_head, mode, level, n, gen, block_bytes)


def _score_layer(held: list[tuple[int, torch.Tensor]], lw, scores: dict) -> None:
    """Scores of every held sender layer into receiver ``lw``, into ``scores[(family, la, lb)]``;
    the senders go in groups of about :data:`SENDER_GROUP_BYTES` as float64."""
    side = _receiver_side(lw)
    group: list[tuple[int, torch.Tensor]] = []
    for i, item in enumerate(held):
        group.append(item)
        if i + 1 < len(held) and sum(p.numel() for _, p in group + [held[i + 1]]) * 8 <= SENDER_GROUP_BYTES:
            continue
        fams = _layer_scores(torch.cat([p for _, p in group]).double(), side)
        for fam, s in fams.items():
            for (la, _), part in zip(group, s.float().split([p.shape[0] for _, p in group])):
                scores[(fam, la, lw.layer)] = part
        group = []


def _all_scores(weights, max_held_bytes: int | None) -> tuple[dict, dict, dict]:
    """``(scores {(family, la, lb): [a, unit]}, units {lb: (heads, kv heads, groups)}, senders {la: heads})``
    of every pair of layers ``la < lb``: receivers read one layer at a time, the senders' factors
    (float32, as held) a block of layers at a time when ``max_held_bytes`` bounds them."""
    scores: dict = {}
    units: dict = {}
    senders: dict = {}
    start = 0
    while start < weights.n_layers - 1:
        held: list[tuple[int, torch.Tensor]] = []
        nbytes, nxt = 0, weights.n_layers
        for lb in range(start, weights.n_layers):
            lw = weights.layer(lb)
            if held:
                _score_layer(held, lw, scores)
            units.setdefault(lb, (list(lw.heads), [int(g) for g in lw.kv_index], lw.W_K.shape[0]))
            if nxt < weights.n_layers:
                continue  # this block is full: later layers are receivers only
            f = sender_factors(lw).float()  # [head, k, d_model]
            if held and max_held_bytes is not None and nbytes + f.numel() * 4 > max_held_bytes:
                nxt = lb
                continue
            held.append((lb, f))
            senders[lb] = list(lw.heads)
            nbytes += f.numel() * 4
        start = nxt
    return scores, units, senders


def receiver_scores(weights, receivers) -> tuple[dict, dict, dict]:
    """:func:`_all_scores`' ``(scores, units, senders)`` for the pairs whose receiver layer is in
    ``receivers`` (all senders held, as one process with no ``max_held_bytes`` holds them: the same
    products, the same numbers): one shard of a sharded run's scores. ``senders`` covers every layer
    below the last receiver, ``units`` the receivers."""
    wanted = sorted(set(int(r) for r in receivers))
    if wanted and not 0 <= wanted[0] <= wanted[-1] < weights.n_layers:
        raise ValueError(f"receivers must be layers 0..{weights.n_layers - 1}; got {wanted}")
    scores: dict = {}
    units: dict = {}
    senders: dict = {}
    held: list[tuple[int, torch.Tensor]] = []
    for lb in range(wanted[-1] + 1 if wanted else 0):
        lw = weights.layer(lb)
        if lb in wanted:
            if held:
                _score_layer(held, lw, scores)
            units[lb] = (list(lw.heads), [int(g) for g in lw.kv_index], lw.W_K.shape[0])
        if lb < wanted[-1]:
            held.append((lb, sender_factors(lw).float()))
            senders[lb] = list(lw.heads)
    return scores, units, senders


def _family_rows(scores, units, senders, n_layers, mode, level) -> dict[str, list]:
    """Columns of every (sender, receiver) pair in different layers for one ``(mode, level)``."""
    cols: dict[str, list] = {k: [] for k in ("sl", "sh", "rl", "rh", "rk", "value")}
    for la in range(n_layers - 1):
        heads_a = senders[la]
        for lb in range(la + 1, n_layers):
            heads, kv, n_groups = units[lb]
            r_heads, r_kv = (heads, kv) if level == "head" else ([None] * n_groups, list(range(n_groups)))
            s = scores[((mode, level), la, lb)].numpy()  # [a, b]
            na, nb = s.shape
            cols["sl"] += [la] * (na * nb)
            cols["sh"] += [h for h in heads_a for _ in range(nb)]
            cols["rl"] += [lb] * (na * nb)
            cols["rh"] += r_heads * na
            cols["rk"] += r_kv * na
            cols["value"].append(s.reshape(-1))
    return cols


def composition_scores(
    weights,
    *,
    n_null: int = 1000,
    seed: int = 0,
    alpha: float = 0.05,
    max_held_bytes: int | None = None,
    null_block_bytes: int = NULL_BLOCK_BYTES,
) -> pd.DataFrame:
    """Every composition score of ``weights`` (a
    :class:`~headscope.probes.models.inhouse.head_weights.ModelWeights`, read one layer at a time;
    with ``max_held_bytes``, the senders' factors are held that many bytes at a time, module doc;
    ``null_block_bytes``: the null's draws per block, :func:`null_scores`),
    frame :data:`~headscope.analyses.circuits.weights.frames.COMPOSITION_COLUMNS`, sorted by
    ``(mode, level)`` then pair. ``ValueError`` for ``n_null < 1`` or ``max_held_bytes < 1``.

    >>> from headscope.probes.models.inhouse.planted import planted_model
    >>> from headscope.probes.models.inhouse.head_weights import head_weights
    >>> df = composition_scores(head_weights(planted_model()), n_null=200)
    >>> top = df[(df["mode"] == "K") & (df.level == "head")].nlargest(1, "value").iloc[0]
    >>> [int(top[c]) for c in ("sender_layer", "sender_head", "receiver_layer", "receiver_head")], top.verdict
    ([0, 0, 1, 1], 'above baseline')
    """
    if n_null < 1:
        raise ValueError(f"n_null must be >= 1; got {n_null}")
    if max_held_bytes is not None and max_held_bytes < 1:
        raise ValueError(f"max_held_bytes must be None or >= 1; got {max_held_bytes}")
    scores, units, senders = _all_scores(weights, max_held_bytes)
    gen = torch.Generator().manual_seed(seed)
    nulls = [null_scores(weights.d_model, weights.d_head, m, lv, n_null, gen, null_block_bytes) for m, lv in FAMILIES]
    return composition_frame(scores, units, senders, weights.n_layers, nulls, alpha=alpha)


def composition_frame(scores: dict, units: dict, senders: dict, n_layers: int, nulls, *, alpha: float = 0.05):
    """:func:`composition_scores`' frame from the pairs' scores (:func:`_all_scores`' triple, or the
    union of :func:`receiver_scores`' over receiver layers) and each family's null (``[n]`` each, in
    :data:`FAMILIES` order: :func:`null_scores` or :func:`family_null`)."""
    frames = []
    for (mode, level), null in zip(FAMILIES, nulls):
        n_null = len(null)
        cols = _family_rows(scores, units, senders, n_layers, mode, level)
        value = np.concatenate(cols["value"]) if cols["value"] else np.zeros(0, dtype=np.float32)
        null = null.float()
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
