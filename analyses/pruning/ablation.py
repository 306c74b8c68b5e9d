"""Ablating heads: single-head ablation, all-but-one per layer, and a role's heads against
random heads; the mean-ablation values they use.

Every study scores all its masks in one call of the engine
(:func:`~headscope.analyses.pruning.scoring.evaluate_groups`), so the masks share the
unablated prefix of each batch. Frames follow :data:`~headscope.analyses.frames.IMPACT_COLUMNS`
(:mod:`~headscope.analyses.pruning.impact`), except :func:`role_ablation`'s
(:data:`ROLE_ABLATION_COLUMNS`).

>>> roles = pd.DataFrame({"layer": [0, 1, 1], "head": [2, 0, 0], "role": ["prev"] * 3,
...     "score": [0.5, 0.9, 0.7], "verdict": [True, True, True]})
>>> role_heads(roles, k=2)                  # best first; a head under two relations counts once
{'prev': [(1, 0), (0, 2)]}
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import torch

from headscope.analyses.pruning.gates import gates_as, head_gates  # noqa: F401 - reports/tools/bench reads them as ablation.*
from headscope.analyses.pruning.impact import bootstrap_se, impact_frame, impact_rows
from headscope.analyses.pruning.masks import check_head_hooks, head_masks
from headscope.analyses.pruning.memo import Scored
from headscope.analyses.pruning.scoring import evaluate, evaluate_groups
from headscope.probes.capture import Capture

# ----------------------------------------------------------------------------- mean ablation


class MeanZ:
    """Streaming mean of ``z`` over real tokens, per layer and head -> ``[layer, head, d_head]``.
    A :class:`~headscope.probes.capture.Reducer` (``update(cap)``, exact ``merge``, ``result``)."""

    def __init__(self, n_layers: int, n_heads: int, d_head: int):
        self.sum = torch.zeros(n_layers, n_heads, d_head, dtype=torch.float64)
        self.count = 0.0

    def update(self, cap: Capture) -> None:
        keep = cap.key_mask.to(torch.float64)  # [batch, pos]
        if self.sum.device != keep.device:  # the sums follow the data
            self.sum = self.sum.to(keep.device)
        for l in cap.layers:
            z = cap["z", l].to(torch.float64)  # [batch, head, pos, d_head]
            self.sum[l] += torch.einsum("bhpd,bp->hd", z, keep)
        self.count += float(keep.sum())

    def merge(self, other: MeanZ) -> MeanZ:
        self.sum += other.sum.to(self.sum.device)
        self.count += other.count
        return self

    def result(self) -> torch.Tensor:
        return (self.sum / max(self.count, 1.0)).float()


def mean_z(model, metric) -> torch.Tensor:
    """Corpus mean of ``z`` over the metric's tokens (padding excluded), with every head
    on: the mean-ablation value ``[layer, head, d_head]``. A metric whose forwards run
    elsewhere (one with its own ``mean_z()``, e.g. a sharded run's) gives its own."""
    if hasattr(metric, "mean_z"):
        return metric.mean_z()
    check_head_hooks(model)
    red = MeanZ(model.spec.n_layers, model.spec.n_heads, model.spec.d_head)
    for unit_red in unit_mean_z(model, metric):
        red.sum = red.sum.to(unit_red.sum.device)  # the sums follow the data, as in update
        red.merge(unit_red)  # 0 + x is x: the same additions, in the same order, as one running sum
    return red.result()


def unit_mean_z(model, metric):
    """One :class:`MeanZ` per unit of ``metric.units``, in order (a generator): folded with
    :meth:`MeanZ.merge` in unit order they give :func:`mean_z`'s sums bit for bit."""
    layers = tuple(range(model.spec.n_layers))
    if hasattr(metric, "place"):  # its tokens go where the model takes its inputs
        metric.place(model)
    for unit in metric.units:
        red = MeanZ(model.spec.n_layers, model.spec.n_heads, model.spec.d_head)
        data = model.run(unit.batch, ("z",), layers)
        red.update(Capture(tokens=unit.batch, data=data, layers=layers, spec=model.spec, item_ids=unit.items))
        yield red


def ablation_values(model, metric, mode: str) -> torch.Tensor | None:
    """``None`` for zero ablation, :func:`mean_z` for mean ablation."""
    if mode == "zero":
        return None
    if mode == "mean":
        if not metric.has_corpus:
            raise ValueError(
                "mean ablation needs a metric with items (its corpus gives the mean of z); use mode='zero'"
            )
        return mean_z(model, metric)
    raise ValueError(f"mode must be 'zero' or 'mean'; got {mode!r}")


# ----------------------------------------------------------------------------- studies


def _group_heads(spec, per_forward: str):
    heads = [(l, h) for l in range(spec.n_layers) for h in range(spec.n_heads)]
    if per_forward == "layer":
        return [heads[l * spec.n_heads : (l + 1) * spec.n_heads] for l in range(spec.n_layers)]
    if per_forward == "all":
        return [heads]
    if per_forward == "one":
        return [[x] for x in heads]
    raise ValueError(f"per_forward must be 'layer', 'all' or 'one'; got {per_forward!r}")


def single_head_ablation(
    model,
    metric,
    *,
    mode: str = "zero",
    ablation: torch.Tensor | None = None,
    per_forward: str = "layer",
    n_boot: int = 200,
    seed: int = 0,
    max_rows: int = 64,
    unpruned: Scored | None = None,
) -> pd.DataFrame:
    """Ablate each head alone; rows per head: ``metric=name`` (ablated value) and
    ``metric="delta_"+name`` (ablated - unablated), ``spread`` = bootstrap SE over items.

    ``study = "ablation:zero"`` or ``"ablation:mean"``; ``ablation`` overrides the
    mean-ablation values (computed by :func:`mean_z` otherwise). ``per_forward``:
    ``"layer"`` or ``"all"`` (every head in one :func:`evaluate` call: replicas of a batch
    per forward, each running the layers from its own), or ``"one"`` (a call per head).
    ``unpruned``: the unablated model's ``(values, weights)`` from :func:`evaluate`, to skip
    re-scoring it.
    """
    spec = model.spec
    if ablation is None:
        ablation = ablation_values(model, metric, mode)
    base_v, w = _unpruned(model, metric, unpruned, max_rows)
    rows = []
    total = spec.n_layers * spec.n_heads
    groups = _group_heads(spec, per_forward)
    masks = [head_masks(n_layers=spec.n_layers, n_heads=spec.n_heads, heads=group) for group in groups]
    if per_forward == "one":
        scored = [evaluate(model, metric, m, ablation=ablation, max_rows=max_rows)[0] for m in masks]
    else:  # every head in one call: the unablated prefix is shared by all layers' heads
        scored, _ = evaluate_groups(model, metric, masks, ablation=ablation, max_rows=max_rows)
    for group, v in zip(groups, scored):
        agg = metric.aggregate(v, w)
        base = metric.aggregate(base_v, w)[0]
        se = bootstrap_se(metric, v, w, n_boot=n_boot, seed=seed)
        se_d = bootstrap_se(metric, v, w, base_v[0], n_boot=n_boot, seed=seed)
        for r, (l, h) in enumerate(group):
            common = dict(layer=l, head=h, fraction_pruned=1 / total, seed=seed, n=metric.n_items)
            rows.append(impact_rows(f"ablation:{mode}", metric.name, value=agg[r], spread=se[r], **common))
            rows.append(
                impact_rows(f"ablation:{mode}", f"delta_{metric.name}", value=agg[r] - base, spread=se_d[r], **common)
            )
    return impact_frame(rows)


def _unpruned(model, metric, unpruned: Scored | None, max_rows: int) -> Scored:
    """The unablated ``(values [1, n_items], weights [n_items])``: ``unpruned`` when given, else scored."""
    if unpruned is not None:
        return unpruned
    return evaluate(model, metric, max_rows=max_rows)


def all_but_one(
    model,
    metric,
    *,
    n_boot: int = 200,
    seed: int = 0,
    max_rows: int = 64,
    unpruned: Scored | None = None,
) -> pd.DataFrame:
    """Michel et al. (2019): in each layer keep only one head (zero-ablate the others,
    every other layer intact); the best single head of the layer is the one whose
    keep-only metric is best. Rows per layer: ``head`` = that head, ``metric=name`` and
    ``"delta_"+name`` (vs the unablated model), ``study="all_but_one"``. Every layer's masks
    go in one :func:`evaluate_groups` call; ``unpruned``: as in :func:`single_head_ablation`."""
    spec = model.spec
    base_v, w = _unpruned(model, metric, unpruned, max_rows)
    base = metric.aggregate(base_v, w)[0]
    rows = []
    masks = []
    for l in range(spec.n_layers):
        m = torch.ones(spec.n_heads, spec.n_layers, spec.n_heads)
        m[:, l] = torch.eye(spec.n_heads)
        masks.append(m)
    scored, _ = evaluate_groups(model, metric, masks, max_rows=max_rows)
    for l, v in enumerate(scored):
        agg = metric.aggregate(v, w)
        score = agg if metric.higher_is_better else -agg
        best = int(torch.argmax(score))
        se = bootstrap_se(metric, v[best : best + 1], w, n_boot=n_boot, seed=seed)[0]
        se_d = bootstrap_se(metric, v[best : best + 1], w, base_v[0], n_boot=n_boot, seed=seed)[0]
        common = dict(
            layer=l,
            head=best,
            fraction_pruned=(spec.n_heads - 1) / (spec.n_layers * spec.n_heads),
            seed=seed,
            n=metric.n_items,
        )
        rows.append(impact_rows("all_but_one", metric.name, value=agg[best], spread=se, **common))
        rows.append(impact_rows("all_but_one", f"delta_{metric.name}", value=agg[best] - base, spread=se_d, **common))
    return impact_frame(rows)


def batching_speedup(model, metric, *, layer: int = 0, repeats: int = 1, max_rows: int = 1 << 30) -> dict:
    """Wall time of zero-ablating each head of ``layer`` by separate forwards vs one
    replicated forward; returns ``{"heads", "separate_s", "batched_s", "ratio", "max_abs_diff"}``
    (``max_abs_diff``: largest difference between the two ways' per-item values)."""
    spec = model.spec
    masks = head_masks(n_layers=spec.n_layers, n_heads=spec.n_heads, heads=[(layer, h) for h in range(spec.n_heads)])
    evaluate(model, metric, masks[:1], max_rows=max_rows)  # warm-up
    t0 = time.perf_counter()
    for _ in range(repeats):
        sep = torch.cat([evaluate(model, metric, masks[r : r + 1], max_rows=max_rows)[0] for r in range(len(masks))])
    t1 = time.perf_counter()
    for _ in range(repeats):
        bat, _ = evaluate(model, metric, masks, max_rows=max_rows)
    t2 = time.perf_counter()
    sep_s, bat_s = (t1 - t0) / repeats, (t2 - t1) / repeats
    return {
        "heads": spec.n_heads,
        "separate_s": sep_s,
        "batched_s": bat_s,
        "ratio": sep_s / max(bat_s, 1e-9),
        "max_abs_diff": float((sep - bat).abs().max()),
    }


ROLE_ABLATION_COLUMNS = ["role", "k", "metric", "value_role", "value_random_mean", "value_random_std", "n_draws"]


def role_heads(roles: pd.DataFrame, k: int) -> dict[str, list[tuple[int, int]]]:
    """Per role, its top-``k`` heads by ``score`` among rows with ``verdict`` True
    (a head listed under several relations of a role counts once, at its best score)."""
    need = {"layer", "head", "role", "score", "verdict"}
    if missing := sorted(need - set(roles.columns)):
        raise ValueError(f"roles frame lacks columns {missing}; expected ROLE_COLUMNS")
    out = {}
    true = roles[roles["verdict"].astype(bool)]
    for role, g in true.groupby("role", sort=True):
        best = g.sort_values(["score", "layer", "head"], ascending=[False, True, True], kind="stable")
        best = best.drop_duplicates(["layer", "head"])
        out[str(role)] = [(int(l), int(h)) for l, h in zip(best["layer"], best["head"])][:k]
    return out


def role_ablation(
    model,
    metric,
    roles: pd.DataFrame,
    *,
    k: int = 3,
    n_draws: int = 5,
    seed: int = 0,
    mode: str = "zero",
    max_rows: int = 64,
    unpruned: Scored | None = None,
) -> pd.DataFrame:
    """Metric change from ablating a role's top-``k`` heads vs as many random heads
    (``n_draws`` seeded draws among the heads outside the role's set; every role's masks
    scored in one :func:`evaluate_groups` call; ``unpruned``: as in :func:`single_head_ablation`).

    Frame (:data:`ROLE_ABLATION_COLUMNS`): ``role``, ``k`` (heads actually ablated: fewer
    when the role has fewer heads with a True verdict), ``metric`` (``"delta_"+name``),
    ``value_role``, ``value_random_mean``, ``value_random_std`` (std over draws), ``n_draws``.
    """
    if n_draws < 1:
        raise ValueError(f"n_draws must be >= 1; got {n_draws}")
    spec = model.spec
    ablation = ablation_values(model, metric, mode)
    base_v, w = _unpruned(model, metric, unpruned, max_rows)
    base = metric.aggregate(base_v, w)[0]
    rng = np.random.default_rng(seed)
    all_heads = [(l, h) for l in range(spec.n_layers) for h in range(spec.n_heads)]
    rows = []
    by_role = role_heads(roles, k)
    masks = []
    for heads in by_role.values():
        pool = [x for x in all_heads if x not in heads]
        sets = [heads] + [
            [pool[i] for i in rng.choice(len(pool), size=len(heads), replace=False)] for _ in range(n_draws)
        ]
        m = torch.ones(len(sets), spec.n_layers, spec.n_heads)
        for r, s in enumerate(sets):
            for l, h in s:
                m[r, l, h] = 0.0
        masks.append(m)
    scored, _ = evaluate_groups(model, metric, masks, ablation=ablation, max_rows=max_rows) if masks else ([], None)
    for (role, heads), v in zip(by_role.items(), scored):
        agg = metric.aggregate(v, w) - base
        rand = agg[1:].double()
        rows.append(
            {
                "role": role,
                "k": len(heads),
                "metric": f"delta_{metric.name}",
                "value_role": float(agg[0]),
                "value_random_mean": float(rand.mean()),
                "value_random_std": float(rand.std()) if n_draws > 1 else float("nan"),
                "n_draws": n_draws,
            }
        )
    df = pd.DataFrame(rows, columns=ROLE_ABLATION_COLUMNS)
    return df.astype(
        {
            "role": "str",
            "k": "int64",
            "metric": "str",
            "value_role": "float64",
            "value_random_mean": "float64",
            "value_random_std": "float64",
            "n_draws": "int64",
        }
    )
