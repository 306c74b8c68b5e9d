"""analyses.stats: intervals and exact tests for 0/1 scores, the permutation p's refinement,
BH/BY corrections, the correction family (issue #13)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import binomtest, norm

from headscope.analyses.frames import ROLE_COLUMNS, empty_roles, roles_frame
from headscope.analyses.roles.config import RolesConfig
from headscope.analyses.stats.resampling import (
    adjust_p,
    benjamini_hochberg,
    benjamini_yekutieli,
    binomial_p,
    clopper_pearson_ci,
    harmonic,
    paired_permutation_p,
    required_p,
    sign_test_p,
    wilson_ci,
)
from headscope.analyses.stats.verdicts import apply_family, layered_rows, verdict_rows

CFG = RolesConfig(n_boot=200, n_perm=500)


# -- intervals for 0/1 scores ---------------------------------------------------------------------
def test_wilson_by_hand_and_against_scipy():
    z = norm.ppf(0.975)
    # 30 of 30: center ± half collapses to [n / (n + z²), 1]
    lo, hi = wilson_ci(30, 30)
    assert float(lo) == pytest.approx(30 / (30 + z * z), rel=1e-12) and float(hi) == 1.0
    # 7 of 20 by the textbook formula
    k, n = 7, 20
    c = (k + z * z / 2) / (n + z * z)
    h = z / (n + z * z) * math.sqrt(k * (n - k) / n + z * z / 4)
    lo, hi = wilson_ci(k, n)
    assert (float(lo), float(hi)) == (pytest.approx(c - h, rel=1e-12), pytest.approx(c + h, rel=1e-12))
    assert (round(float(lo), 4), round(float(hi), 4)) == (0.1812, 0.5671)
    for k, n, level in [(0, 10, 0.95), (3, 10, 0.9), (10, 10, 0.99), (57, 220, 0.95), (1, 1, 0.95)]:
        ref = binomtest(k, n).proportion_ci(level, method="wilson")
        lo, hi = wilson_ci(torch.tensor([k]), torch.tensor([n]), level=level)
        assert float(lo[0]) == pytest.approx(ref.low, abs=1e-12) and float(hi[0]) == pytest.approx(ref.high, abs=1e-12)
    lo, hi = wilson_ci(torch.tensor([0.0]), torch.tensor([0.0]))
    assert math.isnan(float(lo[0])) and math.isnan(float(hi[0]))


def test_clopper_pearson_by_hand_and_against_scipy():
    lo, hi = clopper_pearson_ci(30, 30)  # P(30 of 30 | p) = p^30 = 0.025 at the lower end
    assert float(lo) == pytest.approx(0.025 ** (1 / 30), rel=1e-10) and float(hi) == 1.0
    lo, hi = clopper_pearson_ci(0, 10)
    assert float(lo) == 0.0 and float(hi) == pytest.approx(1 - 0.025 ** (1 / 10), rel=1e-10)
    for k, n, level in [(7, 20, 0.95), (3, 10, 0.9), (57, 220, 0.99)]:
        ref = binomtest(k, n).proportion_ci(level, method="exact")
        lo, hi = clopper_pearson_ci(k, n, level=level)
        assert float(lo) == pytest.approx(ref.low, rel=1e-9) and float(hi) == pytest.approx(ref.high, rel=1e-9)
    # Clopper-Pearson is the wider (conservative) one
    w = wilson_ci(7, 20)
    cp = clopper_pearson_ci(7, 20)
    assert float(cp[0]) < float(w[0]) and float(cp[1]) > float(w[1])


# -- exact tests ----------------------------------------------------------------------------------
def test_exact_sign_test_against_enumeration():
    # 4 discordant items for the head, 1 for the baseline: enumerate the 2^5 sign patterns
    n_pos, n_neg = 4, 1
    patterns = list(itertools.product([0, 1], repeat=n_pos + n_neg))
    p_enum = sum(sum(s) >= n_pos for s in patterns) / len(patterns)
    assert p_enum == 6 / 32
    assert float(sign_test_p(n_pos, n_neg)) == pytest.approx(p_enum, rel=1e-12)
    got = sign_test_p(torch.tensor([4, 0, 9, 0]), torch.tensor([1, 3, 2, 0]))
    want = [6 / 32, 1.0, binomtest(9, 11, 0.5, alternative="greater").pvalue, 1.0]
    assert got.tolist() == pytest.approx(want, rel=1e-12)


def test_exact_binomial_against_scipy():
    for k, n, p0 in [(9, 10, 0.5), (30, 30, 0.25), (12, 40, 0.3), (0, 5, 0.2)]:
        want = binomtest(k, n, p0, alternative="greater").pvalue
        assert float(binomial_p(k, n, p0)) == pytest.approx(want, rel=1e-10)


def _hits(n, k, rate, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n, k, generator=g) < rate).float()


def test_hit_rows_use_wilson_and_exact_tests():
    n = 30
    v = _hits(n, 4, 0.5, 0)
    v[:, 1] = 1.0  # layer 0 head 1: 30 of 30
    base = (torch.arange(n) % 3 == 0).float()[:, None].expand(n, 4)  # a 0/1 per-item baseline (10 of 30 hit)
    rows = verdict_rows(v, base, n_layers=2, n_heads=2, role="syntactic", cfg=CFG, score_kind="hit")
    r = rows[1]
    assert r["score"] == 1.0 and r["ci_high"] == 1.0 and r["ci_low"] < 1.0  # not the bootstrap's [1, 1]
    assert r["ci_low"] == pytest.approx(float(wilson_ci(30, 30)[0]))
    assert (r["test"], r["interval"], r["family"]) == ("exact sign test", "Wilson", "role")
    assert r["p_raw"] == pytest.approx(0.5**20)  # 20 items where only the head hits, none for the baseline
    for r in rows:
        n_pos = int(((v[:, 2 * r["layer"] + r["head"]] == 1) & (base[:, 0] == 0)).sum())
        n_neg = int(((v[:, 2 * r["layer"] + r["head"]] == 0) & (base[:, 0] == 1)).sum())
        assert r["p_raw"] == pytest.approx(binomtest(n_pos, n_pos + n_neg, 0.5, alternative="greater").pvalue)
    # a constant rate: exact binomial
    rows = verdict_rows(v, 0.25, n_layers=2, n_heads=2, role="coreference", cfg=CFG, score_kind="hit")
    k = int(v[:, 0].sum())
    assert rows[0]["test"] == "exact binomial"
    assert rows[0]["p_raw"] == pytest.approx(binomtest(k, n, 0.25, alternative="greater").pvalue)
    # any other baseline: the sign-flip permutation, as for shares
    other = torch.linspace(0.1, 0.4, n)[:, None].expand(n, 4)
    rows = verdict_rows(v, other, n_layers=2, n_heads=2, role="x", cfg=CFG, score_kind="hit")
    assert rows[0]["test"].startswith("sign-flip permutation") and rows[0]["interval"] == "Wilson"
    # and through layered_rows
    rows = layered_rows(v.reshape(n, 2, 2), 0.25, [3, 4], role="coreference", cfg=CFG, score_kind="hit")
    assert [r["layer"] for r in rows] == [3, 3, 4, 4] and {r["test"] for r in rows} == {"exact binomial"}


def test_hit_rows_reject_non_binary_values_and_unknown_kinds():
    v = torch.full((10, 4), 0.5)
    with pytest.raises(ValueError, match="0/1 values; role 'syntactic'"):
        verdict_rows(v, 0.1, n_layers=2, n_heads=2, role="syntactic", cfg=CFG, score_kind="hit")
    with pytest.raises(ValueError, match="score_kind must be one of"):
        verdict_rows(v, 0.1, n_layers=2, n_heads=2, role="syntactic", cfg=CFG, score_kind="rate")
    # NaN (missing items) is not a non-binary value
    h = _hits(10, 4, 0.5, 1)
    h[:3, 0] = float("nan")
    rows = verdict_rows(h, 0.1, n_layers=2, n_heads=2, role="r", cfg=CFG, score_kind="hit")
    assert [r["n"] for r in rows] == [7, 10, 10, 10]


# -- corrections ----------------------------------------------------------------------------------
def test_bh_and_by_by_hand():
    p = torch.tensor([0.001, 0.04, 0.03, 0.2], dtype=torch.float64)
    # sorted 0.001, 0.03, 0.04, 0.2; × 4/i = 0.004, 0.06, 0.0533, 0.2; running min from the top
    bh = [0.004, 0.16 / 3, 0.16 / 3, 0.2]
    assert benjamini_hochberg(p).tolist() == pytest.approx(bh, rel=1e-12)
    c = 1 + 1 / 2 + 1 / 3 + 1 / 4
    assert harmonic(4) == pytest.approx(c)
    assert benjamini_yekutieli(p).tolist() == pytest.approx([min(1.0, x * c) for x in bh], rel=1e-12)
    assert benjamini_yekutieli(torch.tensor([0.5, 0.9])).tolist() == [1.0, 1.0]  # clamped
    nan = float("nan")
    got = adjust_p(torch.tensor([0.001, nan, 0.04, 0.03, 0.2], dtype=torch.float64), "by").tolist()
    assert math.isnan(got[1]) and [got[i] for i in (0, 2, 3, 4)] == pytest.approx([x * c for x in bh], rel=1e-12)
    assert adjust_p(p, "none").tolist() == p.tolist()
    with pytest.raises(ValueError, match="correction must be one of"):
        adjust_p(p, "holm")
    assert required_p(100, 0.01, "bh") == pytest.approx(1e-4)
    assert required_p(100, 0.01, "by") == pytest.approx(1e-4 / harmonic(100))
    assert required_p(100, 0.01, "none") == 0.01


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=1, max_size=60), st.sampled_from(["bh", "by"]))
def test_adjusted_p_never_below_raw(ps, method):
    p = torch.tensor(ps, dtype=torch.float64)
    adj = adjust_p(p, method)
    assert bool((adj >= p - 1e-15).all()) and bool((adj <= 1.0).all())
    # monotone: a smaller raw p never gets a larger adjusted p
    order = torch.argsort(p)
    assert bool((adj[order][1:] >= adj[order][:-1] - 1e-15).all())


@pytest.mark.parametrize("correction", ["bh", "by"])
def test_rows_p_raw_at_most_p_value(correction):
    g = torch.Generator().manual_seed(4)
    v = torch.rand(40, 12, generator=g) * torch.linspace(0.2, 1.0, 12)
    cfg = RolesConfig(n_boot=50, n_perm=200, correction=correction)
    rows = verdict_rows(v, 0.2, n_layers=3, n_heads=4, role="demo", cfg=cfg)
    assert all(r["p_raw"] <= r["p_value"] + 1e-15 for r in rows)
    assert all(r["verdict"] == (r["meets_threshold"] and r["p_value"] < cfg.alpha) for r in rows)
    assert {r["family"] for r in rows} == {"role"}
    rows = verdict_rows(v, 0.2, n_layers=3, n_heads=4, role="demo", cfg=RolesConfig(n_boot=50, correction="none"))
    assert all(r["p_raw"] == r["p_value"] for r in rows) and {r["family"] for r in rows} == {"none"}


# -- the share p: refine at the floor, never a silent normal tail ---------------------------------
def _exact_sign_flip_p(d: np.ndarray) -> float:
    signs = np.array(list(itertools.product([-1.0, 1.0], repeat=len(d))))
    return float((signs @ d >= d.sum() - 1e-9).mean())


def test_share_p_refines_at_the_floor_and_says_so():
    n, m = 14, 200
    d = np.arange(1, n + 1) / n
    d[:2] *= -1  # exact one-sided sign-flip p = 5 / 2^14 = 3.05e-4, below the floor 1/101
    exact = _exact_sign_flip_p(d)
    assert exact == pytest.approx(5 / 2**14)
    g = torch.Generator().manual_seed(0)
    v = 0.5 + 0.4 * (torch.rand(n, m, generator=g, dtype=torch.float64) - 0.5)  # noise around the baseline
    v[:, 0] = torch.from_numpy(0.5 + 0.4 * d)  # the planted head
    v[:, 1] = 0.95  # all differences equal: exact p = 2^-14
    cfg = RolesConfig(n_boot=50, n_perm=100)
    report: dict = {}
    rows = verdict_rows(v, 0.5, n_layers=20, n_heads=10, role="demo", cfg=cfg, report=report)
    target = math.ceil(m / cfg.alpha)  # 20000 draws put the floor below alpha / m
    assert rows[0]["test"] == rows[1]["test"] == f"sign-flip permutation ({target}, refined)"
    assert report["refined"] == report["floor"] >= 2 and report["tail"] == 0
    assert not any("normal tail" in r["test"] for r in rows)
    assert all(r["test"] == "sign-flip permutation (100)" for r in rows if "refined" not in r["test"])
    # the refined p is a Monte-Carlo estimate of the exact p, as is a direct p with far more draws
    direct = float(paired_permutation_p(v[:, :1], 0.5, n_perm=200_000, seed=7)[0])
    sd = math.sqrt(exact * (1 - exact) / target)
    assert abs(rows[0]["p_raw"] - exact) < 4 * sd + 1 / target
    assert abs(rows[0]["p_raw"] - direct) < 4 * sd + 1 / target
    sd1 = math.sqrt(2.0**-14 / target)
    assert abs(rows[1]["p_raw"] - 2.0**-14) < 4 * sd1 + 1 / target
    assert 1 / (target + 1) < required_p(m, cfg.alpha, "bh") < 1 / (cfg.n_perm + 1)


def test_share_p_refines_coarse_p_above_the_floor_too():
    n, m = 14, 200
    d = np.arange(1, n + 1) / n
    d[:4] *= -1  # exact p = 43 / 2^14 = 2.6e-3
    exact = _exact_sign_flip_p(d)
    g = torch.Generator().manual_seed(0)
    v = 0.5 + 0.4 * (torch.rand(n, m, generator=g, dtype=torch.float64) - 0.5)
    v[:, 0] = torch.from_numpy(0.5 + 0.4 * d)
    cfg = RolesConfig(n_boot=50, n_perm=500)
    first = float(paired_permutation_p(v[:, :1], 0.5, n_perm=cfg.n_perm, seed=cfg.seed)[0])
    assert 1 / (cfg.n_perm + 1) < first < cfg.alpha  # a few draws above the floor: still too coarse for BH over 200
    report: dict = {}
    rows = verdict_rows(v, 0.5, n_layers=20, n_heads=10, role="demo", cfg=cfg, report=report)
    target = math.ceil(m / cfg.alpha)
    assert rows[0]["test"] == f"sign-flip permutation ({target}, refined)"
    assert report["refined"] >= report["floor"] + 1  # the planted head is refined though not at the floor
    assert abs(rows[0]["p_raw"] - exact) < 4 * math.sqrt(exact / target) + 1 / target
    # heads that cannot pass (p >= alpha) are not redrawn
    assert all(r["test"] == "sign-flip permutation (500)" for r in rows if r["p_raw"] >= cfg.alpha)
    # the first n_perm draws of the refinement are those already made (same seed)
    assert float(paired_permutation_p(v[:, :1], 0.5, n_perm=target, seed=0)[0]) == rows[0]["p_raw"]


def test_share_p_normal_tail_only_beyond_the_cap_and_named():
    n, m = 20, 200
    v = torch.full((n, m), 0.5, dtype=torch.float64)
    v[:, 0] = 0.9
    cfg = RolesConfig(n_boot=50, n_perm=100, n_perm_max=1000)  # cap: floor 1/1001 is not below alpha / m
    report: dict = {}
    rows = verdict_rows(v, 0.5, n_layers=20, n_heads=10, role="demo", cfg=cfg, report=report)
    assert rows[0]["test"] == "sign-flip permutation (1000) + normal tail"
    assert rows[0]["p_raw"] == pytest.approx(0.5 * math.erfc(math.sqrt(20 / 2)), rel=1e-9)  # 1 - Φ(√20)
    assert report == {"floor": 1, "refined": 1, "tail": 1}
    # zero differences: p = 1, no refinement
    assert rows[1]["p_raw"] == 1.0 and rows[1]["test"] == "sign-flip permutation (100)"
    # no correction: the floor 1/101 is already below alpha, so nothing is redrawn
    rows = verdict_rows(v, 0.5, n_layers=20, n_heads=10, role="demo", cfg=RolesConfig(n_perm=100, correction="none"))
    assert rows[0]["test"] == "sign-flip permutation (100)" and rows[0]["p_raw"] == pytest.approx(1 / 101)
    # BY needs more draws than BH
    rows = verdict_rows(v, 0.5, n_layers=20, n_heads=10, role="demo", cfg=RolesConfig(n_perm=100, correction="by"))
    assert rows[0]["test"] == f"sign-flip permutation ({math.ceil(m * harmonic(m) / 0.01)}, refined)"


# -- the correction family ------------------------------------------------------------------------
def _planted_frame():
    rows = []
    for j in range(10):  # role "b": ten heads, nothing going on
        rows.append(dict(layer=0, head=j, role="b", p_raw=0.5, meets_threshold=True))
    rows.append(dict(layer=1, head=0, role="a", p_raw=0.004, meets_threshold=True))  # alone in its family
    rows.append(dict(layer=1, head=1, role="c", p_raw=1e-6, meets_threshold=False))  # significant, too small
    rows.append(dict(layer=1, head=2, role="c", p_raw=float("nan"), meets_threshold=False))  # no items
    for r in rows:
        r.update(score=0.5, baseline=0.3, margin=0.2, ci_low=0.4, ci_high=0.6, n=30, test="t", interval="Wilson")
        r.update(p_value=r["p_raw"] if r["role"] != "c" else min(1.0, 2 * r["p_raw"]), family="role")
        r["verdict"] = bool(r["meets_threshold"] and r["p_value"] < 0.01)
    return roles_frame(rows)


def test_apply_family_role_and_global():
    f = _planted_frame()
    before = f.copy()
    assert apply_family(f, RolesConfig()) is f  # family "role": unchanged
    a = f["role"] == "a"
    assert bool(f.loc[a, "verdict"].item())
    g = apply_family(f, RolesConfig(family="global"))
    pd.testing.assert_frame_equal(f, before)  # pure
    assert list(g.columns) == ROLE_COLUMNS and set(g["family"]) == {"global"}
    finite = f["p_raw"].notna()
    want = benjamini_hochberg(torch.tensor(f.loc[finite, "p_raw"].to_numpy())).numpy()
    np.testing.assert_allclose(g.loc[finite, "p_value"].to_numpy(), want, rtol=1e-12)
    assert g.loc[a, "p_value"].item() == pytest.approx(0.004 * 12 / 2)  # rank 2 of 12 tests
    assert not bool(g.loc[a, "verdict"].item())  # the lone head no longer passes in a run-wide family
    assert not g["verdict"].any()  # 1e-6 is significant but its threshold is not met
    assert np.isnan(g["p_value"].iloc[-1]) if np.isnan(g["p_raw"].iloc[-1]) else True
    assert (g["verdict"] == (g["meets_threshold"] & (g["p_value"] < 0.01))).all()
    gy = apply_family(f, RolesConfig(family="global", correction="by"))
    np.testing.assert_allclose(gy.loc[finite, "p_value"], np.minimum(1, want * harmonic(12)), rtol=1e-12)
    gn = apply_family(f, RolesConfig(family="global", correction="none"))
    assert set(gn["family"]) == {"none"} and gn.loc[a, "verdict"].item()
    np.testing.assert_array_equal(gn["p_value"].to_numpy(), gn["p_raw"].to_numpy())


def test_apply_family_on_verdict_rows():
    g = torch.Generator().manual_seed(2)
    v = torch.rand(40, 6, generator=g) * 0.2
    v[:, 4] = 0.9
    rows = verdict_rows(v, 0.1, n_layers=2, n_heads=3, role="r1", cfg=CFG)
    rows += verdict_rows(_hits(40, 6, 0.3, 3), 0.25, n_layers=2, n_heads=3, role="r2", cfg=CFG, score_kind="hit")
    f = roles_frame(rows)
    g = apply_family(f, RolesConfig(family="global"))
    assert (g["p_value"] >= g["p_raw"] - 1e-15).all()
    assert g["verdict"].sum() <= f["verdict"].sum()


# -- frames and config ----------------------------------------------------------------------------
def test_role_columns_append_the_uncertainty_columns():
    assert ROLE_COLUMNS[:13] == [
        "layer", "head", "role", "relation", "direction", "score", "baseline", "margin",
        "ci_low", "ci_high", "p_value", "n", "verdict",
    ]  # fmt: skip
    assert ROLE_COLUMNS[13:] == ["p_raw", "test", "interval", "family", "meets_threshold"]
    e = empty_roles()
    assert (
        e.dtypes["p_raw"] == "float64"
        and e.dtypes["meets_threshold"] == "bool"
        and e.dtypes["test"] is np.dtype(object)
    )
    legacy = roles_frame(
        [dict(layer=0, head=0, role="x", score=1.0, baseline=0.0, margin=1.0, ci_low=1.0, ci_high=1.0, p_value=0.001,
              n=5, verdict=True)]
    )  # fmt: skip
    r = legacy.iloc[0]
    assert (r["p_raw"], r["test"], r["interval"], r["family"], bool(r["meets_threshold"])) == (
        0.001,
        "",
        "",
        "role",
        True,
    )


def test_config_correction_and_family():
    assert RolesConfig(correction="by").correction == "by"
    assert RolesConfig().family == "role" and RolesConfig(family="global").family == "global"
    with pytest.raises(ValueError, match="'bh', 'by' or 'none'"):
        RolesConfig(correction="holm")
    with pytest.raises(ValueError, match="'family' parameter"):
        RolesConfig(family="run")
    with pytest.raises(ValueError, match="'n_perm_max'"):
        RolesConfig(n_perm_max=0)
