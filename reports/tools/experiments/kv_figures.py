"""The figures the README's "Long context and the KV cache" section quotes, regenerated from code.

``python -m headscope.reports.tools.experiments.kv_figures`` (part of ``make figures``) runs ``headscope kv
smollm2-135m --quick`` (2,048 tokens, seed 0) into a temp folder, or reads a finished one
(``--from DIR``), and writes ``data/figures/kv_smollm2.json`` in the format of ``patching.json``
(``figures`` → group → name as ``{value, text}``, ``quoted``, ``missing``);
``tests/test_readme_figures.py`` fails while the README quotes other values.

Every figure is read from the folder's ``run.json`` (``kv_summary``) and ``kv_curve`` table: the
unrestricted quality, the savings at the 1 % point, the quality with every group restricted,
and the greedy order against the random orders at half the groups given back; and, where the
run has them, from ``long_context_roles`` and ``kv_summary["long_context"]``: the items of the
long-context roles, how many heads pass each role (streaming per window), the top retrieval heads
with their scores, whether the sink heads' top key moves with BOS put in or taken out, and the
causal check's ratio with its per-draw ratios and bootstrap interval over items.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

from headscope.reports.tools.experiments.figures_doc import write_figures

log = logging.getLogger(__name__)

FIGURES = Path(__file__).resolve().parents[3] / "data" / "figures"
MODEL = "smollm2-135m"
QUOTED = (
    "quality.full",
    "savings.tolerance",
    "curve.all_restricted",
    "curve.half",
    "long.items",
    "long.retrieval",
    "long.streaming",
    "long.sink",
    "long.causal",
)
#: the top retrieval heads the README names
TOP_HEADS = 4


def _fig(out: dict, name: str, value, text: str) -> None:
    group, key = name.split(".")
    out.setdefault(group, {})[key] = {"value": value, "text": text}


def _mib(n) -> str:
    return f"{n / 2**20:,.1f} MiB"


def figures_from(summary: dict, curve: pd.DataFrame, roles: pd.DataFrame | None = None) -> dict:
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
    return {**out, **long_figures(summary, roles)}


def _passing(d: pd.DataFrame) -> int:
    return int(d["verdict"].fillna(False).astype(bool).sum())


def _sink_fig(out: dict, sink: pd.DataFrame, main_bos) -> None:
    main = sink if main_bos is None else sink[sink["bos"] == main_bos]
    heads = main[main["verdict"].fillna(False).astype(bool)]
    other = sink[sink["bos"] != main_bos] if main_bos is not None else sink.iloc[0:0]
    text = f"{len(heads)} sink heads"
    moved = None
    if len(other):
        o = other.set_index(["layer", "head"])["top_key"]
        moved = sum(int(o[(l, h)]) != int(k) for l, h, k in zip(heads["layer"], heads["head"], heads["top_key"]))
        text += (
            f", of which {moved} move their top key when BOS is "
            f"{'taken out' if main_bos else 'put in'} ({len(heads) - moved} keep it at the same position)"
        )
    _fig(out, "long.sink", [len(heads), moved], text)


def long_figures(summary: dict, roles: pd.DataFrame | None) -> dict:
    """The long-context roles' and causal check's figures (module docstring); {} without them."""
    long = summary.get("long_context") or {}
    out: dict = {}
    if not long or roles is None:
        return out
    c = long.get("causal") or {}
    n_heads = roles[roles["role"] == "retrieval"][["layer", "head"]].drop_duplicates().shape[0]
    _fig(
        out,
        "long.items",
        [long["n_items"], long["n_tokens"], c.get("n_items")],
        f"{long['n_items']} needle items of {long['n_tokens']:,} tokens (copy accuracy {long['copy_accuracy']:.3f})"
        + (f"; the causal check on {c['n_items']} items" if c else ""),
    )
    r = roles[roles["role"] == "retrieval"].sort_values(["score", "layer", "head"], ascending=[False, True, True])
    top = [[f"L{l}H{h}", round(float(x), 4)] for l, h, x in zip(r["layer"], r["head"], r["score"])][:TOP_HEADS]
    _fig(
        out,
        "long.retrieval",
        [_passing(r), n_heads, top],
        f"{_passing(r)} of {n_heads} heads are retrieval heads (top: "
        + ", ".join(f"{name} {x:.2f}" for name, x in top)
        + ")",
    )
    st = roles[roles["role"] == "streaming"]
    per = [[int(w), _passing(st[st["window"] == w])] for w in sorted(st["window"].dropna().unique())]
    _fig(
        out,
        "long.streaming",
        per,
        "streaming heads: " + " / ".join(str(n) for _, n in per) + " at windows " + " / ".join(str(w) for w, _ in per),
    )
    _sink_fig(out, roles[roles["role"] == "sink"], long.get("bos"))
    if c:
        pd_ = c["ratio_per_draw"]
        _fig(
            out,
            "long.causal",
            [c["ratio"], min(pd_), max(pd_), *c["ratio_ci"], c["n_items"], c["k"]],
            f"masking the top {c['k']} retrieval heads hurts copying {c['ratio']:.2f} times as much as "
            f"{c['n_draws']} random sets of as many (per draw {min(pd_):.2f} to {max(pd_):.2f}; "
            f"{c['ci_level']:.0%} bootstrap interval over {c['n_items']} items {c['ratio_ci'][0]:.2f} to "
            f"{c['ratio_ci'][1]:.2f})",
        )
    return out


def read(folder: Path) -> tuple[dict, pd.DataFrame, pd.DataFrame | None]:
    """``kv_summary`` of ``folder/run.json``, its ``kv_curve`` table and its ``long_context_roles`` (or None)."""
    run = json.loads((folder / "run.json").read_text(encoding="utf-8"))
    roles = folder / "long_context_roles.parquet"
    curve = pd.read_parquet(folder / "kv_curve.parquet")
    return run["kv_summary"], curve, pd.read_parquet(roles) if roles.exists() else None


def write(figures: dict, out: Path, *, source: str) -> None:
    """Write the figures; a quoted figure the source could not give goes under ``missing``."""
    write_figures(
        out,
        figures,
        model=MODEL,
        generated_by="python -m headscope.reports.tools.experiments.kv_figures",
        source=source,
        quoted=QUOTED,
    )


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(format="%(message)s")  # others' records as before: warnings and up
    log.setLevel(logging.INFO)  # this script's "wrote ..." lines
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
        out = args.out / "kv_smollm2.json"
        write(figures_from(*read(folder)), out, source=source)
        log.info("wrote %s", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
