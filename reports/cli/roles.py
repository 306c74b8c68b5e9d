"""``headscope roles MODEL``: what each head does, as one verdict table.

Reads the probe corpora first (a malformed file fails before the model loads, as
``headscope: error: file:line:col: ...``, exit 2), runs
:func:`headscope.analyses.roles.pipeline.head_roles`, and writes into ``--out`` (default
``runs/roles-<model>``), each atomically:

``roles.csv``/``roles.parquet`` (ROLE_COLUMNS), ``head_stats.*`` (STAT_COLUMNS),
``clusters.*``, ``roles_by_head.*`` (the roles each head holds), ``coref_pairs.*`` (pair consistency on the
coreference minimal pairs), ``skipped.json``
(role group / input file -> reason -> count), ``examples.json`` (one item per role's top
head, for drawing) and ``run.json`` (model, backend, config, items, timings).

``--dtype bf16|fp16`` runs the model (in-house or hf) in that dtype (softmax and norms in
fp32, as HF does); ``headscope diff`` of an fp32 and a bf16 run says whether each role
keeps its top heads and by how much the scores moved. ``--device`` (default: CUDA when
available) places the model; device and dtype are recorded in run.json.

Then prints the top heads per role (groups where some head holds the role) and the
skipped counts; ``--json`` prints the same as JSON; ``--quiet`` prints nothing.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
from pathlib import Path


def register(sub) -> None:
    from headscope.analyses.roles import REGISTRY  # the help lists the registered groups
    from headscope.probes.outputs.folder import out_argument
    from headscope.reports.cli.argtypes import (
        batch_size,
        int_in,
        listed,
        seed,
        unit_interval,
    )

    verdicts = ", ".join(name for name, role in REGISTRY.items() if role.score_kind != "none")
    opt_in = [name for name, role in REGISTRY.items() if not role.default]
    p = sub.add_parser("roles", help=f"classify every head: {verdicts}")
    p.add_argument(
        "model", nargs="?", default="minilm-l6", help="shipped name (minilm-l6, smollm2-135m), directory or .gguf"
    )
    _add_model_flags(p)
    p.add_argument(
        "--conllu",
        action="append",
        metavar="FILE",
        help="CoNLL-U treebank (repeatable; default: the shipped data/syntax/*.conllu)",
    )
    p.add_argument("--coref", metavar="FILE", help="coreference JSONL (default: data/coref/coref.jsonl)")
    p.add_argument(
        "--text", metavar="FILE", help="plain text, one sentence per line (default: data/text/sentences.txt)"
    )
    p.add_argument(
        "--max-tokens",
        type=int_in(8, 1 << 20, "tokens"),
        default=None,
        metavar="N",
        help="long inputs: join consecutive lines of the text corpus (--text FILE or the shipped one) into "
        "passages of at most N tokens (8 to the model's context), a longer line cut; the text roles then "
        "run on the passages (patterns reduced in query chunks, never stored, on the in-house backend)",
    )
    p.add_argument(
        "--roles",
        metavar="LIST",
        help="comma-separated role groups to run (default: "
        + (f"all but {','.join(opt_in)}, which run only when named" if opt_in else "all")
        + f"): {','.join(REGISTRY)}",
    )
    p.add_argument("--out", type=out_argument, metavar="DIR", help="output folder (default: runs/roles-<model>)")
    p.add_argument(
        "--seed", type=seed, default=0, help="seed for bootstrap, permutations and generated sequences (0 to 2**32 - 1)"
    )
    p.add_argument(
        "--margin",
        type=unit_interval,
        default=None,
        help="margin over the baseline for a verdict (default 0.10, Voita et al.)",
    )
    p.add_argument(
        "--correction",
        choices=("bh", "by", "none"),
        default="bh",
        help="multiple-testing correction of the p-values: Benjamini-Hochberg (default), Benjamini-Yekutieli "
        "(any dependence between tests), or none",
    )
    p.add_argument(
        "--family",
        choices=("role", "global"),
        default="role",
        help="what one correction covers: every head of one role/relation/direction (default), or every row of "
        "the run (all heads x all roles)",
    )
    _add_group_flags(p)
    p.add_argument("--batch-size", type=batch_size, default=None, help="items per forward pass (default 32)")
    p.add_argument("--top", type=listed, default=3, help="heads shown per role")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.add_argument("--quiet", action="store_true", help="print nothing (files only)")
    p.set_defaults(func=run)


def _add_model_flags(p) -> None:
    """How the model loads and runs: ``--backend``, ``--dtype``, ``--device`` (and ``--device-map``),
    ``--ray``/``--workers``/``--ray-address``/``--worker-threads``."""
    from headscope.reports.cli.argtypes import add_backend, add_device, add_dtype, add_ray

    add_backend(p)
    add_dtype(p)
    add_device(p, device_map=True)
    add_ray(p)


def _add_group_flags(p) -> None:
    """The flags one role group reads (syntactic labels, IOI's S-inhibition, function vectors' prompts)."""
    from headscope.reports.cli.argtypes import int_in

    p.add_argument(
        "--full-labels", action="store_true", help="keep full UD labels (nmod:poss) instead of the part before ':'"
    )
    p.add_argument(
        "--s-inhibition",
        action="store_true",
        help="IOI roles: also find the S-inhibition heads by path patching into the name movers' queries "
        "(about one forward per head below the name movers per IOI item: minutes on a CPU)",
    )
    p.add_argument(
        "--fv-prompts",
        type=int_in(2, 10, "the roles' 64 generated sequences shared by 6 tasks"),
        default=None,
        metavar="N",
        help="function-vector heads: mean and scored prompts per task (default 5, 2 to 10; the study in the "
        "roles guide uses 8; each costs about two re-runs of the last position per head)",
    )


def default_out(model: str) -> Path:
    """``runs/roles-<model>``, with the model's file stem for a path and unsafe characters replaced."""
    name = Path(model).stem if ("/" in model or model.endswith(".gguf")) else model
    return Path("runs") / f"roles-{re.sub(r'[^A-Za-z0-9._-]+', '_', name) or 'model'}"


def _config(args):
    from headscope.analyses.roles.config import RolesConfig

    kw = {"seed": args.seed, "full_labels": args.full_labels, "correction": args.correction, "family": args.family}
    if getattr(args, "s_inhibition", False):
        kw["ioi_s_inhibition"] = True
    if getattr(args, "fv_prompts", None) is not None:
        kw["fv_prompts"] = args.fv_prompts
    if args.margin is not None:
        kw["margin"] = args.margin
    if args.batch_size is not None:
        kw["batch_size"] = args.batch_size
    return RolesConfig(**kw)


def _read_inputs(args, cfg, groups):
    """Read the corpora the chosen role groups need (before loading the model)."""
    from headscope.analyses.roles.pipeline import corpora_for, default_conllu, default_coref, default_text
    from headscope.probes.corpora import read_conllu, read_coref, read_text

    corpora = corpora_for(groups)
    inputs = {}
    if "conllu" in corpora:
        inputs["conllu"] = [read_conllu(p, full_labels=cfg.full_labels) for p in (args.conllu or default_conllu())]
    if "coref" in corpora:
        inputs["coref"] = read_coref(args.coref or default_coref())
    if "text" in corpora:
        inputs["text"] = read_text(args.text or default_text())
    return inputs


def _skipped_text(skipped: dict) -> str:
    """``group: reason count, ...; group: ...`` of the groups and files that skipped something."""
    parts = [f"{g}: " + ", ".join(f"{k} {v}" for k, v in sorted(r.items())) for g, r in sorted(skipped.items()) if r]
    return "; ".join(parts) or "nothing"


def check_usable(result, inputs: dict, args) -> None:
    """``ValueError`` (one line, naming the input files) when no role group had a usable
    item: how many items were read from each input and what was skipped, by reason. A run
    where some group had items passes (its skipped counts are in skipped.json, run.json and
    on stderr)."""
    from headscope.analyses.roles.pipeline import default_text

    if any(result.n_items.values()) or not result.n_items:
        return
    read, files = [], []
    if "text" in inputs:
        read.append(f"{len(inputs['text'].lines)} text lines")
        files.append(args.text or default_text())
    if "conllu" in inputs:
        read.append(f"{sum(len(c) for c in inputs['conllu'])} CoNLL-U sentences")
        files += [c.path for c in inputs["conllu"]]
    if "coref" in inputs:
        read.append(f"{len(inputs['coref'].items)} coreference items")
        files.append(inputs["coref"].path)
    where = ", ".join(str(f) for f in files) or "roles"
    raise ValueError(
        f"{where}: no usable items: read {', '.join(read) or 'generated items only'}, and every role group "
        f"({', '.join(result.n_items)}) skipped all of them ({_skipped_text(result.skipped)}); nothing written"
    )


def _summary_records(result, top: int) -> list[dict]:
    from headscope.analyses.roles.base import per_relation_roles
    from headscope.analyses.roles.pipeline import summary

    df = summary(result, top=top, only_verdicts=False)
    # syntactic: only relations where some head holds the role (there are dozens)
    keep = ~df.role.isin(per_relation_roles()) | df.groupby(["role", "relation", "direction"])["verdict"].transform(
        "any"
    )
    cols = [
        "role",
        "relation",
        "direction",
        "rank",
        "layer",
        "head",
        "score",
        "baseline",
        "margin",
        "p_value",
        "n",
        "verdict",
    ]
    return df[keep][cols].to_dict("records")


def _print_text(result, records, out: Path) -> None:
    from headscope.analyses.roles.pipeline import roles_by_head

    lines = [
        f"headscope roles: {result.model} — {len(result.frame)} role rows, "
        f"{int(result.frame.verdict.sum())} verdicts; files in {out}"
    ]
    lines.append("")
    lines.append(
        f"{'role':<22} {'relation':<10} {'direction':<10} {'#':>2} {'head':>6} {'score':>6} {'base':>6} {'margin':>7} {'p':>8} {'n':>6}  holds"
    )
    for r in records:
        head = f"L{r['layer']}H{r['head']}"
        lines.append(
            f"{r['role']:<22} {r['relation']:<10} {r['direction']:<10} {r['rank']:>2} {head:>6} {r['score']:>6.3f} "
            f"{r['baseline']:>6.3f} {r['margin']:>+7.3f} {r['p_value']:>8.2g} {r['n']:>6}  {'yes' if r['verdict'] else 'no'}"
        )
    multi = roles_by_head(result)
    multi = multi[multi.n_roles > 1]
    if len(multi):
        lines.append("")
        lines.append(f"{len(multi)} heads hold several roles (roles_by_head.csv)")
    lines.append("")
    lines.append("skipped:")
    any_skip = False
    for group, reasons in sorted(result.skipped.items()):
        if reasons:
            any_skip = True
            lines.append(f"  {group}: " + ", ".join(f"{k} {v}" for k, v in sorted(reasons.items())))
    if not any_skip:
        lines.append("  nothing")
    lines.append("items: " + ", ".join(f"{k} {v}" for k, v in result.n_items.items()))
    print("\n".join(lines))


def _groups(args) -> tuple[str, ...]:
    """The role groups ``--roles`` names, checked (default: every group run by default)."""
    from headscope.analyses.roles import REGISTRY
    from headscope.analyses.roles.pipeline import check_roles

    wanted = None
    if args.roles is not None:
        wanted = [g.strip() for g in args.roles.split(",") if g.strip()]
        if not wanted:
            raise ValueError(
                f"--roles: no role group given (got {args.roles!r}); choose from {','.join(REGISTRY)} "
                "or leave --roles out for all"
            )
    return check_roles(wanted)


def _analyse(args, model, cfg, groups, inputs: dict, pool=None):
    """:func:`~headscope.analyses.roles.pipeline.head_roles` on the loaded model, with the
    terminal's stage progress (long stages only when stderr is a log); with ``pool`` (``--ray``)
    the roles stage's parts on its workers, merged and finished here as the report does."""
    from headscope.analyses.roles.pipeline import head_roles
    from headscope.reports import budget as memory

    if pool is not None:
        from headscope.analyses.roles.parts import finish_filled
        from headscope.reports.stages.command_shards import merged, shard_context

        ctx = shard_context(pool, model, seed=cfg.seed, inputs=_corpora(inputs), role_groups=groups)
        filled = merged(ctx, "roles", cfg).summary["filled"]
        return finish_filled(model, filled, cfg=cfg, roles=groups, inputs=ctx.inputs)

    progress = None
    if not (args.quiet or args.json):
        from headscope.reports.cli.terminal import StageProgress

        progress = StageProgress(long_only=not sys.stderr.isatty())  # a log: only long stages print
    with progress if progress is not None else contextlib.nullcontext():
        return head_roles(
            model,
            conllu=inputs.get("conllu"),
            coref=inputs.get("coref"),
            text=inputs.get("text"),
            roles=groups,
            cfg=cfg,
            progress=memory.roles_timer(progress, groups, inputs, cfg, args.quiet, model.spec),
        )


def _corpora(inputs: dict) -> dict:
    """``inputs`` without the run's records (``long_text``): the corpora the role groups read."""
    return {k: v for k, v in inputs.items() if k in ("text", "conllu", "coref")}


def _write(tmp: Path, args, model, result, groups, inputs: dict, budget) -> None:
    """The roles folder's files into the staging folder ``tmp``, run.json last
    (:func:`~headscope.analyses.run_json.write_run_json`)."""
    from headscope.analyses.roles.pipeline import roles_by_head
    from headscope.analyses.run_json import model_record, write_run_json
    from headscope.probes.outputs.atomic import write_frame, write_json
    from headscope.reports import budget as memory

    write_frame(result.frame, tmp / "roles")
    write_frame(result.stats, tmp / "head_stats")
    write_frame(result.clusters, tmp / "clusters")
    write_frame(roles_by_head(result), tmp / "roles_by_head")
    write_frame(result.coref_pairs, tmp / "coref_pairs")
    write_json(result.skipped, tmp / "skipped.json")
    write_json(result.examples, tmp / "examples.json")
    write_run_json(
        tmp,
        "roles",
        model_record(model),
        model=result.model,
        dtype=args.dtype,  # the dtype asked
        model_arg=args.model,
        device_map=args.device_map,
        roles=list(groups),
        config=result.config,
        n_items=result.n_items,
        skipped=result.skipped,
        timings={k: round(v, 3) for k, v in result.timings.items()},
        pattern_statistics=result.pattern_statistics,  # per stage: chunked (query chunk N) / materialised (why)
        **({"long_text": inputs["long_text"]} if "long_text" in inputs else {}),
        memory=memory.finish(budget, memory.emitter(args.quiet)),
        inputs={
            "conllu": [str(c.path) for c in inputs.get("conllu", [])],
            "coref": str(inputs["coref"].path) if "coref" in inputs else None,
            "text": str(args.text or "") or ("shipped" if "text" in inputs else None),
        },
    )


def _long_passages(args, model, inputs: dict) -> dict:
    """``inputs`` with the text corpus as passages of at most ``--max-tokens`` tokens
    (:func:`~headscope.analyses.roles.long_inputs.passages`), and ``long_text`` (what was done,
    for run.json); a length past the model's context is refused in one line."""
    import dataclasses

    from headscope.analyses.roles.long_inputs import passages, sliding_windows, token_limit

    limit = token_limit(model)
    if args.max_tokens > limit:
        raise ValueError(f"--max-tokens {args.max_tokens} is past the model's context of {limit} positions")
    text = inputs["text"]
    items, starts, cut = passages(model.tokenizer, text.lines, args.max_tokens)
    numbers = tuple(text.line_numbers[i] for i in starts) if text.line_numbers else ()
    record = {"max_tokens": args.max_tokens, "passages": len(items), "lines": len(text.lines), "lines_cut": cut}
    windows = sliding_windows(model)
    record["sliding_windows"] = windows
    notes = [f"{cut} line(s) longer than --max-tokens {args.max_tokens} cut to it"] if cut else []
    if windows and args.max_tokens > windows[0]:
        notes.append(f"layers with a sliding window of {windows[0]} tokens see only that many keys of a passage")
    for note in notes if not args.quiet else ():
        print(f"note: {note}", file=sys.stderr)
    return {**inputs, "text": dataclasses.replace(text, lines=tuple(items), line_numbers=numbers), "long_text": record}


def run(args) -> int:
    from headscope.probes.outputs.folder import claim_output
    from headscope.reports import budget as memory
    from headscope.reports.cli.argtypes import load_from_args, ray_pool, resolve_device

    if args.dtype != "fp32" and args.backend == "bridge":
        raise ValueError(
            f"--dtype {args.dtype} needs the in-house backend (the bridge backend runs in fp32); or --backend hf"
        )
    device = None if args.device_map else resolve_device(args.device)
    cfg = _config(args)
    groups = _groups(args)
    inputs = _read_inputs(args, cfg, groups)
    budget, cfg = memory.roles_start(args, cfg, groups, inputs, device)  # refused in one line if it cannot fit
    out = Path(args.out) if args.out else default_out(args.model)
    with (
        ray_pool(args) as pool,  # --ray: a bad --ray-address or --workers refused here, before anything else
        claim_output(out, "roles") as folder,  # refused before the model loads; locked until written
    ):
        model = load_from_args(args, device)
        if args.max_tokens is not None and "text" in inputs:
            inputs = _long_passages(args, model, inputs)
        budget, cfg = memory.roles_refine(budget, model, cfg, groups, inputs)
        if not (args.quiet or args.json):
            print(f"backend {model.backend_choice}", file=sys.stderr)
        result = _analyse(args, model, cfg, groups, inputs, pool)
        check_usable(result, inputs, args)  # before anything is written
        if not args.quiet and any(result.skipped.values()):
            print(f"skipped: {_skipped_text(result.skipped)} (skipped.json)", file=sys.stderr)
        with folder.staging() as tmp:  # one folder swap: never new tables beside an old run.json
            _write(tmp, args, model, result, groups, inputs, budget)

    records = _summary_records(result, args.top)
    if args.json:
        summary = {
            "model": result.model,
            "out": str(out),
            "top": records,
            "skipped": result.skipped,
            "n_items": result.n_items,
            "timings": result.timings,
        }
        print(json.dumps(summary, indent=2, default=str))
    elif not args.quiet:
        _print_text(result, records, out)
    return 0
