"""``headscope weights MODEL``: circuits from the weights alone (no text is run).

Writes into ``--out`` (default ``runs/weights-<model>``): ``heads.csv``/``.parquet`` (per-head
OV copying score, OV/QK norms, the omitted QK positional share;
:data:`~headscope.analyses.circuits.weights.frames.HEAD_COLUMNS`), ``composition.csv``/``.parquet``
(every pair of heads in different layers through Q, K, V;
:data:`~headscope.analyses.circuits.weights.frames.COMPOSITION_COLUMNS`), ``weights.md`` (a short
summary) and ``run.json``. The weights are read lazily, one tensor at a time, from safetensors
(sharded or not) or GGUF (:func:`~headscope.probes.models.lazy_weights.lazy_weights`): the model
is never built, so a checkpoint larger than memory runs; a ``pytorch_model.bin`` checkpoint (or a
GGUF architecture the lazy reader does not follow) loads on the in-house backend instead. A
safetensors folder of a family the in-house stack does not build (MPNet, GPT-NeoX, OLMo 2, …) is
always read one layer at a time (:func:`~headscope.probes.models.hf_lazy_weights.hf_lazy_weights`:
each layer's matrices checked per module, on embedding-level inputs); where that reader refuses it,
and for such a family without safetensors, the model loads on the hf backend, its matrices checked
against its forward (:mod:`~headscope.probes.models.hf_weights_check`).
``run.json`` says which (``reader``) and how many bytes were read.
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
    from headscope.reports.cli.argtypes import add_ray, int_in, listed, seed

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
    add_ray(p)
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
    positional = heads[(heads.statistic == "qk_positional_share") & (heads.verdict != "omitted")]
    parts = [
        f"# From the weights: {meta['model']}",
        "",
        f"- weights: {meta['reader']}",
        f"- norms: {meta['folding']}; unembedding: {meta['unembedding']}",
        f"- copying score method: {', '.join(sorted(set(cop.method)))}",
        f"- heads with an exactly zero OV circuit: {int((cop.verdict == 'no circuit').sum())} of {len(cop)}",
        f"- {len(comp)} composition scores; above the Gaussian baseline after BH: "
        f"{int((comp.verdict == 'above baseline').sum())}",
    ]
    if len(omitted):
        parts.append(f"- qk_positional_share omitted: {omitted.note.iloc[0]}")
    parts += ["", "## Top copying heads", "", _table(cop.nlargest(top, "value"), _HEAD_COLS)]
    if len(positional):
        parts += ["", "## Top QK positional share", "", _table(positional.nlargest(top, "value"), _HEAD_COLS)]
    parts += ["", "## Top K-composition pairs (per query head)", "", _table(k_head, pair)]
    parts += ["", "## Top K-composition pairs (per KV group)", "", _table(k_group, pair), ""]
    return "\n".join(parts)


_HEAD_COLS = ["layer", "head", "kv_head", "value", "baseline_mean", "p_adjusted", "verdict"]


def open_weights(model: str):
    """The model's :class:`~headscope.probes.models.inhouse.head_weights.ModelWeights`: read
    lazily where the checkpoint is of an in-house family; one layer at a time where it is a
    safetensors folder of another family (:func:`~headscope.probes.models.hf_lazy_weights.hf_lazy_weights`,
    checked per module); else from the model loaded on the in-house backend, else (a family the
    in-house stack does not build: MPNet, Falcon, …) from the model loaded on the hf backend, where
    its matrices pass the check against its forward
    (:func:`~headscope.probes.models.weights_provider.model_weights`)."""
    from headscope.probes.errors import ModelIncompatibleError
    from headscope.probes.models.checkpoints import resolve
    from headscope.probes.models.inhouse.head_weights import head_weights
    from headscope.probes.models.lazy_weights import lazy_weights, reads_lazily
    from headscope.probes.models.loading import load_model
    from headscope.probes.models.weights_provider import model_weights

    source = resolve(model)
    if reads_lazily(source):
        try:
            return lazy_weights(source)
        except ModelIncompatibleError:
            if source.kind == "hf-dir" and not _inhouse_type(source):
                from headscope.probes.models.hf_lazy_weights import hf_lazy_weights

                try:  # a family the in-house stack does not build: one layer at a time, checked per module
                    return hf_lazy_weights(source)
                except ModelIncompatibleError:
                    pass  # the whole model on the hf backend, checked by its forward
    try:
        return head_weights(load_model(source, backend="inhouse"))
    except ModelIncompatibleError:
        if source.kind == "gguf":
            raise
    return model_weights(load_model(source, backend="hf"))


def _inhouse_type(source) -> bool:
    from headscope.probes.models.checkpoints import read_hf_config
    from headscope.probes.models.families import INHOUSE_MODEL_TYPES

    return read_hf_config(source).get("model_type") in INHOUSE_MODEL_TYPES


def _checked(weights) -> dict:
    """run.json's position scheme, scale and check of weights read on the hf backend (none for the in-house)."""
    check = getattr(weights, "check", None)
    if not check:
        return {}
    from headscope.analyses.run_weights import _check_record

    reading = weights.reading()
    return {
        "positions": reading["positions"],
        "scale": reading["scale"],
        "frozen": reading.get("frozen", ""),
        "check": _check_record(check),
    }


def held_budget(weights) -> int | None:
    """Bytes of composition sender factors held at once: None (all) when every layer's fit in a
    quarter of the available memory, else that quarter (the later layers are then read again)."""
    from headscope.probes.models.weights import available_memory_bytes

    total = weights.n_layers * weights.cfg.n_heads * weights.d_head * weights.d_model * 4
    free = available_memory_bytes()
    return None if free is None or total <= free // 4 else max(1, free // 4)


def _heads_on_workers(pool, weights, args):
    """:func:`~headscope.analyses.circuits.weights.ov_qk.head_circuits` with the per-head rows
    computed by the weights stage's parts on ``pool``'s workers, the layers in contiguous runs
    (each worker loads the model and reads its layers' matrices; the rows of a layer depend on it
    and the seeded null alone), and the adjustment and verdicts over all heads here."""
    from headscope.analyses.circuits.weights.ov_qk import head_verdicts
    from headscope.probes.models.checkpoints import resolve
    from headscope.reports.stages.base import RunContext
    from headscope.reports.stages.command_shards import merged
    from headscope.reports.stages.registry import STAGES
    from headscope.reports.stages.sharded import contiguous
    from headscope.reports.stages.weights import WeightsPart

    if _inhouse_type(resolve(args.model)):  # the in-house stack builds it: no --backend auto probe per worker
        pool.load["backend"] = "inhouse"
    cfg = STAGES["weights"].Config(draws=args.draws, seed=args.seed)
    ctx = RunContext(name=str(args.model), seed=args.seed, shards=pool)
    # the stage's head-row split, from the weights read here (the composition scores run here, lazily)
    parts = [WeightsPart(tuple(r), (), ()) for r in contiguous(weights.n_layers, pool.workers)]
    rows = merged(ctx, "weights", cfg, parts).frames["head_rows"]
    return head_verdicts(weights, rows)


def run(args) -> int:
    from headscope.analyses.circuits.weights.composition import composition_scores
    from headscope.analyses.circuits.weights.ov_qk import head_circuits
    from headscope.probes.outputs.atomic import write_frame, write_json
    from headscope.probes.outputs.folder import claim_output
    from headscope.probes.outputs.kinds import manifest_header
    from headscope.reports.cli.argtypes import ray_pool

    out = Path(args.out) if args.out else default_out(args.model)
    with (
        ray_pool(args) as pool,  # --ray: a bad --ray-address or --workers refused here, before anything is read
        claim_output(out, "weights") as folder,  # refused before the model is read
    ):
        weights = open_weights(args.model)
        t0 = time.perf_counter()
        if pool is None:
            heads = head_circuits(weights, n_draws=args.draws, seed=args.seed)
        else:
            heads = _heads_on_workers(pool, weights, args)
        t1 = time.perf_counter()
        held = held_budget(weights)
        comp = composition_scores(weights, n_null=args.null, seed=args.seed, max_held_bytes=held)
        t2 = time.perf_counter()
        meta = {
            "model": weights.name,
            "reader": weights.reader,
            "bytes_read": getattr(weights.source, "bytes_read", None),
            "folding": weights.folding,
            "unembedding": weights.unembedding,
            **_checked(weights),
            "config": {"draws": args.draws, "null": args.null, "seed": args.seed, "max_held_bytes": held},
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
