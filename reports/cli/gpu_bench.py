"""``python -m headscope.reports.cli.gpu_bench``: the GPU bench of ``.ci/gpu-check``
(:func:`~headscope.reports.tools.bench.gpu.gpu_bench`, a model with Llama-3.1-8B's shapes) as a
table on stdout, with ``gpu_bench.json`` and ``gpu_bench.txt`` in ``--out``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from headscope.reports.tools.bench.gpu import GpuBenchConfig, gpu_bench


def render_gpu_bench(result: dict) -> str:
    """The result as a plain-text table."""
    info = result["info"]
    lines = [
        f"headscope GPU bench on {info['device']} ({info['dtype']}, torch {info['torch']}): "
        f"{info['shapes']}, batch {info['batch'][0]}x{info['batch'][1]}",
        f"matmul peak {info['matmul_peak_gflops'] / 1e3:.1f} TFLOP/s; forward at "
        f"{info['forward_pct_of_peak']:.1f}% of it"
        + (
            f", {info['forward_pct_of_nominal']:.1f}% of the nominal peak" if info.get("forward_pct_of_nominal") else ""
        ),
        "",
        f"{'path':<14} {'seconds':>9} {'TFLOP/s':>8} {'tokens/s':>12}  note",
    ]
    for r in result["paths"]:
        tf = f"{r['gflop_per_s'] / 1e3:8.1f}" if r["gflop_per_s"] else f"{'-':>8}"
        lines.append(f"{r['path']:<14} {r['seconds']:>9.4f} {tf} {r['tokens_per_s']:>12.0f}  {r['note']}")
    lines += ["", "targets (reported, not enforced):"]
    for t in result["targets"]:
        lines.append(f"  {t['target']:<36} {t['value']:7.3f}  {'met' if t['met'] else 'NOT met'}")
    lines.append(f"roles: {info['roles_tokens_per_s']:.0f} tokens/s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m headscope.reports.cli.gpu_bench [--dry-run] [--out DIR]``: run, print the
    table, write ``gpu_bench.json`` and ``gpu_bench.txt`` into ``--out`` (default ``$OUT``
    when set)."""
    import argparse
    import os
    import sys

    p = argparse.ArgumentParser(prog="python -m headscope.reports.cli.gpu_bench")
    p.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU")
    p.add_argument("--out", default=os.environ.get("OUT"))
    p.add_argument("--n-texts", type=int, default=None)
    args = p.parse_args(argv)
    cfg = GpuBenchConfig.dry_run() if args.dry_run else GpuBenchConfig()
    if args.n_texts is not None:
        cfg = dataclasses.replace(cfg, n_texts=args.n_texts)
    result = gpu_bench(cfg, log=lambda m: print(f"gpu bench: {m}", file=sys.stderr, flush=True))
    text = render_gpu_bench(result)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "gpu_bench.json").write_text(json.dumps(result, indent=2, default=str))
        (out / "gpu_bench.txt").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
