"""``headscope patch MODEL --task NAME|FILE.jsonl``: causal evidence per head by patching.

Activation patching (each head's ``z`` between the clean and the corrupted input of each
minimal pair, denoising and noising; ``--per-position``: per head and position),
attribution patching (its first-order estimate), zero/mean/resample ablation on the clean
run (``--method ablation --ablation zero mean resample``) and path patching (``--method
path --receiver L.H [--sender L.H] [--via k]``); one tidy
frame (``patch.csv`` + ``patch.parquet``, columns ``PATCH_COLUMNS``), ``run.json`` (config,
task, summary, agreement) and one layer × head heatmap per method under ``figures/``.
"""

from __future__ import annotations

import json
import sys
import warnings
from contextlib import nullcontext
from pathlib import Path


def register(sub) -> None:
    from headscope.analyses.patching.tasks import TASKS
    from headscope.probes.outputs.folder import out_argument
    from headscope.reports.cli.argtypes import add_backend, add_device, add_dtype, add_ray

    p = sub.add_parser("patch", help="causal evidence per head: activation, attribution and path patching")
    p.add_argument(
        "model",
        nargs="?",
        default="smollm2-135m",
        help="shipped name, directory or .gguf (an encoder is measured by embedding cosine)",
    )
    add_backend(p)
    add_dtype(p)
    add_device(p)
    p.add_argument("--task", default="induction", help=f"shipped task ({', '.join(TASKS)}) or a JSONL file")
    _add_method_args(p)
    _add_path_args(p)
    _add_size_args(p)
    p.add_argument(
        "--out", type=out_argument, default=None, help="folder for patch.csv/.parquet, run.json and figures/"
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_ray(p)
    p.set_defaults(func=run)


def _add_method_args(p) -> None:
    """``--method``, ``--direction``, ``--unit``, ``--per-position``, ``--ablation``."""
    from headscope.analyses.patching.study import METHODS

    p.add_argument(
        "--method",
        nargs="+",
        choices=list(METHODS),
        default=["activation", "attribution"],
        help="methods to run (default: activation attribution; path needs --receiver)",
    )
    p.add_argument(
        "--direction",
        nargs="+",
        choices=["denoising", "noising"],
        default=["denoising", "noising"],
        help="activation/attribution: clean into corrupted (denoising) and/or corrupted into clean (noising)",
    )
    p.add_argument("--unit", choices=["head", "kv_group"], default="head", help="kv_group: patch a GQA group together")
    p.add_argument(
        "--atp-fix",
        choices=["none", "qk", "graddrop", "both"],
        default="none",
        help="attribution: AtP*'s corrections (Kramár et al. 2024; in-house backend): qk recomputes later layers' "
        "attention patterns exactly (pre-norm models), graddrop averages |estimate| over the gradient with each "
        "other layer dropped (magnitudes, compared with |effect|), both; the method column says which was used "
        "(attribution_qk_fix_*, attribution_graddrop_*, attribution_qk_fix_graddrop_*)",
    )
    p.add_argument(
        "--per-position",
        action="store_true",
        help="activation and attribution patching per head and position (counted from the end: -1 = last token)",
    )
    p.add_argument(
        "--ablation",
        nargs="+",
        choices=["zero", "mean", "mean_position", "resample"],
        default=["zero", "mean", "resample"],
        help="--method ablation: the kinds run on the clean input (default zero mean resample; mean: one vector per "
        "head over every token of the task's clean inputs, as prune's; mean_position: the mean at each position)",
    )


def _add_path_args(p) -> None:
    """Path patching: ``--receiver``, ``--sender``, ``--via``, ``--path-direction``, ``--receiver-reads``."""
    from headscope.reports.cli.argtypes import head

    p.add_argument("--receiver", type=head, default=None, help="path patching: receiver head LAYER.HEAD")
    p.add_argument(
        "--sender", type=head, default=None, help="path patching: one sender LAYER.HEAD (default: all below)"
    )
    p.add_argument("--via", nargs="+", choices=["q", "k", "v"], default=["q", "k", "v"], help="receiver inputs")
    p.add_argument(
        "--path-direction", choices=["denoising", "noising"], default="noising", help="path patching (default noising)"
    )
    p.add_argument(
        "--receiver-reads",
        choices=["head", "kv_group"],
        default="head",
        help="path patching via k/v on GQA/MQA: patch only the receiver's read of its shared K/V (head, the "
        "default) or the KV head itself, which its whole group reads (kv_group)",
    )


def _add_size_args(p) -> None:
    """Items, lengths, batches and statistics: ``--n-items`` ... ``--top-k``."""
    from headscope.reports.cli.argtypes import (
        MAX_BATCH,
        MAX_SEQ_LEN,
        batch_size,
        int_at_least,
        int_in,
        listed,
        seed,
        unit_interval,
    )

    p.add_argument(
        "--n-items",
        type=int_at_least(2),
        default=None,
        help="items (default: 16 induction/duplicate_token, 32 agreement/coreference, all of a file; more than a "
        "file task holds: all, with a note)",
    )
    p.add_argument(
        "--seq-len",
        type=int_in(2, MAX_SEQ_LEN, "tokens of a generated sequence"),
        default=10,
        help="induction/duplicate_token: length of the random sequence (within the model's context)",
    )
    p.add_argument("--seed", type=seed, default=0, help="seed for generated items and resampling")
    p.add_argument("--batch-size", type=batch_size, default=16, help="items per batch (default 16)")
    p.add_argument(
        "--max-rows",
        type=int_in(1, MAX_BATCH, "sequences per forward pass"),
        default=144,
        help="sequences per forward (default 144)",
    )
    p.add_argument("--alpha", type=unit_interval, default=0.05, help="level of the BH-corrected verdict")
    p.add_argument("--top-k", type=listed, default=10, help="heads listed and compared (default 10)")


def _task_items(args, rows) -> tuple[int | None, list[str]]:
    """``--n-items`` checked against what the task holds, before the model loads: refused past
    :data:`~headscope.analyses.patching.tasks.MAX_GENERATED_ITEMS` for a generated task, capped
    (with the note returned) at the rows of a file task. ``rows``: a task file's rows, read."""
    from headscope.analyses.patching.tasks import MAX_GENERATED_ITEMS, task_size
    from headscope.reports.cli.argtypes import cap_note

    if args.n_items is None:
        return None, []
    holds = len(rows) if rows is not None else task_size(args.task)
    if holds is None:
        if args.n_items > MAX_GENERATED_ITEMS:
            raise ValueError(
                f"--n-items {args.n_items}: task {args.task} generates at most {MAX_GENERATED_ITEMS} items; "
                "write a larger task to a JSONL file (--task FILE.jsonl)"
            )
        return args.n_items, []
    if args.n_items <= holds:
        return args.n_items, []
    what = f"task file {args.task}" if rows is not None else f"task {args.task}"
    return holds, [cap_note("--n-items", args.n_items, holds, what)]


def _unusable_line(task) -> str:
    """``task NAME: K of N items unusable (kind count, ...); listed in run.json``."""
    counts = ", ".join(f"{k} {n}" for k, n in task.unusable_counts().items())
    total = len(task.items) + task.n_unusable
    return f"task {task.name}: {task.n_unusable} of {total} items unusable ({counts}); listed in run.json"


def render_summary(summary: dict) -> str:
    """Plain-text summary of :func:`~headscope.analyses.patching.study.patching_study`'s dict."""
    t = summary["task"]
    lines = [
        f"model {summary['model']}  task {t['name']} ({t['n_items']} items, {t['n_unusable']} unusable)  "
        f"metric {t['metric']}: clean {summary['metric_clean']:.3f}, corrupted {summary['metric_corrupted']:.3f}"
    ]
    if summary.get("measures"):
        lines.append(f"measures: {summary['measures']}")
    for method, heads in summary["top_heads"].items():
        sig = summary["significant_heads"].get(method, [])
        lines.append(f"{method}: top {', '.join(heads[:5])}  ({len(sig)} significant)")
    for d, a in summary["agreement"].items():
        lines.append(
            f"attribution vs activation ({d}): Spearman {a['spearman']:.2f}, top-{a['k']} overlap {a['top_k_overlap']:.2f}"
        )
    return "\n".join(lines)


def figures(frame, spec) -> dict[str, bytes]:
    """``{"figures/<method>.png": png}``: a layer × head heatmap of ``effect`` per method
    (per-position rows: each head's effect at the position where it is largest in size)."""
    from headscope.reports.figures import head_map_figure, png_bytes

    out = {}
    for method, f in frame.groupby("method", observed=True):
        title = f"{spec.name}: {method}" + (
            f" -> {f['receiver'].iloc[0]}" if "receiver" in f and f["receiver"].notna().any() else ""
        )
        if "position" in f and f["position"].notna().any():
            f = f.loc[f["effect"].abs().fillna(-1).groupby([f["layer"], f["head"]]).idxmax()]
            title += " (max |effect| over positions)"
        fig = head_map_figure(
            f.rename(columns={"effect": "value"}),
            n_layers=spec.n_layers,
            n_heads=spec.n_heads,
            label="normalised effect",
            title=title,
        )
        out[f"figures/{method}.png"] = png_bytes(fig)
    return out


def _driver_note(pool, cfg) -> None:
    """With ``--ray``: one line on stderr naming the methods that run in the driver (no split)."""
    rest = [m for m in cfg.methods if m != "activation"]
    if pool is not None and rest:
        print(
            f"note: patch --ray: activation patching runs on the Ray workers; {', '.join(rest)} "
            "run in the driver (no split)",
            file=sys.stderr,
        )


def _sharded_activation(pool, model, task, cfg):
    """Activation patching's ``(effects, run metrics)`` of ``task``, its patched forwards split over
    ``pool``'s workers by the patching stage (:class:`~headscope.reports.stages.patching.StudyPart`)
    and merged: the effects one process computes, each from the same forward."""
    from headscope.analyses.run_patching import CausalConfig
    from headscope.reports.stages.command_shards import merged, shard_context
    from headscope.reports.stages.patching import study_parts

    ctx = shard_context(pool, model, seed=cfg.patch.seed)
    parts = study_parts(model, task, cfg.patch, pool.workers)
    return merged(ctx, "patching", CausalConfig(seed=cfg.patch.seed), parts).summary["study"]


def run(args) -> int:
    from headscope.analyses.patching.activation import PatchConfig
    from headscope.analyses.patching.study import StudyConfig, patching_study
    from headscope.analyses.patching.tasks import TASKS, load_task, read_task_jsonl
    from headscope.analyses.run_json import model_record, write_run_json
    from headscope.probes.models.backends.protocol import placement
    from headscope.probes.outputs.atomic import atomic_write, write_frame
    from headscope.probes.outputs.folder import claim_output
    from headscope.reports import budget as memory
    from headscope.reports.cli.argtypes import load_from_args, ray_in_driver, ray_pool, resolve_device

    shards = "activation" in args.method and not args.per_position  # what has a split: activation's forwards
    if not shards:
        ray_in_driver(args, "patch", "only activation patching (not --per-position) splits over workers")
    device = resolve_device(args.device)  # checked before anything loads
    cfg = StudyConfig(
        methods=tuple(dict.fromkeys(args.method)),
        patch=PatchConfig(
            directions=tuple(dict.fromkeys(args.direction)),
            unit=args.unit,
            batch_size=args.batch_size,
            max_rows=args.max_rows,
            alpha=args.alpha,
            seed=args.seed,
            per_position=args.per_position,
            ablations=tuple(dict.fromkeys(args.ablation)),
            atp_fix=args.atp_fix,
        ),
        receiver=args.receiver,
        senders=(args.sender,) if args.sender else None,
        vias=tuple(dict.fromkeys(args.via)),
        path_direction=args.path_direction,
        path_reads=args.receiver_reads,
        top_k=args.top_k,
    )
    rows = None
    if args.task not in TASKS:  # a task file is checked (file:line:col) before the model loads
        if not Path(args.task).is_file():
            raise FileNotFoundError(
                f"--task {args.task}: neither a shipped task ({', '.join(TASKS)}) nor an existing JSONL file"
            )
        rows = read_task_jsonl(args.task)
    n_items, notes = _task_items(args, rows)  # an absurd count answers before the model loads
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    asked = cfg
    budget, cfg = memory.patch_start(args, asked, device)  # refused in one line if it cannot fit
    with (
        ray_pool(args) if shards else nullcontext() as pool,  # --ray: a bad --ray-address or --workers refused here
        claim_output(args.out, "patch") if args.out else nullcontext() as folder,  # checked before the model loads
    ):
        _driver_note(pool, cfg)
        model = load_from_args(args, device)
        if not args.json:
            print(f"backend {model.backend_choice}", file=sys.stderr)
        with warnings.catch_warnings():  # the library's warning of unusable items: said below in one line
            warnings.filterwarnings("ignore", message=r"task .* items unusable", category=UserWarning)
            task = load_task(model, args.task, n_items=n_items, seed=args.seed, seq_len=args.seq_len)
        if task.n_unusable:
            print(_unusable_line(task), file=sys.stderr)
        budget, cfg = memory.patch_refine(budget, task, cfg, asked)
        activation = _sharded_activation(pool, model, task, cfg) if pool is not None else None
        result = patching_study(model, task, cfg, activation)
        used = memory.finish(budget, memory.emitter(False))
        summary = {"model": model.spec.name, "backend": model.backend, **placement(model), **result.summary}
        if notes:
            summary["notes"] = notes
        if folder is not None:
            with folder.staging() as tmp:
                write_frame(result.frame, tmp / "patch")
                (tmp / "figures").mkdir()
                for rel, png in figures(result.frame, model.spec).items():
                    with atomic_write(tmp / rel, "wb", encoding=None) as f:
                        f.write(png)
                write_run_json(tmp, "patch", model_record(model), **summary, memory=used)
    print(json.dumps(summary, indent=2, sort_keys=True, default=str) if args.json else render_summary(summary))
    return 0
