"""The graph of a model for edge circuits: names of senders and receivers, the edges, circuits
as ``[sender, receiver]`` bool matrices, circuits at budgets and dangling-node pruning.

Senders (in order): ``input`` (the input embeddings), each query head ``L{l}H{h}`` (its output
``W_O^h z_h``), each ``MLP{l}``. Receivers: per layer each query head's ``q`` input (named by
the head, ``L{l}H{h}``), each KV head's ``k`` and ``v`` inputs (``L{l}KV{g}``: on GQA/MQA read by
every query head ``h`` with ``h // group_size == g``, never split into copies), ``MLP{l}``, and
``logits``. The layout is :class:`~headscope.probes.models.inhouse.edge_forward.EdgeLayout`'s.

>>> g = EdgeGraph.of(EdgeLayout(n_layers=1, n_heads=2, n_kv_heads=1))
>>> g.senders, g.receivers, g.n_edges
(['input', 'L0H0', 'L0H1', 'MLP0'], [('L0H0', 'q'), ('L0H1', 'q'), ('L0KV0', 'k'), ('L0KV0', 'v'), ('MLP0', 'mlp'), ('logits', 'logits')], 11)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from headscope.probes.models.inhouse.edge_forward import EdgeLayout

#: the budgets of MIB's circuit track: fractions of all edges
MIB_BUDGETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


@dataclass(frozen=True)
class EdgeGraph:
    """Names and edges of a layout: ``senders``, ``receivers`` (``(name, via)``) and ``valid
    [sender, receiver]`` (the edges)."""

    layout: EdgeLayout
    senders: list[str]
    receivers: list[tuple[str, str]]
    valid: torch.Tensor

    @classmethod
    def of(cls, lay: EdgeLayout) -> EdgeGraph:
        senders = ["input"]
        receivers: list[tuple[str, str]] = []
        for l in range(lay.n_layers):
            senders += [f"L{l}H{h}" for h in range(lay.n_heads)] + [f"MLP{l}"]
            receivers += [(f"L{l}H{h}", "q") for h in range(lay.n_heads)]
            receivers += [(f"L{l}KV{g}", via) for via in ("k", "v") for g in range(lay.n_kv_heads)]
            receivers.append((f"MLP{l}", "mlp"))
        receivers.append(("logits", "logits"))
        return cls(lay, senders, receivers, lay.valid())

    @property
    def n_edges(self) -> int:
        return int(self.valid.sum())

    def edge_index(self, sender: str, receiver: str, via: str) -> tuple[int, int]:
        """``(sender index, receiver index)`` of a named edge; ``ValueError`` when it is no edge."""
        try:
            s, r = self.senders.index(sender), self.receivers.index((receiver, via))
        except ValueError:
            raise ValueError(f"no node {sender!r} or receiver {receiver!r} via {via!r} in this graph") from None
        if not bool(self.valid[s, r]):
            raise ValueError(f"{sender} -> {receiver} ({via}) is no edge: the sender is not upstream")
        return s, r

    def circuit_of(self, edges: list[tuple[str, str, str]]) -> torch.Tensor:
        """``[sender, receiver]`` bool of named edges ``(sender, receiver, via)``."""
        out = torch.zeros_like(self.valid)
        for e in edges:
            out[self.edge_index(*e)] = True
        return out

    def _sender_receivers(self) -> list[list[int]]:
        """For each sender, the receivers that feed it (input: none; a head: its q and its KV
        group's k and v; an MLP: its input)."""
        lay = self.layout
        out: list[list[int]] = [[]]
        group = lay.n_heads // lay.n_kv_heads
        for l in range(lay.n_layers):
            for h in range(lay.n_heads):
                out.append([lay.q_receiver(l, h), lay.k_receiver(l, h // group), lay.v_receiver(l, h // group)])
            out.append([lay.mlp_receiver(l)])
        return out

    def prune(self, circuit: torch.Tensor) -> torch.Tensor:
        """``circuit`` without dangling edges: an edge stays when its sender is reached from the
        input through the circuit and its receiver's node reaches the logits through it."""
        feeds = self._sender_receivers()
        owners: dict[int, list[int]] = {}
        for s, rs in enumerate(feeds):
            for r in rs:
                owners.setdefault(r, []).append(s)
        c = circuit & self.valid
        while True:
            fwd = torch.zeros(len(self.senders), dtype=torch.bool)
            fwd[0] = True
            for s in range(1, len(self.senders)):
                fwd[s] = bool((c[:, feeds[s]] & fwd[:, None]).any())
            bwd = torch.zeros(len(self.receivers), dtype=torch.bool)
            bwd[-1] = True
            for r in range(len(self.receivers) - 2, -1, -1):
                bwd[r] = any(bool((c[s] & bwd).any()) for s in owners.get(r, []))
            new = c & fwd[:, None] & bwd[None, :]
            if torch.equal(new, c):
                return c
            c = new


def budget_edges(budget: float, n_edges: int) -> int:
    """How many edges a budget (a fraction of all edges, MIB) keeps: ``floor(budget × n + 0.5)``,
    at least one for a positive budget; ``ValueError`` outside ``[0, 1]``.

    >>> budget_edges(0.001, 110), budget_edges(0.05, 110), budget_edges(1, 110)
    (1, 6, 110)
    """
    if not 0.0 <= budget <= 1.0 or math.isnan(budget):
        raise ValueError(f"a budget is a fraction of the edges in [0, 1]; got {budget}")
    n = int(math.floor(budget * n_edges + 0.5))
    return max(n, 1) if budget > 0 else 0


def top_circuit(graph: EdgeGraph, scores: torch.Tensor, n: int) -> torch.Tensor:
    """The ``n`` edges of largest ``|score|`` (ties: the lower flat index first), as ``[sender, receiver]`` bool."""
    flat = torch.where(graph.valid, scores.abs(), torch.tensor(-1.0, dtype=scores.dtype)).flatten()
    order = torch.sort(flat, descending=True, stable=True).indices[:n]
    out = torch.zeros(flat.numel(), dtype=torch.bool)
    out[order] = True
    return out.view_as(graph.valid)


def random_circuit(graph: EdgeGraph, n: int, seed: int) -> torch.Tensor:
    """``n`` edges drawn uniformly (without replacement) from the graph's edges, seeded."""
    idx = graph.valid.flatten().nonzero()[:, 0]
    pick = idx[torch.randperm(idx.numel(), generator=torch.Generator().manual_seed(seed))[:n]]
    out = torch.zeros(graph.valid.numel(), dtype=torch.bool)
    out[pick] = True
    return out.view_as(graph.valid)
