"""One edge-circuit study: scores, circuits at budgets evaluated exactly beside random ones, and
the frames the ``circuit`` command and the report's "Circuits" stage write.

:func:`circuit_study` returns ``(edges, faithfulness, summary)``: the edges frame
(:data:`~headscope.analyses.circuits.edges.frames.EDGE_COLUMNS` plus ``kept_at``, the smallest
budget of the study whose pruned circuit holds the edge, NaN where none does), the faithfulness
frame (:data:`~headscope.analyses.circuits.edges.evaluate.FAITHFULNESS_COLUMNS`) and a
JSON-ready summary (method, steps, the task's record, ``m_full``/``m_empty``, CPR/CMD, the
random CPR, the number of edges, the top edges, each budget's row).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field

import pandas as pd
import torch

from headscope.analyses.circuits.edges.attribution import (
    DEFAULT_STEPS,
    EdgeConfig,
    batch_sums,
    edge_scores,
    mean_scores,
    model_graph,
)
from headscope.analyses.circuits.edges.evaluate import PatchedBatches, faithfulness_frame
from headscope.analyses.circuits.edges.frames import edges_frame
from headscope.analyses.circuits.edges.graph import EdgeGraph, budget_edges, top_circuit
from headscope.analyses.patching.items import Task
from headscope.probes.models.inhouse.edge_forward import check_graph_model

#: faithfulness a circuit must reach for the figure to prefer it (MIB's and the issue's bar)
GOOD_FAITHFULNESS = 0.8
#: columns of the study's edges frame: the edges table's and ``kept_at``
STUDY_EDGE_COLUMNS = ("sender", "receiver", "via", "score", "rank", "method", "kept_at")


def kept_at(graph: EdgeGraph, scores: torch.Tensor, budgets) -> torch.Tensor:
    """``[sender, receiver]`` float64: the smallest of ``budgets`` whose pruned top-``|score|``
    circuit holds the edge, NaN where none does (a pruned edge can come back at a larger budget,
    once what it hung from is kept)."""
    out = torch.full(graph.valid.shape, math.nan, dtype=torch.float64)
    for b in sorted(budgets, reverse=True):
        circuit = graph.prune(top_circuit(graph, scores, budget_edges(b, graph.n_edges)))
        out[circuit] = float(b)
    return out


def figure_budget(faith: pd.DataFrame, asked: float | None = None) -> float | None:
    """The budget the figure draws: ``asked`` when it is one of the study's; else the smallest below 1
    whose circuit reaches :data:`GOOD_FAITHFULNESS`, else the most faithful below 1 (the full graph
    says nothing); None for no budget below 1.

    >>> f = pd.DataFrame({"budget": [0.01, 0.1, 1.0], "faithfulness": [0.3, 0.85, 1.0]})
    >>> figure_budget(f), figure_budget(f.assign(faithfulness=[0.3, 0.2, 1.0])), figure_budget(f, 1.0)
    (0.1, 0.01, 1.0)
    """
    if asked is not None and bool((faith["budget"] == asked).any()):
        return float(asked)
    below = faith[faith["budget"] < 1.0]
    if below.empty:
        return None
    good = below[below["faithfulness"] >= GOOD_FAITHFULNESS]
    if not good.empty:
        return float(good["budget"].min())
    return float(below.loc[below["faithfulness"].idxmax(), "budget"])


def circuit_study(
    model,
    task: Task,
    *,
    method: str,
    steps: int,
    budgets,
    seeds: int,
    batch_size: int,
    sums: dict | None = None,
    evaluate=None,
) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """``(edges, faithfulness, summary)`` of one study (module docstring); raises what
    :func:`~headscope.analyses.circuits.edges.attribution.edge_scores` raises. ``sums``: the
    batches' score sums computed already (:func:`~headscope.analyses.circuits.edges.attribution.batch_sums`
    of a sharded run's parts, joined; every batch of the task: ``ValueError`` otherwise);
    ``evaluate``: the circuits' metrics from elsewhere (a sharded run's workers,
    :func:`~headscope.analyses.circuits.edges.evaluate.faithfulness_frame`'s ``evaluate``)."""
    budgets = sorted(float(b) for b in budgets)
    t0 = time.perf_counter()
    edge_cfg = EdgeConfig(method=method, steps=steps, batch_size=batch_size)
    if sums is None:
        graph, scores = edge_scores(model, task, edge_cfg)
    else:
        graph = model_graph(model)
        scores = mean_scores(graph, sums, len(task.items), n_batches(task, batch_size))
    t_scores = time.perf_counter() - t0
    edges = edges_frame(graph, scores, method)
    at = kept_at(graph, scores, budgets)
    index = {n: i for i, n in enumerate(graph.senders)}
    rindex = {r: i for i, r in enumerate(graph.receivers)}
    edges["kept_at"] = [
        float(at[index[s], rindex[(r, v)]])
        for s, r, v in zip(edges["sender"].astype(str), edges["receiver"].astype(str), edges["via"].astype(str))
    ]
    t1 = time.perf_counter()
    patched = PatchedBatches.of(model, task, batch_size) if evaluate is None else None
    faith, summary = faithfulness_frame(patched, graph, scores, budgets, seeds=seeds, evaluate=evaluate)
    t_faith = time.perf_counter() - t1
    top = [f"{r.sender}->{r.receiver}.{r.via}" for r in edges.head(10).itertuples()]
    summary = {
        "method": method,
        "steps": None if method == "eap" else steps,
        "task": task.summary(),
        **summary,
        "top_edges": top,
        "faithfulness": faith.to_dict("records"),
        "seconds": {"scores": round(t_scores, 2), "faithfulness": round(t_faith, 2)},
    }
    return edges[list(STUDY_EDGE_COLUMNS)], faith, summary


#: the report's budgets: a few of MIB's, enough for the curve and its areas at a fraction of the time
REPORT_BUDGETS = (0.001, 0.005, 0.02, 0.1, 0.5, 1.0)


@dataclass(frozen=True, kw_only=True)
class CircuitsConfig:
    """Settings of the report's "Circuits" stage: the ``task`` (a shipped patching task or a JSONL
    file; its metric must read next-token logits), ``n_items`` and ``seq_len`` of a generated task,
    the scoring ``method`` and EAP-IG's ``steps``, the ``budgets`` evaluated, random circuits per
    budget (``seeds``), the budget the figure draws (``figure_budget``; None: the smallest reaching
    faithfulness 0.8, else the most faithful below 1), items per forward, the seed of generated items."""

    task: str = field(default="induction", metadata={"help": "patching task whose circuit is found"})
    n_items: int = field(default=8, metadata={"help": "items of the task"})
    seq_len: int = field(default=10, metadata={"help": "tokens of a generated sequence"})
    method: str = field(default="eap-ig", metadata={"help": "edge scores: eap, eap-ig, eap-ig-activations"})
    steps: int = field(default=DEFAULT_STEPS, metadata={"help": "EAP-IG interpolation steps"})
    budgets: tuple[float, ...] = field(default=REPORT_BUDGETS, metadata={"cli": False})
    seeds: int = field(default=3, metadata={"help": "random circuits per budget", "low": 0, "high": 100})
    figure_budget: float | None = field(default=None, metadata={"help": "budget of the drawn circuit"})
    batch_size: int = field(default=16, metadata={"help": "items per forward"})
    seed: int = field(default=0, metadata={"help": "seed of generated items", "low": 0})

    def __post_init__(self):
        EdgeConfig(method=self.method, steps=self.steps, batch_size=self.batch_size)  # its checks
        for k in ("n_items", "seq_len"):
            if getattr(self, k) < 1:
                raise ValueError(f"The {k!r} parameter of CircuitsConfig must be >= 1; got {getattr(self, k)}.")
        if self.seeds < 0:
            raise ValueError(f"The 'seeds' parameter of CircuitsConfig must be >= 0; got {self.seeds}.")
        if not self.budgets:
            raise ValueError("The 'budgets' parameter of CircuitsConfig needs at least one budget; got none.")
        for b in (*self.budgets, *(() if self.figure_budget is None else (self.figure_budget,))):
            budget_edges(b, 1)  # a budget outside [0, 1] is refused


def circuit_task(model, cfg: CircuitsConfig) -> Task:
    """The study's task (``cfg.task``, ``cfg.n_items`` items of ``cfg.seq_len`` tokens, ``cfg.seed``),
    its unusable items counted in its record rather than warned about. Raises what
    :func:`~headscope.analyses.patching.tasks.load_task` raises."""
    import warnings

    from headscope.analyses.patching.tasks import load_task

    with warnings.catch_warnings():  # unusable items are counted in the summary's task record
        warnings.filterwarnings("ignore", message=r"task .* items unusable", category=UserWarning)
        return load_task(model, cfg.task, n_items=cfg.n_items, seed=cfg.seed, seq_len=cfg.seq_len)


def n_batches(task: Task, batch_size: int) -> int:
    """How many batches of at most ``batch_size`` items (of one length each) the task's items make."""
    return sum(-(-n // batch_size) for n in Counter(len(it.clean) for it in task.items).values())


def score_part(model, cfg: CircuitsConfig, part: tuple[int, int]) -> dict:
    """Part ``(k, n)`` of the study's edge scores, a sharded run's worker's work: ``{batch number:
    Σ over its items of the scores [sender, receiver]}`` of every ``n``-th batch from the ``k``-th
    (:func:`~headscope.analyses.circuits.edges.attribution.batch_sums`). The parts' sums joined are
    :func:`run_circuits`'s ``sums``: the circuits, faithfulness and random baselines run there,
    on the merged scores. Raises what :func:`run_circuits` raises."""
    check_graph_model(model)
    task = circuit_task(model, cfg)
    return batch_sums(model, task, EdgeConfig(method=cfg.method, steps=cfg.steps, batch_size=cfg.batch_size), part)


def evaluate_part(model, cfg: CircuitsConfig, masks: torch.Tensor, which: list[int]) -> dict[int, float]:
    """``{circuit index: m(C)}`` of the circuits ``masks[which]`` (``[circuit, sender, receiver]``),
    a sharded run's worker's share of the faithfulness evaluation: the task's corrupted runs made
    as one process makes them, then each circuit's metric over every batch, as one process sums it."""
    patched = PatchedBatches.of(model, circuit_task(model, cfg), cfg.batch_size)
    return {i: patched.metric_of(masks[i]) for i in which}


def run_circuits(
    model, cfg: CircuitsConfig, sums: dict | None = None, evaluate=None
) -> tuple[dict[str, pd.DataFrame], dict]:
    """The report stage's work: ``({"circuit_edges", "circuit_faithfulness"}, summary)`` of
    :func:`circuit_study` on ``cfg.task``, the summary with the graph's shape and the budget the
    figure draws. ``sums``: the edge scores' batch sums of a sharded run (:func:`score_part`'s,
    joined): the same floats as one process adds, so the same tables; ``evaluate``: ``masks ->
    [m(C)]``, the circuits' metrics from a sharded run's workers (:func:`evaluate_part`'s, joined).
    Raises ``ValueError`` / ``ModelIncompatibleError`` as the study does."""
    net = check_graph_model(model)
    task = circuit_task(model, cfg)
    edges, faith, summary = circuit_study(
        model,
        task,
        method=cfg.method,
        steps=cfg.steps,
        budgets=cfg.budgets,
        seeds=cfg.seeds,
        batch_size=cfg.batch_size,
        sums=sums,
        evaluate=evaluate,
    )
    summary["figure_budget"] = figure_budget(faith, cfg.figure_budget)
    summary["graph"] = {"n_layers": net.cfg.n_layers, "n_heads": net.cfg.n_heads, "n_kv_heads": net.cfg.n_kv_heads}
    return {"circuit_edges": edges, "circuit_faithfulness": faith}, summary
