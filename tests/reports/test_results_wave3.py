"""Reading runs back and comparing them, and what reaches the report (issue #29).

1. ``headscope diff`` against a run whose scores are NaN (all or some): the NaN rows are
   counted, left out of the comparison and reported; a side with no finite score says so.
2. ``load_run`` checks each table's columns and dtypes against the documented schema and
   refuses, in one line naming the file and the column, a table that does not hold them
   (numeric strings are not taken for numbers).
3. Every user-derived string (a coreference ``kind``, the model's name, file names, words)
   reaches report.md escaped, and report.html escaped too: built from a real coreference
   run on MiniLM with hostile kinds.
"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from cli_checks import cli_error
from test_report import _meta

from headscope.analyses.frames import IMPACT_COLUMNS
from headscope.data import path
from headscope.reports import pipeline
from headscope.reports.cli.app import main
from headscope.reports.stages import frames as run_frames

# ------------------------------------------------------------- 3. escaping in the report

KINDS = [
    "<script>alert(1)</script>",
    "a|b",
    "[x](javascript:alert(1))",
    "`tick` *em* _u_ #h &amp; ~~s~~",
    "two\n# lines",
    "$\\frac$",  # matplotlib mathtext: a figure title must not parse it
]
MODEL = "<img src=x onerror=alert(1)>|m"
SKIPPED_FILE = "evil<b>|[f](javascript:x).conllu"
WORD = "<u>table</u>"


class _Page(HTMLParser):
    """Tags, attributes and text of an HTML page; the text of each table row's cells."""

    def __init__(self):
        super().__init__()
        self.tags, self.text, self.rows, self._row, self._in = [], [], [], None, []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._in.append(tag)
        if tag == "tr":
            self._row = []
            self.rows.append(self._row)
        elif tag in ("td", "th") and self._row is not None:
            self._row.append("")

    def handle_endtag(self, tag):
        if self._in and self._in[-1] == tag:
            self._in.pop()

    def handle_data(self, data):
        if self._in and self._in[-1] == "script":
            return
        self.text.append(data)
        if self._row is not None and self._in and self._in[-1] in ("td", "th"):
            self._row[-1] += data


def _parse(html: str) -> _Page:
    p = _Page()
    p.feed(html)
    return p


@pytest.fixture(scope="module")
def hostile_report(minilm, tmp_path_factory):
    """A report from a real coreference run on MiniLM whose items carry hostile kinds (and
    one hostile word), one head per kind planted to hold the role (so each kind gets its
    section, table and example figure), a hostile model name and a hostile skipped file."""
    from headscope.analyses.roles.config import RolesConfig
    from headscope.analyses.roles.pipeline import head_roles
    from headscope.probes.models.card import model_card, render_card

    tmp = tmp_path_factory.mktemp("hostile")
    items = [json.loads(line) for line in path("coref/coref.jsonl").read_text(encoding="utf-8").splitlines()[:12]]
    jsonl = tmp / "coref.jsonl"
    with jsonl.open("w", encoding="utf-8") as f:
        for i, item in enumerate(items):
            item["kind"] = KINDS[(i // 2) % len(KINDS)]
            if i == 0:
                item["words"] = [WORD if w == "table" else w for w in item["words"]]
            f.write(json.dumps(item) + "\n")
    rr = head_roles(minilm, coref=jsonl, roles=["coreference"], cfg=RolesConfig(n_boot=100, n_perm=500))
    roles = rr.frame.copy()
    assert set(roles["role"]) == {f"coreference:{k}" for k in KINDS}  # the kinds reached the frame as they are
    best = roles.sort_values("score", ascending=False).drop_duplicates("role").index
    roles.loc[best, "verdict"] = True  # planted: one head per kind holds its role
    frames = {
        "roles": roles,
        "examples": run_frames.examples_frame(rr.examples),
        "coref_pairs": rr.coref_pairs.reset_index(drop=True),
        "skipped": run_frames.skipped_frame({**rr.skipped, SKIPPED_FILE: {"malformed line": 2}}),
    }
    card = model_card("minilm-l6")
    paths = pipeline.write_report(
        frames, card=card, card_text=render_card(card), meta=_meta(model=MODEL), out_dir=tmp / "report"
    )
    return paths


def _markdown_as_html(md: str) -> str:
    markdown_it = pytest.importorskip("markdown_it")  # CommonMark + GFM tables (comes with rich)
    return markdown_it.MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"]).render(md)


def test_report_markdown_escapes_every_user_string(hostile_report):
    md = hostile_report["markdown"].read_text(encoding="utf-8")
    page = _parse(_markdown_as_html(md))
    tags = [t for t, _ in page.tags]
    # nothing the values hold became markup: no script, image other than the figures, link,
    # emphasis, code, strikethrough or heading beyond the report's own
    assert "script" not in tags and "a" not in tags and "u" not in tags and "b" not in tags
    assert {t for t in tags} <= {"h1", "h2", "h3", "p", "em", "strong", "blockquote", "img", "pre", "code"} | {
        "table",
        "thead",
        "tbody",
        "tr",
        "th",
        "td",
    }
    imgs = [a for t, a in page.tags if t == "img"]
    assert imgs and all(re.fullmatch(r"figures/[\w-]+\.png", a["src"]) for a in imgs)
    assert "onerror" not in {k for a in imgs for k in a}
    assert sum(t == "h1" for t in tags) == 1
    assert sum(t == "code" for t in tags) == sum(t == "pre" for t in tags) == 1  # the model card, fenced
    assert sum(t == "strong" for t in tags) == md.count("> **Note.** ")  # only the notes' own bold
    # every table row has as many cells as its header: no value split a cell
    tables = re.findall(r"<table>.*?</table>", _markdown_as_html(md), flags=re.S)
    assert len(tables) >= len(KINDS) + 2  # a top-heads table per kind, the skipped and the run tables
    for t in tables:
        widths = {len(r) for r in _parse(t).rows}
        assert len(widths) == 1, t[:300]
    # and each value reads as itself
    text = "".join(page.text)
    for kind in KINDS:
        shown = " ".join(kind.split())  # a line break reads as a space, as in the HTML page
        assert f"Role: coreference:{shown}" in text
        assert f"coreference:{shown}" in [c.strip() for r in page.rows for c in r] or shown in text
    assert f"What the attention heads of {MODEL} do" in text
    assert MODEL in [c.strip() for r in page.rows for c in r]  # the run table's model cell
    assert SKIPPED_FILE in [c.strip() for r in page.rows for c in r]
    assert "Jain & Wallace 2019" in md  # a plain & stays as it is


def test_report_html_escapes_every_user_string(hostile_report):
    html = hostile_report["html"].read_text(encoding="utf-8")
    page = _parse(html)
    scripts = [a for t, a in page.tags if t == "script"]
    assert scripts == [{"type": "application/json", "id": "head-view-data"}, {}]  # the head view's own two
    assert all(a["href"].startswith("#") for t, a in page.tags if t == "a")  # the contents' own links only
    assert not [t for t, _ in page.tags if t in ("u", "b")]
    assert all(a["src"].startswith("data:image/png;base64,") for t, a in page.tags if t == "img")
    text = "".join(page.text)
    for kind in KINDS:
        assert f"Role: coreference:{kind}" in text
    assert f"What the attention heads of {MODEL} do" in text and SKIPPED_FILE in text
    # the head view's JSON holds the kinds, with no way out of its <script>
    data = html.split('<script type="application/json" id="head-view-data">', 1)[1].split("</script>", 1)[0]
    assert "<" not in data and f"coreference:{KINDS[0]}" in json.loads(data)["colours"]


# ------------------------------------------------------------- 1. NaN scores in diff

ROLES = pd.DataFrame(
    {
        "layer": [0, 0, 1],
        "head": [0, 1, 0],
        "role": ["r", "r", "r"],
        "relation": "",
        "direction": "",
        "score": [0.9, 0.5, 0.1],
        "verdict": [True, False, False],
        "n": 10,
    }
)


def _impact(values) -> pd.DataFrame:
    """Single-head ablation of L1H0, one row per seed."""
    return pd.DataFrame(
        [("ablation:zero", 1, 0, 0, 0.0, "delta_accuracy", v, None, seed, 8) for seed, v in enumerate(values)],
        columns=IMPACT_COLUMNS,
    )


def _run(folder: Path, roles: pd.DataFrame | None = ROLES, impact: pd.DataFrame | None = None) -> Path:
    folder.mkdir(parents=True)
    if roles is not None:
        roles.to_csv(folder / "roles.csv", index=False)
    if impact is not None:
        impact.to_csv(folder / "ablation.csv", index=False)
    return folder


def test_diff_against_a_run_with_no_finite_score_is_refused(tmp_path, capsys):
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b", ROLES.assign(score=np.nan, verdict=False))
    line = cli_error(capsys, "diff", a, b, "--out", tmp_path / "d")
    assert "nothing to compare between" in line
    assert "run B: none of its 3 role rows has a finite score (NaN: r 3)" in line
    assert "no role row has a finite score in both runs" in line
    assert not (tmp_path / "d").exists()
    both = _run(tmp_path / "c", ROLES.assign(score=np.nan))
    assert "run A: none of its 3 role rows" in cli_error(capsys, "diff", both, b, "--out", tmp_path / "d")


def test_diff_says_which_run_has_no_finite_score(tmp_path, capsys):
    # importance can be compared, the roles cannot: every role row is 'unknown', none is 'none'
    a = _run(tmp_path / "a", impact=_impact([0.1]))
    b = _run(tmp_path / "b", ROLES.assign(score=np.nan, verdict=False), _impact([0.3]))
    assert main(["diff", str(a), str(b), "--out", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert "note: run B: none of its 3 role rows has a finite score (NaN: r 3)" in out
    assert "note: roles with no finite score in run B, not compared: r" in out
    assert "unknown (run B has no finite score) 3: L0H0 r, L0H1 r, L1H0 r" in out
    assert "importance ablation:zero L1H0 delta_accuracy: 0.1 → 0.3 (+0.2)" in out
    rc = pd.read_csv(tmp_path / "d" / "tables" / "role_changes.csv")
    assert rc["change"].tolist() == ["unknown (run B has no finite score)"] * 3
    doc = json.loads((tmp_path / "d" / "diff.json").read_text())
    assert doc["verdict_changes"] == {"gained": 0, "lost": 0, "kept": 0, "none": 0, "unknown": 3}
    assert doc["not_finite"]["run_b"]["roles"] == {"rows": 3, "nan": 3, "by_role": {"r": 3}}
    assert doc["not_finite"]["run_a"]["roles"] == {"rows": 3, "nan": 0, "by_role": {}}
    assert doc["top_heads"]["roles"] == 0 and any("run B: none of its 3" in n for n in doc["notes"])


def test_diff_counts_and_leaves_out_some_nan_heads(tmp_path, capsys):
    # L0H1 has no score in B; a seed of L1H0's ablation is NaN in A
    a = _run(tmp_path / "a", impact=_impact([0.1, np.nan]))
    b = _run(tmp_path / "b", ROLES.assign(score=[0.8, np.nan, 0.3]), _impact([0.3, 0.3]))
    assert main(["diff", str(a), str(b), "--out", str(tmp_path / "d"), "--top-heads", "2"]) == 0
    out = capsys.readouterr().out
    assert "note: run B: 1 of 3 role rows have no finite score (NaN: r 1)" in out
    assert "note: run A: 1 of 2 per-head importance rows have no finite value (NaN: ablation:zero 1)" in out
    assert "unknown (run B has no finite score) 1: L0H1 r" in out
    # the finite heads are compared, largest first; the mean of L1H0 in A is over its finite seed
    assert "L1H0 r: 0.100 → 0.300 (+0.200)" in out and "L0H0 r: 0.900 → 0.800 (-0.100)" in out
    assert "importance ablation:zero L1H0 delta_accuracy: 0.1 → 0.3 (+0.2)" in out
    rc = pd.read_csv(tmp_path / "d" / "tables" / "role_changes.csv")
    assert rc[["layer", "head", "change"]].values.tolist() == [
        [1, 0, "none"],
        [0, 0, "kept"],
        [0, 1, "unknown (run B has no finite score)"],  # no delta: last
    ]
    top = pd.read_csv(tmp_path / "d" / "tables" / "top_heads.csv").iloc[0]
    assert (top["top_a"], top["top_b"], top["max_abs_delta"]) == ("L0H0 L0H1", "L0H0 L1H0", pytest.approx(0.2))
    doc = json.loads((tmp_path / "d" / "diff.json").read_text())
    assert doc["verdict_changes"] == {"gained": 0, "lost": 0, "kept": 1, "none": 1, "unknown": 1}
    assert doc["not_finite"]["run_a"]["importance"] == {"rows": 2, "nan": 1, "by_study": {"ablation:zero": 1}}


def test_diff_of_runs_whose_finite_heads_do_not_meet(tmp_path, capsys):
    # A scores L0H0 and L0H1 only, B L1H0 only: the role is in both, no head in both (was a crash)
    a = _run(tmp_path / "a", ROLES.assign(score=[0.9, 0.5, np.nan]), _impact([0.1]))
    b = _run(tmp_path / "b", ROLES.assign(score=[np.nan, np.nan, 0.4]), _impact([0.2]))
    assert main(["diff", str(a), str(b), "--out", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert (
        "top-3 heads per role: the same heads in 0 of 1 roles (0 in the same order); "
        "no head has a finite score in both runs" in out
    )
    assert "unknown (run A has no finite score) 1: L1H0 r" in out
    assert "unknown (run B has no finite score) 2: L0H0 r, L0H1 r" in out


# ------------------------------------------------------------- 2. load_run checks the schema


@pytest.fixture(scope="module")
def real_runs(minilm, tmp_path_factory):
    """One folder of each kind, written by headscope itself (small runs): roles (MiniLM,
    positional, 12 lines), prune (the planted copy model), patch (activation and attribution
    patching of the planted induction model), report (synthetic frames) and diff (the
    report against itself)."""
    from pruning_cases import alternating, planted_copy_model
    from test_report import synthetic_frames

    import headscope.probes.models.loading as loading
    from headscope.analyses.patching.study import StudyConfig, patching_study
    from headscope.analyses.patching.tasks import load_task
    from headscope.analyses.pruning.metrics import LMLoss
    from headscope.analyses.pruning.study import PruneConfig, pruning_study
    from headscope.probes.models.card import model_card, render_card
    from headscope.probes.models.inhouse.planted import planted_model, writing_induction
    from headscope.probes.outputs.atomic import write_frame, write_json
    from headscope.probes.outputs.folder import claim_output
    from headscope.probes.outputs.kinds import manifest_header

    base = tmp_path_factory.mktemp("runs")
    text = base / "t.txt"
    text.write_text("".join(path("text/sentences.txt").read_text(encoding="utf-8").splitlines(True)[:12]))
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(loading, "load_model", lambda *a, **k: minilm)
        argv = ["roles", "minilm-l6", "--roles", "positional", "--text", text, "--out", base / "roles", "--quiet"]
        assert main([str(a) for a in argv]) == 0
    finally:
        mp.undo()
    # a patch folder as `headscope patch` writes it (the frame of a real study, its writers)
    planted = writing_induction(planted_model())
    study = patching_study(planted, load_task(planted, "induction", n_items=6, seq_len=6), StudyConfig())
    with claim_output(base / "patch", "patch") as folder, folder.staging() as tmp:
        write_frame(study.frame, tmp / "patch")
        write_json({**manifest_header("patch"), **study.summary}, tmp / "run.json")
    copy = planted_copy_model()
    cfg = PruneConfig(metric="lm_loss", step=0.34, n_random_seeds=2, n_boot=20)
    pruning_study(copy, cfg, base / "prune", metric=LMLoss(copy, alternating(8, seed=2)))
    frames = {k: v for k, v in synthetic_frames().items() if k in ("roles", "stats", "prune_ablation", "skipped")}
    card = model_card("minilm-l6")
    pipeline.write_report(frames, card=card, card_text=render_card(card), meta=_meta(), out_dir=base / "report")
    assert main(["diff", str(base / "report"), str(base / "report"), "--out", str(base / "diff"), "--json"]) == 0
    return {kind: base / kind for kind in ("roles", "prune", "patch", "report", "diff")}


def _copy(real_runs, kind: str, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(real_runs[kind], tmp_path / kind))


def _rewrite(folder: Path, kind: str, stem: str, change, csv: bool = False) -> Path:
    """Apply ``change`` to table ``stem`` of ``folder`` (its Parquet, or its CSV with the
    Parquet removed) and return the file changed."""
    sub = folder / ("tables" if kind in ("report", "diff") else "")
    parquet, text = sub / f"{stem}.parquet", sub / f"{stem}.csv"
    if csv:
        parquet.unlink()
        df = pd.read_csv(text, keep_default_na=False, na_values=[""])
        change(df).to_csv(text, index=False)
        return text
    change(pd.read_parquet(parquet)).to_parquet(parquet, index=False)
    return parquet


def _first(df, column, value):
    df = df.copy()
    df[column] = df[column].astype(object)
    df.loc[df.index[0], column] = value
    return df


NUMBERS = r"must hold numbers \(empty where there is none\)"
SCHEMA_CASES = [
    # kind, table, change, CSV?, the error after "<file>: "
    (
        "roles",
        "roles",
        lambda d: d.drop(columns="p_value"),
        False,
        r"not a roles table \(missing column 'p_value'\); expected columns layer, head, role, relation, "
        r"direction, score, baseline, margin, ci_low, ci_high, p_value, n, verdict, p_raw, test",
    ),
    ("roles", "roles", lambda d: d.astype({"score": str}), False, rf"column 'score' {NUMBERS}; got the text '0\.\d+"),
    ("roles", "roles", lambda d: d.astype({"p_value": str}), False, rf"column 'p_value' {NUMBERS}; got the text"),
    ("roles", "roles", lambda d: d.astype({"verdict": int}), False, r"column 'verdict' must hold True or False; got"),
    (
        "roles",
        "roles",
        lambda d: d.astype({"n": float}).assign(n=2.5),
        False,
        r"column 'n' must hold integers; got 2\.5",
    ),
    ("roles", "roles", lambda d: _first(d, "score", "high"), True, rf"column 'score' {NUMBERS}; got 'high' in row 1$"),
    ("roles", "roles", lambda d: _first(d, "layer", ""), True, r"column 'layer' must hold integers; got an empty cell"),
    ("roles", "roles", lambda d: _first(d, "verdict", "maybe"), True, r"column 'verdict' .* got 'maybe' in row 1$"),
    ("roles", "roles", lambda d: d.assign(role=1), False, r"column 'role' must hold text; got 1 in row 1$"),
    ("roles", "roles_by_head", lambda d: d.astype({"n_roles": str}), False, r"column 'n_roles' .*; got the text '\d'"),
    ("prune", "ablation", lambda d: d.astype({"value": str}), False, rf"column 'value' {NUMBERS}; got the text"),
    (
        "prune",
        "curves",
        lambda d: _first(d.astype({"layer": float}), "layer", 1.5),
        False,
        r"column 'layer' must hold integers or empty cells; got 1\.5 in row 1$",
    ),
    (
        "prune",
        "prunable",
        lambda d: d.drop(columns="base_value"),
        False,
        r"not a prunable-fraction table \(missing column 'base_value'\)",
    ),
    ("patch", "patch", lambda d: d.astype({"effect": str}), False, rf"column 'effect' {NUMBERS}; got the text"),
    ("patch", "patch", lambda d: _first(d, "significant", "yes"), True, r"'significant' .*; got 'yes' in row 1$"),
    ("patch", "patch", lambda d: d.drop(columns="p_value"), False, r"not a patching table \(missing column 'p_value'"),
    ("report", "roles", lambda d: d.drop(columns="score"), False, r"not a roles table \(missing column 'score'\)"),
    ("report", "prune_ablation", lambda d: d.astype({"value": str}), False, rf"column 'value' {NUMBERS}; got the"),
    ("report", "stats", lambda d: _first(d, "value", "x"), True, rf"column 'value' {NUMBERS}; got 'x' in row 1$"),
    ("diff", "role_changes", lambda d: d.astype({"delta": str}), False, rf"column 'delta' {NUMBERS}; got the text"),
]


@pytest.mark.parametrize("kind, stem, change, csv, message", SCHEMA_CASES)
def test_load_run_checks_each_table_against_its_schema(real_runs, tmp_path, kind, stem, change, csv, message):
    from headscope.reports import load_run

    folder = _copy(real_runs, kind, tmp_path)
    load_run(folder)  # as headscope wrote it: read
    changed = _rewrite(folder, kind, stem, change, csv)
    with pytest.raises(ValueError) as err:
        load_run(folder)
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"{changed}: ") and re.search(message, line), line


def test_a_csv_cell_that_reads_as_a_number_is_a_number(real_runs, tmp_path):
    from headscope.reports import load_run

    folder = _copy(real_runs, "roles", tmp_path)
    _rewrite(folder, "roles", "roles", lambda d: _first(d, "score", "NaN"), csv=True)
    roles = load_run(folder).tables["roles"]
    assert roles["score"].dtype == "float64" and np.isnan(roles["score"].iloc[0])
    assert roles["score"].iloc[1:].notna().all()


def test_diff_refuses_numbers_stored_as_text(real_runs, tmp_path, capsys):
    # a report folder (read by load_run) and a folder of hand-written tables (read by diff itself)
    good = real_runs["report"]
    bad = _copy(real_runs, "report", tmp_path)
    changed = _rewrite(bad, "report", "roles", lambda d: d.astype({"score": str}))
    line = cli_error(capsys, "diff", good, bad, "--out", tmp_path / "d")
    assert f"{changed}: column 'score' must hold numbers" in line and "got the text" in line
    loose = tmp_path / "loose"
    loose.mkdir()
    ROLES.astype({"score": str}).to_parquet(loose / "roles.parquet", index=False)
    line = cli_error(capsys, "diff", loose, loose, "--out", tmp_path / "d")
    assert re.search(r"loose/roles\.parquet:row 1: score must be a finite number \(or empty\); got '0\.9'", line)
    (loose / "roles.parquet").unlink()
    ROLES.to_parquet(loose / "roles.parquet", index=False)
    _impact([0.1]).astype({"value": str}).to_parquet(loose / "ablation.parquet", index=False)
    line = cli_error(capsys, "diff", loose, loose, "--out", tmp_path / "d")
    assert re.search(r"loose/ablation\.parquet:row 1: value must be a finite number \(or empty\); got '0\.1'", line)
    assert not (tmp_path / "d").exists()


def test_the_schema_lists_agree_with_the_modules_that_write_the_tables():
    from headscope.analyses.frames import EXAMPLE_COLUMNS
    from headscope.analyses.patching.frames import PATCH_COLUMNS
    from headscope.analyses.pruning.ablation import ROLE_ABLATION_COLUMNS
    from headscope.analyses.pruning.curves import PRUNABLE_COLUMNS
    from headscope.analyses.roles.coreference import PAIR_COLUMNS
    from headscope.analyses.roles.pipeline import CLUSTER_DTYPES
    from headscope.reports import diff
    from headscope.reports.runs import _schemas
    from headscope.reports.stages.frames import SKIPPED_COLUMNS

    s = _schemas()
    assert list(s["patch"].columns) == PATCH_COLUMNS and list(s["role_ablation"].columns) == ROLE_ABLATION_COLUMNS
    assert list(s["prunable"].columns) == PRUNABLE_COLUMNS and list(s["coref_pairs"].columns) == PAIR_COLUMNS
    assert list(s["clusters"].columns) == list(CLUSTER_DTYPES) and list(s["examples"].columns) == EXAMPLE_COLUMNS
    assert list(s["skipped"].columns) == SKIPPED_COLUMNS
    assert list(s["role_changes"].columns) == diff.ROLE_CHANGE_COLUMNS
    assert list(s["importance_changes"].columns) == diff.IMPORTANCE_CHANGE_COLUMNS
    assert list(s["top_heads"].columns) == diff.TOP_HEADS_COLUMNS


@pytest.mark.filterwarnings("ignore:Glyph 27:UserWarning")  # the figure's title draws the escape as a box
def test_diff_prints_a_role_name_from_a_file_on_one_line_without_terminal_codes(tmp_path, capsys):
    name = "r\x1b[2J\nnext"  # a terminal escape and a line break, from a user's roles table
    a = _run(tmp_path / "a", ROLES.assign(role=name))
    b = _run(tmp_path / "b", ROLES.assign(role=name, verdict=[True, True, False]))
    assert main(["diff", str(a), str(b), "--out", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "gained 1: L0H1 r\\x1b[2J\\x0anext" in out.splitlines()
