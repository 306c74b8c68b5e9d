"""The registry sweep on its fixed sample (``headscope sweep --sample``): every in-house family and more,
each check's outcome equal to the committed ``data/sweep/sweep.csv`` (so a regression, and a check that
starts to pass without the table saying so, both fail here; ``make sweep`` regenerates the table).

It also holds what ``tests/reports/test_families_report.py`` asserted on the report of every family
of ``tests/tiny_models.py`` (all of them in the sample): roles for every head, importance reaching
(nearly) every head, the three curves to 50%, the HTML with nothing missing, the backend auto chose.
Measured: the sample's sweep took 34 min of wall time on the 2-core machine shared with four other
sweeps and five engineers' jobs (each family 40-90 s there, ~6-10 s of CPU); marked slow."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_models import FAMILIES as TINY_FAMILIES
from tiny_models import check_tiny_report

from headscope.probes.models.config import INHOUSE_MODEL_TYPES
from headscope.reports.cli.app import main
from headscope.reports.tools.sweep.run import CHECKS, by_design, read_sweep, sample, sweep
from headscope.reports.tools.sweep.tiny_config import N_HEADS, N_LAYERS

COMMITTED = Path(__file__).resolve().parents[4] / "data" / "sweep" / "sweep.csv"
COMPARED = ("kind", "built", "backend", *CHECKS)


def _swept(family: str, tmp_path_factory) -> tuple[Path, dict]:
    """The sweep's row of one ``family`` and the folder of its files (a family per test, so the
    sample spreads over the suite's workers instead of running in one)."""
    work = tmp_path_factory.mktemp(f"sweep-{family}")
    return work, sweep([family], cli=main, work=work)[0]


@pytest.fixture(scope="module")
def committed():
    return {row["family"]: row for row in read_sweep(COMMITTED)}


def test_the_sample_holds_every_inhouse_family_and_at_least_25():
    assert set(INHOUSE_MODEL_TYPES) <= set(sample()) and len(set(sample())) >= 25
    assert set(TINY_FAMILIES) <= set(sample())  # the families test_families_report.py ran report on


@pytest.mark.slow
@pytest.mark.parametrize("family", sample())
def test_every_check_of_the_sample_is_what_the_committed_sweep_says(family, tmp_path_factory, committed):
    """Each check's outcome equals the committed row; on a family of ``tests/tiny_models.py``, also
    the report checks test_families_report.py made (roles for every head, importance reaching
    (nearly) every head, the three curves to 50%, the HTML with nothing missing, the backend auto chose)."""
    work, row = _swept(family, tmp_path_factory)
    want = committed.get(family)
    assert want is not None, f"{family} is not in {COMMITTED.name}: run make sweep"
    diffs = {c: (want[c], row[c]) for c in COMPARED if row[c] != want[c]}
    assert not diffs, (
        f"{family}: outcomes differ from {COMMITTED.name} (committed, now): {diffs}; rerun make sweep if intended"
    )
    if family in TINY_FAMILIES:
        _report_checks(family, work, row)


def _report_checks(family: str, work: Path, row: dict) -> None:
    """test_families_report.py's report checks, on the sweep's report of the family (default backend)."""
    assert row["report"] == "ok", row
    run = check_tiny_report(work / f"{family}-report", family, N_LAYERS, N_HEADS)  # the tiny config's sizes
    assert {k: v for k, v in run["absent"].items() if not by_design(k, v, run["backend"])} == {}
