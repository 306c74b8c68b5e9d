"""The contextualisation figures the guide's "From static to contextual" page quotes: the
verdicts for #41's claims 1, 4 and 5 on MiniLM-L6 and SmolLM2, regenerated from code.

``python -m headscope.reports.tools.experiments.context_figures`` (``make context``) runs the
contextualisation measurements (:func:`~headscope.analyses.context.run_context`, full settings:
the whole shipped English sense set, seed 0) on each model and writes
``data/figures/context_<model>.json`` in the format of ``patching.json`` (``figures`` → group →
name as ``{value, text}``, ``quoted``, ``missing``); ``tests/test_readme_figures.py`` fails
while the page quotes other values.

- ``similarity``: claim 1, self-similarity of the static row, the layer-0 input and the last
  layer's output, with bootstrap CIs over words, and the last layer's anisotropy;
- ``saturation``: claim 4, the share of attention rows whose top weight exceeds 0.9 under the
  model's scale and under scale 1 (mean over heads, and the range of the per-layer means), and
  the ranking reversals the scale causes (0: the ranking is unchanged);
- ``distance``: claim 5, Spearman ρ of attention distance against depth with its bootstrap CI
  and verdict, raw weights and norm-based weights.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

from headscope.reports.tools.experiments.figures_doc import write_figures

FIGURES = Path(__file__).resolve().parents[3] / "data" / "figures"
MODELS = {"minilm-l6": "context_minilm.json", "smollm2-135m": "context_smollm2.json"}
QUOTED = (
    "similarity.static",
    "similarity.last",
    "saturation.rows",
    "distance.raw",
    "distance.norm",
)

log = logging.getLogger(__name__)


def _fig(out: dict, name: str, value, text: str) -> None:
    group, key = name.split(".")
    out.setdefault(group, {})[key] = {"value": value, "text": text}


def figures_from(frames: dict, summary: dict) -> dict:
    """The figures of one :func:`~headscope.analyses.context.run_context` result (module doc)."""
    out: dict = {}
    sim = frames["similarity"].set_index(["metric", "depth"])
    last = int(frames["similarity"]["depth"].max())
    for name, depth, where in (("static", -1, "static row"), ("input", 0, "layer-0 input"), ("last", last, "")):
        r = sim.loc[("self_similarity", depth)]
        label = where or f"layer {depth - 1} output"
        _fig(
            out,
            f"similarity.{name}",
            [float(r.value), float(r.ci_low), float(r.ci_high), int(r.n)],
            f"self-similarity {r.value:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}] at the {label} ({int(r.n)} words)",
        )
    aniso = float(sim.loc[("anisotropy", last)].value)
    _fig(out, "similarity.anisotropy", aniso, f"anisotropy {aniso:.3f} at the last layer's output")
    heads = frames["heads"]
    share = {m: heads[heads.metric == f"saturated_{m}"] for m in ("actual", "scale1")}
    mean = {m: float(f.value.mean()) for m, f in share.items()}
    by_layer = {m: f.groupby("layer").value.mean() for m, f in share.items()}
    rng = {m: [float(s.min()), float(s.max())] for m, s in by_layer.items()}
    _fig(
        out,
        "saturation.rows",
        [mean["actual"], mean["scale1"], *rng["actual"], *rng["scale1"], summary["reversals"]],
        f"rows with a weight over 0.9: {mean['actual']:.0%} of a head's rows at the model's scale "
        f"(layers {rng['actual'][0]:.0%} to {rng['actual'][1]:.0%}) vs {mean['scale1']:.0%} at scale 1 "
        f"(layers {rng['scale1'][0]:.0%} to {rng['scale1'][1]:.0%}); {summary['reversals']} ranking reversals",
    )
    for view, t in summary["distance_trend"].items():
        _fig(out, f"distance.{view}", [t["rho"], t["ci_low"], t["ci_high"], t["n"]], f"{view}: {t['verdict']}")
    return out


def measure(model_name: str):
    """``(frames, summary, seconds)`` of the full contextualisation run on ``model_name``."""
    from headscope.analyses.context import ContextConfig, run_context
    from headscope.probes.models.loading import load_model

    model = load_model(model_name, "inhouse")
    start = time.perf_counter()
    frames, summary = run_context(model, ContextConfig(seed=0))
    return frames, summary, time.perf_counter() - start


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated (default: both)")
    p.add_argument("--out", type=Path, default=FIGURES, help="folder of the JSON files (default data/figures)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for name in args.models.split(","):
        if name not in MODELS:
            raise SystemExit(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
        frames, summary, seconds = measure(name)
        log.info("%s: contextualisation measured in %.0f s", name, seconds)
        write_figures(
            args.out / MODELS[name],
            figures_from(frames, summary),
            model=name,
            generated_by="python -m headscope.reports.tools.experiments.context_figures",
            source="run_context(ContextConfig(seed=0)): data/senses/en_senses.jsonl, every sentence",
            quoted=QUOTED,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
