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
import shutil
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from headscope.data import path
from headscope.reports import checkpoint_report
from headscope.reports.checkpoint_inputs import read_checkpoints, step_of, unique_labels
from headscope.reports.cli.app import main
from headscope.reports.tools.experiments.checkpoint_figures import PLANTED, write_example_checkpoints

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide" / "checkpoints.md"


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """``root/out/checkpoint-{100,200}`` (MiniLM, and MiniLM with :data:`PLANTED` silenced),
    ``root/tiny`` (random 3 × 4 BERT) and ``root/broken`` (a corrupt weights file): the docs'
    example checkpoints (:func:`write_example_checkpoints`) and one that cannot load."""
    root = write_example_checkpoints(tmp_path_factory.mktemp("ckpts"))
    shutil.copytree(root / "tiny", root / "broken")
    (root / "broken" / "model.safetensors").write_bytes(b"\x00" * 64)
    return root


def _small(config, text):
    """The report's stages made small: the positional roles on 12 lines, single-head zero ablation on 4 items."""
    from headscope.analyses.pruning.study import PruneConfig
    from headscope.analyses.roles.config import RolesConfig

    return replace(
        config,
        role_groups=("positional",),
        role_inputs={"text": str(text)},
        roles_config=RolesConfig(n_boot=50, n_perm=100, n_perm_max=200),
        prune_config=PruneConfig(quick=True, studies=("ablation",), ablation_modes=("zero",), n_items=4, n_boot=20),
    )


@pytest.fixture(scope="module")
def compared(ckpts, tmp_path_factory):
    """``headscope report out/ tiny broken --only roles,pruning --json`` (stages made small):
    ``(exit code, JSON printed, out folder)``."""
    import contextlib
    import io

    from headscope.analyses.roles.pipeline import default_text

    text = tmp_path_factory.mktemp("text") / "text.txt"
    text.write_text("".join(open(default_text(), encoding="utf-8").readlines()[:12]), encoding="utf-8")
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


def test_a_bad_line_in_a_checkpoint_list_is_named(ckpts, tmp_path, capsys):
    listing = tmp_path / "list.txt"
    listing.write_text(f"{ckpts / 'tiny'}\n{ckpts / 'tiny' / 'config.json'}\n")
    assert main(["report", "--checkpoints", str(listing), "--out", str(tmp_path / "never")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "config.json: a config file, not a checkpoint" in err
    assert not (tmp_path / "never").exists()


def test_a_rerun_may_replace_its_comparison_and_nothing_else(compared):
    _, _, out = compared
    cks = read_checkpoints([str(out.parent / "out"), str(out.parent / "tiny"), str(out.parent / "broken")])
    assert checkpoint_report.check_out(out, cks) == out  # an earlier comparison and its reports: replaced
    (out / "mine.txt").write_text("x")
    try:
        with pytest.raises(ValueError, match="mine.txt, which headscope did not write"):
            checkpoint_report.check_out(out, cks)
    finally:
        (out / "mine.txt").unlink()


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


def test_the_docs_quote_the_regenerated_example():
    """docs/guide/checkpoints.md quotes data/figures/checkpoints_minilm.json (make checkpoints), and
    the planted difference holds in it: the zeroed heads' importance is 0 at step 200 only."""
    doc = json.loads(path("figures/checkpoints_minilm.json").read_text(encoding="utf-8"))
    page = GUIDE.read_text(encoding="utf-8")
    figs = {f"{g}.{n}": f for g, group in doc["figures"].items() for n, f in group.items()}
    missing = {n: figs[n]["text"] for n in doc["quoted"] if figs[n]["text"] not in page}
    assert not missing, f"docs/guide/checkpoints.md lacks (run make checkpoints): {missing}"
    for layer, head in PLANTED:
        before, after = figs[f"planted.L{layer}H{head}"]["value"]
        assert before > 1e-4 and after == 0.0
    assert figs["roles.upstream"]["value"] == 0.0 and figs["matching.tiny"]["value"] == {"0": 1, "1": 3, "2": 5}


# The Ray runs go in their own process: a session that already holds a Ray cluster (the sharded-stage
# tests' pools hold every CPU of it) would queue the jobs' tasks behind those actors for ever.
_RAY_RUN = """
import json, pickle, sys
from headscope.reports import checkpoint_report
from headscope.reports.stages.sharded import RayConfig
cks, cfg, out = pickle.load(open(sys.argv[1], "rb"))
r = checkpoint_report.compare_checkpoints(cks, cfg, out, ray=RayConfig(workers=2))
print(json.dumps(sorted(r.failed)))
"""

# the tiny checkpoint's worker killed once it has claimed its report folder (its pid in the folder's
# lock, ``.tiny.lock``, while its analyses run); the pid that claims it next is the retry's
_RAY_KILL = """
import json, os, pickle, signal, sys, threading, time
from pathlib import Path
from headscope.reports import checkpoint_report
from headscope.reports.stages.sharded import RayConfig
cks, cfg, out = pickle.load(open(sys.argv[1], "rb"))
lock, pids, done = Path(out) / ".tiny.lock", [], threading.Event()

def ray_worker(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::")
    except OSError:
        return False

def watch():
    while not done.is_set():
        try:
            pid = int(lock.read_text().strip() or 0)
        except (OSError, ValueError):
            pid = 0
        if pid and pid not in pids and ray_worker(pid):
            pids.append(pid)
            if len(pids) == 1:
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)

threading.Thread(target=watch, daemon=True).start()
notices = []
r = checkpoint_report.compare_checkpoints(cks, cfg, out, ray=RayConfig(workers=2), notice=notices.append)
done.set()
print(json.dumps({"failed": sorted(r.failed), "pids": pids, "notices": notices}))
"""


@pytest.fixture(scope="module")
def on_one(ckpts, tmp_path_factory):
    """The tiny and the broken checkpoint (stages made small) in one process: ``(checkpoints,
    config, result, out)``, what the Ray runs must reproduce."""
    from headscope.analyses.roles.pipeline import default_text
    from headscope.reports.stages.config import RunConfig

    tmp = tmp_path_factory.mktemp("on_one")
    text = tmp / "text.txt"
    text.write_text("".join(open(default_text(), encoding="utf-8").readlines()[:12]), encoding="utf-8")
    cks = read_checkpoints([str(ckpts / "tiny"), str(ckpts / "broken")])
    cfg = _small(RunConfig(only=("roles", "pruning")), text)
    return cks, cfg, checkpoint_report.compare_checkpoints(cks, cfg, tmp / "one"), tmp / "one"


def _in_a_process(script: str, cks, cfg, out: Path) -> str:
    """``script`` run on ``(cks, cfg, out)`` in a fresh Python (its own local Ray cluster): its last line."""
    import pickle
    import subprocess
    import sys

    job = out.with_name(out.name + ".pkl")
    job.write_bytes(pickle.dumps((cks, cfg, out)))
    run = subprocess.run([sys.executable, "-c", script, str(job)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout.strip().splitlines()[-1]


def _same_tables(mine: Path, theirs: Path, names=("checkpoint_heads", "role_emergence")) -> None:
    for name in names:
        a, b = (pd.read_parquet(d / "tables" / f"{name}.parquet") for d in (mine, theirs))
        assert b.equals(a), name


@pytest.mark.slow  # a local Ray cluster: ~40 s on a loaded 2-core machine
def test_on_ray_the_jobs_write_what_they_write_in_one_process(on_one, tmp_path):
    """Two checkpoints and a broken one as Ray tasks on two workers (a fresh process, its own local
    cluster): the same tables as one process, the broken one counted."""
    pytest.importorskip("ray")
    cks, cfg, one, one_out = on_one
    failed = json.loads(_in_a_process(_RAY_RUN, cks, cfg, tmp_path / "ray"))
    assert sorted(one.failed) == failed == ["broken"]
    _same_tables(one_out, tmp_path / "ray")


@pytest.mark.slow  # a local Ray cluster, one job run twice: ~60 s on a loaded 2-core machine
def test_a_job_whose_worker_is_killed_runs_again_on_another_once(on_one, tmp_path):
    """The tiny checkpoint's Ray worker killed (``SIGKILL``) while its analyses run: Ray runs the job
    again on another worker; its report and the comparison equal the one-process run's, and nothing is
    written twice: the checkpoint is told once, its folder holds what one process writes (no
    half-written staging folder of the killed worker beside it, no second copy)."""
    pytest.importorskip("ray")
    cks, cfg, one, one_out = on_one
    out = tmp_path / "ray"
    got = json.loads(_in_a_process(_RAY_KILL, cks, cfg, out))
    killed, *again = got["pids"]
    assert len(again) == 1 and again[0] != killed, got  # claimed again by one other worker process
    assert got["failed"] == sorted(one.failed) == ["broken"]
    assert [n.split(":")[0] for n in got["notices"]] == ["tiny", "broken"], got["notices"]
    assert "report written" in got["notices"][0]
    _same_tables(one_out, out)
    _same_tables(one_out / "tiny", out / "tiny", names=("roles", "prune_ablation"))

    def files(root):
        return sorted(str(p.relative_to(root)) for p in root.rglob("*"))

    assert files(out) == files(one_out)  # no staging folder, lock or second copy left
