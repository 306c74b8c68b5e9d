"""The AtP* figures' aggregation (``reports/tools/experiments/atp_figures.py``) on hand-made frames:
what the README's table rows and its "which agrees best" line are computed from."""

from __future__ import annotations

import pandas as pd
import pytest

from headscope.reports.tools.experiments.atp_figures import DIRECTIONS, ESTIMATES, best_figures, task_figures


def _frame(method: str, effects: list[float]) -> pd.DataFrame:
    rows = [
        {"layer": i // 4, "head": i % 4, "method": f"{method}_{d}", "effect": e}
        for d in DIRECTIONS
        for i, e in enumerate(effects)
    ]
    return pd.DataFrame(rows)


def test_rows_compare_signs_and_magnitudes_and_the_best_is_the_highest_mean():
    truth = [0.9, -0.8, 0.1, 0.0, 0.3, -0.2, 0.05, 0.6, -0.4, 0.2, 0.0, 0.1]
    frames = {
        "activation": _frame("activation", truth),
        "total": _frame("attribution", truth),  # the same ranking: 1.0 both ways
        "direct": _frame("attribution_bypass_heads", [-e for e in truth]),  # signs flipped: -1.0 signed, 1.0 |.|
        "graddrop": _frame("attribution_graddrop", [abs(e) for e in truth]),  # magnitudes only
    }
    figs = task_figures("smollm2-135m", "induction", frames, {"items": 8})
    assert figs["total_denoising_spearman"]["value"] == pytest.approx(1.0)
    assert figs["direct_noising_spearman"]["value"] == pytest.approx(-1.0) and figs["direct_noising_spearman_abs"][
        "value"
    ] == pytest.approx(1.0)
    assert "graddrop_denoising_spearman" not in figs and figs["graddrop_denoising_spearman_abs"][
        "value"
    ] == pytest.approx(1.0)
    row = figs["row_denoising"]["text"]
    assert row.startswith("| SmolLM2 | induction | denoising | 1.00 / 10 · 1.00 / 10 | -1.00 / ")
    assert row.count("n/a") == 2 and "| — · 1.00 / 10 |" in row  # qk, both not run; GradDrop has no sign
    best = best_figures({"induction": figs})
    assert best["best"]["text"] == "best by signed: total"
    assert set(best) == {
        "mean_total_abs",
        "mean_direct_abs",
        "mean_graddrop_abs",
        "best_abs",
        "mean_total",
        "mean_direct",
        "best",
    }
    assert set(ESTIMATES) == {"total", "direct", "qk", "graddrop", "both"}
