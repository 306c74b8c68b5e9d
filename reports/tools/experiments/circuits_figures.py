"""SmolLM2-135M's induction, IOI and greater-than circuits by EAP-IG, regenerated from code (``make circuits``).

``python -m headscope.reports.tools.experiments.circuits_figures`` scores every edge of SmolLM2-135M
(in-house backend) on the shipped induction task with EAP-IG (inputs variant), evaluates the top
edges at MIB's budgets by exact edge patching beside random circuits of the same size, and writes
``data/figures/circuits_smollm2.json`` (``--task ioi`` / ``greater_than``: ``circuits_smollm2_<task>.json``,
without the induction-only figures): the settings, ``m_full``/``m_empty``, the faithfulness
curve with its random baseline (mean, spread), CPR/CMD, the top edges, for each head that
activation and path patching single out (:data:`HEADS`) the budgets whose circuit holds it,
and the edge ``L16H0 -> L18KV2 k`` (L18H6's keys) with its rank, score and exact effect.
``tests/analyses/circuits/edges/test_circuits_figures.py`` reads it.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch

FIGURES = Path(__file__).resolve().parents[3] / "data" / "figures"
MODEL = "smollm2-135m"
#: the heads activation patching (denoising top four) and noising (L16H0) single out on this task
HEADS = ("L16H0", "L18H6", "L29H1", "L23H7", "L23H2")
#: L16H0 into L18H6's keys: L18H6 reads KV head 6 // 3 = 2 (9 query heads, 3 KV heads)
K_EDGE = ("L16H0", "L18KV2", "k")

#: the tasks ``make circuits`` studies, each into :func:`figures_name`
TASKS = ("induction", "ioi", "greater_than")

log = logging.getLogger(__name__)


def figures_name(task: str) -> str:
    """``circuits_smollm2.json`` for induction (the first study's name), else ``circuits_smollm2_<task>.json``."""
    return "circuits_smollm2.json" if task == "induction" else f"circuits_smollm2_{task}.json"


def _heads_in(graph, circuit: torch.Tensor) -> set[str]:
    """Senders with a kept outgoing edge (after pruning, every one of them is also fed)."""
    return {graph.senders[s] for s in circuit.any(1).nonzero()[:, 0].tolist()}


def study(model, task, *, steps: int, budgets, seeds: int, batch_size: int, induction: bool = True) -> dict:
    """The figures of one run (module docstring); ``induction`` False (another task): without the
    induction heads' budgets and the key edge, which name that task's heads."""
    from headscope.analyses.circuits.edges.attribution import EdgeConfig, edge_scores
    from headscope.analyses.circuits.edges.evaluate import PatchedBatches, faithfulness_frame
    from headscope.analyses.circuits.edges.frames import edges_frame

    t0 = time.perf_counter()
    graph, scores = edge_scores(model, task, EdgeConfig(method="eap-ig", steps=steps, batch_size=batch_size))
    t_scores = time.perf_counter() - t0
    edges = edges_frame(graph, scores, "eap-ig")
    patched = PatchedBatches.of(model, task, batch_size)
    t1 = time.perf_counter()
    faith, summary = faithfulness_frame(patched, graph, scores, budgets, seeds=seeds)
    t_faith = time.perf_counter() - t1
    out = {
        "model": model.spec.name,
        "task": task.summary(),
        "method": "eap-ig",
        "steps": steps,
        "seeds": seeds,
        "n_edges_total": graph.n_edges,
        **{k: summary[k] for k in ("m_full", "m_empty", "cpr", "cmd", "random_cpr")},
        "faithfulness": faith.to_dict("records"),
        "top_edges": [
            {"sender": e.sender, "receiver": e.receiver, "via": e.via, "score": float(e.score)}
            for e in edges.head(20).itertuples()
        ],
        "seconds": {"scores": round(t_scores, 1), "faithfulness": round(t_faith, 1)},
    }
    return {**out, **_induction_figures(graph, scores, edges, patched, budgets)} if induction else out


def _induction_figures(graph, scores, edges, patched, budgets) -> dict:
    """The budgets whose circuit holds each of :data:`HEADS`, and :data:`K_EDGE`'s rank, score and
    exact effect."""
    from headscope.analyses.circuits.edges.evaluate import edge_effects
    from headscope.analyses.circuits.edges.graph import budget_edges, top_circuit

    heads = {h: [] for h in HEADS}
    for b in budgets:
        kept = _heads_in(graph, graph.prune(top_circuit(graph, scores, budget_edges(b, graph.n_edges))))
        for h in HEADS:
            if h in kept:
                heads[h].append(b)
    s, r = graph.edge_index(*K_EDGE)
    row = edges[(edges["sender"] == K_EDGE[0]) & (edges["receiver"] == K_EDGE[1]) & (edges["via"] == "k")]
    exact = float(edge_effects(patched, graph, [(s, r)])[0])
    return {
        "heads_in_circuit": heads,
        "k_edge": {
            "edge": list(K_EDGE),
            "rank": int(row["rank"].iloc[0]),
            "score": float(row["score"].iloc[0]),
            "exact_effect": exact,
        },
    }


def faithfulness_table(figures: dict) -> str:
    """The Markdown table docs/guide/circuits.md quotes: budget, edges kept after pruning,
    faithfulness, random baseline ``mean ± std [min, max]``."""
    lines = [
        "| budget | edges | faithfulness | random circuits |",
        "|---:|---:|---:|---|",
    ]
    for r in figures["faithfulness"]:
        rand = f"{r['random_mean']:.3f} ± {r['random_std']:.3f} [{r['random_min']:.3f}, {r['random_max']:.3f}]"
        lines.append(f"| {r['budget']:g} | {r['n_edges_pruned']:,} | {r['faithfulness']:.3f} | {rand} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from headscope.analyses.circuits.edges.graph import MIB_BUDGETS
    from headscope.analyses.patching.tasks import load_task
    from headscope.probes.models.loading import load_model

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n-items", type=int, default=16)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--budgets", type=float, nargs="+", default=list(MIB_BUDGETS))
    p.add_argument("--task", choices=TASKS, default="induction")
    p.add_argument("--out", type=Path, default=None, help="default: data/figures/" + figures_name("TASK"))
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    model = load_model(MODEL, "inhouse")
    task = load_task(model, args.task, n_items=args.n_items, seed=0)
    out = study(
        model,
        task,
        steps=args.steps,
        budgets=sorted(args.budgets),
        seeds=args.seeds,
        batch_size=args.batch_size,
        induction=args.task == "induction",
    )
    args.out = args.out or FIGURES / figures_name(args.task)
    args.out.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    log.info("wrote %s", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
