"""The figures the README's "Long context and the KV cache" section quotes, regenerated from code.

``python -m headscope.analyses.kvcache.figures`` (part of ``make figures``) runs ``headscope kv
smollm2-135m --quick`` (2,048 tokens, seed 0) into a temp folder, or reads a finished one
(``--from DIR``), and writes ``data/figures/kv_smollm2.json`` in the format of ``patching.json``
(``figures`` → group → name as ``{value, text}``, ``quoted``, ``missing``);
``tests/test_readme_figures.py`` fails while the README quotes other values.

Every figure is read from the folder's ``run.json`` (``kv_summary``) and ``kv_curve`` table: the
unrestricted quality, the savings at the 1 % point, the quality with every group restricted,
and the greedy order against the random orders at half the groups given back.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

FIGURES = Path(__file__).resolve().parents[2] / "data" / "figures"
MODEL = "smollm2-135m"
QUOTED = ("quality.full", "savings.tolerance", "curve.all_restricted", "curve.half")


def _fig(out: dict, name: str, value, text: str) -> None:
    group, key = name.split(".")
    out.setdefault(group, {})[key] = {"value": value, "text": text}


def _mib(n) -> str:
    return f"{n / 2**20:,.1f} MiB"


def figures_from(summary: dict, curve: pd.DataFrame) -> dict:
    """The figures of one ``headscope kv`` folder (module docstring)."""
    out: dict = {}
    full, n, ctx, top = (
        summary["full"],
        summary.get("units", summary["groups"]),
        summary["context"],
        summary["max_context"],
    )
    unit = "layers" if summary.get("unit") == "layer" else "KV groups"
    _fig(
        out,
        "quality.full",
        [full["lm_loss"], full["copy_accuracy"]],
        f"LM loss {full['lm_loss']:.3f} and copy accuracy {full['copy_accuracy']:.3f} with every cache full",
    )
    at = summary.get("savings_at_tolerance")
    if at is not None:
        _fig(
            out,
            "savings.tolerance",
            [at["full_groups"], at["fraction_saved"], at["bytes_saved_max"]],
            f"{at['full_groups']} of {n} {unit} keep a full cache; the others' sink + window save "
            f"{_mib(at['bytes_saved'])} ({at['fraction_saved']:.1%}) of the 16-bit cache at {ctx:,} tokens and "
            f"{_mib(at['bytes_saved_max'])} ({at['fraction_saved_max']:.1%}) at {top:,}",
        )
    g = curve[curve["study"] == "greedy"].sort_values("step")
    if len(g):
        first = g.iloc[0]
        _fig(
            out,
            "curve.all_restricted",
            [float(first["quality_change"]), float(first["fraction_saved"])],
            f"every group restricted ({first['fraction_saved']:.1%} saved): quality change {first['quality_change']:.3f}",
        )
        r = curve[curve["study"] == "random"]
        half = min(g["step"], key=lambda s: (abs(s - n // 2), s))
        gh = g[g["step"] == half].iloc[0]
        rh = r[r["step"] == half]["quality_change"]
        if len(rh):
            _fig(
                out,
                "curve.half",
                [int(half), float(gh["quality_change"]), float(rh.min()), float(rh.max())],
                f"with {half} of {n} {unit} given back, the greedy order's quality change is "
                f"{gh['quality_change']:.3f}, the random orders' {rh.min():.3f} to {rh.max():.3f}",
            )
    return out


def read(folder: Path) -> tuple[dict, pd.DataFrame]:
    """``kv_summary`` of ``folder/run.json`` and its ``kv_curve`` table."""
    run = json.loads((folder / "run.json").read_text(encoding="utf-8"))
    return run["kv_summary"], pd.read_parquet(folder / "kv_curve.parquet")


def write(figures: dict, out: Path, *, source: str) -> None:
    """Write the figures; a quoted figure the source could not give goes under ``missing``."""
    given = {f"{g}.{n}" for g, d in figures.items() for n in d}
    doc = {
        "model": MODEL,
        "generated_by": "python -m headscope.analyses.kvcache.figures",
        "source": source,
        "quoted": [q for q in QUOTED if q in given],
        "missing": [q for q in QUOTED if q not in given],
        "figures": figures,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--from", dest="src", type=Path, help="a finished `headscope kv smollm2-135m --quick` folder")
    p.add_argument("--out", type=Path, default=FIGURES, help=f"the folder the JSON goes to (default {FIGURES})")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="headscope-kv-figures-") as tmp:
        folder = args.src or Path(tmp) / "kv"
        if args.src is None:
            cmd = [sys.executable, "-m", "headscope.reports.cli.app", "kv", MODEL, "--quick", "--quiet"]
            subprocess.run([*cmd, "--out", str(folder)], check=True)
        source = str(folder) if args.src else f"headscope kv {MODEL} --quick (seed 0)"
        summary, curve = read(folder)
        out = args.out / "kv_smollm2.json"
        write(figures_from(summary, curve), out, source=source)
        print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
