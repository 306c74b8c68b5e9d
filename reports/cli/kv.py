"""``headscope kv MODEL``: the KV-cache compression study alone
(:mod:`headscope.analyses.kvcache`): which KV groups need their whole cache, which can keep
only ``--sink`` first tokens plus a ``--window`` of recent ones.

Writes into ``--out`` (default ``runs/kv-<model>``): ``kv_study.csv``/``.parquet`` (one row per
measured configuration and metric: :data:`~headscope.analyses.kvcache.study.COLUMNS`),
``kv_curve.csv``/``.parquet`` (the greedy and random orders' points with their quality change),
``kv.md`` (a short summary) and ``run.json``. An encoder is refused in one line: the KV cache is
a decoder's.

With ``--ray`` the configurations are measured on the workers by rounds, as the report's KV stage
shards them (:func:`sharded_kv`), and the files equal the run without it.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

#: the longest input the study takes (the model's context bounds it further)
MAX_TOKENS = 65536


def register(sub) -> None:
    from headscope.probes.outputs.folder import out_argument
    from headscope.reports.cli.argtypes import add_ray, int_in, seed

    p = sub.add_parser("kv", help="KV-cache compression study: which KV groups keep a full cache, sink + window")
    p.add_argument("model", nargs="?", default="smollm2-135m", help="shipped name (smollm2-135m), directory or .gguf")
    p.add_argument(
        "--tokens",
        type=int_in(16, MAX_TOKENS, "tokens per input"),
        default=None,
        help="tokens per input (default 2048, or the model's context where shorter; at most the context)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="the curve on one needle item, the greedy order by single-group damage, "
        "4 points per order, 2 random orders (SmolLM2 at 2,048 tokens: minutes on 2 cores)",
    )
    p.add_argument("--sink", type=int_in(0, MAX_TOKENS, "sink tokens"), default=4, help="first tokens kept (4)")
    p.add_argument(
        "--window", type=int_in(1, MAX_TOKENS, "window tokens"), default=256, help="recent tokens kept (256)"
    )
    p.add_argument(
        "--roles",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="first the long-context roles (retrieval, streaming, sink) on 16 needle items and their causal check, "
        "joined with the study, the sink heads also with BOS put in or taken out (default: on; at the study's tokens, "
        "the check on 8 items; --quick: at 512 tokens, the check on 4 items)",
    )
    p.add_argument("--seed", type=seed, default=0, help="seed of the inputs and the random orders (0)")
    p.add_argument("--out", type=out_argument, help="output folder (default runs/kv-<model>)")
    p.add_argument("--quiet", action="store_true", help="print nothing but errors")
    add_ray(p)
    p.set_defaults(func=run)


def default_out(model: str) -> Path:
    """``runs/kv-<model>``, with the model's file stem for a path and unsafe characters replaced."""
    name = Path(model).stem if ("/" in model or model.endswith(".gguf")) else model
    return Path("runs") / f"kv-{re.sub(r'[^A-Za-z0-9._-]+', '_', name) or 'model'}"


def config_of(args):
    """The study's :class:`~headscope.analyses.kvcache.study.KVConfig` of the arguments."""
    import dataclasses

    from headscope.analyses.kvcache.study import QUICK_KV, KVConfig

    base = QUICK_KV if args.quick else KVConfig()
    return dataclasses.replace(base, tokens=args.tokens or 2048, sink=args.sink, window=args.window, seed=args.seed)


def summary_text(name: str, summary: dict) -> str:
    """The Markdown summary: the unrestricted quality, the savings at the 1 % point, the first
    groups the greedy order gives back."""
    from headscope.reports.sections.long_context import long_lines, savings_lines

    order = ", ".join(f"L{l}" if g is None else f"L{l}G{g}" for l, g in summary["greedy_order"][:10])
    lines = [
        f"# KV cache: {name}",
        "",
        *savings_lines(summary),
        *long_lines(summary),
        f"- greedy order (first 10): {order}",
        "",
    ]
    return "\n".join(lines)


def sharded_kv(pool, model, cfg, long_roles: dict) -> tuple[dict, dict]:
    """``(frames, summary)`` of the study ``cfg`` (and, with ``long_roles``, the long-context roles)
    with its configurations measured on ``pool``'s workers: the KV stage's parts
    (:mod:`~headscope.reports.stages.kv_shards`: each worker's unrestricted pass, the long-context
    roles on the first, then each round of configurations cut over the workers), the study's
    choices and frames in the driver, at the command's own settings (``KVStageConfig.study``)."""
    from headscope.analyses.kvcache.stage import KVStageConfig, KVStudyError, check_tokens
    from headscope.reports.stages.base import StageAbsent
    from headscope.reports.stages.command_shards import merged, shard_context
    from headscope.reports.stages.registry import STAGES

    check_tokens(model, cfg.tokens)  # in one line, before any worker builds its inputs
    given = {k: long_roles[k] for k in ("role_items", "role_tokens", "causal_items", "bos_pass") if k in long_roles}
    scfg = KVStageConfig(study=cfg, **{"role_items": 0, **given})
    ctx = shard_context(pool, model, seed=cfg.seed)
    try:
        result = STAGES["kv"].finish(ctx, scfg, merged(ctx, "kv", scfg))
    except StageAbsent as e:  # inputs the tokenizer or context cannot give: one line, as without --ray
        raise KVStudyError(str(e)) from e
    return result.frames, result.summary


def run(args) -> int:
    import dataclasses
    import time

    from headscope.analyses.kvcache.stage import CAUSAL_ITEMS, LONG_ITEMS, LONG_TOKENS, KVStudyError, kv_blocker, run_kv
    from headscope.analyses.kvcache.study import curve_frame
    from headscope.analyses.run_json import model_record, versions, write_run_json
    from headscope.probes.models.loading import load_model
    from headscope.probes.outputs.atomic import write_frame
    from headscope.probes.outputs.folder import claim_output
    from headscope.reports.cli.argtypes import ray_pool

    cfg = config_of(args)
    out = Path(args.out) if args.out else default_out(args.model)
    with (
        ray_pool(args) as pool,  # --ray: a bad --ray-address or --workers refused here, before anything else
        claim_output(out, "kv") as folder,  # refused before the model loads
    ):
        t0 = time.perf_counter()
        model = load_model(args.model, backend="inhouse")
        load_s = round(time.perf_counter() - t0, 3)
        if (why := kv_blocker(model)) is not None:
            raise KVStudyError(why)
        if args.tokens is None:  # the default: 2048, or the model's context where shorter
            cfg = dataclasses.replace(cfg, tokens=min(cfg.tokens, model.spec.max_positions))
        long_roles = dict(role_items=LONG_ITEMS, role_tokens=LONG_TOKENS, causal_items=CAUSAL_ITEMS, bos_pass=True)
        if not args.quick:  # the roles at the study's own context, the causal check on 8 items
            long_roles.update(role_tokens=None, causal_items=8)
        long_roles = long_roles if args.roles else {}
        if pool is None:
            frames, summ = run_kv(model, cfg, **long_roles)
        else:  # --ray: the configurations measured on the workers, by rounds
            frames, summ = sharded_kv(pool, model, cfg, long_roles)
        summ["timings"]["load_s"] = load_s
        text = summary_text(model.spec.name, summ)
        with folder.staging() as tmp:
            write_frame(frames["kv_study"], tmp / "kv_study")
            write_frame(curve_frame(frames["kv_study"]), tmp / "kv_curve")
            for name in ("kv_roles", "long_context_roles", "long_context_causal"):
                if name in frames:
                    write_frame(frames[name], tmp / name)
            (tmp / "kv.md").write_text(text)
            write_run_json(
                tmp,
                "kv",
                model_record(model),
                model_arg=args.model,
                quick=bool(args.quick),
                versions=versions(),
                kv_summary=summ,
                tables=["kv_curve", "kv_study"],
            )
    if not args.quiet:
        print(text)
        print(f"wrote {out}", file=sys.stderr)
    return 0
