"""The report's figures on small planted frames: each figure's drawn data equals the
frame it was drawn from, PNGs are byte-identical across calls, and the seaborn style
stays inside the figure functions (matplotlib's rcParams are unchanged afterwards)."""

from __future__ import annotations

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PolyCollection, QuadMesh
from matplotlib.colors import to_rgba
from matplotlib.patches import Rectangle

from headscope.reports import figures as F

N_LAYERS, N_HEADS = 3, 4


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def roles_frame() -> pd.DataFrame:
    rows = [
        # L0H1 holds two roles; punctuation appears on two rows (largest margin wins)
        (0, 1, "punctuation", 0.3, True),
        (0, 1, "punctuation", 0.1, True),
        (0, 1, "positional:previous", 0.6, True),
        (2, 3, "positional:previous", 0.2, True),
        (1, 0, "syntactic", 0.9, False),  # not held: not drawn
    ]
    return pd.DataFrame(rows, columns=["layer", "head", "role", "margin", "verdict"])


def stats_frame() -> pd.DataFrame:
    return pd.DataFrame(
        [
            dict(layer=l, head=h, metric=m, value=(1.0 if m == "entropy" else 5.0) + l + 0.1 * h, n=10)
            for m in ("entropy", "mean_distance")
            for l in range(N_LAYERS)
            for h in range(N_HEADS)
        ]
    )


def curves_frame() -> pd.DataFrame:
    """IMPACT-shaped rows: a seedless ordered study with its own spread, and three seeds of
    a random order (their mean and standard deviation are the line and band)."""
    rows = []
    for step, f in enumerate((0.0, 0.5, 1.0)):
        rows.append(
            dict(
                study="importance",
                step=step,
                fraction_pruned=f,
                metric="accuracy",
                value=0.9 - 0.4 * f,
                spread=0.01,
                seed=np.nan,
                n=100,
            )
        )
        for seed, off in zip((0, 1, 2), (-0.05, 0.0, 0.05)):
            rows.append(dict(study="random", step=step, fraction_pruned=f, metric="accuracy",
                             value=0.9 - 0.2 * f + off * f, spread=0.02, seed=seed, n=100))  # fmt: skip
    return pd.DataFrame(rows)


def ablation_frame() -> pd.DataFrame:
    rows = [
        dict(layer=l, head=h, value=0.01 * (l * N_HEADS + h) - 0.05) for l in range(N_LAYERS) for h in range(N_HEADS)
    ]
    return pd.DataFrame(rows[:-1])  # L2H3 missing: a blank cell


def all_figures():
    yield "role_map", lambda: F.role_map_figure(roles_frame(), n_layers=N_LAYERS, n_heads=N_HEADS)
    yield "stats", lambda: F.stats_by_layer_figure(stats_frame())
    yield "pruning", lambda: F.pruning_figure(curves_frame())
    yield (
        "ablation",
        lambda: F.head_map_figure(
            ablation_frame(), n_layers=N_LAYERS, n_heads=N_HEADS, label="delta_accuracy", title="t"
        ),
    )
    yield "example", lambda: F.example_figure(example_frame())


def test_role_map_draws_one_stripe_per_held_role():
    fig = F.role_map_figure(roles_frame(), n_layers=N_LAYERS, n_heads=N_HEADS)
    assert isinstance(fig, matplotlib.figure.Figure)
    ax = fig.axes[0]
    mesh = next(c for c in ax.collections if isinstance(c, QuadMesh))
    count = np.zeros((N_LAYERS, N_HEADS))
    count[0, 1], count[2, 3] = 2, 1
    np.testing.assert_array_equal(np.asarray(mesh.get_array()).reshape(N_LAYERS, N_HEADS), count)
    stripes = {p.get_gid(): p for p in ax.patches if isinstance(p, Rectangle) and p.get_gid()}
    assert set(stripes) == {"L0H1:positional:previous", "L0H1:punctuation", "L2H3:positional:previous"}
    colours = F.role_colours(["positional:previous", "punctuation"])
    # sorted by role: positional left half, punctuation right half of L0H1
    prev, punct = stripes["L0H1:positional:previous"], stripes["L0H1:punctuation"]
    assert prev.get_x() == pytest.approx(1.06) and punct.get_x() == pytest.approx(1.06 + 0.44)
    assert prev.get_width() == pytest.approx(0.44) and prev.get_y() == pytest.approx(0.06)
    assert to_rgba(prev.get_facecolor(), 1) == to_rgba(colours["positional:previous"], 1)
    assert to_rgba(punct.get_facecolor(), 1) == to_rgba(colours["punctuation"], 1)
    # opacity by margin relative to the role's best head: 0.6 is the best positional margin
    assert prev.get_alpha() == pytest.approx(1.0)
    assert stripes["L2H3:positional:previous"].get_alpha() == pytest.approx(0.35 + 0.65 * 0.2 / 0.6)
    assert punct.get_alpha() == pytest.approx(1.0)  # its largest margin (0.3) is the role's best
    assert ax.yaxis_inverted()  # layer 0 on top
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["positional:previous", "punctuation"]


def test_role_map_without_roles_is_all_grey():
    fig = F.role_map_figure(roles_frame().iloc[:0], n_layers=2, n_heads=2)
    ax = fig.axes[0]
    assert not [p for p in ax.patches if p.get_gid()]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["no role"]


def test_stats_by_layer_dots_are_heads_and_line_is_layer_mean():
    stats = stats_frame()
    fig = F.stats_by_layer_figure(stats)
    assert F.stats_metrics(stats) == ["entropy", "mean_distance"]
    assert [ax.get_title() for ax in fig.axes] == ["entropy", "mean distance"]
    for ax, m in zip(fig.axes, ("entropy", "mean_distance")):
        d = stats[stats["metric"] == m].sort_values(["layer", "head"])
        dots = ax.collections[0].get_offsets()
        np.testing.assert_allclose(dots[:, 1], d["value"])
        assert np.all(np.abs(dots[:, 0] - d["layer"].to_numpy()) <= 0.15)  # jittered within the layer
        line = next(l for l in ax.lines if l.get_label() == "layer mean")
        mean = d.groupby("layer")["value"].mean()
        np.testing.assert_allclose(line.get_xdata(), mean.index)
        np.testing.assert_allclose(line.get_ydata(), mean.values)
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["head", "layer mean"]
    assert fig.axes[1].get_legend() is None
    assert F.stats_by_layer_figure(stats.iloc[:0]) is None


def test_pruning_lines_are_seed_means_and_bands_are_spread():
    impact = curves_frame()
    fig = F.pruning_figure(impact)
    (ax,) = fig.axes
    summary = F.curve_rows(impact)
    colours = F.role_colours(["importance", "random"])
    lines = [l for l in ax.lines if len(l.get_xdata()) == 3]
    assert len(lines) == 2
    for line, study in zip(lines, ("importance", "random")):
        s = summary[summary["study"] == study].sort_values("fraction_pruned")
        np.testing.assert_allclose(line.get_xdata(), s["fraction_pruned"])
        np.testing.assert_allclose(line.get_ydata(), s["value"])
        assert to_rgba(line.get_color()) == to_rgba(colours[study])
        band = next(c for c in ax.collections if isinstance(c, PolyCollection) and c.get_label() == f"_band:{study}")
        v = band.get_paths()[0].vertices
        for x, y, sp in zip(s["fraction_pruned"], s["value"], s["spread"]):
            ys = v[np.isclose(v[:, 0], x), 1]
            assert ys.min() == pytest.approx(y - sp) and ys.max() == pytest.approx(y + sp)
    rnd = summary[summary["study"] == "random"].sort_values("fraction_pruned")
    # random: the band is the standard deviation over the three seeds (0 at 0 % pruned)
    np.testing.assert_allclose(rnd["spread"], [0.0, 0.025, 0.05])
    np.testing.assert_allclose(rnd["value"], [0.9, 0.8, 0.7])
    assert ax.get_legend().get_title().get_text() == "order"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["importance", "random"]
    # the report passes curve_rows' output: the same figure
    again = F.pruning_figure(summary, summarised=True)
    assert F.png_bytes(again) == F.png_bytes(fig)
    assert F.pruning_figure(impact.iloc[:0]) is None


def test_ablation_heatmap_is_the_pivot_and_small_grids_are_annotated():
    frame = ablation_frame()
    fig = F.head_map_figure(frame, n_layers=N_LAYERS, n_heads=N_HEADS, label="delta_accuracy", title="t")
    ax = fig.axes[0]
    mesh = next(c for c in ax.collections if isinstance(c, QuadMesh))
    pivot = frame.pivot_table(index="layer", columns="head", values="value").reindex(
        index=range(N_LAYERS), columns=range(N_HEADS)
    )
    arr = np.ma.masked_invalid(pivot.to_numpy(float))
    got = np.ma.asarray(mesh.get_array()).reshape(N_LAYERS, N_HEADS)
    np.testing.assert_array_equal(np.ma.getmaskarray(got), np.ma.getmaskarray(arr))
    np.testing.assert_allclose(got.compressed(), arr.compressed())
    lim = float(np.nanmax(np.abs(pivot.to_numpy())))
    assert mesh.norm.vmin == pytest.approx(-lim) and mesh.norm.vmax == pytest.approx(lim)
    texts = [t.get_text() for t in ax.texts]
    assert texts == [
        format(v, ".3f").replace("-0.000", "0.000") for v in arr.compressed()
    ]  # lim 0.06: two significant digits
    assert fig.axes[1].get_ylabel() == "delta_accuracy"  # the colour bar
    big = pd.DataFrame([dict(layer=l, head=h, value=0.1) for l in range(12) for h in range(16)])
    fig = F.head_map_figure(big, n_layers=12, n_heads=16, label="d", title="t")
    assert not fig.axes[0].texts


def example_frame() -> pd.DataFrame:
    words = ["The", "cat", "sat"]
    rows = [
        dict(
            example="e",
            role="r",
            relation="",
            direction="",
            layer=1,
            head=2,
            level="word",
            sentence="The cat sat",
            query_index=i,
            key_index=j,
            query_word=words[i],
            key_word=words[j],
            weight=float(j == max(i - 1, 0)),
            gold=(i, j) == (2, 1),
        )  # fmt: skip
        for i in range(3)
        for j in range(3)
    ]
    return pd.DataFrame(rows, columns=F.EXAMPLE_COLUMNS)


def test_example_heatmap_is_the_attention_and_gold_is_outlined():
    ex = example_frame()
    fig = F.example_figure(ex)
    ax = fig.axes[0]
    mesh = next(c for c in ax.collections if isinstance(c, QuadMesh))
    pivot = ex.pivot_table(index="query_index", columns="key_index", values="weight")
    np.testing.assert_allclose(np.asarray(mesh.get_array()).reshape(3, 3), pivot.to_numpy())
    gold = [p for p in ax.patches if isinstance(p, Rectangle) and not p.get_fill()]
    assert [(p.get_x(), p.get_y()) for p in gold] == [(1, 2)]  # key "cat" (column 1), query "sat" (row 2)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["The", "cat", "sat"]
    assert ax.get_title() == "L1H2"
    assert F.example_figure(ex.iloc[:0]) is None


def test_diff_heatmaps_are_the_deltas_and_mark_changed_verdicts():
    rows = [
        dict(
            role=role,
            layer=l,
            head=h,
            delta=(0.5 if role == "a" else 0.1) * (l - h),
            change="gained" if (role, l, h) == ("a", 1, 0) else "",
        )  # fmt: skip
        for role in ("a", "b")
        for l in range(2)
        for h in range(2)
    ]
    diff = pd.DataFrame(rows)
    fig = F.diff_figure(diff, n_layers=2, n_heads=2)
    ax_a, ax_b = fig.axes[:2]
    assert (ax_a.get_title(), ax_b.get_title()) == ("a", "b")  # largest change first
    for ax, role in ((ax_a, "a"), (ax_b, "b")):
        mesh = next(c for c in ax.collections if isinstance(c, QuadMesh))
        want = diff[diff["role"] == role].pivot_table(index="layer", columns="head", values="delta").to_numpy()
        np.testing.assert_allclose(np.asarray(mesh.get_array()).reshape(2, 2), want)
        assert mesh.norm.vmin == pytest.approx(-0.5) and mesh.norm.vmax == pytest.approx(0.5)
    assert [(t.get_text(), t.get_position()) for t in ax_a.texts] == [("+", (0.5, 1.5))]


@pytest.mark.parametrize("name,make", list(all_figures()))
def test_pngs_are_deterministic_and_style_does_not_leak(name, make):
    before = dict(plt.rcParams)
    # seaborn's own global state is untouched too (no set_theme at import or per call)
    a, b = F.png_bytes(make()), F.png_bytes(make())
    assert a[:8] == b"\x89PNG\r\n\x1a\n" and a == b
    assert b"tIME" not in a  # no timestamp chunk
    after = dict(plt.rcParams)
    assert {k for k in before if before[k] != after[k]} == set()


def test_import_does_not_change_global_style():
    import importlib
    import subprocess
    import sys

    code = (
        "import matplotlib; matplotlib.use('Agg'); import matplotlib.pyplot as plt; b = dict(plt.rcParams);"
        "import headscope.reports.figures; a = dict(plt.rcParams);"
        "print(sorted(k for k in b if b[k] != a[k] and k != 'backend'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"
    assert importlib.import_module("headscope.reports.figures").theme is not None
