"""``headscope prune MODEL``: single-head ablation, all-but-one, gradient importance and
iterative pruning curves; frames as CSV + Parquet in ``--out``, a summary on stdout.

Re-running with the same ``--out`` and options resumes an interrupted run.
"""

from __future__ import annotations

import json
import sys
from contextlib import nullcontext


def register(sub) -> None:
    from headscope.analyses.pruning.curves import ORDERS
    from headscope.analyses.pruning.metrics import METRICS
    from headscope.probes.outputs.folder import out_argument
    from headscope.reports.cli.argtypes import (
        MAX_SEEDS,
        add_backend,
        add_device,
        add_dtype,
        add_ray,
        batch_size,
        fraction,
        int_at_least,
        int_in,
        seed,
    )

    p = sub.add_parser("prune", help="what happens when heads are removed: ablation, importance, pruning curves")
    p.add_argument("model", nargs="?", default="minilm-l6", help="shipped name, directory or .gguf")
    add_backend(p)
    add_dtype(p)
    add_device(p, device_map=True)
    add_ray(p)
    p.add_argument(
        "--metric",
        choices=list(METRICS),
        default=None,
        help="default: lm_loss for a language model, cosine_to_unpruned for an embedding model (what the "
        "checkpoint is for, decided when it loads)",
    )
    p.add_argument(
        "--prompt",
        default=None,
        metavar="NAME",
        help="an embedding model's prompt, by name (config_sentence_transformers.json's prompts; default: its "
        "default_prompt_name, if any)",
    )
    p.add_argument("--step", type=float, default=0.10, help="fraction of heads removed per pruning step (default 0.1)")
    p.add_argument(
        "--max-fraction",
        type=fraction,
        default=None,
        help="stop the curves at this fraction (default 1.0; 0.5 with --quick)",
    )
    p.add_argument("--orders", nargs="+", choices=list(ORDERS), default=list(ORDERS), help="pruning orders to compare")
    p.add_argument(
        "--seeds",
        type=int_in(1, MAX_SEEDS, "random-order seeds, each a whole pruning curve"),
        default=3,
        help=f"random-order seeds (default 3, at most {MAX_SEEDS})",
    )
    p.add_argument("--seed", type=seed, default=0, help="seed for random orders and draws (0 to 2**32 - 1; default 0)")
    p.add_argument(
        "--unit",
        choices=["head", "kv_group"],
        default="head",
        help="kv_group: remove a KV head together with all query heads that read it (GQA)",
    )
    p.add_argument(
        "--n-items",
        type=int_at_least(2),
        default=None,
        help="items of the metric's data (default all; 24 with --quick; more than the data holds: all, with a note)",
    )
    p.add_argument("--batch-size", type=batch_size, default=16, help="items per forward pass (default 16)")
    p.add_argument("--quick", action="store_true", help="fewer items and steps")
    p.add_argument(
        "--studies",
        nargs="+",
        choices=["ablation", "all_but_one", "importance", "curves"],
        default=["ablation", "all_but_one", "importance", "curves"],
        help="which studies to run",
    )
    p.add_argument(
        "--roles", default=None, help="roles frame (CSV/Parquet with ROLE_COLUMNS) to compare against random heads"
    )
    p.add_argument("--out", type=out_argument, default=None, help="folder for the frames and the resumable state")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def _read_roles(path):
    """The ``--roles`` frame, checked (a file that is not a roles table fails here, naming
    itself, before the model loads)."""
    from headscope.reports.table_checks import read_roles_table

    return read_roles_table(path)


def metric_data_size(metric: str | None) -> tuple[int, str]:
    """``(items, what)``: how many items the data of ``--metric`` holds (``None``: the
    default metric, lm_loss or cosine_to_unpruned, both on ``heldout/lm_text.txt``), counted
    as :func:`~headscope.analyses.pruning.metrics.build_metric` reads it, without the model."""
    import inspect

    from headscope.analyses.pruning.metrics import CorefAccuracy, read_lines, read_paraphrases
    from headscope.data import path

    if metric == "coref_accuracy":
        from headscope.probes.corpora import read_coref

        kinds = inspect.signature(CorefAccuracy).parameters["kinds"].default  # build_metric keeps these kinds
        items = [it for it in read_coref(path("coref/coref.jsonl")).items if it.kind is None or it.kind in kinds]
        return len(items), f"the coref_accuracy data (coref/coref.jsonl, {'/'.join(kinds)} items)"
    if metric == "paraphrase_accuracy":
        items = read_paraphrases(path("paraphrase/pairs.jsonl"))
        return len(items), "the paraphrase_accuracy data (paraphrase/pairs.jsonl)"
    name = f"the {metric} data" if metric else "the default metric's data"
    return len(read_lines(path("heldout/lm_text.txt"))), f"{name} (heldout/lm_text.txt)"


def _capped_items(args) -> tuple[int | None, list[str]]:
    """``--n-items`` capped at what the metric's data holds, and the note saying so."""
    if args.n_items is None:
        return None, []
    from headscope.reports.cli.argtypes import cap_note

    holds, what = metric_data_size(args.metric)
    if args.n_items <= holds:
        return args.n_items, []
    return holds, [cap_note("--n-items", args.n_items, holds, what)]


def render_summary(summary: dict) -> str:
    """Plain-text summary of :func:`~headscope.analyses.pruning.study.study_summary`'s dict."""
    lines = [
        f"model {summary['model']}  metric {summary['metric']} ({'higher' if summary['higher_is_better'] else 'lower'} is better)"
    ]
    if summary.get("measures"):
        lines.append(f"measures: {summary['measures']}")
    if "base_value" in summary:
        lines.append(f"unpruned {summary['metric']}: {summary['base_value']:.4f}")
    if summary.get("caveat"):
        lines.append(f"caveat: {summary['caveat']}")
    for key, label in (
        ("most_harmful_head", "most harmful single head"),
        ("least_harmful_head", "least harmful single head"),
    ):
        if key in summary:
            h = summary[key]
            lines.append(f"{label}: L{h['layer']}H{h['head']} (delta {h['delta']:+.4f})")
    if "prunable" in summary:
        lines.append(f"fraction of heads prunable ({summary['unit']} units) within 1% / 5% of the unpruned metric:")
        by_order: dict[str, dict[float, float]] = {}
        for r in summary["prunable"]:
            by_order.setdefault(r["order"], {})[r["tolerance"]] = r["fraction_pruned"]
        for o in sorted(by_order):
            lines.append(
                f"  {o:<20} {by_order[o].get(0.01, float('nan')):.2f} / {by_order[o].get(0.05, float('nan')):.2f}"
            )
    if not summary.get("complete", True):
        lines.append("incomplete: run again with the same --out to resume")
    return "\n".join(lines)


def _sharded_metric(pool, model, cfg):
    """The pruning stage's metric with its forwards on ``pool``'s workers, each over its part of
    the items (:func:`~headscope.reports.stages.pruning.sharded_metric`), as the report runs it."""
    from headscope.reports.stages.command_shards import merged, shard_context
    from headscope.reports.stages.pruning import sharded_metric

    ctx = shard_context(pool, model, seed=cfg.seed)
    return sharded_metric(ctx, cfg, merged(ctx, "pruning", cfg))


def run(args) -> int:
    from headscope.analyses.pruning.study import PruneConfig, pruning_study
    from headscope.analyses.run_json import add_to_run_json
    from headscope.probes.outputs.folder import claim_output
    from headscope.reports import budget as memory
    from headscope.reports.cli.argtypes import load_from_args, ray_pool, resolve_device

    device = None if args.device_map else resolve_device(args.device)
    n_items, notes = _capped_items(args)  # before the model loads: an absurd count answers at once
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    cfg = PruneConfig(
        metric=args.metric,
        prompt=args.prompt,
        step=args.step,
        max_fraction=args.max_fraction,
        orders=tuple(args.orders),
        n_random_seeds=args.seeds,
        seed=args.seed,
        quick=args.quick,
        batch_size=args.batch_size,
        n_items=n_items,
        unit=args.unit,
        studies=tuple(args.studies),
    )
    roles = _read_roles(args.roles) if args.roles else None
    asked = cfg
    budget, cfg = memory.prune_start(args, asked, device)  # refused in one line if it cannot fit
    with (
        ray_pool(args) as pool,  # --ray: a bad --ray-address or --workers refused here, before anything else
        claim_output(args.out, "prune") if args.out else nullcontext(),  # checked and locked before the model loads
    ):
        model = load_from_args(args, device)
        if cfg.metric is not None:  # #47: a metric that does not apply to what the model is for, in one line
            from headscope.analyses.pruning.metrics import METRICS, check_kind

            check_kind(cfg.metric, METRICS[cfg.metric], model)
        budget, cfg = memory.prune_refine(budget, model, cfg, asked)
        if not args.json:
            print(f"backend {model.backend_choice}", file=sys.stderr)
        timer = memory.parts_timer(None, "pruning", None, False, "parts of the study")
        metric = _sharded_metric(pool, model, cfg) if pool is not None else None  # --ray: forwards on the workers
        result = pruning_study(model, cfg, args.out, metric=metric, roles=roles, progress=timer)  # frames, state: --out
        add_to_run_json(args.out, memory=memory.finish(budget, memory.emitter(False)))
        if notes:
            result.summary["notes"] = notes
            add_to_run_json(args.out, notes=notes)  # the capped counts
    print(json.dumps(result.summary, indent=2, sort_keys=True) if args.json else render_summary(result.summary))
    return 0
