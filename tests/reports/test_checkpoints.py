"""``headscope report CKPT1 CKPT2 …``: one report per checkpoint and a comparison across them.

The checkpoints are real: MiniLM saved with ``save_pretrained`` as ``out/checkpoint-100``, and a
copy whose attention output (W_O) of heads L1H3 and L4H7 is zeroed as ``out/checkpoint-200`` (the
planted difference: those heads' importance must fall to exactly 0, and no role score of layers 0
and 1 may move, since their attention does not depend on what a head writes); a random 3 × 4 BERT
(another size, matched by depth fraction); and a checkpoint whose weights file is corrupt (its
report fails, the others run). One command runs them all, with small stage settings.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pandas as pd
import pytest
import torch

from headscope.reports import checkpoint_report
from headscope.reports.checkpoint_inputs import read_checkpoints, step_of, unique_labels
from headscope.reports.cli.app import main

PLANTED = [(1, 3), (4, 7)]  # heads whose W_O is zeroed in checkpoint-200


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """``root/out/checkpoint-{100,200}`` (MiniLM, and MiniLM with :data:`PLANTED` silenced),
    ``root/tiny`` (random 3 × 4 BERT) and ``root/broken`` (a corrupt weights file)."""
    from transformers import AutoModel, AutoTokenizer, BertConfig, BertModel

    from headscope.probes.models.checkpoints import resolve

    root = tmp_path_factory.mktemp("ckpts")
    src = resolve("minilm-l6").path
    model, tok = AutoModel.from_pretrained(src), AutoTokenizer.from_pretrained(src)
    for step in (100, 200):
        if step == 200:
            d = model.config.hidden_size // model.config.num_attention_heads
            with torch.no_grad():
                for layer, head in PLANTED:
                    model.encoder.layer[layer].attention.output.dense.weight[:, head * d : (head + 1) * d] = 0
        model.save_pretrained(root / "out" / f"checkpoint-{step}")
        tok.save_pretrained(root / "out" / f"checkpoint-{step}")
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=64, num_hidden_layers=3, num_attention_heads=4)
    BertModel(cfg).save_pretrained(root / "tiny")
    tok.save_pretrained(root / "tiny")
    (root / "broken").mkdir()
    (root / "broken" / "config.json").write_text((root / "tiny" / "config.json").read_text())
    tok.save_pretrained(root / "broken")
    (root / "broken" / "model.safetensors").write_bytes(b"\x00" * 64)
    return root


def _small(config, text):
    """The report's stages made small: the positional roles on 24 lines, single-head zero ablation on 6 items."""
    from headscope.analyses.pruning.study import PruneConfig
    from headscope.analyses.roles.config import RolesConfig

    return replace(
        config,
        role_groups=("positional",),
        role_inputs={"text": str(text)},
        roles_config=RolesConfig(n_boot=50, n_perm=100, n_perm_max=200),
        prune_config=PruneConfig(quick=True, studies=("ablation",), ablation_modes=("zero",), n_items=6, n_boot=20),
    )


@pytest.fixture(scope="module")
def compared(ckpts, tmp_path_factory):
    """``headscope report out/ tiny broken --only roles,pruning --json`` (stages made small):
    ``(exit code, JSON printed, out folder)``."""
    import contextlib
    import io

    from headscope.analyses.roles.pipeline import default_text

    text = tmp_path_factory.mktemp("text") / "text.txt"
    text.write_text("".join(open(default_text(), encoding="utf-8").readlines()[:24]), encoding="utf-8")
    out = ckpts / "compared"
    orig = checkpoint_report.compare_checkpoints
    mp = pytest.MonkeyPatch()
    mp.setattr(
        checkpoint_report, "compare_checkpoints", lambda cks, cfg, o, **kw: orig(cks, _small(cfg, text), o, **kw)
    )
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            code = main(
                ["report", str(ckpts / "out"), str(ckpts / "tiny"), str(ckpts / "broken")]
                + ["--only", "roles,pruning", "--json", "--out", str(out)]
            )
    finally:
        mp.undo()
    return code, json.loads(buf.getvalue()), out


def _table(out, name):
    return pd.read_parquet(out / "tables" / f"{name}.parquet")


def test_a_failed_checkpoint_is_counted_named_and_the_others_run(compared):
    code, printed, out = compared
    assert code == 1  # a report failed: non-zero, after the others ran
    runs = _table(out, "checkpoint_runs")
    assert runs["checkpoint"].tolist() == ["checkpoint-100", "checkpoint-200", "tiny", "broken"]
    assert runs["step"].tolist()[:2] == [100, 200] and pd.isna(runs["step"].iloc[2])
    assert runs["status"].tolist() == ["ran", "ran", "ran", "failed"]
    assert "model.safetensors" in runs["error"].iloc[3]
    assert printed["failed"] == 1 and [c["status"] for c in printed["checkpoints"]][-1] == "failed"
    for label in ("checkpoint-100", "checkpoint-200", "tiny"):  # each its own complete report
        assert json.loads((out / label / "run.json").read_text())["output"]["kind"] == "report"
    md = (out / "comparison.md").read_text(encoding="utf-8")
    assert "1 checkpoint failed" in md and "broken (" in md


def test_the_planted_heads_importance_falls_to_zero(compared):
    _, _, out = compared
    heads = _table(out, "checkpoint_heads").drop_duplicates(["checkpoint", "layer", "head"])
    imp = heads.set_index(["checkpoint", "layer", "head"])["importance"]
    assert (
        heads["importance_metric"][heads["checkpoint"] != "tiny"] == "|delta_cosine_to_unpruned| (ablation:zero)"
    ).all()
    for layer, head in PLANTED:
        assert imp[("checkpoint-100", layer, head)] > 1e-4
        assert imp[("checkpoint-200", layer, head)] == 0.0
    zero = heads[(heads["importance"] == 0) & heads["checkpoint"].str.startswith("checkpoint-")]
    assert sorted(zip(zero["checkpoint"], zero["layer"], zero["head"])) == [("checkpoint-200", *h) for h in PLANTED]
    ic = _table(out, "checkpoint_importance_changes")  # headscope diff's importance changes, 100 → 200
    d = ic[ic["metric"] == "delta_cosine_to_unpruned"].set_index(["layer", "head"])
    for h in PLANTED:
        assert d.loc[h, "value_b"] == 0.0 and d.loc[h, "value_a"] < -1e-4


def test_roles_below_the_planted_heads_do_not_move_and_later_ones_do(compared):
    _, _, out = compared
    rc = _table(out, "checkpoint_role_changes")
    assert set(zip(rc["from_checkpoint"], rc["to_checkpoint"])) == {("checkpoint-100", "checkpoint-200")}
    moved = rc.groupby("layer")["delta"].apply(lambda s: s.abs().max())
    assert (moved[[0, 1]] == 0).all(), moved  # attention in layers 0-1 is upstream of every zeroed W_O
    assert (moved[[2, 3, 4, 5]] > 1e-3).all(), moved


def test_another_size_is_matched_by_depth_fraction_and_says_so(compared):
    _, _, out = compared
    heads = _table(out, "checkpoint_heads")
    mini = heads[heads["checkpoint"] != "tiny"]
    assert (mini["matching"] == "position").all() and (mini["matched_head"] == mini["head"]).all()
    tiny = heads[heads["checkpoint"] == "tiny"].drop_duplicates("layer").set_index("layer")
    assert (tiny["matching"] == "depth fraction").all() and tiny["matched_head"].isna().all()
    assert tiny["matched_layer"].to_dict() == {0: 1, 1: 3, 2: 5}  # centres 1/6, 1/2, 5/6 of 6 layers
    meta = json.loads((out / "comparison.json").read_text())
    assert meta["reference"] == "checkpoint-100" and meta["matching"]["depth fraction"] == ["tiny"]
    assert any("tiny" in n and "depth fraction" in n for n in meta["notes"])


def test_the_comparison_writes_tables_figures_html_and_markdown(compared):
    _, _, out = compared
    em = _table(out, "role_emergence")
    assert set(em["checkpoint"]) == {"checkpoint-100", "checkpoint-200", "tiny"}
    assert em["share"].between(0, 1).all()
    for name in ("role_emergence", "importance_by_step"):
        assert (out / "figures" / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    html = (out / "comparison.html").read_text(encoding="utf-8")
    assert html.count("data:image/png;base64,") == 2 and "depth fraction" in html
    assert "figures/role_emergence.png" in (out / "comparison.md").read_text(encoding="utf-8")


# ----------------------------------------------------------------------------- bad input, no job run
def test_a_path_that_is_not_a_checkpoint_is_one_line_exit_2_before_any_job(ckpts, tmp_path, capsys):
    out = tmp_path / "never"
    code = main(["report", str(ckpts / "tiny"), str(tmp_path / "nope"), "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert str(tmp_path / "nope") in err and "expected an HF model folder" in err
    (tmp_path / "empty").mkdir()
    assert main(["report", str(ckpts / "tiny"), str(tmp_path / "empty"), "--out", str(out)]) == 2
    assert "empty: not a checkpoint" in capsys.readouterr().err
    assert not out.exists()  # nothing ran, nothing written


def test_a_foreign_out_folder_is_refused_before_any_job(ckpts, tmp_path, capsys):
    out = tmp_path / "busy"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["report", str(ckpts / "tiny"), str(ckpts / "out" / "checkpoint-100"), "--out", str(out)]) == 2
    assert "holds no earlier checkpoint comparison" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_checkpoint_lists_and_step_folders(ckpts, tmp_path):
    for step in (1000, 20, 300):  # ordered by step number, not by name
        (tmp_path / "run" / f"checkpoint-{step}").mkdir(parents=True)
        (tmp_path / "run" / f"checkpoint-{step}" / "config.json").write_text(
            (ckpts / "tiny" / "config.json").read_text()
        )
    got = read_checkpoints([str(tmp_path / "run")])
    assert [(c.label, c.step) for c in got] == [
        ("checkpoint-20", 20),
        ("checkpoint-300", 300),
        ("checkpoint-1000", 1000),
    ]
    listing = tmp_path / "list.txt"
    listing.write_text(f"# two\n\nrun/checkpoint-300\n{ckpts / 'tiny'}\n")  # relative to the list's folder
    got = read_checkpoints([], listing)
    assert [c.model for c in got] == [str(tmp_path / "run" / "checkpoint-300"), str(ckpts / "tiny")]
    (tmp_path / "final").mkdir()
    (tmp_path / "final" / "trainer_state.json").write_text('{"global_step": 750}')
    assert step_of(tmp_path / "final") == 750
    assert unique_labels(["a", "a", "b"]) == ["a", "a-2", "b"]
    (tmp_path / "none.txt").write_text("# nothing yet\n")
    with pytest.raises(ValueError, match="lists no checkpoint"):
        read_checkpoints([], tmp_path / "none.txt")
