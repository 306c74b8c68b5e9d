"""Exact evaluation of edge circuits by patching, and their MIB faithfulness.

A circuit ``C`` (``[sender, receiver]`` bool, :mod:`.graph`) is run on the clean input with every
edge outside it patched: each receiver reads the corrupted run's output of the senders whose
edge to it is not in ``C`` and this run's output of the others
(:func:`~headscope.probes.models.inhouse.edge_forward.graph_forward`). So the full graph gives
the clean metric ``m(M)`` and the empty circuit the corrupted one ``m(∅)`` (exactly, up to float
summation order). **Faithfulness** (MIB): ``(m(C) - m(∅)) / (m(M) - m(∅))`` with ``m`` the
task's metric averaged over items. **CPR** is the area under faithfulness over budgets (higher
is better), **CMD** the area under ``|1 - faithfulness|`` (lower is better); both by the
trapezoid rule over the budget fractions (x from the smallest budget to the largest), divided by
that span so a constant curve ``f`` has area ``f``.

An edge's **exact effect** (:func:`edge_effects`): ``m(clean with only that edge corrupted) -
m(clean)``, the quantity EAP estimates (:mod:`.attribution`; same sign convention).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

from headscope.analyses.circuits.edges.graph import EdgeGraph, budget_edges, random_circuit, top_circuit
from headscope.analyses.patching.items import Task
from headscope.analyses.patching.tasks import metric_fn
from headscope.probes.models.inhouse.edge_forward import check_graph_model, graph_forward

#: columns of the faithfulness frame (:func:`faithfulness_frame`)
FAITHFULNESS_COLUMNS = (
    "budget",
    "n_edges",
    "n_edges_pruned",
    "metric",
    "faithfulness",
    "random_mean",
    "random_std",
    "random_min",
    "random_max",
    "n_seeds",
)


@dataclass
class PatchedBatches:
    """A task's batches with the corrupted run's sender outputs, computed once:
    ``[(clean ids, corrupted outs [sender, batch, pos, d_model], answer, wrong)]``."""

    net: object
    metric: object
    batches: list
    n_items: int

    @classmethod
    def of(cls, model, task: Task, batch_size: int = 16) -> PatchedBatches:
        net = check_graph_model(model)
        if not task.items:
            raise ValueError(f"task {task.name!r} has no usable items ({task.n_unusable} unusable)")
        out, dev = [], next(net.parameters()).device
        with torch.no_grad():
            for clean, corrupted, answer, wrong, _ in task.batches(batch_size):
                wrong = None if wrong is None else wrong.to(dev)
                out.append((clean.to(dev), graph_forward(net, corrupted.to(dev))[1], answer.to(dev), wrong))
        return cls(net, metric_fn(task.metric), out, len(task.items))

    def metric_of(self, keep: torch.Tensor) -> float:
        """The mean metric over items with edges patched by ``keep [sender, receiver]`` (1: this
        run's value, 0: the corrupted run's)."""
        total = 0.0
        with torch.no_grad():
            for clean, outs_x, answer, wrong in self.batches:
                keep = keep.to(device=outs_x.device, dtype=outs_x.dtype)
                logits, _, _ = graph_forward(self.net, clean, corrupted=outs_x, keep=keep)
                total += float(self.metric(logits, answer, wrong).sum())
        return total / self.n_items


def circuit_metric(patched: PatchedBatches, circuit: torch.Tensor) -> float:
    """``m(C)``: the mean metric with every edge outside ``circuit`` corrupted."""
    return patched.metric_of(circuit)


def faithfulness(m_circuit: float, m_full: float, m_empty: float) -> float:
    """MIB's normalised faithfulness ``(m(C) - m(∅)) / (m(M) - m(∅))``; ``ValueError`` when
    ``m(M) == m(∅)`` (the task does not move the metric).

    >>> faithfulness(0.5, 1.0, 0.0)
    0.5
    """
    if m_full == m_empty:
        raise ValueError(f"faithfulness needs m(M) != m(empty); both are {m_full}")
    return (m_circuit - m_empty) / (m_full - m_empty)


def edge_effects(patched: PatchedBatches, graph: EdgeGraph, edges: list[tuple[int, int]]) -> torch.Tensor:
    """Exact effect of each edge ``(sender, receiver)`` alone: ``m(clean, only that edge
    corrupted) - m(clean)`` ``[edge]``."""
    full = graph.valid.clone()
    m_full = patched.metric_of(full)
    out = torch.empty(len(edges))
    for i, (s, r) in enumerate(edges):
        keep = full.clone()
        keep[s, r] = False
        out[i] = patched.metric_of(keep) - m_full
    return out


def _area(budgets: list[float], values: list[float]) -> float:
    """Trapezoid area of ``values`` over ``budgets`` divided by the span (one budget: the value)."""
    if len(budgets) == 1:
        return float(values[0])
    order = sorted(range(len(budgets)), key=budgets.__getitem__)
    x = torch.tensor([budgets[i] for i in order], dtype=torch.float64)
    y = torch.tensor([values[i] for i in order], dtype=torch.float64)
    return float(torch.trapezoid(y, x) / (x[-1] - x[0]))


def cpr_cmd(budgets: list[float], faith: list[float]) -> tuple[float, float]:
    """``(CPR, CMD)``: areas under faithfulness and under ``|1 - faithfulness|`` (module docstring).

    >>> cpr_cmd([0.0, 1.0], [0.5, 1.0])
    (0.75, 0.25)
    """
    return _area(budgets, faith), _area(budgets, [abs(1.0 - f) for f in faith])


def circuit_masks(graph: EdgeGraph, scores: torch.Tensor, budgets: list[float], seeds: int) -> torch.Tensor:
    """``[circuit, sender, receiver]`` bool: every circuit :func:`faithfulness_frame` evaluates, in
    its order: the full graph, the empty circuit, then per budget its top-``|score|`` circuit,
    pruned, and ``seeds`` random circuits of as many edges (pruned)."""
    out = [graph.valid.clone(), torch.zeros_like(graph.valid)]
    for b in budgets:
        n = budget_edges(b, graph.n_edges)
        out.append(graph.prune(top_circuit(graph, scores, n)))
        out += [graph.prune(random_circuit(graph, n, seed)) for seed in range(seeds)]
    return torch.stack(out).bool()


def faithfulness_frame(
    patched: PatchedBatches | None,
    graph: EdgeGraph,
    scores: torch.Tensor,
    budgets: list[float],
    *,
    seeds: int = 5,
    evaluate=None,
) -> tuple[pd.DataFrame, dict]:
    """Each budget's top-``|score|`` circuit, pruned, evaluated exactly, beside ``seeds`` random
    circuits of the same number of edges (also pruned) -> (:data:`FAITHFULNESS_COLUMNS` frame,
    summary ``{m_full, m_empty, cpr, cmd, random_cpr, n_edges_total}``). ``evaluate``: ``masks
    [circuit, sender, receiver] -> [m(C) per circuit]`` (:func:`circuit_masks`' circuits; a
    sharded run's workers evaluate them); None: ``patched.metric_of`` of each, in this process."""
    masks = circuit_masks(graph, scores, budgets, seeds)
    metrics = [patched.metric_of(m) for m in masks] if evaluate is None else list(evaluate(masks))
    if len(metrics) != len(masks):
        raise ValueError(f"evaluate must give one metric per circuit ({len(masks)}); got {len(metrics)}")
    m_full, m_empty = metrics[0], metrics[1]
    rows = []
    for i, b in enumerate(budgets):
        at = 2 + i * (1 + seeds)  # the budget's circuit, then its random ones
        m_c = metrics[at]
        rand = torch.tensor(
            [faithfulness(m, m_full, m_empty) for m in metrics[at + 1 : at + 1 + seeds]], dtype=torch.float64
        )
        rows.append(
            {
                "budget": float(b),
                "n_edges": budget_edges(b, graph.n_edges),
                "n_edges_pruned": int(masks[at].sum()),
                "metric": m_c,
                "faithfulness": faithfulness(m_c, m_full, m_empty),
                "random_mean": float(rand.mean()) if seeds else float("nan"),
                "random_std": float(rand.std()) if seeds > 1 else float("nan"),
                "random_min": float(rand.min()) if seeds else float("nan"),
                "random_max": float(rand.max()) if seeds else float("nan"),
                "n_seeds": seeds,
            }
        )
    frame = pd.DataFrame(rows, columns=list(FAITHFULNESS_COLUMNS))
    cpr, cmd = cpr_cmd(list(frame["budget"]), list(frame["faithfulness"]))
    random_cpr = cpr_cmd(list(frame["budget"]), list(frame["random_mean"]))[0] if seeds else float("nan")
    summary = {
        "m_full": m_full,
        "m_empty": m_empty,
        "cpr": cpr,
        "cmd": cmd,
        "random_cpr": random_cpr,
        "n_edges_total": graph.n_edges,
    }
    return frame, summary
