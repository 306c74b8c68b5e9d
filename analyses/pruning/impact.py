"""Impact frames: the rows every pruning study writes, and their spread.

Frames follow :data:`~headscope.analyses.frames.IMPACT_COLUMNS`; ``value`` holds the metric
(``metric = name``) or its change from the unablated model (``metric = "delta_" + name``);
``spread`` is the bootstrap standard error over items (:func:`bootstrap_se`: ``n_boot``
resamples of items, seeded), NaN for a metric without items.

>>> impact_frame([impact_rows("baseline", "lm_loss", value=2.5, n=3)])[["study", "metric", "value", "n"]].values.tolist()
[['baseline', 'lm_loss', 2.5, 3]]
"""

from __future__ import annotations

import pandas as pd
import torch

from headscope.analyses.frames import IMPACT_COLUMNS, IMPACT_DTYPES


def bootstrap_se(
    metric,
    values: torch.Tensor,
    weights: torch.Tensor,
    base: torch.Tensor | None = None,
    *,
    n_boot: int = 200,
    seed: int = 0,
) -> torch.Tensor:
    """Bootstrap standard error over items of ``metric.aggregate(values[r])`` for ``values
    [R, item]``, ``weights [item]`` (minus the aggregate of ``base [item]`` on the same
    resample when given) -> ``[R]``; NaN for fewer than 2 items."""
    n = values.shape[1]
    if n < 2:
        return torch.full((values.shape[0],), float("nan"))
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, n, (n_boot, n), generator=gen)
    counts = torch.zeros(n_boot, n).scatter_add_(1, idx, torch.ones(n_boot, n)).double()
    w = weights.double()
    denom = (counts @ w).clamp(min=1e-12)  # [n_boot]
    agg = metric.finalize((values.double() * w) @ counts.T / denom)  # [R, n_boot]
    if base is not None:
        agg = agg - metric.finalize((base.double() * w) @ counts.T / denom)[None]
    return agg.std(dim=1).float()


def impact_rows(
    study: str,
    metric_name: str,
    *,
    layer=None,
    head=None,
    step=0,
    fraction_pruned=0.0,
    value=float("nan"),
    spread=float("nan"),
    seed=None,
    n=0,
) -> dict:
    """One IMPACT_COLUMNS row (``layer``/``head``/``seed`` may be None)."""
    return {
        "study": study,
        "layer": layer,
        "head": head,
        "step": step,
        "fraction_pruned": float(fraction_pruned),
        "metric": metric_name,
        "value": float(value),
        "spread": float(spread),
        "seed": seed,
        "n": int(n),
    }


def impact_frame(rows: list[dict]) -> pd.DataFrame:
    """Rows -> frame with IMPACT_COLUMNS and stable dtypes (nullable ints for layer/head/seed)."""
    df = pd.DataFrame(rows, columns=IMPACT_COLUMNS)
    return df.astype(IMPACT_DTYPES)


def harm(metric, delta):
    """Positive when a change of the metric is for the worse (higher loss, lower accuracy)."""
    return -delta if metric.higher_is_better else delta
