"""reports/tools/experiments/report_figures.py reads the README's figures off a report folder.

A small folder is built by hand (2 layers × 2 heads, tables and run.json in the report's
layout, a 4-item coreference corpus), so no report runs; each figure's text is what the
README would print for these tables.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from headscope.reports.tools.experiments import report_figures as R

HEADS = [(0, 0), (0, 1), (1, 0), (1, 1)]


def _role(role, scores, baseline, verdicts, n, relation="", direction="", p=None, ci=None):
    return [
        {
            "layer": layer,
            "head": head,
            "role": role,
            "relation": relation,
            "direction": direction,
            "score": s,
            "baseline": baseline,
            "margin": s - baseline,
            "ci_low": (ci or (s - 0.1, s + 0.1))[0],
            "ci_high": (ci or (s - 0.1, s + 0.1))[1],
            "p_value": 0.5 if p is None else p,
            "n": n,
            "verdict": v,
        }
        for (layer, head), s, v in zip(HEADS, scores, verdicts)
    ]


def _pairs(kind, both, n_pairs):
    return [
        {"layer": layer, "head": head, "kind": kind, "n_pairs": n_pairs, "both_right": b, "pair_accuracy": b / n_pairs}
        for (layer, head), b in zip(HEADS, both)
    ]


def _curves(fraction_values: dict, metric: str):
    rows = []
    for order, values in fraction_values.items():
        for step, (f, v) in enumerate(values):
            rows.append(
                {"study": f"curve:{order}", "step": step, "fraction_pruned": f, "metric": metric, "value": v, "n": 1}
            )
    return pd.DataFrame(rows)


F, T = False, True


@pytest.fixture
def minilm_folder(tmp_path):
    roles = (
        _role("positional:previous", [1.0, 0.2, 0.1, 0.05], 0.0668, [T, F, F, F], 10)
        # the best score L0H1 has no verdict: the lead is the verdict row with the largest margin
        + _role("syntactic", [0.3, 0.9, 0.8, 0.2], 0.57, [F, F, T, F], 2193, "det", "dep->head")
        + _role("syntactic", [0.6, 0.1, 0.1, 0.1], 0.25, [T, F, F, F], 640, "obj", "head->dep")
        + _role("coreference:gender", [1.0, 0.5, 0.5, 0.25], 0.75, [T, F, F, F], 4)
        + _role("coreference:number", [0.5, 0.5, 0.5, 1.0], 0.5, [F, F, F, F], 2, p=0.0351)
        + _role("coreference:winograd", [0.5, 0.6, 0.5, 0.5], 0.5, [F, F, F, F], 4, p=0.8, ci=(0.454, 0.7))
        + _role("special", [0.6, 0.55, 0.2, 0.9], 0.134, [T, T, F, T], 10)
        + _role("duplicate-token", [0.1, 0.5, 0.1, 0.1], 0.0227, [F, T, F, F], 8)
        + _role("induction", [0.0214, 0.01, 0.01, 0.01], 0.0227, [F, F, F, F], 8)
        + _role("positional:first", [0.9, 0.9, 0.9, 0.1], 0.067, [T, T, T, F], 10)
        + _role("sink:first-token", [0.9, 0.9, 0.1, 0.1], 0.067, [T, T, F, F], 10)
    )
    pairs = _pairs("gender", [2, 0, 0, 0], 2) + _pairs("winograd", [1, 0, 0, 0], 5)
    curves = _curves(
        {
            o: [(0.0, 1.0), (0.25, 0.95), (0.5, v)]
            for o, v in {"importance": 0.9, "ablation": 0.8, "random": 0.7, "reverse_importance": 0.6}.items()
        },
        "cosine_to_unpruned",
    )
    tables = tmp_path / "report" / "tables"
    tables.mkdir(parents=True)
    pd.DataFrame(roles).to_parquet(tables / "roles.parquet")
    pd.DataFrame(pairs).to_parquet(tables / "coref_pairs.parquet")
    curves.to_parquet(tables / "prune_curve_summary.parquet")
    curves.assign(n=24).to_parquet(tables / "prune_curves.parquet")
    (tmp_path / "report" / "run.json").write_text(json.dumps({"n_items": {"coreference": 10}}), encoding="utf-8")
    # 4 gender items "A met B and she left": first candidate right in 3, nearest (B) in 1; plus the other kinds
    coref = tmp_path / "coref.jsonl"
    base = {"words": ["A", "met", "B", "and", "she", "left"], "pronoun": 4, "candidates": [[0, 1], [2, 3]]}
    lines = [dict(base, antecedent=a, kind="gender") for a in (0, 0, 1, 0)] + [dict(base, antecedent=0, kind="number")]
    coref.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return tmp_path / "report", coref


def _texts(figures):
    return {f"{g}.{n}": f["text"] for g, d in figures.items() for n, f in d.items()}


def test_minilm_figures_from_a_hand_built_report(minilm_folder):
    folder, coref = minilm_folder
    t = _texts(R.minilm_figures(folder, coref=coref))
    assert t["table.positional_previous"] == "| L0H0 | 1.000 | 0.067 (uniform) | 10 sentences |"
    assert t["table.syntactic_det"] == "| L1H0 | 0.800 | 0.570 (best fixed offset) | 2,193 arcs"
    assert t["table.syntactic_obj"] == "| L0H0 | 0.600 | 0.250 (best fixed offset) | 640 |"
    assert t["table.coreference_gender"] == (
        "| L0H0 | 1.000 (both items right in 2 of 2 pairs) | 0.750 (first candidate; nearest 0.25) | 4 |"
    )
    assert t["table.coreference_number"] == (
        "| L1H1 | 1.000 (no verdict: 2 items are too few after BH over 4 heads, p adj. 0.035) | 0.500 | 2 |"
    )
    assert t["table.coreference_winograd"] == (
        "none: best L0H1 0.600, CI 0.45–0.70, p adj. 0.80; best pair accuracy 1 of 5 | | 0.500 | 4 |"
    )
    assert t["table.special"] == "| L1H1 | 0.900 | 0.134 | 10 sentences |"
    assert t["table.duplicate_token"] == "| L0H1 | 0.500 | 0.023 | 8 sequences |"
    assert t["table.induction"] == "| none: best 0.021 vs 0.023 |"
    # pooled over 4 + 2 + 4 items, the gender lead L0H0: (1.0·4 + 0.5·2 + 0.5·4) / 10
    assert t["coreference.pooled"] == "pooled over all 10 items, L0H0 (0.700)"
    assert t["coreference.winograd_mean_pair_accuracy"] == "the mean pair accuracy over MiniLM's heads is 0.05"
    assert t["first_token.positional_first"] == "(positional:first, 3 heads)"
    assert t["first_token.sink_first_token"] == "(sink:first-token, 2)"
    assert t["first_token.special"] == "(special, 3)"
    assert t["first_token.all_three"] == "2 heads hold all three (Jaccard 0.67 / 0.50 / 0.67)"
    assert [t[f"pruning.{k}"] for k in ("n", "fraction", "importance", "ablation", "random", "reverse_importance")] == [
        "24 sentences",
        "at 50% of heads pruned",
        "gradient-importance order keeps 0.900",
        "single-head-ablation order 0.800",
        "random order 0.700",
        "reverse importance 0.600",
    ]


def test_rule_baselines_must_cover_the_items_the_report_used(minilm_folder):
    folder, coref = minilm_folder
    coref.write_text(coref.read_text(encoding="utf-8").split("\n", 1)[1], encoding="utf-8")  # 3 gender items left
    with pytest.raises(ValueError, match="3 gender items, the report used 4"):
        R.minilm_figures(folder, coref=coref)


def test_smollm2_figures_from_hand_built_tables():
    roles = pd.DataFrame(
        _role("sink:first-token", [0.99, 0.5, 0.4, 0.3], 0.24, [T, T, F, F], 10)
        + _role("previous-token", [0.1, 0.86, 0.2, 0.1], 0.081, [F, T, F, F], 10)
        + _role("punctuation", [0.77, 0.2, 0.2, 0.1], 0.09, [T, F, F, F], 10)
        + _role("syntactic", [0.1, 0.1, 0.784, 0.1], 0.256, [F, F, T, F], 640, "obj", "dep->head")
        + _role("syntactic", [0.1, 0.9, 0.1, 0.95], 0.49, [F, T, F, F], 178, "nummod", "head->dep")
        + _role("induction", [0.407, 0.345, 0.324, 0.1], 0.016, [T, F, F, F], 64)
        + _role("coreference:gender", [0.76, 0.70, 0.5, 0.5], 0.5, [F, T, F, F], 100)
        + _role("coreference:winograd", [0.5, 0.5, 0.5, 0.5], 0.5, [F, F, F, F], 100)
    )
    metric = "lm_loss"
    curves = _curves(
        {
            o: [(0.0, 4.4), (0.3, v)]
            for o, v in {"importance": 4.74, "ablation": 5.44, "random": 7.06, "reverse_importance": 11.37}.items()
        },
        metric,
    )
    skipped = pd.DataFrame({"analysis": ["special"], "reason": ["no special token visible"], "count": [319]})
    run = {
        "config": {"roles": {"induction_threshold": 0.4}},
        "pruning_summary": {"metric": metric, "base_value": 4.401},
    }
    t = _texts(R.smollm2_figures(roles, curves, skipped, run))
    assert t["induction.top3"] == "L0H0 0.407, L0H1 0.345, L1H0 0.324 (baseline 0.016)"
    assert t["roles.held"] == "3 of the 4 heads holding a role"  # L1H1 holds none
    assert t["roles.sink"] == "sink in 2 (L0H0 0.990 of the attention mass vs 0.240 uniform)"
    assert t["roles.previous_token"] == "previous-token heads (L0H1 0.860 vs 0.081)"
    assert t["roles.punctuation"] == "punctuation heads (L0H0 0.770 vs 0.090)"
    # the largest margin among verdict rows, not the highest score (L1H1's nummod 0.95 has no verdict)
    assert t["roles.syntactic"] == "syntactic heads in 2 (L1H0 0.784 vs best offset 0.256)"
    assert t["roles.induction"] == "one induction head over the 0.4 threshold (L0H0 0.407)"
    assert [t[f"pruning.{k}"] for k in ("fraction", "importance", "ablation", "random", "reverse_importance")] == [
        "Pruning 30% of its heads",
        "from 4.40 to 4.74",
        "single-head-ablation order to 5.44",
        "random order 7.06",
        "reverse importance 11.37",
    ]
    assert t["special.skipped"] == '319 texts "no special token visible"'
    assert t["coreference.gender"] == "one gender head (L0H1 0.70 vs 0.50)"
    assert t["coreference.winograd"] == "every head scores exactly 0.50"


def test_a_curve_without_the_point_is_an_error():
    curves = _curves({"importance": [(0.0, 1.0), (0.25, 0.9)]}, "m")
    with pytest.raises(ValueError, match="0 points at fraction 0.5"):
        R.curve_at(curves, "importance", "m", 0.5)


def test_roles_and_prune_folders_stand_in_for_a_report(tmp_path):
    """``--from`` reads ``<model>-roles`` + ``<model>-prune`` when there is no report folder;
    an unfinished prune folder (no curve_summary) gives no pruning figures, listed as missing."""
    roles = tmp_path / "m-roles"
    roles.mkdir()
    pd.DataFrame(_role("special", [0.1, 0.2, 0.3, 0.4], 0.1, [F, F, F, T], 10)).to_parquet(roles / "roles.parquet")
    pd.DataFrame(_pairs("gender", [1, 0, 0, 0], 2)).to_parquet(roles / "coref_pairs.parquet")
    run = {"config": {"induction_threshold": 0.4}, "n_items": {"special": 10}, "skipped": {"special": {"x": 3}}}
    (roles / "run.json").write_text(json.dumps(run), encoding="utf-8")
    (tmp_path / "m-prune").mkdir()
    tables, run, source = R.read_any(tmp_path, "m")
    assert source == f"{roles} + {tmp_path / 'm-prune'}"
    assert run["config"]["roles"]["induction_threshold"] == 0.4 and "pruning_summary" not in run
    assert tables["skipped"].values.tolist() == [["special", "x", 3]] and "prune_curve_summary" not in tables
    curves = _curves({"importance": [(0.0, 4.0), (0.3, 5.0)]}, "lm_loss")
    curves.to_parquet(tmp_path / "m-prune" / "curve_summary.parquet")
    curves.to_parquet(tmp_path / "m-prune" / "curves.parquet")
    summary = {"metric": "lm_loss", "base_value": 4.0}
    (tmp_path / "m-prune" / "run.json").write_text(json.dumps({"summary": summary}), encoding="utf-8")
    tables, run, _ = R.read_any(tmp_path, "m")
    assert (
        run["pruning_summary"] == summary
        and R.curve_at(tables["prune_curve_summary"], "importance", "lm_loss", 0.3) == 5.0
    )
    out = tmp_path / "f.json"
    R.write("smollm2", {"special": {"skipped": {"value": 3, "text": "3"}}}, out, source="here")
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["quoted"] == ["special.skipped"] and "pruning.importance" in doc["missing"]


def test_no_source_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither m-report/ nor m-roles/"):
        R.read_any(tmp_path, "m")
