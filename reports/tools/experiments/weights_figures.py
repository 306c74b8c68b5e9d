"""The figures the README's "From the weights" section quotes, regenerated from code.

``python -m headscope.reports.tools.experiments.weights_figures`` (part of ``make figures``) runs
``headscope report`` on MiniLM-L6 and SmolLM2-135M (seed 0) into a temp folder, or reads
finished report folders (``--from DIR``: ``DIR/<model>-report``), and writes
``data/figures/weights_minilm.json`` and ``data/figures/weights_smollm2.json`` in the format of
``patching.json`` (``figures`` → group → name as ``{value, text}``, ``quoted``, ``missing``);
``tests/test_readme_figures.py`` fails while the README quotes other values.

Every figure is read from the report's own tables: ``weights_heads`` (the top copying head),
``join_k_composition`` (the first induction head's K-composition ranking against the
previous-token heads) and ``join_copying`` (copying score against the patching effect per task).
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

from headscope.reports.tools.experiments.figures_doc import write_figures

log = logging.getLogger(__name__)

FIGURES = Path(__file__).resolve().parents[3] / "data" / "figures"
MODELS = {"minilm": "minilm-l6", "smollm2": "smollm2-135m"}
QUOTED = ("copying.top", "k_composition.first", "copying_vs_patching.induction", "copying_vs_patching.duplicate_token")


def _fig(out: dict, name: str, value, text: str) -> None:
    group, key = name.split(".")
    out.setdefault(group, {})[key] = {"value": value, "text": text}


def _p(p: float) -> str:
    return f"{p:.2g}"


def figures_from(tables: dict[str, pd.DataFrame]) -> dict:
    """The figures of one report's weights tables (module docstring); a table the report lacks
    gives no figure (listed as missing by :func:`write`)."""
    out: dict = {}
    heads = tables.get("weights_heads")
    if heads is not None and not heads.empty:
        cop = heads[heads["statistic"].astype(str) == "ov_copying"].dropna(subset=["value"])
        top = cop.sort_values(["value", "layer", "head"], ascending=[False, True, True]).iloc[0]
        name = f"L{int(top['layer'])}H{int(top['head'])}"
        _fig(out, "copying.top", [name, float(top["value"])], f"{name} ({top['value']:.4f})")
    k = tables.get("join_k_composition")
    if k is not None and not k.empty:
        r = k[(k["level"].astype(str) == "head") & (k["note"].fillna("") == "")]
        if len(r):
            r = r.iloc[0]
            rank = "none" if pd.isna(r["best_role_rank"]) else str(int(r["best_role_rank"]))
            text = (
                f"{r['receiver']}: {int(r['role_in_top_k'])} of its top {int(r['k'])} K-composition senders are "
                f"previous-token heads (chance {r['expected_in_top_k']:.2f}; best rank {rank} of {int(r['n_senders'])}; "
                f"p {_p(r['p_value'])})"
            )
            _fig(out, "k_composition.first", [r["receiver"], int(r["role_in_top_k"]), rank, float(r["p_value"])], text)
    c = tables.get("join_copying")
    if c is not None and not c.empty:
        for _, r in c.iterrows():
            text = (
                f"{r['task']}: Spearman {r['spearman']:.2f} over {int(r['n_heads'])} heads, top-{int(r['k'])} "
                f"overlap {r['top_k_overlap']:.1f}"
            )
            _fig(out, f"copying_vs_patching.{r['task']}", [float(r["spearman"]), float(r["top_k_overlap"])], text)
    return out


def read_tables(folder: Path) -> dict[str, pd.DataFrame]:
    """The weights tables of the report folder ``folder`` (those present)."""
    names = ("weights_heads", "join_k_composition", "join_copying")
    return {
        n: pd.read_parquet(folder / "tables" / f"{n}.parquet")
        for n in names
        if (folder / "tables" / f"{n}.parquet").is_file()
    }


def write(key: str, figures: dict, out: Path, *, source: str) -> None:
    """Write one model's figures; a quoted figure the source could not give goes under ``missing``."""
    write_figures(
        out,
        figures,
        model=MODELS[key],
        generated_by="python -m headscope.reports.tools.experiments.weights_figures",
        source=source,
        quoted=QUOTED,
    )


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(format="%(message)s")  # others' records as before: warnings and up
    log.setLevel(logging.INFO)  # this script's "wrote ..." lines
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--from", dest="src", type=Path, help="a folder holding <model>-report/ for each model")
    p.add_argument("--out", type=Path, default=FIGURES, help=f"the folder the JSONs go to (default {FIGURES})")
    p.add_argument("--only", choices=sorted(MODELS), help="one model only")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="headscope-weights-figures-") as tmp:
        for key in [args.only] if args.only else list(MODELS):
            folder = (args.src or Path(tmp)) / f"{MODELS[key]}-report"
            if args.src is None:
                cmd = [sys.executable, "-m", "headscope.reports.cli.app", "report", MODELS[key], "--quiet"]
                subprocess.run([*cmd, "--out", str(folder)], check=True)
            source = str(folder) if args.src else f"headscope report {MODELS[key]} (seed 0, shipped data)"
            out = args.out / f"weights_{key}.json"
            write(key, figures_from(read_tables(folder)), out, source=source)
            log.info("wrote %s", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
