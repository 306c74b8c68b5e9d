"""Attribution patching and AtP*'s corrections measured against activation patching on every
shipped task, and the induction heads' attention score next to their causal effect.

``python -m headscope.reports.tools.experiments.atp_figures`` (``make figures``; MiniLM-L6 about 3
minutes, SmolLM2-135M about 30 on 2 loaded CPU cores) writes ``data/figures/atp.json``:

* ``{model}.{task}``: activation patching of every head (8 items per task; induction and
  duplicate_token ``seq_len`` 8, seed 0; both directions) and five estimates of it:
  ``total`` (plain attribution, the full gradient), ``direct`` (later heads cut:
  ``gradient="bypass_heads"``), ``qk`` (AtP*'s QK-fix; pre-norm models only: not on
  MiniLM, which is post-norm), ``graddrop`` and ``both``. Per estimate and direction, the
  Spearman correlation over heads and the top-10 overlap with activation patching (GradDrop's
  estimates are magnitudes: compared with ``|effect|``); each row of the README's table is one
  figure (its text the Markdown row);
* ``{model}.best``: the estimate with the highest mean Spearman over the model's tasks and
  directions, and that mean;
* ``smollm2-135m.detect``: for the five heads transformer-lens' ``detect_head`` ranks first
  on SmolLM2 (L18H6, L17H4, L17H3, L17H5, L18H7), headscope's own induction score (the
  roles' probe: 64 sequences of BOS + 20 random tokens repeated, the ``mul`` score) and the
  head's activation-patching denoising effect and rank on the induction task.

``--models`` and ``--tasks`` run a subset; a partial run keeps the other groups of an existing
JSON and lists what it did not measure under ``missing``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import time
from pathlib import Path

import pandas as pd
import torch

from headscope.analyses.patching import PatchConfig, activation_patching, agreement, attribution_patching
from headscope.analyses.patching.tasks import TASKS, load_task

log = logging.getLogger(__name__)
OUT = Path(__file__).resolve().parents[3] / "data" / "figures" / "atp.json"
MODELS = ("minilm-l6", "smollm2-135m")
N_ITEMS, SEQ_LEN = 8, 8
#: estimate -> (PatchConfig changes, whether it estimates a magnitude)
ESTIMATES = {
    "total": ({}, False),
    "direct": ({"gradient": "bypass_heads"}, False),
    "qk": ({"atp_fix": "qk"}, False),
    "graddrop": ({"atp_fix": "graddrop"}, True),
    "both": ({"atp_fix": "both"}, True),
}
DIRECTIONS = ("denoising", "noising")
DETECT_TOP5 = ((18, 6), (17, 4), (17, 3), (17, 5), (18, 7))
SHORT = {"minilm-l6": "MiniLM-L6", "smollm2-135m": "SmolLM2"}


def _fig(out: dict, name: str, value, text: str | None = None) -> None:
    if text is None:
        text = f"{value:.3f}" if isinstance(value, float) else str(value)
    out[name] = {"value": value, "text": text}


def _method(frame: pd.DataFrame, direction: str) -> pd.DataFrame:
    return frame[frame["method"].astype(str).str.endswith(f"_{direction}")]  # "_noising" never ends "denoising"


def task_frames(model, task_name: str, cache: Path | None = None) -> tuple[dict, dict]:
    """Activation patching and the five estimates on one task: ``({"activation" | estimate: frame},
    {"items", "gap"})``; with ``cache``, frames already there are read instead of measured."""
    task = load_task(model, task_name, n_items=N_ITEMS, seq_len=SEQ_LEN)
    cfg = PatchConfig(n_perm=2000, n_boot=200, max_rows=64)
    post_norm = bool(model.network.cfg.post_norm or model.network.cfg.sandwich_norm)
    frames: dict = {}
    meta: dict = {"items": len(task.items)}
    for est, (change, _) in {"activation": ({}, False), **ESTIMATES}.items():
        if est in ("qk", "both") and post_norm:
            continue  # the QK-fix needs a pre-norm model (atp_star)
        path = None if cache is None else cache / f"{model.spec.name}.{task_name}.{est}.parquet"
        if path is not None and path.is_file():
            frames[est] = pd.read_parquet(path)
            continue
        t = time.perf_counter()
        if est == "activation":
            frame, run = activation_patching(model, task, cfg)
            meta["gap"] = float(run.gap.mean())
        else:
            frame, _ = attribution_patching(model, task, dataclasses.replace(cfg, **change))
        log.info("%s %s %s: %.1f s", model.spec.name, task_name, est, time.perf_counter() - t)
        frames[est] = frame
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            frame.assign(method=frame["method"].astype(str)).to_parquet(path)
    return frames, meta


def task_figures(name: str, task_name: str, frames: dict, meta: dict) -> dict:
    """Per estimate and direction: Spearman and top-10 overlap with activation patching, signed
    (not for GradDrop's magnitudes) and of magnitudes (``|estimate|`` vs ``|effect|``, all five)."""
    act = frames["activation"]
    out: dict = {}
    for k, v in meta.items():
        _fig(out, k, v)
    for d in DIRECTIONS:
        cells = []
        for est, (_, magnitude) in ESTIMATES.items():
            if est not in frames:
                cells.append("n/a")
                continue
            a, b = _method(act, d), _method(frames[est], d)
            cell = []
            for kind in ("signed", "abs"):
                if kind == "signed" and magnitude:
                    cell.append("—")
                    continue
                aa, bb = (a, b) if kind == "signed" else (_abs(a), _abs(b))
                got = agreement(aa, bb, k=10)
                rho, top = float(got["spearman"]), int(round(got["top_k_overlap"] * 10))
                suffix = "" if kind == "signed" else "_abs"
                _fig(out, f"{est}_{d}_spearman{suffix}", rho)
                _fig(out, f"{est}_{d}_top10{suffix}", top)
                cell.append(f"{rho:.2f} / {top}")
            cells.append(" · ".join(cell))
        row = f"| {SHORT.get(name, name)} | {task_name} | {d} | " + " | ".join(cells) + " |"
        _fig(out, f"row_{d}", row, row)
    return out


def _abs(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.assign(effect=frame["effect"].abs())


def best_figures(groups: dict) -> dict:
    """Mean Spearman over a model's tasks and directions per estimate: of magnitudes (all five
    estimates) and signed (those that keep a sign); the best of each."""
    out: dict = {}
    for suffix, label in (("_abs", "magnitudes"), ("", "signed")):
        means = {}
        for est in ESTIMATES:
            key = [f"{est}_{d}_spearman{suffix}" for d in DIRECTIONS]
            vals = [g[k]["value"] for g in groups.values() for k in key if k in g]
            if vals and len(vals) == len(groups) * len(DIRECTIONS):
                means[est] = sum(vals) / len(vals)
        for est, v in means.items():
            _fig(out, f"mean_{est}{suffix}", v, f"{est} {v:.2f}")
        best = max(means, key=means.get)
        _fig(out, f"best{suffix}", best, f"best by {label}: {best}")
    return out


def detect_figures(model, induction_act: pd.DataFrame) -> dict:
    """headscope's induction score (the roles' probe) and the patching effect of detect_head's top 5."""
    from headscope.analyses.roles.induction import detection_patterns, mul_score, repeated_random_tokens

    ids, _ = repeated_random_tokens(model.tokenizer, n_sequences=64, seq_len=20, seed=0)
    pats: dict = {}
    points = model.hook_points
    from headscope.probes.models.inhouse.hooks import hooks

    pairs = [
        (points[f"blocks.{l}.attn.hook_pattern"], lambda t, name, l=l: pats.__setitem__(l, t.detach()))
        for l in sorted({l for l, _ in DETECT_TOP5})
    ]
    with torch.inference_mode(), hooks(pairs):
        model.forward(ids, torch.ones_like(ids))
    det = detection_patterns(ids, causal=True)["induction"]
    valid = torch.ones_like(det).tril()
    eff = _method(induction_act, "denoising").set_index(["layer", "head"])["effect"]
    rank = eff.rank(ascending=False, method="min")
    out: dict = {}
    for l, h in DETECT_TOP5:
        score = float(mul_score(pats[l], det, valid)[:, h].mean())
        name = f"L{l}H{h}"
        _fig(out, f"{name}_score", score)
        _fig(out, f"{name}_effect", float(eff[(l, h)]))
        _fig(out, f"{name}_rank", int(rank[(l, h)]))
        row = f"| {name} | {score:.2f} | {float(eff[(l, h)]):.3f} | {int(rank[(l, h)])} |"
        _fig(out, f"{name}_row", row, row)
    return out


def main(argv: list[str] | None = None) -> int:
    from headscope.probes.models.loading import load_model

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=OUT, help=f"the JSON written (default {OUT})")
    p.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    p.add_argument("--tasks", nargs="+", choices=sorted(TASKS), default=list(TASKS))
    p.add_argument(
        "--cache", type=Path, default=None, help="folder of frames: read where there, written where measured"
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    doc = json.loads(args.out.read_text(encoding="utf-8")) if args.out.is_file() else {"figures": {}}
    figures = doc["figures"]
    start = time.perf_counter()
    for name in args.models:
        model = load_model(name, "inhouse")
        for task in args.tasks:
            frames, meta = task_frames(model, task, args.cache)
            figures[f"{name}.{task}"] = task_figures(name, task, frames, meta)
            if name == "smollm2-135m" and task == "induction":
                figures[f"{name}.detect"] = detect_figures(model, frames["activation"])
            write(figures, args.out, seconds=time.perf_counter() - start)
        groups = {k: v for k, v in figures.items() if k.startswith(f"{name}.") and k.split(".", 1)[1] in TASKS}
        if len(groups) == len(TASKS):
            figures[f"{name}.best"] = best_figures(groups)
        write(figures, args.out, seconds=time.perf_counter() - start)
    log.info("wrote %s", args.out)
    return 0


def quoted(figures: dict) -> list[str]:
    """The figures the README quotes: every table row, the best estimate of each model, the detect rows."""
    out = []
    for group, figs in figures.items():
        for name in figs:
            if name.startswith(("row_", "best", "mean_")) or name.endswith("_row"):
                out.append(f"{group}.{name}")
    return out


def write(figures: dict, out: Path = OUT, *, seconds: float | None = None) -> None:
    """Write the figures, which the README quotes and which groups are not measured yet (``missing``)."""
    expected = [f"{m}.{t}" for m in MODELS for t in TASKS] + [f"{m}.best" for m in MODELS] + ["smollm2-135m.detect"]
    doc = {
        "models": list(MODELS),
        "backend": "inhouse",
        "generated_by": "python -m headscope.reports.tools.experiments.atp_figures",
        "seconds": None if seconds is None else round(seconds),
        "quoted": quoted(figures),
        "missing": [g for g in expected if g not in figures],
        "figures": figures,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
