"""``build_report``: run the analyses on a model and write the report folder.

The run itself (the model resolved and loaded once, its memory planned before the load, the
registered stages run in order) is :func:`~headscope.reports.stages.runner.report_run`;
:class:`~headscope.reports.stages.config.RunConfig` says what it does. This module calls it
and writes the folder from the frames (:func:`write_report`: no model needed). ``<out>`` is
claimed before the analyses run (refused at once when it is a file, holds anything but an
earlier report, or another run is writing it), the folder is written into
``<out>.tmp-<pid>`` and swapped in whole once complete
(:mod:`headscope.probes.outputs.folder`), so a crash never leaves a half report that
looks complete, nor no report at all.

Folder layout::

    report.html      self-contained (inline CSS, images as data URIs)
    report.md        same findings; figures under figures/
    figures/*.png
    tables/*.csv, tables/*.parquet   tidy frames (roles, stats, examples, prune_*, patching, ...)
    run.json         config, versions, model file SHA-256, seed, timings, skipped counts

Example (runs the analyses)::

    result = build_report("minilm-l6", RunConfig(seed=1), out_dir="runs/report-minilm-l6")
    result.paths["html"], result.summary["roles"]["positional:previous"]["top"][0]
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from headscope.analyses.run_json import run_json, versions
from headscope.analyses.run_patching import CAUSAL_METHOD
from headscope.probes.budget import peak_rss_bytes
from headscope.probes.outputs.atomic import write_frame, write_json
from headscope.probes.outputs.folder import claim_output
from headscope.probes.outputs.swap import recover as recover_out  # noqa: F401 - kept for callers of the old name
from headscope.reports import figures as F
from headscope.reports.html import write_document
from headscope.reports.sections import build_document
from headscope.reports.sections.pruning import curves_frame
from headscope.reports.sections.role_detail import top_heads
from headscope.reports.stages import registry
from headscope.reports.stages.config import RunConfig
from headscope.reports.stages.runner import report_run, timed


@dataclass
class ReportResult:
    """``frames``: the tidy frames written under tables/; ``paths``: html, markdown,
    run_json, out_dir; ``summary``: what the terminal shows (JSON-serialisable);
    ``timings``: seconds per stage."""

    frames: dict[str, pd.DataFrame]
    paths: dict[str, Path]
    summary: dict
    timings: dict[str, float] = field(default_factory=dict)


# ----------------------------------------------------------------- summary and writing
def run_summary(frames: dict[str, pd.DataFrame], meta: dict, out_dir: Path, top: int = 3) -> dict:
    """What the terminal shows, JSON-serialisable: top heads per role (with the causal
    comparison), pruning curve end points, skipped count, where the report is."""
    roles = frames.get("roles")
    rvi = frames.get("roles_vs_importance")
    out_roles = {}
    for role, best in top_heads(roles, top).items():
        d = roles[(roles["role"].astype(str) == role) & roles["verdict"].astype(bool)]
        causal = None
        if rvi is not None and not rvi.empty:
            c = rvi[rvi["role"].astype(str) == role]
            if not c.empty:
                r = c.iloc[0]
                causal = (
                    f"{r['metric']} {r['value_role']:.3f} vs {r['value_random_mean']:.3f}±{r['value_random_std']:.3f}"
                )
        out_roles[role] = {
            "n_heads": int(d.drop_duplicates(["layer", "head"]).shape[0]),
            "top": [
                {
                    "head": f"L{int(r.layer)}H{int(r.head)}",
                    "layer": int(r.layer),
                    "head_index": int(r.head),
                    "score": float(r.score),
                    "baseline": float(r.baseline),
                    "margin": float(r.margin),
                    "verdict": bool(r.verdict),
                }
                for r in best.itertuples()
            ],
            "causal": causal,
        }
    pruning = []
    curves = F.curve_rows(curves_frame(frames, meta.get("prune_metric")))
    for (study, metric), d in curves.groupby(["study", "metric"], observed=True):
        d = d.sort_values("fraction_pruned")
        mid = d.iloc[len(d) // 2]
        pruning.append(
            f"{study}: {metric} {d['value'].iloc[0]:.3f} → {mid['value']:.3f} at {mid['fraction_pruned']:.0%} pruned"
            f" → {d['value'].iloc[-1]:.3f} at {d['fraction_pruned'].iloc[-1]:.0%}"
        )
    sk = frames.get("skipped")
    return {
        "model": meta.get("model"),
        "patching": _patching_summary(frames, meta),
        "backend": meta.get("backend"),
        "out_dir": str(out_dir),
        "report": str(out_dir / "report.html"),
        "pruning_figure": str(out_dir / "figures" / "pruning_curves.png"),
        "roles": out_roles,
        "pruning": pruning,
        "skipped": int(sk["count"].sum()) if sk is not None and not sk.empty else 0,
        "timings": meta.get("timings", {}),
        "seconds": round(sum(v for k, v in meta.get("timings", {}).items() if "." not in k), 1),
    }


def _patching_summary(frames: dict[str, pd.DataFrame], meta: dict) -> dict:
    """Per role with a task: its task, top heads by attention and by patching, and how many
    of the first are among the second (``{}`` when patching did not run)."""
    from headscope.reports.sections.causal import attention_top, patching_top

    summ, patching, roles = meta.get("patching_summary") or {}, frames.get("patching"), frames.get("roles")
    out = {}
    if not summ or patching is None or roles is None:
        return out
    k = int(summ.get("top_k", 10))
    for r in summ.get("roles") or []:
        if r["task"] not in (summ.get("tasks") or {}):
            out[r["label"]] = {"task": r["task"], "refused": (summ.get("refused") or {}).get(r["task"])}
            continue
        att = attention_top(roles, r["role"], r.get("relation") or "", k)
        pat = patching_top(patching, r["task"], summ.get("method", CAUSAL_METHOD), k)
        a = [f"L{int(x.layer)}H{int(x.head)}" for x in att.itertuples()]
        p = [f"L{int(x.layer)}H{int(x.head)}" for x in pat.itertuples()]
        out[r["label"]] = {"task": r["task"], "by_attention": a, "by_patching": p, "overlap": len(set(a) & set(p))}
    return out


def write_report(
    frames: dict[str, pd.DataFrame], *, card: dict, card_text: str, meta: dict, out_dir, progress=None
) -> dict[str, Path]:
    """Write the report folder from frames (no model needed). Returns the paths.

    The folder is claimed (:func:`~headscope.probes.outputs.folder.claim_output`: an
    existing ``out_dir`` is replaced only when it is an earlier report with nothing else
    in it; a second run into it is refused), written beside it and swapped in whole."""
    out = Path(out_dir)
    timings = meta.setdefault("timings", {})
    with claim_output(out, "report") as folder:
        with timed(timings, "figures", progress):
            doc = build_document(frames, card=card, card_text=card_text, meta=meta)
        with folder.staging() as tmp:
            if progress:
                progress("write", 0, None)
            t0 = time.perf_counter()
            _write_tables(frames, tmp / "tables")
            write_document(doc, tmp, "report")
            timings["write"] = round(time.perf_counter() - t0, 3)  # run.json, written last, records it
            write_json(_report_json(frames, card, meta), tmp / "run.json")
            if progress:
                progress("write", 1, 1)
    return {
        "out_dir": out,
        "html": out / "report.html",
        "markdown": out / "report.md",
        "run_json": out / "run.json",
        "tables": out / "tables",
        "figures": out / "figures",
    }


def _write_tables(frames: dict[str, pd.DataFrame], folder: Path) -> None:
    for name, df in frames.items():
        if isinstance(df, pd.DataFrame):
            write_frame(df, folder / name)


def _report_json(frames, card, meta) -> dict:
    """The report's run.json (:func:`~headscope.analyses.run_json.run_json`) from its frames,
    card and meta."""
    sk = frames.get("skipped")
    skipped = {}
    if sk is not None and not sk.empty:
        for r in sk.itertuples(index=False):
            skipped.setdefault(r.analysis, {})[r.reason] = int(r.count)
    return run_json(
        "report",
        meta,
        model_arg=meta.get("model_arg"),
        absent=meta.get("absent") or {},
        full=bool(meta.get("full")),
        seed=meta.get("seed"),
        config=meta.get("config", {}),
        versions=meta.get("versions") or versions(),
        model_file=meta.get("model_file", {}),
        timings=meta.get("timings", {}),
        skipped=skipped,
        n_items=meta.get("n_items", {}),
        architecture={"layers": card.get("layers"), "heads": card.get("heads"), "kv_heads": card.get("kv_heads")},
        pruning_summary=meta.get("prune_summary", {}),
        patching_summary=meta.get("patching_summary", {}),
        weights_summary=meta.get("weights_summary", {}),
        kv_summary=meta.get("kv_summary", {}),
        card=card,
        tables=sorted(k for k, v in frames.items() if isinstance(v, pd.DataFrame)),
        memory={**meta["memory"], "peak_rss_bytes": peak_rss_bytes()} if meta.get("memory") else None,
        quick=meta.get("quick"),
        stages=meta.get("stages") or {},
        **{k: meta.get(k) or {} for k in _stage_keys()},
        **({"device_plan": meta["device_plan"]} if meta.get("device_plan") else {}),  # --device-map auto's plan
    )


def _stage_keys() -> list[str]:
    """run.json keys of the summaries of stages registered after the first five (theirs are named
    above as they always were)."""
    known = {"roles_summary", "prune_summary", "patching_summary", "weights_summary", "kv_summary"}
    return [s.key() for s in registry.STAGES.values() if s.key() not in known]


def build_report(
    model_name="minilm-l6",
    config: RunConfig | None = None,
    *,
    out_dir=None,
    quiet: bool = False,
    progress=None,
    notice=None,
    **options,
) -> ReportResult:
    """Run the analyses on ``model_name`` as ``config`` says and write the report folder
    ``out_dir`` (default ``runs/report-<model>``). ``model_name`` is a shipped name or a path,
    or a model a notebook holds: what :func:`~headscope.probes.models.loading.load_model`
    returned, or a transformer-lens ``TransformerBridge`` (:func:`~headscope.reports.stages.runner.load_into`).
    ``config``: a :class:`~headscope.reports.stages.config.RunConfig`, or its fields given as keywords
    (``options``: ``build_report("minilm-l6", seed=1, patching=False)``), not both.
    ``progress(stage, done, total)`` is called on every stage (``quiet=True``: never);
    ``notice(line)``: the memory plan and the estimated time (:func:`~headscope.reports.stages.runner.report_run`). Raises
    ``ValueError`` when ``out_dir`` exists and is not an earlier report."""
    if config is None:
        config = RunConfig(**options)
    elif options:
        raise TypeError(f"build_report takes a RunConfig or its fields as keywords, not both; got {sorted(options)}")
    label = (
        model_name
        if isinstance(model_name, (str, os.PathLike))
        else getattr(getattr(model_name, "spec", None), "name", "model")
    )
    out = Path(out_dir) if out_dir is not None else Path("runs") / f"report-{Path(str(label)).name}"
    if quiet:
        progress = None
    with claim_output(out, "report"):  # checked and locked before the analyses run
        frames, card, card_text, meta = report_run(model_name, config, progress=progress, notice=notice)
        paths = write_report(frames, card=card, card_text=card_text, meta=meta, out_dir=out, progress=progress)
    summary = run_summary(frames, meta, out)
    return ReportResult(frames=frames, paths=paths, summary=summary, timings=dict(meta["timings"]))
