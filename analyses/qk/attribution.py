"""Why a head attends where it does: its score difference split over (query part, key part) pairs.

Softmax is unchanged by a shift of one query's scores, so what decides attention is a
difference: the score of the attended key ``t`` minus a baseline over the other keys the mask
allows (``mean``: their mean score; ``runner_up``: the best of them). With the query
``q = Σ_a q_a`` and each key ``k_j = Σ_c k_{c,j}`` split into components
(:mod:`headscope.probes.qk_parts`), that difference is exactly

``D = Σ_{a,c} D[a, c]``,  ``D[a, c] = scale · q_a · (k_{c,t} - k̄_c)``

(``k̄_c``: component ``c`` of the baseline key: the mean over the other keys is linear). A pair's
share is ``D[a, c] / D``; the query-side marginal of ``a`` is ``Σ_c D[a, c]``, the key-side one of
``c`` is ``Σ_a D[a, c]``. Averaged over items, shares are of the mean difference.

>>> q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])             # 2 query parts, d_head 2
>>> k = torch.tensor([[[2.0, 0.0], [0.0, 0.0]],            # part 0 at keys 0, 1
...                   [[0.0, 0.0], [0.0, 1.0]]])           # part 1
>>> difference_pairs(q, k, torch.tensor([True, True]), 0, 1.0).tolist()
[[2.0, 0.0], [0.0, -1.0]]
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["BASELINES", "Attribution", "attribute", "difference_pairs"]

#: the baselines the attended key's score is compared with
BASELINES = ("mean", "runner_up")


def difference_pairs(
    q: torch.Tensor, k: torch.Tensor, allowed: torch.Tensor, target: int, scale: float, baseline: str = "mean"
) -> torch.Tensor | None:
    """``[q_component, k_component]``: each pair's part of ``score(target) - baseline`` for one
    query (``q [component, d_head]``, ``k [component, key_pos, d_head]``, ``allowed [key_pos]``
    bool). None where ``target`` is not allowed or no other key is. ``ValueError`` for an
    unknown ``baseline``."""
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {BASELINES}; got {baseline!r}")
    n_key = k.shape[1]
    if not 0 <= target < n_key or not bool(allowed[target]):
        return None
    others = allowed.clone()
    others[target] = False
    if not bool(others.any()):
        return None
    if baseline == "mean":
        k_base = k[:, others].mean(1)  # [component, d_head]
    else:
        scores = (q.sum(0) @ k.sum(0).T).masked_fill(~others, float("-inf"))
        k_base = k[:, int(scores.argmax())]
    return (q @ (k[:, target] - k_base).T) * scale


@dataclass
class Attribution:
    """Per-item pair matrices of one head: ``pairs [item, q_component, k_component]`` (score
    units), ``names`` of the components, ``skipped``: queries with no other allowed key (or an
    attended key the mask hides), ``max_error``: the largest relative error of the split against
    the model's scores over the batches seen."""

    layer: int
    head: int
    names: tuple[str, ...]
    baseline: str
    pairs: list[torch.Tensor] = field(default_factory=list)
    skipped: int = 0
    max_error: float = 0.0

    @property
    def n(self) -> int:
        return len(self.pairs)

    def mean(self) -> torch.Tensor:
        """``[q_component, k_component]``: the mean pair matrix over the items."""
        if not self.pairs:
            raise ValueError(f"head {self.layer}.{self.head}: no item attributed ({self.skipped} skipped)")
        return torch.stack(self.pairs).mean(0)


def attribute(parts, queries, *, baseline: str = "mean", into: Attribution | None = None) -> Attribution:
    """Add the items ``queries`` (``(batch row, query_pos, key_pos)`` of ``parts``, a
    :class:`~headscope.probes.qk_parts.QKParts`) to ``into`` (a new :class:`Attribution` by
    default); a key of ``None`` means the key the model attends most. Returns it."""
    out = into or Attribution(parts.layer, parts.head, parts.names, baseline)
    if out.names != parts.names:
        raise ValueError(f"components differ between batches: {out.names[:4]}… vs {parts.names[:4]}…")
    out.max_error = max(out.max_error, parts.relative_error())
    for b, i, t in queries:
        allowed = parts.allowed[b, i]
        if t is None:
            t = int(parts.scores[b, i].masked_fill(~allowed, float("-inf")).argmax())
        d = difference_pairs(parts.q[:, b, i], parts.k[:, b], allowed, t, parts.scale, baseline)
        if d is None:
            out.skipped += 1
            continue
        out.pairs.append(d)
    return out
