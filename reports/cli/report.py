"""``headscope report [MODEL]``: run the analyses and write a self-contained report folder.

``report.html`` (inline images and CSS, opens offline), ``report.md`` with ``figures/``,
``tables/*.csv|parquet`` and ``run.json``; the folder appears only when complete.
"""

from __future__ import annotations

import argparse
import sys


def register(sub) -> None:
    from headscope.probes.outputs.folder import out_argument
    from headscope.reports.cli.argtypes import add_backend, add_device, add_dtype, add_ray, seed

    p = sub.add_parser("report", help="what every head does and what pruning costs: HTML + Markdown + tables")
    p.add_argument(
        "model",
        nargs="*",
        default=None,
        help="shipped name, directory or .gguf (default: minilm-l6); several checkpoints, or a folder of "
        "checkpoint-<step> folders, run one report each and write a comparison (docs: guide/checkpoints)",
    )
    p.add_argument(
        "--checkpoints",
        default=None,
        metavar="FILE",
        help="a text file of checkpoints, one path a line: one report each and a comparison across them",
    )
    p.add_argument("--model", dest="model_opt", default=None, metavar="NAME", help="same as the positional MODEL")
    add_backend(p)
    add_dtype(p)
    add_device(p, device_map=True)
    add_plan_flags(p, max_memory=True)
    add_ray(p)
    p.add_argument("--full", action="store_true", help="every pruning study to 100%% (default: quick, up to 50%%)")
    add_stage_switches(p)
    p.add_argument(
        "--out", type=out_argument, default=None, metavar="DIR", help="output folder (default: runs/report-<model>)"
    )
    p.add_argument("--seed", type=seed, default=0, help="seed for every random draw (0 to 2**32 - 1; default 0)")
    p.add_argument("--quiet", action="store_true", help="no progress bars, no summary table")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.set_defaults(func=run)


#: the help of a stage's ``--<stage>/--no-<stage>`` switch where it says more than the stage's own line
_SWITCH_HELP = {
    "patching": "causal evidence per role by activation + attribution patching on the role's task (default: on; "
    "quick: a bounded number of items, --full: 64 per task)",
    "weights": "the 'From the weights' section: OV copying and K-composition read from the in-house model's weights, "
    "joined with the roles and patching (default: on)",
    "kv": "the 'Long context and the KV cache' section on a causal decoder: the KV-cache compression study at "
    "1,024 tokens, quick settings (default: on; headscope kv runs it alone)",
}


def add_plan_flags(p, *, max_memory: bool = False) -> None:
    """``--dry-run`` (the plan, printed, and exit 0 before any weight loads) and, with ``max_memory``,
    ``--max-memory GPU=SIZE,...`` (the devices a ``--device-map auto`` placement is planned over)."""
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the plan (each stage's estimated peak, batch and time; with --device-map auto, the layers "
        "and memory per device) and exit before anything loads",
    )
    if max_memory:
        p.add_argument(
            "--max-memory",
            type=max_memory_flag,
            default=None,
            metavar="GPU=SIZE,...",
            help="with --device-map auto: the memory of each GPU to place the layers in, e.g. 0=8GiB,1=8GiB "
            "(default: each GPU's free memory); with --dry-run any GPUs, present or not",
        )


def max_memory_flag(text: str) -> dict:
    """``--max-memory``'s type: :func:`~headscope.probes.models.placement.parse_max_memory`, its
    ``ValueError`` as argparse's one-line error (exit 2)."""
    from headscope.probes.models.placement import parse_max_memory

    try:
        return parse_max_memory(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--max-memory ")) from None


def add_stage_switches(p) -> None:
    """``--only``, ``--skip`` and a ``--<stage>/--no-<stage>`` switch for every registered stage."""
    from headscope.reports.stages.registry import STAGES

    names = ", ".join(STAGES)
    p.add_argument("--only", default=None, metavar="STAGES", help=f"run only these stages, comma-separated ({names})")
    p.add_argument("--skip", default=None, metavar="STAGES", help=f"leave out these stages, comma-separated ({names})")
    for name, stage in STAGES.items():
        p.add_argument(
            f"--{name}",
            dest=f"stage_{name}",
            action=argparse.BooleanOptionalAction,
            default=None,
            help=_SWITCH_HELP.get(name, f"{stage.help} (default: {'on' if stage.default_on else 'off'})"),
        )


def stage_selection(args) -> dict:
    """``RunConfig`` keywords ``only``, ``skip``, ``off`` from the switches (names checked: an
    unknown one is one line listing the known stages, exit 2)."""
    from headscope.reports.stages.registry import STAGES, check_names

    def names(text, flag):
        return None if text is None else check_names(text.split(","), flag)

    off = tuple(n for n in STAGES if getattr(args, f"stage_{n}", None) is False)
    on = tuple(n for n in STAGES if getattr(args, f"stage_{n}", None) is True)
    return {"only": names(args.only, "--only"), "skip": names(args.skip, "--skip") or (), "off": off, "on": on}


def model_name(args) -> str:
    given = args.model[0] if isinstance(args.model, list) and args.model else args.model or None
    if given and args.model_opt and given != args.model_opt:
        raise ValueError(
            f"MODEL given twice with different values ({given!r} and --model {args.model_opt!r}); give one"
        )
    return given or args.model_opt or "minilm-l6"


def _many(args) -> bool:
    """Whether the arguments name several checkpoints (or a list file, or a folder of checkpoint-<step> folders)."""
    from pathlib import Path

    from headscope.reports.checkpoint_inputs import step_folders

    models = args.model if isinstance(args.model, list) else [m for m in [args.model] if m]
    return args.checkpoints is not None or len(models) > 1 or (len(models) == 1 and bool(step_folders(Path(models[0]))))


def run(args) -> int:
    from headscope.reports.budget import emitter
    from headscope.reports.cli.argtypes import ray_config, resolve_device
    from headscope.reports.cli.terminal import StageProgress, print_summary
    from headscope.reports.pipeline import build_report
    from headscope.reports.stages.config import RunConfig

    many = _many(args)
    name = None if many else model_name(args)
    config = RunConfig(
        backend=args.backend,
        full=args.full,
        seed=args.seed,
        trust_remote_code=args.trust_remote_code,
        **stage_selection(args),
        dtype=args.dtype,
        device=None if args.device_map else resolve_device(args.device),
        device_map=args.device_map,
        max_memory=args.max_memory,
        ray=ray_config(args),
    )
    if args.dry_run:
        if many:
            raise ValueError("--dry-run plans one model; give one MODEL")
        return print_plan(name, config)
    if many:
        return run_checkpoints(args, config)
    with StageProgress(quiet=args.quiet or args.json) as progress:
        result = build_report(
            name,
            config,
            out_dir=args.out,
            quiet=args.quiet,
            progress=progress,
            notice=emitter(args.quiet),  # the memory estimate up front, the estimated time, the peak at the end
        )
    if args.json:
        print_summary(result.summary, as_json=True)
    elif not args.quiet:
        print_summary(result.summary)
    return 0


def print_plan(model, config) -> int:
    """``--dry-run``: the plan's lines on stdout (:func:`~headscope.reports.dry_run.dry_run`), exit 0."""
    from headscope.reports.dry_run import dry_run

    for line in dry_run(model, config):
        print(line)
    return 0


def run_checkpoints(args, config) -> int:
    """``headscope report CKPT1 CKPT2 …``: every checkpoint checked before any job runs (one line,
    exit 2), one report each under ``--out``, the comparison beside them; exit 1 when a report failed."""
    import json

    from headscope.reports.checkpoint_inputs import read_checkpoints
    from headscope.reports.checkpoint_report import check_out, compare_checkpoints, summary_lines

    if args.model_opt:
        raise ValueError("--model names one model; give the checkpoints as arguments or with --checkpoints")
    checkpoints = read_checkpoints(args.model or [], args.checkpoints)
    out = args.out or "runs/report-checkpoints"
    check_out(out, checkpoints)
    quiet = args.quiet or args.json
    result = compare_checkpoints(
        checkpoints, config, out, ray=config.ray, notice=None if quiet else lambda line: print(line, flush=True)
    )
    if args.json:
        runs = result.frames["checkpoint_runs"]
        json.dump(
            {
                "out_dir": str(result.paths["out_dir"]),
                "comparison": str(result.paths["html"]),
                "checkpoints": runs.astype(object).where(runs.notna(), None).to_dict("records"),
                "failed": len(result.failed),
                "notes": result.notes,
            },
            sys.stdout,
            indent=2,
            default=str,
        )
        sys.stdout.write("\n")
    elif not args.quiet:
        for line in summary_lines(result):
            print(line)
    return 1 if result.failed else 0
