"""The figures the README quotes for patching on SmolLM2, regenerated from code.

``python -m headscope.reports.tools.experiments.patching_figures`` (``make figures``; about 15
minutes on 2 CPU cores) runs the studies below on SmolLM2-135M (in-house backend) and
writes ``data/figures/patching.json``: every figure under a name, with the text the README
prints for it. ``tests/test_readme_figures.py`` fails when a text is missing from the
README, so a figure that changes fails loudly instead of going stale.

* ``induction8``: 8 induction items (``seq_len`` 8, seed 0), denoising: activation patching
  of every head, attribution patching with the total gradient and with later heads cut
  (``bypass_heads``), their agreement (Spearman over 270 heads, top-10 overlap);
* ``path``: path patching into L18H6 (16 items, noising) through K, V and Q, the receiver's
  own read of its shared K/V (``reads="head"``) and its KV group's (``"kv_group"``): the
  sum over the 162 senders below it and the leading senders.
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

from headscope.analyses.patching import PatchConfig, activation_patching, agreement, attribution_patching, path_patching
from headscope.analyses.patching.activation import GRADIENTS
from headscope.analyses.patching.frames import top_heads
from headscope.analyses.patching.tasks import induction_task

log = logging.getLogger(__name__)
OUT = Path(__file__).resolve().parents[3] / "data" / "figures" / "patching.json"
RECEIVER = (18, 6)

#: the figures the README's patching section quotes (``group.name``); tests/test_readme_figures.py checks them
QUOTED = (
    "induction8.clean",
    "induction8.corrupted",
    "induction8.activation_denoising_top5",
    "induction8.activation_denoising_L29H1",
    "induction8.activation_denoising_L23H7",
    "induction8.activation_denoising_rank_L18H6",
    "induction8.activation_denoising_rank_L17H3",
    "induction8.activation_denoising_rank_L17H4",
    "induction8.total_denoising_spearman",
    "induction8.total_denoising_top10",
    "induction8.bypass_heads_denoising_spearman",
    "induction8.bypass_heads_denoising_top10",
    "path.k_head_sum",
    "path.k_head_lead",
    "path.k_head_lead_effect",
    "path.k_kv_group_sum",
    "path.k_kv_group_lead_effect",
    "path.v_head_sum",
    "path.v_kv_group_sum",
    "path.q_head_sum",
)
#: the (via, reads) paths into the receiver: its own read of K, V and Q, and its KV group's of K and V
PATHS = (("k", "head"), ("v", "head"), ("q", "head"), ("k", "kv_group"), ("v", "kv_group"))


def _ordinal(n: int) -> str:
    """``1st``, ``2nd``, ``13th``, ``75th``.

    >>> [_ordinal(n) for n in (1, 2, 3, 4, 11, 13, 21, 75)]
    ['1st', '2nd', '3rd', '4th', '11th', '13th', '21st', '75th']
    """
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _head(lh) -> str:
    return f"L{lh[0]}H{lh[1]}"


def _fig(out: dict, name: str, value, text: str | None = None) -> None:
    """One figure: its value and the text the README prints for it (3 decimals by default)."""
    if text is None:
        text = f"{value:.3f}" if isinstance(value, float) else str(value)
    out[name] = {"value": value, "text": text}


def induction_figures(model, n_items: int, seq_len: int, directions: tuple[str, ...]) -> dict:
    """Activation and attribution (both gradients) patching on one induction task -> figures."""
    task = induction_task(model.tokenizer, n_items=n_items, seq_len=seq_len, seed=0)
    cfg = PatchConfig(directions=directions, n_perm=2000, n_boot=200, max_rows=64)
    act, run = activation_patching(model, task, cfg)
    att = {g: attribution_patching(model, task, dataclasses.replace(cfg, gradient=g))[0] for g in GRADIENTS}
    meta = {
        "tokens": len(task.items[0].clean),
        "clean": float(run.clean.mean()),
        "corrupted": float(run.corrupted.mean()),
    }
    return induction_from_frames(act, att, meta, directions)


def induction_from_frames(act: pd.DataFrame, att: dict, meta: dict, directions) -> dict:
    """The figures of one induction task from its frames: ``act`` (activation patching),
    ``att`` ``{gradient: attribution frame}``, ``meta`` (``tokens``, ``clean``, ``corrupted``)."""
    out: dict = {}
    for k in ("tokens", "clean", "corrupted"):
        _fig(out, k, meta[k])
    for d in directions:
        f = act[act["method"] == f"activation_{d}"]
        eff = f.set_index(["layer", "head"])["effect"]
        top = top_heads(f, 10)
        _fig(out, f"activation_{d}_top5", ", ".join(map(_head, top[:5])))
        for lh in top[:2]:
            _fig(out, f"activation_{d}_{_head(lh)}", float(eff[lh]))
        rank = eff.rank(ascending=False, method="min")
        for lh in ((18, 6), (17, 3), (17, 4)):
            _fig(out, f"activation_{d}_rank_{_head(lh)}", int(rank[lh]), f"{_head(lh)} is {_ordinal(int(rank[lh]))}")
    for gradient, frame in att.items():
        for d in directions:
            a = agreement(f_of(act, f"activation_{d}"), f_of(frame, d, suffix=True), k=10)
            _fig(out, f"{gradient}_{d}_spearman", float(a["spearman"]), f"Spearman {a['spearman']:.2f}")
            overlap = int(round(a["top_k_overlap"] * 10))
            _fig(out, f"{gradient}_{d}_top10", overlap, f"top-10 overlap {overlap}/10")
    return out


def f_of(frame: pd.DataFrame, method: str, *, suffix: bool = False) -> pd.DataFrame:
    """The rows of one method (``suffix``: whose method ends with ``method``, e.g. a direction)."""
    return frame[frame["method"].str.endswith(method)] if suffix else frame[frame["method"] == method]


def path_figures(model) -> dict:
    """Path patching into :data:`RECEIVER` through k, v (both readings) and q -> figures."""
    task = induction_task(model.tokenizer, n_items=16, seq_len=10, seed=0)
    cfg = PatchConfig(n_perm=2000, n_boot=200, max_rows=64)
    frames = {
        (via, reads): path_patching(model, task, receiver=RECEIVER, via=via, reads=reads, cfg=cfg)[0]
        for via, reads in PATHS
    }
    return path_from_frames(frames)


def path_from_frames(frames: dict) -> dict:
    """The figures of path patching from ``{(via, reads): frame}``: per path the sum over
    senders and the leading sender."""
    out: dict = {}
    for (via, reads), f in frames.items():
        eff = f.set_index(["layer", "head"])["effect"]
        lead = eff.idxmax()
        _fig(out, f"{via}_{reads}_sum", float(eff.sum()))
        _fig(out, f"{via}_{reads}_lead", _head(lead))
        _fig(out, f"{via}_{reads}_lead_effect", float(eff[lead]))
    return out


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(format="%(message)s")  # others' records as before: warnings and up
    log.setLevel(logging.INFO)  # this script's "wrote ..." lines
    from headscope.probes.models.loading import load_model

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=OUT, help=f"the JSON written (default {OUT})")
    args = p.parse_args(argv)
    model = load_model("smollm2-135m", "inhouse")
    start = time.perf_counter()
    figures = {
        "induction8": induction_figures(model, 8, 8, ("denoising",)),
        "path": path_figures(model),
    }
    write(figures, args.out, seconds=time.perf_counter() - start)
    log.info("wrote %s", args.out)
    return 0


def write(figures: dict, out: Path = OUT, *, seconds: float | None = None) -> None:
    """Write the figures (and which of them the README quotes, :data:`QUOTED`) to ``out``."""
    doc = {
        "model": "smollm2-135m",
        "backend": "inhouse",
        "generated_by": "python -m headscope.reports.tools.experiments.patching_figures",
        "seconds": None if seconds is None else round(seconds),
        "quoted": list(QUOTED),
        "figures": figures,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    log.info("wrote %s", out)


if __name__ == "__main__":
    sys.exit(main())
