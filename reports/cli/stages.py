"""``headscope <stage> [MODEL]``: a subcommand for every registered stage without a hand-written one.

Its flags are the stage's config fields (``--<field-name>``; a field's ``metadata["help"]`` is the
help, ``metadata={"cli": False}`` keeps it off), plus the report's common ones (``--out``,
``--seed``, ``--full``, ``--backend``, ``--dtype``, ``--device``, ``--ray``, ``--workers``,
``--ray-address``). It runs the report with the
stage and the stages it requires (``--only``), writes the same folder as ``headscope report``,
and prints what the stage's :meth:`~headscope.reports.stages.base.Stage.describe` says of its run.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing


def _flag_type(t) -> tuple[type | None, bool]:
    """``(scalar type, optional)`` of a field annotation the command line can give, or ``(None, _)``."""
    args = typing.get_args(t)
    optional = typing.get_origin(t) in (typing.Union, types.UnionType) and type(None) in args
    if optional:
        rest = [a for a in args if a is not type(None)]
        t = rest[0] if len(rest) == 1 else None
    if t in (int, float, str, bool):
        return t, optional
    if typing.get_origin(t) is tuple and typing.get_args(t)[:1] == (str,):
        return tuple, optional
    return None, optional


def add_config_flags(p: argparse.ArgumentParser, config: type) -> list[str]:
    """Add a ``--<field>`` flag per field of the dataclass ``config`` the command line can give;
    returns the fields added."""
    from headscope.reports.cli.argtypes import int_in

    hints, added = typing.get_type_hints(config), []
    for f in dataclasses.fields(config):
        if not f.metadata.get("cli", True):
            continue
        kind, _optional = _flag_type(hints[f.name])
        if kind is None:
            continue
        flag, default = "--" + f.name.replace("_", "-"), f.default
        help_ = f.metadata.get("help", f.name.replace("_", " ")) + f" (default: {default})"
        if kind is bool:
            p.add_argument(flag, dest=f"cfg_{f.name}", action=argparse.BooleanOptionalAction, default=None, help=help_)
        elif kind is tuple:
            p.add_argument(
                flag, dest=f"cfg_{f.name}", default=None, type=lambda v: tuple(x for x in v.split(",") if x), help=help_
            )
        elif kind is int:  # a count: bounded (the field's metadata "low"/"high", else 1 to 1,000,000)
            low, high = f.metadata.get("low", 1), f.metadata.get("high", 1_000_000)
            p.add_argument(
                flag, dest=f"cfg_{f.name}", type=int_in(low, high, f.name.replace("_", " ")), default=None, help=help_
            )
        else:
            p.add_argument(flag, dest=f"cfg_{f.name}", type=kind, default=None, help=help_)
        added.append(f.name)
    return added


def config_from_args(config: type, args, fields: list[str]):
    """The ``config`` the flags say (a flag not given keeps the field's default); None when none given."""
    given = {k: getattr(args, f"cfg_{k}") for k in fields if getattr(args, f"cfg_{k}", None) is not None}
    return config(**given) if given else None


def _needs(name: str) -> tuple[str, ...]:
    """``name`` and every stage it requires, transitively."""
    from headscope.reports.stages.registry import STAGES

    out, todo = [], [name]
    while todo:
        n = todo.pop()
        if n not in out:
            out.append(n)
            todo += list(STAGES[n].requires)
    return tuple(out)


def register(sub) -> None:
    """A subcommand per registered stage with no hand-written command (:attr:`Stage.command`)."""
    from headscope.probes.outputs.folder import out_argument
    from headscope.reports.cli.argtypes import add_backend, add_device, add_dtype, add_ray, seed
    from headscope.reports.cli.report import add_plan_flags
    from headscope.reports.stages.registry import STAGES

    for name, stage in STAGES.items():
        if stage.command is not None:
            continue
        p = sub.add_parser(name, help=f"{stage.help} (a report with this stage and what it needs)")
        p.add_argument("model", nargs="?", default="minilm-l6", help="shipped name, directory or .gguf")
        add_backend(p)
        add_dtype(p)
        add_device(p)
        add_plan_flags(p)
        add_ray(p)
        p.add_argument("--full", action="store_true", help="the stages' full settings (default: quick)")
        p.add_argument("--out", type=out_argument, default=None, metavar="DIR", help=f"default: runs/{name}-<model>")
        p.add_argument("--seed", type=seed, default=0, help="seed for every random draw (default 0)")
        p.add_argument("--quiet", action="store_true", help="no progress bars, no summary table")
        fields = add_config_flags(p, stage.Config)
        p.set_defaults(func=_runner(name, fields))


def _runner(name: str, fields: list[str]):
    def run(args) -> int:
        import json
        from pathlib import Path

        from headscope.reports.budget import emitter
        from headscope.reports.cli.argtypes import ray_config, resolve_device
        from headscope.reports.cli.terminal import StageProgress, print_summary
        from headscope.reports.pipeline import build_report
        from headscope.reports.stages.config import RunConfig
        from headscope.reports.stages.registry import STAGES

        cfg = config_from_args(STAGES[name].Config, args, fields)
        config = RunConfig(
            backend=args.backend,
            full=args.full,
            seed=args.seed,
            dtype=args.dtype,
            device=resolve_device(args.device),
            trust_remote_code=args.trust_remote_code,
            only=_needs(name),
            configs={name: cfg} if cfg is not None else {},
            ray=ray_config(args),
        )
        if args.dry_run:
            from headscope.reports.cli.report import print_plan

            return print_plan(args.model, config)
        out = args.out or Path("runs") / f"{name}-{Path(str(args.model)).name}"
        with StageProgress(quiet=args.quiet) as progress:
            result = build_report(
                args.model, config, out_dir=out, quiet=args.quiet, progress=progress, notice=emitter(args.quiet)
            )
        if not args.quiet:
            print_summary(result.summary)
        stage = STAGES[name]
        run = json.loads(Path(result.paths["run_json"]).read_text(encoding="utf-8"))
        text = stage.describe(
            {k: v for k, v in result.frames.items() if k in stage.schemas}, run.get(stage.key()) or {}
        )
        if text:
            print(text)
        return 0

    return run
