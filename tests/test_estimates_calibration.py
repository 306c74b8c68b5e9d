"""Issue #38: every registered stage's memory estimate, held against the peak it measured.

``data/figures/estimates.json`` is written by ``make estimates``
(:mod:`headscope.reports.tools.bench.estimates`); these tests only read it: a registered stage with
no calibration row fails, and so does any row outside the band."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from headscope.data import path
from headscope.reports.stages import registry
from headscope.reports.tools.bench.estimates import BAND, CASES, SHAPES, SMALL_MB, WHOLE, in_band, render_table

DOC = json.loads(path("figures/estimates.json").read_text(encoding="utf-8"))
MEASURED = [r for r in DOC["rows"] if r["estimate_mb"] and r["peak_mb"]]


ROOT = Path(__file__).resolve().parents[1]


def test_every_registered_stage_has_a_calibration_row():
    measured = {r["stage"] for r in MEASURED if r["stage"] != WHOLE}
    missing = [name for name in registry.STAGES if name not in measured]
    assert not missing, f"registered stages with no calibration row (run `make estimates`): {missing}"


def test_the_calibration_cases_cover_the_issue():
    """``make estimates`` runs MiniLM-L6, SmolLM2-135M, a long vocabulary and a d_head of 256, at two
    batch sizes, in fp32 and bf16; the committed JSON holds cases of that list (a case may run some
    stages alone) with the band the test applies."""
    assert {"minilm-l6", "smollm2-135m", "qwen2-vocab152k", "llama-dhead256"} <= {c.model for c in CASES}
    assert len({c.batch for c in CASES}) >= 2 and {"fp32", "bf16"} <= {c.dtype for c in CASES}
    assert SHAPES["qwen2-vocab152k"]["vocab_size"] >= 150_000 and SHAPES["llama-dhead256"]["head_dim"] == 256
    known = {(c.model, c.dtype, c.batch) for c in CASES}
    assert all((c["model"], c["dtype"], c["batch"]) in known for c in DOC["cases"]), DOC["cases"]
    assert tuple(DOC["band"]) == BAND and DOC["small_mb"] == SMALL_MB


@pytest.mark.parametrize("row", MEASURED, ids=lambda r: f"{r['case']}:{r['stage']}")
def test_each_stage_estimate_is_in_the_band(row):
    assert in_band(row["estimate_mb"], row["peak_mb"]), (
        f"{row['case']} {row['stage']}: estimated {row['estimate_mb']} MiB, measured {row['peak_mb']} MiB "
        f"({row['error']:+.1%}; band {BAND[0]:+.0%}..{BAND[1]:+.0%} or within {SMALL_MB:.0f} MiB)"
    )


def test_in_band_reads_the_band_both_ways():
    assert in_band(1000, 1000) and in_band(1290, 1000) and in_band(910, 1000)
    assert not in_band(1400, 1000) and not in_band(800, 1000)
    assert in_band(240, 100)  # a small stage: within 150 MiB


def test_the_guide_page_quotes_the_calibration():
    """docs/guide/estimates.md holds the table ``make estimates`` writes from the JSON, as it is now."""
    page = (ROOT / "docs" / "guide" / "estimates.md").read_text(encoding="utf-8")
    assert render_table(DOC) in page, "docs/guide/estimates.md is stale: run `make estimates`"
