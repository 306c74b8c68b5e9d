"""Why SmolLM2-135M's induction circuit stays below faithfulness 0.8: the same faithfulness curve
with the edges ranked and scored in other ways, regenerated from code (``make circuit-variants``).

``python -m headscope.reports.tools.experiments.circuit_variants`` scores SmolLM2-135M's induction
edges (8 items) and evaluates the top edges at a few budgets by exact edge patching, for each variant:

* ``abs``: EAP-IG (5 steps), edges ranked by ``|score|`` (MIB's default; what ``make circuits`` does);
* ``signed``: the same scores, edges ranked by ``-score`` (those whose corruption lowers the
  metric most first: an edge that raises the metric when corrupted is left out of small circuits);
* ``steps20``: EAP-IG with 20 steps, ranked by ``|score|``.

Writes ``data/figures/circuits_smollm2_variants.json`` (settings, ``m_full``/``m_empty``, each
variant's faithfulness per budget, 5 random circuits per budget as the baseline, and which of the
patching heads :data:`HEADS` each variant's most faithful circuit holds); ~10 min of one core.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch

from headscope.reports.tools.experiments.circuits_figures import FIGURES, HEADS, MODEL, _heads_in

OUT = FIGURES / "circuits_smollm2_variants.json"
BUDGETS = (0.02, 0.1, 0.2, 0.5)
log = logging.getLogger(__name__)


def _random_rows(patched, graph, budgets, m_full: float, m_empty: float, seeds: int) -> list[dict]:
    """Per budget, the faithfulness of ``seeds`` random circuits of as many edges (pruned):
    mean, std, min, max (the baseline of ``make circuits``)."""
    from headscope.analyses.circuits.edges.evaluate import faithfulness
    from headscope.analyses.circuits.edges.graph import budget_edges, random_circuit

    rows = []
    for b in budgets:
        n = budget_edges(b, graph.n_edges)
        f = torch.tensor(
            [
                faithfulness(patched.metric_of(graph.prune(random_circuit(graph, n, s))), m_full, m_empty)
                for s in range(seeds)
            ],
            dtype=torch.float64,
        )
        rows.append(
            {"budget": b, "mean": float(f.mean()), "std": float(f.std()), "min": float(f.min()), "max": float(f.max())}
        )
    return rows


def variant_study(model, task, *, budgets, batch_size: int, seeds: int = 5) -> dict:
    from headscope.analyses.circuits.edges.attribution import EdgeConfig, edge_scores
    from headscope.analyses.circuits.edges.evaluate import PatchedBatches, faithfulness
    from headscope.analyses.circuits.edges.graph import budget_edges, top_circuit

    t0 = time.perf_counter()
    graph, s5 = edge_scores(model, task, EdgeConfig(method="eap-ig", steps=5, batch_size=batch_size))
    _, s20 = edge_scores(model, task, EdgeConfig(method="eap-ig", steps=20, batch_size=batch_size))
    t_scores = time.perf_counter() - t0
    patched = PatchedBatches.of(model, task, batch_size)
    m_full = patched.metric_of(graph.valid)
    m_empty = patched.metric_of(torch.zeros_like(graph.valid))
    # top_circuit ranks by |.|: a signed ranking is |.| of the negative part, the positive edges last
    signed = torch.where(s5 < 0, -s5, torch.zeros(()) - 1e-30 * s5.abs())
    variants = {"abs": s5, "signed": signed, "steps20": s20}
    t1 = time.perf_counter()
    out, heads = {}, {}
    for name, scores in variants.items():
        rows, kept = [], {}
        for b in budgets:
            circuit = graph.prune(top_circuit(graph, scores, budget_edges(b, graph.n_edges)))
            f = faithfulness(patched.metric_of(circuit), m_full, m_empty)
            rows.append({"budget": b, "n_edges_pruned": int(circuit.sum()), "faithfulness": f})
            kept[b] = sorted(_heads_in(graph, circuit) & set(HEADS))
        out[name] = rows
        best = max(rows, key=lambda r: r["faithfulness"])["budget"]
        heads[name] = {"budget": best, "heads": kept[best]}
    return {
        "random": _random_rows(patched, graph, budgets, m_full, m_empty, seeds),
        "heads_at_best": heads,
        "model": model.spec.name,
        "task": task.summary(),
        "n_edges_total": graph.n_edges,
        "m_full": m_full,
        "m_empty": m_empty,
        "variants": out,
        "seeds": seeds,
        "seconds": {"scores": round(t_scores, 1), "faithfulness": round(time.perf_counter() - t1, 1)},
    }


#: the variants' column heads in the guide's table
LABELS = {
    "abs": "by absolute score, 5 steps",
    "signed": "by signed score, 5 steps",
    "steps20": "by absolute score, 20 steps",
}


def variants_table(doc: dict) -> str:
    """The Markdown table docs/guide/circuits.md quotes: per budget, each variant's faithfulness
    (edges kept after pruning) and the random circuits' ``mean ± std [min, max]``."""
    names = list(doc["variants"])
    lines = [
        "| budget | " + " | ".join(LABELS.get(n, n) for n in names) + " | random circuits |",
        "|---:|" + "---:|" * len(names) + "---|",
    ]
    for i, rand in enumerate(doc["random"]):
        cells = [
            f"{doc['variants'][n][i]['faithfulness']:.3f} ({doc['variants'][n][i]['n_edges_pruned']:,})" for n in names
        ]
        r = f"{rand['mean']:.3f} ± {rand['std']:.3f} [{rand['min']:.3f}, {rand['max']:.3f}]"
        lines.append(f"| {rand['budget']:g} | " + " | ".join(cells) + f" | {r} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from headscope.analyses.patching.tasks import load_task
    from headscope.probes.models.loading import load_model

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n-items", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    model = load_model(MODEL, "inhouse")
    task = load_task(model, "induction", n_items=args.n_items, seed=0)
    out = variant_study(model, task, budgets=BUDGETS, batch_size=args.batch_size)
    args.out.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    log.info("wrote %s", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
