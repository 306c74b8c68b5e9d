"""The edges table of an edge circuit run: one row per edge of the graph.

Columns (:data:`EDGE_COLUMNS`): ``sender`` (``input``, ``L{l}H{h}``, ``MLP{l}``), ``receiver``
(``L{l}H{h}`` for q, ``L{l}KV{g}`` for k and v, ``MLP{l}``, ``logits``), ``via`` (``q``, ``k``,
``v``, ``mlp``, ``logits``), ``score`` (:mod:`.attribution`: the estimated change of the
metric when the edge alone is corrupted), ``rank`` (1 = largest ``|score|``), ``method``.
"""

from __future__ import annotations

import pandas as pd
import torch

from headscope.analyses.circuits.edges.graph import EdgeGraph

EDGE_COLUMNS = ("sender", "receiver", "via", "score", "rank", "method")


def edges_frame(graph: EdgeGraph, scores: torch.Tensor, method: str) -> pd.DataFrame:
    """Every edge of ``graph`` with its score ``scores [sender, receiver]``, sorted by rank."""
    s_idx, r_idx = graph.valid.nonzero(as_tuple=True)
    vals = scores[s_idx, r_idx].double()
    frame = pd.DataFrame(
        {
            "sender": [graph.senders[i] for i in s_idx.tolist()],
            "receiver": [graph.receivers[i][0] for i in r_idx.tolist()],
            "via": [graph.receivers[i][1] for i in r_idx.tolist()],
            "score": vals.numpy(),
        }
    )
    order = torch.sort(vals.abs(), descending=True, stable=True).indices.numpy()
    frame = frame.iloc[order].reset_index(drop=True)
    frame["rank"] = range(1, len(frame) + 1)
    frame["method"] = method
    for c in ("sender", "receiver", "via", "method"):
        frame[c] = frame[c].astype("category")
    return frame[list(EDGE_COLUMNS)]
