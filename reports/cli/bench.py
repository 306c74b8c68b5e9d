"""``headscope bench [MODEL]``: what capturing attention costs, path by path, on the same batches.

Prints a table (rich when installed, plain text otherwise) or ``--json``; ``--memory``
instead measures the peak RSS of streaming a small and a ten-times larger corpus, each
in its own subprocess. Targets are reported (met or not), never enforced. Timings on a
machine shared with other work are indicative only.
"""

from __future__ import annotations

import argparse
import json
import math
import sys


def paths_epilog() -> str:
    """``--help``'s list of the bench paths: every name of the registry with its description, in run order."""
    from headscope.reports.tools.bench.registry import PATHS

    width = max(map(len, PATHS))
    lines = [f"  {name:<{width}}  {p.description}" for name, p in PATHS.items()]
    return "\n".join(["paths (--paths; default all, in this order):", *lines])


def register(sub) -> None:
    from headscope.reports.cli.argtypes import MAX_REPEATS, MAX_SENTENCES, add_device, batch_size, int_in, seed
    from headscope.reports.tools.bench.registry import PATHS

    p = sub.add_parser(
        "bench",
        help="time attention capture against HF and transformer-lens on the same batches",
        epilog=paths_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", nargs="?", default="minilm-l6", help="shipped name or model directory")
    p.add_argument(
        "--sentences", type=int_in(1, MAX_SENTENCES, "sentences"), default=512, help="sentences to run (default 512)"
    )
    p.add_argument("--batch", type=batch_size, default=64, help="batch size (default 64)")
    p.add_argument(
        "--dtype", choices=["fp32", "bf16"], default="fp32", help="dtype of the model paths (fp32 default, or bf16)"
    )
    p.add_argument(
        "--repeats",
        type=int_in(1, MAX_REPEATS, "timed rounds per path"),
        default=3,
        help="timed rounds per path; the fastest is reported, the median kept (default 3)",
    )
    p.add_argument(
        "--paths",
        nargs="+",
        metavar="PATH",
        default=None,
        help=f"paths to run (default all): {' '.join(PATHS)}",
    )
    p.add_argument(
        "--corpus",
        default="generated",
        help="'generated' (12-40 words, seeded), 'shipped' (data/text/sentences.txt) or a text file",
    )
    p.add_argument("--seed", type=seed, default=0, help="seed of the generated corpus (0 to 2**32 - 1; default 0)")
    add_device(p)
    p.add_argument("--memory", action="store_true", help="peak RSS of streaming a small vs a 10x corpus instead")
    p.add_argument("--memory-sizes", default="1000,10000", help="corpus sizes for --memory (default 1000,10000)")
    p.add_argument(
        "--memory-reducer",
        choices=["roles", "noop", "mass"],
        default="roles",
        help="what --memory runs: roles (every text role with verdicts, default), noop (capture only), "
        "or mass (per-head first-token mass and entropy)",
    )
    p.add_argument(
        "--report",
        action="store_true",
        help="instead of the paths: run `headscope report MODEL` once with its default settings (--dtype and "
        "--device apply) and say where its time goes, stage by stage (wall and CPU seconds, peak RSS)",
    )
    p.add_argument(
        "--long-context",
        action="store_true",
        help="instead of the paths: peak memory and time of the text roles' pattern statistics on one long "
        "text, in query chunks vs stored patterns, at --long-lengths tokens, each run in its own process "
        "(issue #27's targets are for smollm2-135m)",
    )
    p.add_argument("--long-lengths", default="512,1024,2048,4096", help="token counts for --long-context")
    p.add_argument(
        "--estimates",
        action="store_true",
        help="instead of the paths: every registered stage's memory estimate against its measured peak on "
        "the calibration cases (MiniLM-L6, SmolLM2-135M, random-weight shapes; two batch sizes, fp32 and bf16), "
        "each in its own process, written to --estimates-out (MODEL: only the cases of that model; 'all': every one)",
    )
    p.add_argument("--estimates-out", default=None, help="JSON file for --estimates (default: printed only)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def _fmt(v, spec: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return format(v, spec)


def _header(result) -> list[str]:
    info = result.info
    m = info["machine"]
    return [
        f"headscope bench: {info['model']}, {info['sentences']} sentences, {info['batches']} batches, "
        f"{info['real_tokens']} tokens, {info['forward_gflop']:.1f} GFLOP per forward pass",
        f"machine: torch {m['torch']}, {m['threads']} threads, {m['cpus']} CPUs, load average "
        f"{', '.join(f'{x:.1f}' for x in (m['load_average'] or []))}; matmul peak fp32 {m['fp32_peak_gflops']:.1f} GFLOP/s, "
        f"bf16 {_fmt(m['bf16_peak_gflops'], '.1f')} ({'native' if m['bf16_native'] else 'not native'}: {m['bf16_note']})",
    ]


def _footer(result) -> list[str]:
    info = result.info
    lines = [
        f"padding: {info['padding_ratio_bucketed']:.3f} padded per real token with length buckets, "
        f"{info['padding_ratio_unsorted']:.3f} unsorted",
        f"patterns: {info['pattern_bytes_store_all'] / 2**20:.1f} MiB to store all, "
        f"{info['pattern_bytes_streaming'] / 2**20:.1f} MiB peak when streaming batch by batch",
        "targets (reported, not enforced):",
    ]
    for t in result.targets.itertuples():
        met = "met" if t.met is True else "NOT met" if t.met is False else "-"
        lines.append(f"  {t.target:<36} {_fmt(t.value, '.2f'):>7}  {met:<8} {t.note}")
    return lines


_COLS = ("path", "status", "seconds", "ratio", "GFLOP/s", "%peak", "RSS MiB", "peak MiB", "note")


def _cells(r) -> list[str]:
    return [
        r.path,
        r.status,
        _fmt(r.seconds, ".3f"),
        _fmt(r.ratio, ".2f"),
        _fmt(r.gflops_per_s, ".2f"),
        _fmt(r.peak_pct, ".1f"),
        f"{r.rss_mb:.0f}",
        f"{r.peak_rss_mb:.0f}",
        r.note,
    ]


def render(result) -> str:
    """Plain-text table of a :class:`~headscope.reports.tools.bench.results.BenchResult`."""
    rows = [list(_COLS)] + [_cells(r) for r in result.frame.itertuples()]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLS) - 1)]
    table = []
    for row in rows:
        cells = [c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))]
        table.append("  ".join(cells) + "  " + row[-1])
    return "\n".join(_header(result) + [""] + table + [""] + _footer(result))


def _rich_print(result) -> bool:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        return False
    console = Console()
    for line in _header(result):
        console.print(line, highlight=False, markup=False)
    table = Table(show_header=True, header_style="bold")
    for i, col in enumerate(_COLS[:-1]):
        table.add_column(col, justify="left" if i < 2 else "right", no_wrap=True)
    for r in result.frame.itertuples():
        table.add_row(*_cells(r)[:-1])
    console.print(table)
    for r in result.frame.itertuples():
        if r.note:
            console.print(f"  {r.path}: {r.note}", highlight=False, markup=False)
    for line in _footer(result):
        console.print(line, highlight=False, markup=False)
    return True


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"--memory-sizes must be comma-separated integers; got {text!r}") from None
    if len(sizes) < 2 or min(sizes) < 1:
        raise ValueError(f"--memory-sizes needs at least two positive sizes; got {text!r}")
    from headscope.reports.cli.argtypes import MAX_SENTENCES

    if max(sizes) > MAX_SENTENCES:
        raise ValueError(f"--memory-sizes: a corpus size must be at most {MAX_SENTENCES} sentences; got {max(sizes)}")
    return sizes


def print_report_stages(model, *, dtype: str = "fp32", device=None, as_json: bool = False) -> int:
    """``headscope bench MODEL --report``: print :func:`~headscope.reports.tools.bench.report_stages.report_stages`'
    table (or JSON); 0."""
    from headscope.reports.budget import emitter
    from headscope.reports.cli.terminal import StageProgress
    from headscope.reports.tools.bench.report_stages import render, report_stages

    with StageProgress(quiet=as_json) as progress:
        out = report_stages(
            model, dtype=dtype, device=device, notice=None if as_json else emitter(False), progress=progress
        )
    if as_json:
        doc = {**out, "stages": json.loads(out["stages"].to_json(orient="records"))}
        print(json.dumps(doc, indent=2, default=str))
    else:
        print(render(out), file=sys.stdout)
    return 0


def print_estimates(model: str, out, *, as_json: bool = False) -> int:
    """``bench --estimates``: the calibration rows, as JSON or one line per case and stage."""
    import sys

    from headscope.reports.tools.bench.estimates import CASES, calibrate, in_band

    cases = CASES if model == "all" else [c for c in CASES if c.model == model]
    if not cases:
        names = sorted({c.model for c in CASES})
        raise ValueError(f"--estimates: no calibration case of {model!r}; choose from all, {', '.join(names)}")
    rows = calibrate(cases, out, progress=lambda name: print(f"headscope: {name}", file=sys.stderr, flush=True))
    if as_json:
        print(json.dumps(rows, indent=1))
        return 0
    for r in rows:
        if r["estimate_mb"] and r["peak_mb"]:
            ok = "ok" if in_band(r["estimate_mb"], r["peak_mb"]) else "OUT OF BAND"
            print(
                f"{r['case']:<40} {r['stage']:<9} est {r['estimate_mb']:>8.1f} MiB  peak {r['peak_mb']:>8.1f} MiB  "
                f"{r['error']:+.1%}  {r['seconds'] or 0:.1f} s  {ok}"
            )
        else:
            print(f"{r['case']:<40} {r['stage']:<9} {r['status']}: {r['reason']}")
    return 0


def run(args) -> int:
    from headscope.reports.cli.argtypes import resolve_device
    from headscope.reports.tools.bench.harness import (
        BenchConfig,
        check_device,
        memory_scaling,
        run_bench,
    )
    from headscope.reports.tools.bench.targets import MEMORY

    args.device = str(resolve_device(args.device))  # auto -> cuda or cpu, checked before any model loads
    check_device(args.device, "--device")
    if args.estimates:
        return print_estimates(args.model, args.estimates_out, as_json=args.json)
    if args.report:
        return print_report_stages(args.model, dtype=args.dtype, device=args.device, as_json=args.json)
    if args.long_context:
        from headscope.reports.tools.bench import long_context as lc

        lengths = lc.parse_lengths(args.long_lengths)
        frame = lc.long_context_scaling(args.model, lengths, seed=args.seed, device=args.device)
        summary = lc.long_context_summary(frame)
        out = {"runs": json.loads(frame.to_json(orient="records")), "targets": summary}
        print(json.dumps(out, indent=2) if args.json else lc.render_long(frame, summary))
        return 0
    if args.memory:
        frame, ratio = memory_scaling(
            args.model,
            _sizes(args.memory_sizes),
            reducer=args.memory_reducer,
            batch_size=args.batch,
            seed=args.seed,
            device=args.device,
        )
        if args.json:
            print(
                json.dumps(
                    {
                        "runs": json.loads(frame.to_json(orient="records")),
                        "ratio": ratio,
                        "target": MEMORY.threshold,
                        "met": MEMORY.met(ratio),
                    },
                    indent=2,
                )
            )
        else:
            print(frame.to_string(index=False, float_format=lambda x: f"{x:.1f}"))
            print(
                f"peak RSS ratio, largest/smallest corpus: {ratio:.3f} "
                f"(target <= {MEMORY.threshold:.2f}: {'met' if MEMORY.met(ratio) else 'NOT met'})"
            )
        return 0
    cfg = BenchConfig(
        model=args.model,
        n_sentences=args.sentences,
        batch_size=args.batch,
        dtype=args.dtype,
        repeats=args.repeats,
        paths=tuple(args.paths) if args.paths else None,
        corpus=args.corpus,
        seed=args.seed,
        device=args.device,
    )
    progress = None
    if not args.json and sys.stderr.isatty():

        def progress(name):
            print(f"bench: {name} ...", file=sys.stderr)

    result = run_bench(cfg, progress=progress)
    if args.json:
        print(json.dumps(result.to_json(), indent=2, default=str))
    elif not (sys.stdout.isatty() and _rich_print(result)):
        print(render(result))
    return 0
