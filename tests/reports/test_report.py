"""The report: frames -> HTML / Markdown / tables / run.json, atomic folder, diff.

Rendering is checked on synthetic frames with planted content (exact values must reach
the page); the end-to-end run on MiniLM checks the real pipeline once per session.
"""

from __future__ import annotations

import base64
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from headscope.analyses import run_json
from headscope.analyses.frames import EXAMPLE_COLUMNS, IMPACT_COLUMNS, ROLE_COLUMNS, STAT_COLUMNS, roles_frame
from headscope.reports import html as report_html
from headscope.reports import pipeline
from headscope.reports.stages import frames as run_frames
from headscope.reports.stages import runner

N_LAYERS, N_HEADS = 6, 12


# ----------------------------------------------------------------- synthetic frames
def synthetic_frames(seed: int = 0, shift: float = 0.0) -> dict[str, pd.DataFrame]:
    """MiniLM-shaped frames: planted roles on known heads, every head scored per role."""
    rng = np.random.default_rng(seed)
    planted = {
        "positional:previous": {(1, 3): 0.95, (2, 5): 0.91},
        "punctuation": {(4, 0): 0.62, (1, 3): 0.45},  # L1H3 holds two roles
        "syntactic": {(3, 7): 0.71},
        "coreference": {},  # no head passes
    }
    rows = []
    for role, heads in planted.items():
        rel = "nsubj" if role == "syntactic" else ""
        direction = "dep->head" if role == "syntactic" else ""
        for l in range(N_LAYERS):
            for h in range(N_HEADS):
                score = heads.get((l, h), float(rng.uniform(0.05, 0.25)))
                if role == "coreference":
                    score = 0.30 + 0.001 * (l * N_HEADS + h)
                if role == "syntactic" and (l, h) == (3, 7):
                    score += shift
                base = 0.2
                hit = (l, h) in heads
                rows.append(
                    dict(
                        layer=l,
                        head=h,
                        role=role,
                        relation=rel,
                        direction=direction,
                        score=score,
                        baseline=base,
                        margin=score - base,
                        ci_low=score - 0.03,
                        ci_high=score + 0.03,
                        p_value=1e-4 if hit else 0.5,
                        n=120,
                        verdict=hit,
                    )
                )
    roles = roles_frame(rows)
    stats = pd.DataFrame(
        [
            dict(layer=l, head=h, metric=m, value=(1.0 + 0.2 * l if m == "entropy" else 2.0 + 0.5 * l) + 0.01 * h, n=50)
            for m in ("entropy", "distance")
            for l in range(N_LAYERS)
            for h in range(N_HEADS)
        ],
        columns=STAT_COLUMNS,
    )
    words = ["The", "cat", "sat", "on", "the", "mat", "."]
    n = len(words)
    prev = [[1.0 if j == max(i - 1, 0) else 0.0 for j in range(n)] for i in range(n)]
    punct = [[1.0 if j == n - 1 else 0.0 for j in range(n)] for i in range(n)]
    # as analyses.roles.build_examples gives them: {key: record}
    examples = run_frames.examples_frame(
        {
            "positional:previous": {
                "role": "positional:previous",
                "relation": "",
                "direction": "",
                "layer": 1,
                "head": 3,
                "words": words,
                "word_pattern": prev,
                "marks": [],
            },
            "punctuation": {
                "role": "punctuation",
                "relation": "",
                "direction": "",
                "layer": 4,
                "head": 0,
                "words": words,
                "word_pattern": punct,
                "marks": [],
            },
            "syntactic:nsubj:dep->head": {
                "role": "syntactic",
                "relation": "nsubj",
                "direction": "dep->head",
                "layer": 3,
                "head": 7,
                "words": words,
                "word_pattern": prev,
                "marks": [[1, 2]],
            },
        }
    )
    imp = []
    for study, slope in (("importance", 0.2), ("reverse", 1.4)):
        for step, f in enumerate(np.linspace(0, 1, 6)):
            imp.append(("curve:" + study, np.nan, np.nan, step, f, "accuracy", 0.9 - slope * 0.6 * f, 0.0, 0, 200))
            imp.append(("curve:" + study, np.nan, np.nan, step, f, "query_heads_pruned", 72 * f, np.nan, 0, 200))
    for s in range(3):
        for step, f in enumerate(np.linspace(0, 1, 6)):
            imp.append(("curve:random", np.nan, np.nan, step, f, "accuracy", 0.9 - 0.5 * f + 0.02 * s, 0.0, s, 200))
    curves = pd.DataFrame(imp, columns=IMPACT_COLUMNS)
    ablation = pd.DataFrame(
        [
            ("ablation:zero", l, h, 0, 0.0, "delta_accuracy", -0.3 if (l, h) == (1, 3) else -0.001 * h, 0.01, 0, 200)
            for l in range(N_LAYERS)
            for h in range(N_HEADS)
        ],
        columns=IMPACT_COLUMNS,
    )
    baseline = pd.DataFrame(
        [("baseline", np.nan, np.nan, 0, 0.0, "accuracy", 0.9, 0.012, 0, 200)], columns=IMPACT_COLUMNS
    )
    rvi = pd.DataFrame(
        [
            dict(
                role="positional:previous",
                k=2,
                metric="accuracy",
                value_role=0.41,
                value_random_mean=0.86,
                value_random_std=0.03,
                n_draws=20,
            ),
            dict(
                role="punctuation",
                k=2,
                metric="accuracy",
                value_role=0.85,
                value_random_mean=0.86,
                value_random_std=0.03,
                n_draws=20,
            ),
        ]
    )
    skipped = run_frames.skipped_frame(
        {"syntactic": {"longer than max_positions": 3, "no aligned words": 1}, "coreference": {}}
    )
    return {
        "roles": roles,
        "stats": stats,
        "examples": examples,
        "prune_curves": curves,
        "prune_ablation": ablation,
        "prune_baseline": baseline,
        "roles_vs_importance": rvi,
        "skipped": skipped,
    }


@pytest.fixture(scope="module")
def minilm_card():
    from headscope.probes.models.card import model_card, render_card

    card = model_card("minilm-l6")
    return card, render_card(card)


def _meta(**kw):
    meta = dict(
        model="minilm-l6",
        backend="inhouse",
        full=False,
        seed=0,
        sha256="ab" * 32,
        model_file={"name": "model.safetensors", "sha256": "ab" * 32},
        versions=run_json.versions(),
        timings={"roles": 1.0},
        n_items={"roles": 120},
        config={},
    )
    meta.update(kw)
    return meta


@pytest.fixture(scope="module")
def synthetic_report(tmp_path_factory, minilm_card):
    card, text = minilm_card
    out = tmp_path_factory.mktemp("rep") / "report-synth"
    frames = synthetic_frames()
    paths = pipeline.write_report(frames, card=card, card_text=text, meta=_meta(), out_dir=out)
    return frames, paths


class _Imgs(HTMLParser):
    def __init__(self):
        super().__init__()
        self.imgs, self.external, self.tables, self.th = [], [], 0, 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "img":
            self.imgs.append(a)
        # an inline <script> (the head view's code and JSON) is part of the page; one with src, or a <link>, is not
        if (
            (tag == "script" and "src" in a)
            or tag == "link"
            or (tag != "a" and any(str(v).startswith(("http:", "https:", "//")) for v in a.values() if v))
        ):
            self.external.append((tag, a))
        self.tables += tag == "table"
        self.th += tag == "th"


def test_html_self_contained_and_accessible(synthetic_report):
    frames, paths = synthetic_report
    html = paths["html"].read_text()
    p = _Imgs()
    p.feed(html)
    assert p.external == []  # no script, stylesheet link or remote resource
    names = {
        "role_map",
        "example_positional-previous",
        "example_punctuation",
        "example_syntactic-nsubj-dep-head",
        "stats_by_layer",
        "pruning_curves",
        "ablation_map",
        "causal_evidence",
    }
    assert len(p.imgs) == len(names)
    for img in p.imgs:
        assert img["src"].startswith("data:image/png;base64,")
        png = base64.b64decode(img["src"].split(",", 1)[1])
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 2000
        assert len(img["alt"]) > 40  # a description, not a filename
    assert p.tables >= 6 and p.th > 20


def test_html_carries_the_planted_findings(synthetic_report, minilm_card):
    frames, paths = synthetic_report
    html = paths["html"].read_text()
    assert "12 heads × 32 = 384" in html  # the card
    for role in ("positional:previous", "punctuation", "syntactic"):
        assert f"Role: {role}" in html
    assert "Role: coreference" not in html  # no head holds it: listed in one table instead
    # top head of each role with its numbers
    assert "L1H3" in html and "0.950" in html and "L4H0" in html and "0.620" in html
    assert "expected links: &#x27;cat&#x27;→&#x27;sat&#x27; (0.00)" in html  # the gold arc, which this head misses
    assert "No head passes the threshold for 1 role (coreference)" in html
    assert "<td>coreference</td><td>L5H11</td>" in html  # its best-scoring head
    # 4 heads hold a role, one (L1H3) holds two
    assert "4 of minilm-l6&#x27;s 72 heads hold at least one role" in html and "1 holds more than one" in html
    # causal evidence beside the role, with the caveat
    assert "ablating its top 2 heads gives accuracy = 0.410; ablating 2 random heads gives 0.860 ± 0.030" in html
    assert "-15.0 sd from random" in html
    assert "Jain &amp; Wallace 2019" in html and "Wiegreffe &amp; Pinter 2019" in html
    # skipped items with reasons
    assert "4 items were skipped" in html and "longer than max_positions" in html
    assert "Unpruned model: accuracy = 0.900 (bootstrap SE 0.012, 200 items)" in html
    assert "the largest change is L1H3 (-0.3000)" in html
    assert "Multi-head attention: every query head has its own key-value head" in html
    assert "ab" * 32 in html


def test_markdown_tables_and_run_json(synthetic_report):
    frames, paths = synthetic_report
    out = paths["out_dir"]
    md = paths["markdown"].read_text()
    figs = re.findall(r"!\[[^\]]*\]\((figures/[^)]+\.png)\)", md)
    assert len(figs) == 8 and all((out / f).read_bytes()[:4] == b"\x89PNG" for f in figs)
    assert "| L1H3 |" in md and "0.950" in md and "Jain & Wallace 2019" in md
    for name in ("roles", "stats", "examples", "prune_curves", "prune_ablation", "roles_vs_importance", "skipped"):
        back = pd.read_parquet(out / "tables" / f"{name}.parquet")
        pd.testing.assert_frame_equal(back, frames[name].reset_index(drop=True), check_dtype=False)
        assert (out / "tables" / f"{name}.csv").exists()
    roles = pd.read_csv(out / "tables" / "roles.csv")
    assert list(roles.columns) == ROLE_COLUMNS
    run = json.loads(paths["run_json"].read_text())
    assert run["trust_remote_code"] is False
    assert run["skipped"] == {"syntactic": {"longer than max_positions": 3, "no aligned words": 1}}
    assert run["architecture"] == {"layers": 6, "heads": 12, "kv_heads": 12}
    assert set(run["versions"]) >= {"torch", "transformers", "transformer_lens", "headscope"}
    assert run["versions"]["torch"].startswith("2.")
    assert not list(out.parent.glob("*.tmp-*"))


def test_prune_tables_become_report_tables_by_field():
    """The role ablation is ``roles_vs_importance`` because of the field it sits in, not
    its columns; every other study table is ``prune_<its file name>``."""
    from headscope.analyses.pruning.study import PruneTables

    fr = synthetic_frames()
    tables = PruneTables(
        baseline=fr["prune_baseline"],
        curves=fr["prune_curves"],
        role_ablation=fr["roles_vs_importance"],
    )
    out = run_frames.prune_frames(tables)
    assert list(out) == ["prune_baseline", "roles_vs_importance", "prune_curves"]
    pd.testing.assert_frame_equal(out["roles_vs_importance"], fr["roles_vs_importance"].reset_index(drop=True))
    assert tables.by_file().keys() == {"baseline", "roles", "curves"}  # the prune folder's file names


def test_pruning_curves_average_random_seeds():
    from headscope.reports.figures import curve_rows
    from headscope.reports.sections.pruning import curves_frame

    c = curve_rows(curves_frame(synthetic_frames()))
    assert set(c["metric"]) == {"accuracy"}  # head counts are not plotted
    r = c[(c["study"] == "random") & (c["fraction_pruned"] == 0.0)].iloc[0]
    assert r["n_seeds"] == 3 and r["value"] == pytest.approx(0.92) and r["spread"] == pytest.approx(0.02)
    imp = c[(c["study"] == "importance") & (c["fraction_pruned"] == 1.0)].iloc[0]
    assert imp["value"] == pytest.approx(0.78) and imp["spread"] == 0.0


def test_gqa_groups_from_the_card(tmp_path):
    from headscope.probes.models.card import model_card, render_card

    card = model_card("smollm2-135m")
    fr = synthetic_frames()
    fr = {k: v for k, v in fr.items() if k in ("skipped", "prune_baseline")}  # only the GQA figure to draw
    paths = pipeline.write_report(
        fr, card=card, card_text=render_card(card), meta=_meta(model="smollm2-135m"), out_dir=tmp_path / "r"
    )
    html = paths["html"].read_text()
    assert "GQA groups: each KV head is shared by 3 query heads" in html
    assert '<td class="num">0</td><td>0, 1, 2</td>' in html and '<td class="num">2</td><td>6, 7, 8</td>' in html
    assert "KV head 1 is read by query heads 3–5" in html


# ----------------------------------------------------------------- atomicity
def test_failed_write_leaves_no_folder_and_keeps_the_old_one(tmp_path, minilm_card, monkeypatch):
    card, text = minilm_card
    out = tmp_path / "rep"
    frames = {
        k: v for k, v in synthetic_frames().items() if k in ("skipped", "prune_baseline", "stats")
    }  # one figure: fast

    def boom(*a, **k):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(report_html, "render_html", boom)
    with pytest.raises(RuntimeError, match="disk on fire"):
        pipeline.write_report(frames, card=card, card_text=text, meta=_meta(), out_dir=out)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no <out>, no leftover tmp
    monkeypatch.undo()
    pipeline.write_report(frames, card=card, card_text=text, meta=_meta(seed=1), out_dir=out)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    monkeypatch.setattr(report_html, "render_html", boom)
    with pytest.raises(RuntimeError):
        pipeline.write_report(frames, card=card, card_text=text, meta=_meta(seed=2), out_dir=out)
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before and json.loads((out / "run.json").read_text())["seed"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep"]


def test_refuses_to_replace_a_folder_that_is_not_a_report(tmp_path, minilm_card):
    card, text = minilm_card
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("precious")
    with pytest.raises(ValueError, match="not a headscope report"):
        pipeline.write_report(synthetic_frames(), card=card, card_text=text, meta=_meta(), out_dir=tmp_path / "mine")
    assert (tmp_path / "mine" / "thesis.tex").read_text() == "precious"


def test_examples_frame_from_records():
    import torch

    ex = run_frames.examples_frame(
        {
            "syntactic:det:dep->head": {
                "role": "syntactic",
                "relation": "det",
                "direction": "dep->head",
                "layer": 3,
                "head": 7,
                "words": ["a", "b"],
                "word_pattern": torch.tensor([[0.1, 0.9], [0.7, 0.3]]),
                "marks": [[0, 1]],
            },
            "broken": {"layer": 0, "head": 0, "words": ["a"], "word_pattern": [[0.5, 0.5]]},
        }
    )  # shape mismatch: left out
    assert ex.shape == (4, len(EXAMPLE_COLUMNS)) and set(ex["example"]) == {"syntactic:det:dep->head"}
    assert ex.loc[(ex.query_word == "a") & (ex.key_word == "b"), "weight"].item() == pytest.approx(0.9)
    assert ex["gold"].tolist() == [False, True, False, False]
    assert set(ex["relation"]) == {"det"} and set(ex["sentence"]) == {"a b"} and set(ex["level"]) == {"word"}
    # a [CLS]-looking head: its word rows hold 0.1 of the attention, so the token map is drawn
    sink = run_frames.examples_frame(
        {
            "special": {
                "role": "special",
                "layer": 2,
                "head": 7,
                "words": ["hi", "there"],
                "word_pattern": [[0.05, 0.05], [0.05, 0.05]],
                "tokens": ["[CLS]", "hi", "there", "[SEP]"],
                "token_pattern": [[1, 0, 0, 0], [0.9, 0.05, 0.05, 0], [0.9, 0.05, 0.05, 0], [1, 0, 0, 0]],
                "marks": [[0, 1]],
            }
        }
    )
    assert set(sink["level"]) == {"token"} and len(sink) == 16 and not sink["gold"].any()
    assert sink.loc[(sink.query_word == "hi") & (sink.key_word == "[CLS]"), "weight"].item() == pytest.approx(0.9)


# ----------------------------------------------------------------- diff and CLI
def _run_folder(path: Path, roles: pd.DataFrame, ablation: pd.DataFrame | None = None) -> Path:
    from headscope.probes.outputs.atomic import write_frame

    write_frame(roles, path / "roles")
    if ablation is not None:
        write_frame(ablation, path / "ablation")
    return path


def test_diff_finds_planted_changes(tmp_path, capsys):
    from headscope.reports.cli.app import main

    fa = synthetic_frames()
    roles_b = fa["roles"].copy()
    syn = (roles_b.role == "syntactic") & (roles_b.layer == 3) & (roles_b["head"] == 7)
    roles_b.loc[syn, "score"] += 0.2  # 0.71 -> 0.91
    lost = (roles_b.role == "positional:previous") & (roles_b.layer == 2) & (roles_b["head"] == 5)
    roles_b.loc[lost, "verdict"] = False
    gained = (roles_b.role == "punctuation") & (roles_b.layer == 0) & (roles_b["head"] == 0)
    roles_b.loc[gained, ["score", "verdict"]] = [0.9, True]
    abl_b = fa["prune_ablation"].copy()
    abl_b.loc[(abl_b.layer == 1) & (abl_b["head"] == 3), "value"] = -0.05
    a = _run_folder(tmp_path / "a", fa["roles"], fa["prune_ablation"])
    b = _run_folder(tmp_path / "b", roles_b, abl_b)
    assert main(["diff", str(a), str(b), "--out", str(tmp_path / "d"), "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "gained 1: L0H0 punctuation" in out and "lost 1: L2H5 positional:previous" in out
    assert "L3H7 syntactic:nsubj dep->head: 0.710 → 0.910 (+0.200)" in out
    assert "importance ablation:zero L1H3 delta_accuracy: -0.3 → -0.05 (+0.25)" in out
    # the planted punctuation head (0.138 -> 0.9) takes the lead; the other roles keep their top 3
    assert "top-3 heads per role: the same heads in 3 of 4 roles (3 in the same order)" in out
    assert "top heads differ in: punctuation" in out
    top = pd.read_parquet(tmp_path / "d" / "tables" / "top_heads.parquet").set_index("role")
    assert top.loc["punctuation", "top_b"] == "L0H0 L4H0 L1H3" and top.loc[
        "punctuation", "max_abs_delta"
    ] == pytest.approx(0.9 - 0.1380754, abs=1e-6)
    rc = pd.read_parquet(tmp_path / "d" / "tables" / "role_changes.parquet")
    assert len(rc) == 4 * 72 and rc["change"].value_counts().to_dict() == {
        "none": 282,
        "kept": 4,
        "gained": 1,
        "lost": 1,
    }
    row = rc[(rc.layer == 3) & (rc["head"] == 7) & (rc.role == "syntactic")].iloc[0]
    assert row["delta"] == pytest.approx(0.2) and row["change"] == "kept"
    ic = pd.read_parquet(tmp_path / "d" / "tables" / "importance_changes.parquet")
    assert ic.iloc[0][["layer", "head"]].tolist() == [1, 3] and ic.iloc[0]["delta"] == pytest.approx(0.25)
    assert (tmp_path / "d" / "figures" / "role_score_deltas.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((tmp_path / "d" / "diff.json").read_text())["verdict_changes"]["gained"] == 1


def test_diff_refuses_other_architecture(tmp_path, capsys):
    from headscope.reports.cli.app import main

    a = _run_folder(tmp_path / "a", synthetic_frames()["roles"])
    other = synthetic_frames()["roles"].copy()
    other["layer"] = other["layer"] * 5  # 26 layers
    b = _run_folder(tmp_path / "b", other)
    assert main(["diff", str(a), str(b), "--out", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "same architecture" in err and "6 × 12" in err and "26 × 12" in err
    assert not (tmp_path / "d").exists()


def test_report_cli_refuses_a_foreign_out_folder_before_running(tmp_path, capsys):
    from headscope.reports.cli.app import main

    (tmp_path / "notes.txt").write_text("mine")
    assert main(["report", "--model", "minilm-l6", "--out", str(tmp_path), "--quiet"]) == 2
    assert "not a headscope report" in capsys.readouterr().err
    assert main(["report", "minilm-l6", "--model", "smollm2-135m", "--out", str(tmp_path / "x")]) == 2
    assert "MODEL given twice" in capsys.readouterr().err


# ----------------------------------------------------------------- the real run (MiniLM, quick)
def real_report_dir(tmp_path_factory) -> Path:
    """Build the MiniLM report once per test session, shared with test_browser.py and, under
    xdist, by every worker (the session's folder above the workers' own, a lock while the first
    one builds it). Lighter than the CLI default to keep the suite short: 80 text lines, the
    hand-written treebank, 12 pruning items, importance vs 2 random orders."""
    import fcntl
    import os

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    out = root / "real-report-minilm-l6"
    with open(root / "real-report-minilm-l6.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (out / "run.json").exists():
            _build_real_report(out)
    return out


def _build_real_report(out: Path) -> None:
    from headscope.analyses.pruning.study import PruneConfig
    from headscope.analyses.roles.config import RolesConfig
    from headscope.data import path as data_path
    from headscope.probes.corpora import read_text

    text = list(read_text(data_path("text/sentences.txt")).lines)[:80]
    pipeline.build_report(
        "minilm-l6",
        out_dir=out,
        quiet=True,
        roles_config=RolesConfig(seed=0, n_boot=200),
        prune_config=PruneConfig(
            quick=True,
            seed=0,
            n_items=12,
            ablation_modes=("zero",),
            orders=("importance", "random"),
            n_random_seeds=2,
            role_draws=3,
            studies=("ablation", "importance", "curves"),
        ),
        role_inputs={"text": text, "conllu": [data_path("syntax/handwritten.conllu")]},
    )


@pytest.fixture(scope="session")
def real_report(tmp_path_factory):
    return real_report_dir(tmp_path_factory)


@pytest.mark.slow
def test_real_report_minilm(real_report):
    import hashlib

    from headscope.probes.models.checkpoints import resolve

    out = real_report
    for rel in (
        "report.html",
        "report.md",
        "run.json",
        "tables/roles.csv",
        "tables/roles.parquet",
        "tables/stats.csv",
        "tables/prune_curves.parquet",
        "tables/roles_vs_importance.csv",
        "figures/role_map.png",
        "figures/pruning_curves.png",
    ):
        assert (out / rel).is_file(), rel
    html = (out / "report.html").read_text()
    assert "12 heads × 32 = 384" in html
    roles = pd.read_csv(out / "tables" / "roles.csv", keep_default_na=False)
    assert list(roles.columns) == ROLE_COLUMNS
    assert roles[["layer", "head"]].drop_duplicates().shape[0] == 72
    held = set(roles.loc[roles["verdict"].astype(str) == "True", "role"])
    unheld = set(roles["role"]) - held
    assert held and all(f"Role: {r}" in html for r in held)
    assert all(f"<td>{r}</td>" in html for r in unheld)
    # MiniLM's L0H2 attends to the previous token (measured: 1.00 of its max-attention on offset -1)
    prev = roles[(roles.role == "positional:previous") & (roles.layer == 0) & (roles["head"] == 2)].iloc[0]
    assert prev["score"] > 0.95 and str(prev["verdict"]) == "True"
    assert '<section id="pruning"><h2>Pruning</h2>' in html
    p = _Imgs()
    p.feed(html)
    assert len(p.imgs) >= 5 and p.external == []
    for img in p.imgs:
        assert img["src"].startswith("data:image/png;base64,") and len(img["src"]) > 1000 and len(img["alt"]) > 40
    # pruning by gradient importance keeps the output closer than random orders (measured 0.83 vs 0.74 at 50%)
    curves = pd.read_parquet(out / "tables" / "prune_curve_summary.parquet")
    end = curves[(curves.metric == "cosine_to_unpruned") & (curves.fraction_pruned == curves.fraction_pruned.max())]
    by = dict(zip(end["study"], end["value"]))
    assert by["curve:importance"] > by["curve:random"] + 0.05
    run = json.loads((out / "run.json").read_text())
    weights = resolve("minilm-l6").path / "model.safetensors"
    assert run["model_file"]["name"] == "model.safetensors"
    assert run["model_file"]["sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert run["trust_remote_code"] is False and run["seed"] == 0
    assert {"card", "load", "roles", "pruning", "figures", "write"} <= set(run["timings"])
    assert run["config"]["pruning"]["n_items"] == 12 and run["architecture"] == {
        "layers": 6,
        "heads": 12,
        "kv_heads": 12,
    }
    md = (out / "report.md").read_text()
    assert "12 heads × 32 = 384" in md and "![" in md


def test_crash_mid_run_leaves_no_report(tmp_path, monkeypatch, minilm_card):
    """A stage that raises after the model is loaded: no <out>, and an older report stays."""

    def boom(*a, **k):
        raise RuntimeError("roles stage crashed")

    monkeypatch.setattr(runner, "run_stages", boom)  # after the model is loaded
    with pytest.raises(RuntimeError, match="roles stage crashed"):
        pipeline.build_report("minilm-l6", out_dir=tmp_path / "rep", quiet=True)
    assert list(tmp_path.iterdir()) == []
    card, text = minilm_card
    pipeline.write_report(
        {"skipped": run_frames.skipped_frame({})},
        card=card,
        card_text=text,
        meta=_meta(seed=7),
        out_dir=tmp_path / "rep",
    )
    with pytest.raises(RuntimeError):
        pipeline.build_report("minilm-l6", out_dir=tmp_path / "rep", quiet=True)
    assert json.loads((tmp_path / "rep" / "run.json").read_text())["seed"] == 7
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep"]
