"""``headscope weights MODEL``: circuits from the weights alone (no text is run).

Writes into ``--out`` (default ``runs/weights-<model>``): ``heads.csv``/``.parquet`` (per-head
OV copying score, OV/QK norms, the omitted QK positional share;
:data:`~headscope.analyses.circuits.frames.HEAD_COLUMNS`), ``composition.csv``/``.parquet``
(every pair of heads in different layers through Q, K, V;
:data:`~headscope.analyses.circuits.frames.COMPOSITION_COLUMNS`), ``weights.md`` (a short
summary) and ``run.json``. The model loads on the in-house backend.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pandas as pd

#: the most Gaussian heads drawn per head, and draws per composition null: a bound the run can meet
#: in minutes on SmolLM2's shapes, refused in one line past it
MAX_DRAWS = 100_000
MAX_NULL = 1_000_000


def register(sub) -> None:
    from headscope.probes.outputs.folder import out_argument
    from headscope.reports.cli.argtypes import int_in, listed, seed

    p = sub.add_parser("weights", help="circuits from the weights alone: OV copying, QK/OV composition (GQA-aware)")
    p.add_argument(
        "model", nargs="?", default="minilm-l6", help="shipped name (minilm-l6, smollm2-135m), directory or .gguf"
    )
    p.add_argument("--out", type=out_argument, help="output folder (default runs/weights-<model>)")
    p.add_argument(
        "--draws",
        type=int_in(1, MAX_DRAWS, "Gaussian heads per head baseline"),
        default=200,
        help="Gaussian heads per head baseline (200)",
    )
    p.add_argument(
        "--null",
        type=int_in(1, MAX_NULL, "Gaussian draws per composition null"),
        default=1000,
        help="Gaussian draws per composition null (1000)",
    )
    p.add_argument("--seed", type=seed, default=0, help="seed of the Gaussian baselines (0)")
    p.add_argument("--top", type=listed, default=10, help="rows per table in the summary (10)")
    p.add_argument("--quiet", action="store_true", help="print nothing but errors")
    p.set_defaults(func=run)


def default_out(model: str) -> Path:
    """``runs/weights-<model>``, with the model's file stem for a path and unsafe characters replaced."""
    name = Path(model).stem if ("/" in model or model.endswith(".gguf")) else model
    return Path("runs") / f"weights-{re.sub(r'[^A-Za-z0-9._-]+', '_', name) or 'model'}"


def _table(df: pd.DataFrame, cols: list[str]) -> str:
    """``df[cols]`` as a Markdown table (floats to 4 places)."""
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in df[cols].itertuples(index=False):
        cells = ["–" if v is pd.NA else f"{v:.4g}" if isinstance(v, float) else str(v) for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(heads: pd.DataFrame, comp: pd.DataFrame, meta: dict, top: int) -> str:
    """The Markdown summary of one run: top copying heads, top K-composition pairs (per query
    head and per KV group), and what was folded, omitted or empty."""
    cop = heads[heads.statistic == "ov_copying"]
    k_head = comp[(comp["mode"] == "K") & (comp.level == "head")].nlargest(top, "value")
    k_group = comp[(comp["mode"] == "K") & (comp.level == "kv_group")].nlargest(top, "value")
    pair = ["sender_layer", "sender_head", "receiver_layer", "receiver_head", "receiver_kv_head", "value", "margin"]
    omitted = heads[heads.verdict == "omitted"]
    parts = [
        f"# From the weights: {meta['model']}",
        "",
        f"- norms: {meta['folding']}; unembedding: {meta['unembedding']}",
        f"- copying score method: {', '.join(sorted(set(cop.method)))}",
        f"- heads with an exactly zero OV circuit: {int((cop.verdict == 'no circuit').sum())} of {len(cop)}",
        f"- {len(comp)} composition scores; above the Gaussian baseline after BH: "
        f"{int((comp.verdict == 'above baseline').sum())}",
    ]
    if len(omitted):
        parts.append(f"- qk_positional_share omitted: {omitted.note.iloc[0]}")
    parts += ["", "## Top copying heads", "", _table(cop.nlargest(top, "value"), _HEAD_COLS)]
    parts += ["", "## Top K-composition pairs (per query head)", "", _table(k_head, pair)]
    parts += ["", "## Top K-composition pairs (per KV group)", "", _table(k_group, pair), ""]
    return "\n".join(parts)


_HEAD_COLS = ["layer", "head", "kv_head", "value", "baseline_mean", "p_adjusted", "verdict"]


def run(args) -> int:
    from headscope.analyses.circuits.composition import composition_scores
    from headscope.analyses.circuits.ov_qk import head_circuits
    from headscope.probes.models.inhouse.head_weights import head_weights
    from headscope.probes.models.loading import load_model
    from headscope.probes.outputs.atomic import write_frame, write_json
    from headscope.probes.outputs.folder import claim_output
    from headscope.probes.outputs.kinds import manifest_header

    out = Path(args.out) if args.out else default_out(args.model)
    with claim_output(out, "weights") as folder:  # refused before the model loads
        weights = head_weights(load_model(args.model, backend="inhouse"))
        t0 = time.perf_counter()
        heads = head_circuits(weights, n_draws=args.draws, seed=args.seed)
        t1 = time.perf_counter()
        comp = composition_scores(weights, n_null=args.null, seed=args.seed)
        t2 = time.perf_counter()
        meta = {
            "model": weights.name,
            "folding": weights.folding,
            "unembedding": weights.unembedding,
            "config": {"draws": args.draws, "null": args.null, "seed": args.seed},
            "timings": {"heads_s": round(t1 - t0, 3), "composition_s": round(t2 - t1, 3)},
        }
        text = summary(heads, comp, meta, args.top)
        with folder.staging() as tmp:
            write_frame(heads, tmp / "heads")
            write_frame(comp, tmp / "composition")
            (tmp / "weights.md").write_text(text)
            write_json({**manifest_header("weights"), **meta}, tmp / "run.json")
    if not args.quiet:
        print(text)
        print(f"wrote {out}", file=sys.stderr)
    return 0
