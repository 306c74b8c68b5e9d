"""Reducers the benchmark streams a corpus into: :class:`AttentionMassReducer` (small and exactly
mergeable: per head, the attention mass on the first token and the pattern entropy over real
query rows, summed in float64 with the row count; ``result()`` a
:data:`~headscope.analyses.frames.STAT_COLUMNS` frame), :class:`NoOpReducer` (the cost of capture
alone), and :class:`on_device` (a model moved to ``device``, its batches and outputs with it).

>>> import torch
>>> from headscope.probes.capture import Capture
>>> from headscope.probes.tokens import TokenBatch
>>> tb = TokenBatch(input_ids=torch.zeros(1, 2, dtype=torch.long), attention_mask=torch.ones(1, 2, dtype=torch.long),
...                 texts=[""], words=[[]], tokens=[[]], offsets=[[]], word_ids=[[]], special=[[]], lengths=[2])
>>> p = torch.tensor([[[[1.0, 0.0], [0.5, 0.5]]]])          # one head: row 0 on key 0, row 1 uniform
>>> r = AttentionMassReducer(); r.update(Capture(tokens=tb, data={("pattern", 0): p}, layers=(0,), spec=None))
>>> r.result()[["metric", "value", "n"]].round(4).values.tolist()
[['first_token_mass', 0.75, 2], ['entropy', 0.3466, 2]]
"""

from __future__ import annotations

import contextlib
import sys

import pandas as pd
import torch

from headscope.analyses.frames import STAT_COLUMNS
from headscope.probes.capture import Capture

__all__ = ["AttentionMassReducer", "NoOpReducer", "on_device"]


class AttentionMassReducer:
    """Per (layer, head): sums over real query rows of the attention on the first key
    position and of the pattern's entropy (nats), and the number of rows; float64.

    ``result()`` -> frame ``[layer, head, metric, value, n]`` with metrics
    ``first_token_mass`` and ``entropy`` (means over rows). ``merge`` adds the sums, so
    any split of the corpus gives the same result up to float64 rounding.
    """

    def __init__(self):
        self.mass: dict[int, torch.Tensor] = {}  # layer -> [head]
        self.entropy: dict[int, torch.Tensor] = {}
        self.rows: int = 0

    def update(self, cap: Capture) -> None:
        qmask = cap.key_mask.to(torch.float64)  # [batch, query_pos]: real query rows
        n_rows = int(qmask.sum())
        for layer in cap.layers:
            p = cap["pattern", layer].to(torch.float64)  # [batch, head, query_pos, key_pos]
            first = (p[..., 0] * qmask[:, None, :]).sum((0, 2))  # [head]
            ent = (torch.special.entr(p).sum(-1) * qmask[:, None, :]).sum((0, 2))  # [head]
            self.mass[layer] = self.mass.get(layer, 0) + first.cpu()  # [head] sums on the host: merged across workers
            self.entropy[layer] = self.entropy.get(layer, 0) + ent.cpu()
        self.rows += n_rows

    def merge(self, other: AttentionMassReducer) -> AttentionMassReducer:
        if not isinstance(other, AttentionMassReducer):
            raise TypeError(f"can only merge AttentionMassReducer; got {type(other).__name__}")
        for layer in other.mass:
            self.mass[layer] = self.mass.get(layer, 0) + other.mass[layer]
            self.entropy[layer] = self.entropy.get(layer, 0) + other.entropy[layer]
        self.rows += other.rows
        return self

    def result(self) -> pd.DataFrame:
        rows = []
        for layer in sorted(self.mass):
            for metric, sums in (("first_token_mass", self.mass[layer]), ("entropy", self.entropy[layer])):
                for head, s in enumerate(sums.tolist()):
                    rows.append(
                        {"layer": layer, "head": head, "metric": metric, "value": s / max(self.rows, 1), "n": self.rows}
                    )
        df = pd.DataFrame(rows, columns=STAT_COLUMNS)
        return df.astype({"layer": "int64", "head": "int64", "value": "float64", "n": "int64"})


class NoOpReducer:
    """Looks at nothing; counts batches. For measuring the cost of capture alone."""

    def __init__(self):
        self.batches = 0

    def update(self, cap: Capture) -> None:
        self.batches += 1

    def merge(self, other: NoOpReducer) -> NoOpReducer:
        self.batches += other.batches
        return self

    def result(self) -> int:
        return self.batches


class on_device:
    """Wrap a loaded model after moving it to ``device``; everything passes through (every
    backend's ``run`` moves its batch to the model's device, and the captured tensors stay
    there: reducers work on the device and hand small per-item values to the host).
    ``"cpu"`` leaves the model where it is."""

    def __init__(self, model, device: str | torch.device = "cpu"):
        self._model = model
        self.device = torch.device(device)
        if self.device.type != "cpu":
            with contextlib.redirect_stdout(sys.stderr):  # the bridge's .to() prints to stdout
                model.to(self.device)

    def __getattr__(self, name):
        return getattr(self._model, name)

    def run(self, batch, quantities=("pattern",), layers=None, **kw):
        return self._model.run(batch, quantities, layers, **kw)
