"""How well EAP-IG ranks SmolLM2-135M's induction edges: its scores against exact single-edge
effects over the top edges, regenerated from code (``make circuit-ranks``).

``python -m headscope.reports.tools.experiments.circuit_ranks`` scores every edge of SmolLM2-135M
(in-house backend) on the shipped induction task with EAP-IG (inputs variant), takes the ``--top``
edges by ``|score|`` (200), patches each alone exactly
(:func:`~headscope.analyses.circuits.edges.evaluate.edge_effects`: ``m(clean, only that edge
corrupted) - m(clean)``, the quantity EAP estimates), and writes
``data/figures/circuits_smollm2_ranks.json``: the settings, Spearman (and Pearson) between scores
and exact effects over those edges (signed, and of their magnitudes), how many share their sign, the
edges, and the edge ``L16H0 -> L18KV2 k`` (L18H6's keys) with its rank, score and exact effect.
``tests/analyses/circuits/edges/test_circuit_ranks.py`` reads it; docs/guide/circuits.md quotes it.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch

from headscope.reports.tools.experiments.circuits_figures import FIGURES, K_EDGE, MODEL

OUT = FIGURES / "circuits_smollm2_ranks.json"
log = logging.getLogger(__name__)


def rank_study(model, task, *, steps: int, top: int, batch_size: int) -> dict:
    """The figures of the module docstring on ``model`` and ``task``."""
    from scipy.stats import pearsonr, spearmanr

    from headscope.analyses.circuits.edges.attribution import EdgeConfig, edge_scores
    from headscope.analyses.circuits.edges.evaluate import PatchedBatches, edge_effects

    t0 = time.perf_counter()
    graph, scores = edge_scores(model, task, EdgeConfig(method="eap-ig", steps=steps, batch_size=batch_size))
    t_scores = time.perf_counter() - t0
    flat = torch.where(graph.valid, scores.abs(), torch.tensor(-1.0)).flatten()
    order = torch.sort(flat, descending=True, stable=True).indices
    n_r = graph.valid.shape[1]
    edges = [(int(i) // n_r, int(i) % n_r) for i in order[:top]]
    k = graph.edge_index(*K_EDGE)
    k_rank = int((order == k[0] * n_r + k[1]).nonzero()[0, 0]) + 1
    patched = PatchedBatches.of(model, task, batch_size)
    t1 = time.perf_counter()
    exact = edge_effects(patched, graph, edges if k in edges else [*edges, k])
    t_exact = time.perf_counter() - t1
    s = torch.tensor([float(scores[e]) for e in edges], dtype=torch.float64)
    x = exact[:top].double()
    rows = [
        {
            "sender": graph.senders[a],
            "receiver": graph.receivers[b][0],
            "via": graph.receivers[b][1],
            "score": float(s[i]),
            "exact_effect": float(x[i]),
        }
        for i, (a, b) in enumerate(edges)
    ]
    k_exact = float(exact[edges.index(k)] if k in edges else exact[-1])
    return {
        "model": model.spec.name,
        "task": task.summary(),
        "method": "eap-ig",
        "steps": steps,
        "top": top,
        "n_edges_total": graph.n_edges,
        "spearman": float(spearmanr(s, x).statistic),
        "spearman_abs": float(spearmanr(s.abs(), x.abs()).statistic),
        "pearson": float(pearsonr(s, x).statistic),
        "same_sign": int(((s > 0) == (x > 0)).sum()),
        "k_edge": {"edge": list(K_EDGE), "rank": k_rank, "score": float(scores[k]), "exact_effect": k_exact},
        "edges": rows,
        "seconds": {"scores": round(t_scores, 1), "exact": round(t_exact, 1)},
    }


def main(argv: list[str] | None = None) -> int:
    from headscope.analyses.patching.tasks import load_task
    from headscope.probes.models.loading import load_model

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n-items", type=int, default=8)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--top", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    model = load_model(MODEL, "inhouse")
    task = load_task(model, "induction", n_items=args.n_items, seed=0)
    out = rank_study(model, task, steps=args.steps, top=args.top, batch_size=args.batch_size)
    args.out.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    log.info("wrote %s", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
