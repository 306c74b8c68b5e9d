"""The figures the README's "What the default report finds" section quotes, regenerated from code.

``python -m headscope.reports.tools.experiments.report_figures`` (``make figures``) runs
``headscope report`` on MiniLM-L6 and on SmolLM2-135M (seed 0, shipped data) into a temp
folder, or reads finished report folders (``--from DIR``: ``DIR/minilm-l6-report`` and
``DIR/smollm2-135m-report``; where one is absent, ``DIR/<model>-roles`` with
``DIR/<model>-prune``, the output of ``headscope roles`` and ``headscope prune --quick``,
whose tables equal the report's), and writes ``data/figures/report_minilm.json`` and
``data/figures/report_smollm2.json`` in the format of ``patching.json``: every figure under
``figures`` → group → name as ``{value, text}`` with the text the README prints for it, and
``quoted`` naming those the README section quotes; a quoted figure the source cannot give
(an unfinished prune folder has no curves) is listed under ``missing``, and
``tests/test_readme_figures.py`` reports it as a skip. That test fails while the README
quotes other values.

Every figure is read from the report's own output (``tables/*.parquet`` and ``run.json``)
with the rounding the README prints, or, where the tables do not hold it, computed by the
library function the analysis itself uses: the coreference rule baselines by
:func:`~headscope.analyses.roles.coreference.nearest_candidate` /
:func:`~headscope.analyses.roles.coreference.first_candidate` over the shipped corpus, the
first-token overlap by :func:`~headscope.analyses.roles.pipeline.verdict_overlap`, and the
per-example importance by :func:`~headscope.analyses.pruning.importance.head_importance`
on MiniLM (16 sentences, as ``tests/analyses/pruning/test_importance_per_example.py``).

Not figures here: wall-clock times (``make report`` 26 s, 9 min 39 s, the per-stage
times, peak RSS) and file sizes (report.html 1.6 MB) are measurements of one machine; the
README states them as "measured on ..." prose and nothing regenerates them. The same goes
for the transformer-lens agreement bound (5e-8), which is a test tolerance
(tests of ``detect_head``), not a report output.

A head's *lead row* in a role (:func:`lead`): among the rows with a verdict, the largest
margin over the baseline (ties: lower layer, then head); a role no head holds leads with
its best score (the README's "none: best ...").
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

log = logging.getLogger(__name__)
FIGURES = Path(__file__).resolve().parents[3] / "data" / "figures"
MODELS = {"minilm": "minilm-l6", "smollm2": "smollm2-135m"}
FIRST_TOKEN = ("positional:first", "sink:first-token", "special")

#: the figures the README's default-report section quotes (``group.name``), per model
QUOTED = {
    "minilm": (
        "table.positional_previous",
        "table.syntactic_det",
        "table.syntactic_obj",
        "table.coreference_gender",
        "table.coreference_number",
        "table.coreference_winograd",
        "table.special",
        "table.duplicate_token",
        "table.induction",
        "coreference.pooled",
        "coreference.winograd_mean_pair_accuracy",
        "first_token.positional_first",
        "first_token.sink_first_token",
        "first_token.special",
        "first_token.all_three",
        "pruning.n",
        "pruning.fraction",
        "pruning.importance",
        "pruning.ablation",
        "pruning.random",
        "pruning.reverse_importance",
        "per_example.n",
        "per_example.all_positive",
        "per_example.spearman",
        "per_example.lead",
    ),
    "smollm2": (
        "induction.top3",
        "roles.held",
        "roles.sink",
        "roles.previous_token",
        "roles.punctuation",
        "roles.syntactic",
        "roles.induction",
        "pruning.fraction",
        "pruning.importance",
        "pruning.ablation",
        "pruning.random",
        "pruning.reverse_importance",
        "special.skipped",
        "coreference.gender",
        "coreference.winograd",
    ),
}


def _fig(out: dict, name: str, value, text: str) -> None:
    out[name] = {"value": value, "text": text}


def _head(row) -> str:
    return f"L{int(row['layer'])}H{int(row['head'])}"


def _rows(roles: pd.DataFrame, role: str, relation: str = "", direction: str = "") -> pd.DataFrame:
    f = roles[(roles["role"] == role) & (roles["relation"] == relation) & (roles["direction"] == direction)]
    if f.empty:
        raise ValueError(f"the roles table has no rows for {role!r} {relation!r} {direction!r}")
    return f


def lead(roles: pd.DataFrame, role: str, relation: str = "", direction: str = "") -> pd.Series:
    """The lead row of a role (see the module doc)."""
    f = _rows(roles, role, relation, direction)
    held = f[f["verdict"].astype(bool)]
    if len(held):
        return held.sort_values(["margin", "layer", "head"], ascending=[False, True, True]).iloc[0]
    return f.sort_values(["score", "layer", "head"], ascending=[False, True, True]).iloc[0]


def held_heads(roles: pd.DataFrame, role: str | None = None) -> set[tuple[int, int]]:
    """Heads with a verdict in ``role`` (any relation and direction), or in any role."""
    f = roles[roles["verdict"].astype(bool)]
    if role is not None:
        f = f[f["role"] == role]
    return {(int(layer), int(head)) for layer, head in zip(f["layer"], f["head"])}


def _n_heads(roles: pd.DataFrame) -> int:
    return len(roles[["layer", "head"]].drop_duplicates())


def curve_at(summary: pd.DataFrame, order: str, metric: str, fraction: float) -> float:
    """The pruning curve of ``order`` (``prune_curve_summary``: random = mean over seeds) at ``fraction``."""
    f = summary[(summary["study"] == f"curve:{order}") & (summary["metric"] == metric)]
    at = f[(f["fraction_pruned"] - fraction).abs() < 1e-9]
    if len(at) != 1:
        raise ValueError(f"the {order} curve of {metric} has {len(at)} points at fraction {fraction}")
    return float(at["value"].iloc[0])


def _table_row(out: dict, name: str, r: pd.Series, baseline: str, items: str, end: str = " |") -> None:
    _fig(
        out,
        name,
        {"head": _head(r), "score": float(r["score"]), "baseline": float(r["baseline"]), "n": int(r["n"])},
        f"| {_head(r)} | {r['score']:.3f} | {r['baseline']:.3f}{baseline} | {items}{end}",
    )


def coref_rule_accuracy(kind: str, coref: Path | None = None) -> dict[str, float]:
    """``{"nearest": acc, "first": acc, "n": items}`` of the two rule baselines on the corpus's
    items of ``kind`` (the report's own rules; the shipped corpus by default)."""
    from headscope.analyses.roles.coreference import first_candidate, nearest_candidate
    from headscope.analyses.roles.inputs import default_coref
    from headscope.probes.corpora import read_coref

    items = [it for it in read_coref(coref or default_coref()) if (it.kind or "") == kind]
    n = len(items)
    return {
        "nearest": sum(nearest_candidate(it) == it.antecedent for it in items) / n,
        "first": sum(first_candidate(it) == it.antecedent for it in items) / n,
        "n": n,
    }


def minilm_table(roles: pd.DataFrame, pairs: pd.DataFrame, coref: Path | None = None) -> dict:
    """The role table's rows (best head, score, baseline, items)."""
    out: dict = {}
    prev = lead(roles, "positional:previous")
    _table_row(out, "positional_previous", prev, " (uniform)", f"{int(prev['n'])} sentences")
    det = lead(roles, "syntactic", "det", "dep->head")
    _table_row(out, "syntactic_det", det, " (best fixed offset)", f"{int(det['n']):,} arcs", end="")
    obj = lead(roles, "syntactic", "obj", "head->dep")
    _table_row(out, "syntactic_obj", obj, " (best fixed offset)", f"{int(obj['n']):,}")
    _coref_rows(out, roles, pairs, coref)
    special = lead(roles, "special")
    _table_row(out, "special", special, "", f"{int(special['n'])} sentences")
    dup = lead(roles, "duplicate-token")
    _table_row(out, "duplicate_token", dup, "", f"{int(dup['n'])} sequences")
    ind = lead(roles, "induction")
    _fig(
        out,
        "induction",
        {"held": bool(ind["verdict"]), "score": float(ind["score"]), "baseline": float(ind["baseline"])},
        f"| {'held' if bool(ind['verdict']) else 'none'}: best {ind['score']:.3f} vs {ind['baseline']:.3f} |",
    )
    return out


def _coref_rows(out: dict, roles: pd.DataFrame, pairs: pd.DataFrame, coref: Path | None) -> None:
    """The role table's three coreference rows (gender, number, winograd)."""
    n_heads = _n_heads(roles)
    g = lead(roles, "coreference:gender")
    gp = pairs[(pairs["kind"] == "gender") & (pairs["layer"] == g["layer"]) & (pairs["head"] == g["head"])].iloc[0]
    rules = coref_rule_accuracy("gender", coref)
    if rules["n"] != int(g["n"]):
        raise ValueError(
            f"the corpus has {rules['n']} gender items, the report used {int(g['n'])}: rule baselines differ"
        )
    chosen = "nearest" if rules["nearest"] >= rules["first"] else "first"
    other = "first" if chosen == "nearest" else "nearest"
    _fig(
        out,
        "coreference_gender",
        {
            "head": _head(g),
            "score": float(g["score"]),
            "both_right": int(gp["both_right"]),
            "n_pairs": int(gp["n_pairs"]),
            "baseline": float(g["baseline"]),
            "chosen": chosen,
            other: rules[other],
            "n": int(g["n"]),
        },
        f"| {_head(g)} | {g['score']:.3f} (both items right in {int(gp['both_right'])} of {int(gp['n_pairs'])} pairs) | "
        f"{g['baseline']:.3f} ({chosen} candidate; {other} {rules[other]:.2f}) | {int(g['n'])} |",
    )
    num = lead(roles, "coreference:number")
    verdict = (
        ""
        if bool(num["verdict"])
        else (
            f" (no verdict: {int(num['n'])} items are too few after BH over {n_heads} heads, p adj. {num['p_value']:.3f})"
        )
    )
    _fig(
        out,
        "coreference_number",
        {
            "head": _head(num),
            "score": float(num["score"]),
            "verdict": bool(num["verdict"]),
            "p_adj": float(num["p_value"]),
        },
        f"| {_head(num)} | {num['score']:.3f}{verdict} | {num['baseline']:.3f} | {int(num['n'])} |",
    )
    w = lead(roles, "coreference:winograd")
    wp = pairs[pairs["kind"] == "winograd"]
    best_pairs = wp.sort_values(["both_right", "layer", "head"], ascending=[False, True, True]).iloc[0]
    _fig(
        out,
        "coreference_winograd",
        {
            "held": bool(w["verdict"]),
            "head": _head(w),
            "score": float(w["score"]),
            "ci": [float(w["ci_low"]), float(w["ci_high"])],
            "p_adj": float(w["p_value"]),
            "best_both_right": int(best_pairs["both_right"]),
            "n_pairs": int(best_pairs["n_pairs"]),
        },
        f"{'held' if bool(w['verdict']) else 'none'}: best {_head(w)} {w['score']:.3f}, CI {w['ci_low']:.2f}–{w['ci_high']:.2f}, p adj. {w['p_value']:.2f}; "
        f"best pair accuracy {int(best_pairs['both_right'])} of {int(best_pairs['n_pairs'])} | | {w['baseline']:.3f} | {int(w['n'])} |",
    )


def minilm_coreference(roles: pd.DataFrame, pairs: pd.DataFrame, run: dict) -> dict:
    """Pooled over all coreference items, the gender lead head's accuracy; Winograd's mean pair accuracy."""
    out: dict = {}
    coref = roles[roles["role"].str.startswith("coreference:") & (roles["relation"] == "")]
    pooled = coref.assign(hits=coref["score"] * coref["n"]).groupby(["layer", "head"])[["hits", "n"]].sum()
    g = lead(roles, "coreference:gender")
    key = (int(g["layer"]), int(g["head"]))
    n = int(pooled.loc[key, "n"])
    if n != run["n_items"]["coreference"]:
        raise ValueError(f"the coreference roles cover {n} items, run.json says {run['n_items']['coreference']}")
    score = float(pooled.loc[key, "hits"] / n)
    _fig(
        out,
        "pooled",
        {"head": _head(g), "score": score, "n": n},
        f"pooled over all {n} items, {_head(g)} ({score:.3f})",
    )
    mean = float(pairs[pairs["kind"] == "winograd"]["pair_accuracy"].mean())
    _fig(out, "winograd_mean_pair_accuracy", mean, f"the mean pair accuracy over MiniLM's heads is {mean:.2f}")
    return out


def first_token(roles: pd.DataFrame) -> dict:
    """Heads per first-token role, those holding all three, and the pairs' Jaccard indices
    (:func:`~headscope.analyses.roles.pipeline.verdict_overlap`, as the report's sentence)."""
    from headscope.analyses.roles.pipeline import verdict_overlap

    out: dict = {}
    held = {r: held_heads(roles, r) for r in FIRST_TOKEN}
    _fig(
        out,
        "positional_first",
        len(held["positional:first"]),
        f"(positional:first, {len(held['positional:first'])} heads)",
    )
    _fig(out, "sink_first_token", len(held["sink:first-token"]), f"(sink:first-token, {len(held['sink:first-token'])})")
    _fig(out, "special", len(held["special"]), f"(special, {len(held['special'])})")
    all_three = len(set.intersection(*held.values()))
    jaccard = [float(j) for j in verdict_overlap(roles, roles=list(FIRST_TOKEN))["jaccard"]]
    _fig(
        out,
        "all_three",
        {"heads": all_three, "jaccard": jaccard},
        f"{all_three} heads hold all three (Jaccard {' / '.join(f'{j:.2f}' for j in jaccard)})",
    )
    return out


def minilm_pruning(summary: pd.DataFrame, curves: pd.DataFrame, fraction: float = 0.5) -> dict:
    """Each order's cosine to the unpruned model at ``fraction`` of heads pruned, and the items."""
    out: dict = {}
    metric = "cosine_to_unpruned"
    n = int(curves[curves["metric"] == metric]["n"].max())
    _fig(out, "n", n, f"{n} sentences")
    labels = {
        "importance": "gradient-importance order keeps",
        "ablation": "single-head-ablation order",
        "random": "random order",
        "reverse_importance": "reverse importance",
    }
    _fig(out, "fraction", fraction, f"at {fraction:.0%} of heads pruned")
    for order, label in labels.items():
        v = curve_at(summary, order, metric, fraction)
        _fig(out, order, v, f"{label} {v:.3f}")
    return out


def per_example_figures(model, n_items: int = 16) -> dict:
    """Per-example vs batch gradient importance of ``cosine_to_unpruned`` on ``n_items`` sentences."""
    from headscope.analyses.pruning.importance import head_importance
    from headscope.analyses.pruning.metrics import build_metric

    metric = build_metric("cosine_to_unpruned", model, n_items=n_items)
    batch = head_importance(model, metric)
    per_ex = head_importance(model, metric, per_example=True)
    return per_example_from(batch, per_ex, n_items)


def per_example_from(batch, per_ex, n_items: int) -> dict:
    """The figures from the two importances ``[layer, head]``."""
    from scipy.stats import spearmanr

    out: dict = {}
    n_heads = per_ex.shape[1]
    _fig(out, "n", n_items, f"on {n_items} MiniLM sentences")
    positive = bool((per_ex > 0).all())
    _fig(out, "all_positive", positive, "every head > 0" if positive else "some head = 0")
    rho = float(spearmanr(batch.flatten().numpy(), per_ex.flatten().numpy())[0])
    _fig(out, "spearman", rho, f"Spearman {rho:.2f} with the batch importance")
    tops = [int(t.flatten().argmax()) for t in (batch, per_ex)]
    names = [f"L{t // n_heads}H{t % n_heads}" for t in tops]
    same = names[0] == names[1]
    _fig(
        out,
        "lead",
        names,
        f"both lead with {names[0]}" if same else f"batch leads with {names[0]}, per-example with {names[1]}",
    )
    return out


def _lead_fig(out: dict, name: str, r: pd.Series, text: str, **extra) -> None:
    value = {"head": _head(r), "score": float(r["score"]), "baseline": float(r["baseline"]), **extra}
    _fig(out, name, value, text)


def _count(n: int, noun: str) -> str:
    """``one gender head``, ``3 gender heads``."""
    return f"one {noun}" if n == 1 else f"{n} {noun}s"


def smollm2_roles(roles: pd.DataFrame, run: dict) -> dict:
    """Heads holding a role, and the lead head of sink, previous-token, punctuation, syntactic, induction."""
    r: dict = {}
    held = held_heads(roles)
    n_heads = _n_heads(roles)
    _fig(r, "held", {"heads": len(held), "of": n_heads}, f"{len(held)} of the {n_heads} heads holding a role")
    sink, n = lead(roles, "sink:first-token"), len(held_heads(roles, "sink:first-token"))
    _lead_fig(
        r,
        "sink",
        sink,
        f"sink in {n} ({_head(sink)} {sink['score']:.3f} of the attention mass vs {sink['baseline']:.3f} uniform)",
        heads=n,
    )
    for name, role, label in (
        ("previous_token", "previous-token", "previous-token"),
        ("punctuation", "punctuation", "punctuation"),
    ):
        x = lead(roles, role)
        _lead_fig(r, name, x, f"{label} heads ({_head(x)} {x['score']:.3f} vs {x['baseline']:.3f})")
    syn = roles[(roles["role"] == "syntactic") & roles["verdict"].astype(bool)]
    best = syn.sort_values(["margin", "layer", "head"], ascending=[False, True, True]).iloc[0]
    n = len(held_heads(roles, "syntactic"))
    _lead_fig(
        r,
        "syntactic",
        best,
        f"syntactic heads in {n} ({_head(best)} {best['score']:.3f} vs best offset {best['baseline']:.3f})",
        heads=n,
        relation=best["relation"],
        direction=best["direction"],
    )
    top, n = lead(roles, "induction"), len(held_heads(roles, "induction"))
    threshold = run["config"]["roles"]["induction_threshold"]
    _lead_fig(
        r,
        "induction",
        top,
        f"{_count(n, 'induction head')} over the {threshold} threshold ({_head(top)} {top['score']:.3f})",
        heads=n,
        threshold=threshold,
    )
    return r


def smollm2_pruning(summary: pd.DataFrame, run: dict, fraction: float = 0.3) -> dict:
    """The metric (held-out LM loss) unpruned and after pruning ``fraction`` of the heads in each order."""
    out: dict = {}
    metric = run["pruning_summary"]["metric"]
    base = float(run["pruning_summary"]["base_value"])
    _fig(out, "fraction", fraction, f"Pruning {fraction:.0%} of its heads")
    v = {o: curve_at(summary, o, metric, fraction) for o in ("importance", "ablation", "random", "reverse_importance")}
    _fig(out, "importance", {"base": base, "value": v["importance"]}, f"from {base:.2f} to {v['importance']:.2f}")
    _fig(out, "ablation", v["ablation"], f"single-head-ablation order to {v['ablation']:.2f}")
    _fig(out, "random", v["random"], f"random order {v['random']:.2f}")
    _fig(out, "reverse_importance", v["reverse_importance"], f"reverse importance {v['reverse_importance']:.2f}")
    return out


def smollm2_figures(
    roles: pd.DataFrame, summary: pd.DataFrame | None, skipped: pd.DataFrame, run: dict, fraction: float = 0.3
) -> dict:
    """The SmolLM2 figures: induction heads, roles held, pruning at ``fraction`` (left out when
    ``summary`` is None), the skipped special role, coreference."""
    ind = _rows(roles, "induction").sort_values(["score", "layer", "head"], ascending=[False, True, True]).head(3)
    top3 = ", ".join(f"{_head(r)} {r['score']:.3f}" for _, r in ind.iterrows())
    induction: dict = {}
    value = [[_head(r), float(r["score"])] for _, r in ind.iterrows()]
    _fig(induction, "top3", value, f"{top3} (baseline {ind['baseline'].iloc[0]:.3f})")
    special: dict = {}
    sk = skipped[(skipped["analysis"] == "special") & (skipped["reason"] == "no special token visible")]
    n_sk = int(sk["count"].astype(int).sum())
    _fig(special, "skipped", n_sk, f'{n_sk} texts "no special token visible"')
    coref: dict = {}
    g, n = lead(roles, "coreference:gender"), len(held_heads(roles, "coreference:gender"))
    text = f"{_count(n, 'gender head')} ({_head(g)} {g['score']:.2f} vs {g['baseline']:.2f})"
    _lead_fig(coref, "gender", g, text, heads=n)
    w = _rows(roles, "coreference:winograd")["score"]
    same = bool(w.nunique() == 1)
    _fig(
        coref,
        "winograd",
        {"all_equal": same, "min": float(w.min()), "max": float(w.max())},
        f"every head scores exactly {w.iloc[0]:.2f}" if same else f"heads score {w.min():.2f} to {w.max():.2f}",
    )
    out = {"induction": induction, "roles": smollm2_roles(roles, run), "special": special, "coreference": coref}
    if summary is not None:
        out["pruning"] = smollm2_pruning(summary, run, fraction)
    return out


def read_report(folder: Path) -> tuple[dict[str, pd.DataFrame], dict]:
    """The tables (``tables/<name>.parquet``) and ``run.json`` of a report folder."""
    folder = Path(folder)
    run = json.loads((folder / "run.json").read_text(encoding="utf-8"))
    tables = {p.stem: pd.read_parquet(p) for p in sorted((folder / "tables").glob("*.parquet"))}
    return tables, run


def read_split(roles_dir: Path, prune_dir: Path | None) -> tuple[dict[str, pd.DataFrame], dict]:
    """The same tables and run.json keys from the output folders of ``headscope roles`` and
    ``headscope prune --quick`` (the report runs both stages with the same settings: on
    MiniLM all their tables equal the report's, pandas ``.equals``). A prune folder without
    ``curve_summary.parquet`` (unfinished) gives no ``prune_curve_summary``."""
    roles_dir = Path(roles_dir)
    rrun = json.loads((roles_dir / "run.json").read_text(encoding="utf-8"))
    tables = {name: pd.read_parquet(roles_dir / f"{name}.parquet") for name in ("roles", "coref_pairs")}
    skipped = [(a, reason, int(n)) for a, d in rrun.get("skipped", {}).items() for reason, n in d.items()]
    tables["skipped"] = pd.DataFrame(skipped, columns=["analysis", "reason", "count"])
    run = {"config": {"roles": rrun["config"]}, "n_items": rrun.get("n_items", {})}
    if prune_dir is not None and (Path(prune_dir) / "curve_summary.parquet").exists():
        prun = json.loads((Path(prune_dir) / "run.json").read_text(encoding="utf-8"))
        run["pruning_summary"] = prun["summary"]
        tables["prune_curve_summary"] = pd.read_parquet(Path(prune_dir) / "curve_summary.parquet")
        tables["prune_curves"] = pd.read_parquet(Path(prune_dir) / "curves.parquet")
    return tables, run


def read_any(src: Path, model: str) -> tuple[dict[str, pd.DataFrame], dict, str]:
    """``src/<model>-report``, else ``src/<model>-roles`` with ``src/<model>-prune``: tables, run, source."""
    report = Path(src) / f"{model}-report"
    if (report / "run.json").exists():
        return (*read_report(report), str(report))
    roles, prune = Path(src) / f"{model}-roles", Path(src) / f"{model}-prune"
    if not (roles / "run.json").exists():
        raise FileNotFoundError(f"{src} holds neither {report.name}/ nor {roles.name}/ with a run.json")
    tables, run = read_split(roles, prune)
    return tables, run, f"{roles} + {prune}"


def minilm_figures(folder: Path, model=None, coref: Path | None = None) -> dict:
    """All MiniLM figures from a report folder (``model``: the loaded MiniLM for the per-example
    importance; None leaves that group out)."""
    t, run = read_report(folder)
    return minilm_from(t, run, model, coref)


def minilm_from(t: dict, run: dict, model=None, coref: Path | None = None) -> dict:
    figures = {
        "table": minilm_table(t["roles"], t["coref_pairs"], coref),
        "coreference": minilm_coreference(t["roles"], t["coref_pairs"], run),
        "first_token": first_token(t["roles"]),
        "pruning": minilm_pruning(t["prune_curve_summary"], t["prune_curves"]),
    }
    if model is not None:
        figures["per_example"] = per_example_figures(model)
    return figures


def smollm2_from(t: dict, run: dict) -> dict:
    return smollm2_figures(t["roles"], t.get("prune_curve_summary"), t["skipped"], run)


def write(key: str, figures: dict, out: Path, *, source: str, seconds: float | None = None) -> None:
    """Write one model's figures (and which the README quotes, :data:`QUOTED`) to ``out``; a
    quoted figure the source could not give is listed under ``missing``."""
    quoted = [q for q in QUOTED[key] if q.split(".")[1] in figures.get(q.split(".")[0], {})]
    doc = {
        "model": MODELS[key],
        "generated_by": "python -m headscope.reports.tools.experiments.report_figures",
        "source": source,
        "seconds": None if seconds is None else round(seconds),
        "quoted": quoted,
        "missing": [q for q in QUOTED[key] if q not in quoted],
        "figures": figures,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    log.info("wrote %s", out)


def _report(model: str, out: Path) -> None:
    cmd = [sys.executable, "-m", "headscope.reports.cli.app", "report", model, "--quiet", "--out", str(out)]
    subprocess.run(cmd, check=True)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(format="%(message)s")  # others' records as before: warnings and up
    log.setLevel(logging.INFO)  # this script's "wrote ..." lines
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--from",
        dest="src",
        type=Path,
        help="a folder holding <model>-report/ (or <model>-roles/ and <model>-prune/) for minilm-l6 and smollm2-135m",
    )
    p.add_argument("--out", type=Path, default=FIGURES, help=f"the folder the JSONs go to (default {FIGURES})")
    p.add_argument("--only", choices=sorted(MODELS), help="one model only")
    args = p.parse_args(argv)
    from headscope.probes.models.loading import load_model

    keys = [args.only] if args.only else list(MODELS)
    with tempfile.TemporaryDirectory(prefix="headscope-figures-") as tmp:
        for key in keys:
            start = time.perf_counter()
            if args.src is None:
                _report(MODELS[key], Path(tmp) / f"{MODELS[key]}-report")
                source = f"headscope report {MODELS[key]} (seed 0, shipped data)"
            tables, run, where = read_any(args.src or Path(tmp), MODELS[key])
            if args.src is not None:
                source = where
            if key == "minilm":
                figures = minilm_from(tables, run, model=load_model("minilm-l6", "inhouse"))
            else:
                figures = smollm2_from(tables, run)
            out = args.out / f"report_{key}.json"
            write(key, figures, out, source=source, seconds=None if args.src else time.perf_counter() - start)
            missing = [q for q in QUOTED[key] if q.split(".")[1] not in figures.get(q.split(".")[0], {})]
            log.info("wrote %s%s", out, f"; missing (not in {source}): {', '.join(missing)}" if missing else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
