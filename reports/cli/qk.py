"""``headscope qk MODEL --head L.H [--task induction | --sentence S --query-token Q --key-token K]``:
why a head attends where it does, its score difference split exactly over (query component, key
component) pairs (:mod:`headscope.analyses.qk`); writes ``qk.csv``/``qk.parquet``, ``run.json`` and a bar figure per head under ``figures/``."""

from __future__ import annotations

import json
import sys
from contextlib import nullcontext


def register(sub) -> None:
    from headscope.analyses.qk.attribution import BASELINES
    from headscope.analyses.qk.study import TASK_ITEMS
    from headscope.probes.outputs.folder import out_argument
    from headscope.reports.cli.argtypes import (
        MAX_SEQ_LEN,
        add_backend,
        add_device,
        add_dtype,
        add_ray,
        batch_size,
        head,
        int_in,
        seed,
    )

    p = sub.add_parser("qk", help="why a head attends where it does: exact QK attribution over components")
    p.add_argument("model", nargs="?", default="smollm2-135m", help="shipped name or directory (in-house backend)")
    add_backend(p)
    add_dtype(p)
    add_device(p)
    p.add_argument("--head", type=head, action="append", required=True, help="head LAYER.HEAD (repeatable)")
    p.add_argument(
        "--task",
        choices=sorted(TASK_ITEMS),
        default=None,
        help="items: induction (default; key: the token after the earlier copy) or duplicate_token (key: the copy)",
    )
    p.add_argument("--n-items", type=int_in(1, 100_000, "task items"), default=16, help="task items (default 16)")
    p.add_argument(
        "--seq-len",
        type=int_in(3, MAX_SEQ_LEN, "tokens of a generated sequence"),
        default=10,
        help="task: tokens per sequence (default 10; within the model's context)",
    )
    p.add_argument("--seed", type=seed, default=0, help="the task items' seed (default 0)")
    p.add_argument("--sentence", default=None, help="one sentence instead of a task")
    p.add_argument("--query-token", default=None, help="with --sentence: query token (text or index; default all)")
    p.add_argument("--key-token", default=None, help="with --sentence: attended key (default the head's argmax)")
    p.add_argument("--baseline", choices=BASELINES, default="mean", help="what the attended key is compared with")
    p.add_argument(
        "--top", type=int_in(1, 1_000_000, "pairs kept per head"), default=20, help="pairs kept per head (default 20)"
    )
    p.add_argument("--batch-size", type=batch_size, default=16, help="items per forward (default 16)")
    p.add_argument("--out", type=out_argument, default=None, help="folder for qk.csv/.parquet and run.json")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_ray(p)
    p.set_defaults(func=run)


def render_summary(summary: dict) -> str:
    lines = [f"QK attribution of {summary['model']} ({summary['items']}; baseline {summary['baseline']})"]
    for key, s in summary["heads"].items():
        if not s.get("n_items"):
            lines.append(f"  {key}: no item attributed ({s['n_skipped']} query positions skipped: no other key)")
            continue
        tq, tk, tp = s["top_query"], s["top_key"], s["top_pair"]
        lines.append(
            f"  {key}: difference {s['mean_difference']:.3g} over {s['n_items']} items "
            f"({s['n_skipped']} skipped); key side {tk['component']} {tk['share']:.0%}, query side "
            f"{tq['component']} {tq['share']:.0%}, top pair {tp['component']} {tp['share']:.0%}; "
            f"split error {s['max_relative_error']:.1e}"
        )
    return "\n".join(lines)


def figures(frame, top: int = 8) -> dict[str, bytes]:
    """``{"figures/qk_L{layer}H{head}.png": png}``: per head, the ``top`` key-side and query-side
    shares of the score difference as bars (from the frame alone)."""
    import matplotlib.pyplot as plt

    from headscope.reports.figures import png_bytes, theme

    out = {}
    for (layer, h), f in frame.groupby(["layer", "head"]):
        with theme():
            fig, axes = plt.subplots(1, 2, figsize=(8, 0.3 * top + 1.2))
            for ax, side, col in zip(axes, ("key", "query"), ("key_component", "query_component"), strict=True):
                rows = f[f.side == side].sort_values("rank").head(top)[::-1]
                ax.barh(rows[col], rows.share, color="#4c72b0")
                ax.axvline(0, color="black", lw=0.6)
                ax.set_title(f"{side} side")
                ax.set_xlabel("share of the score difference")
            fig.suptitle(f"L{layer}H{h}: what its attended key's score owes to each component")
        out[f"figures/qk_L{layer}H{h}.png"] = png_bytes(fig)
    return out


def _items(args, model):
    from headscope.analyses.qk.study import sentence_items, task_items

    if args.sentence is not None:
        if args.task is not None:
            raise ValueError("give --task or --sentence, not both")
        items, tokens = sentence_items(model, args.sentence, args.query_token, args.key_token)
        return items, f"sentence of {len(tokens)} tokens"
    if args.query_token is not None or args.key_token is not None:
        raise ValueError("--query-token and --key-token need --sentence")
    name = args.task or "induction"
    items = task_items(name, model.tokenizer, n_items=args.n_items, seq_len=args.seq_len, seed=args.seed)
    return items, f"{name} task, {args.n_items} items of seq_len {args.seq_len}"


def run(args) -> int:
    from headscope.analyses.qk.study import QKConfig, qk_study
    from headscope.analyses.run_json import model_record, write_run_json
    from headscope.probes.errors import ModelIncompatibleError
    from headscope.probes.outputs.atomic import atomic_write, write_frame
    from headscope.probes.outputs.folder import claim_output
    from headscope.probes.qk_parts import qk_refusal
    from headscope.reports.cli.argtypes import load_from_args, ray_in_driver, resolve_device

    ray_in_driver(args, "qk", "QK attribution has no stage split")
    device = resolve_device(args.device)
    cfg = QKConfig(baseline=args.baseline, batch_size=args.batch_size, top_pairs=args.top)
    with claim_output(args.out, "qk") if args.out else nullcontext() as folder:
        model = load_from_args(args, device)
        spec = model.spec
        for l, h in args.head:  # a head outside the model: one line naming its size, before any work
            if not (l < spec.n_layers and h < spec.n_heads):
                raise ValueError(
                    f"--head {l}.{h} is outside {spec.name}: {spec.n_layers} layers (0-{spec.n_layers - 1}) x "
                    f"{spec.n_heads} heads (0-{spec.n_heads - 1})"
                )
        why = qk_refusal(model)
        if why is not None:
            raise ModelIncompatibleError(why)
        items, described = _items(args, model)
        result = qk_study(model, args.head, items, cfg)
        summary = {
            "model": spec.name,
            "items": described,
            "baseline": cfg.baseline,
            "forwards": result.forwards,
            "heads": result.summary,
        }
        if folder is not None:
            with folder.staging() as tmp:
                write_frame(result.frame, tmp / "qk")
                (tmp / "figures").mkdir()
                for rel, png in figures(result.frame).items():
                    with atomic_write(tmp / rel, "wb", encoding=None) as f:
                        f.write(png)
                write_run_json(tmp, "qk", model_record(model), **summary)
    out = json.dumps(summary, indent=2, sort_keys=True, default=str) if args.json else render_summary(summary)
    print(out, file=sys.stdout)
    return 0
