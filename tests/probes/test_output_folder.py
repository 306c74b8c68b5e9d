"""Output folders: nothing of the user's is ever deleted, a folder is one run's complete
output or the previous one, and concurrent runs never mix (issue #12, items 1, 3, 5, 8, 9)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from cli_checks import cli_error

from headscope.probes.outputs import folder as of
from headscope.probes.outputs import kinds, swap
from headscope.probes.outputs.atomic import write_frame, write_json

TEXT = [
    "The cat sat on the mat.",
    "Heads can be pruned, and often are.",
    "A dog barked at the old man.",
    "She read the book that he wrote.",
    "Birds sing in the morning.",
]


@pytest.fixture
def text_file(tmp_path):
    p = tmp_path / "small.txt"
    p.write_text("\n".join(TEXT) + "\n")
    return p


@pytest.fixture
def no_model(monkeypatch):
    """Fail loudly if a command gets as far as loading a model."""
    import headscope.probes.models.loading as models

    def refuse(*a, **k):
        raise AssertionError("the model was loaded before --out was checked")

    monkeypatch.setattr(models, "load_model", refuse)


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------ 1. data loss


@pytest.mark.parametrize(
    "command", [["report", "minilm-l6", "--quiet"], ["roles", "minilm-l6", "--quiet"], ["prune", "minilm-l6"]]
)
def test_a_folder_with_a_run_json_and_user_files_is_refused_and_untouched(tmp_path, capsys, no_model, command):
    """The reported repro: x/run.json ('{}'), x/important.txt, x/src/ — deleted by `report --out x`."""
    x = tmp_path / "x"
    (x / "src").mkdir(parents=True)
    (x / "src" / "main.py").write_text("print('mine')\n")
    (x / "run.json").write_text("{}")
    (x / "important.txt").write_text("keep")
    before = _tree(x)
    err = cli_error(capsys, *command, "--out", x)
    assert str(x) in err and "not a headscope" in err
    assert _tree(x) == before and sorted(p.name for p in tmp_path.iterdir()) == ["x"]


def test_an_earlier_report_with_a_user_file_inside_is_refused(tmp_path, minilm_report_frames):
    frames, card, text, meta = minilm_report_frames
    from headscope.reports.pipeline import write_report

    out = tmp_path / "rep"
    write_report(frames, card=card, card_text=text, meta=meta, out_dir=out)
    (out / "notes.txt").write_text("my notes on this report")
    (out / "tables" / "mine.svg").write_text("<svg/>")
    before = _tree(out)
    with pytest.raises(ValueError, match=r"also notes.txt, tables/mine.svg, which headscope does not write"):
        write_report(frames, card=card, card_text=text, meta=meta, out_dir=out)
    assert _tree(out) == before
    (out / "notes.txt").unlink()
    (out / "tables" / "mine.svg").unlink()
    write_report(
        frames, card=card, card_text=text, meta={**meta, "seed": 5}, out_dir=out
    )  # a clean earlier report: replaced
    assert json.loads((out / "run.json").read_text())["seed"] == 5


def test_each_kind_refuses_the_others_folder(tmp_path, capsys, no_model):
    roles = tmp_path / "roles"
    roles.mkdir()
    write_json({**kinds.manifest_header("roles"), "model": "m"}, roles / "run.json")
    write_frame(pd.DataFrame({"layer": [0]}), roles / "roles")
    before = _tree(roles)
    err = cli_error(capsys, "prune", "minilm-l6", "--out", roles)  # used to overwrite the roles run.json
    assert "holds a headscope roles output; prune does not replace it" in err
    err = cli_error(capsys, "report", "minilm-l6", "--quiet", "--out", roles)
    assert "holds a headscope roles output; report does not replace it" in err
    assert _tree(roles) == before
    # outputs written before the manifest carried its kind are recognised by their keys
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "run.json").write_text(json.dumps({"model": "m", "roles": ["positional"], "config": {}, "n_items": {}}))
    assert kinds.output_kind_of(legacy) == "roles"
    of.check_output(legacy, "roles")
    with pytest.raises(ValueError, match="holds a headscope roles output"):
        of.check_output(legacy, "report")


# ------------------------------------------------------------------ 5. --out checked first


def test_out_that_is_a_file_or_under_one_fails_before_the_model_loads(tmp_path, capsys, no_model):
    f = tmp_path / "a-file"
    f.write_text("data")
    for command in (["roles", "minilm-l6", "--quiet"], ["report", "minilm-l6", "--quiet"], ["prune", "minilm-l6"]):
        assert "is a file, not a folder" in cli_error(capsys, *command, "--out", f)
        assert f"{f} is a file, not a folder" in cli_error(capsys, *command, "--out", f / "sub" / "out")
    assert f.read_text() == "data" and sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


# ------------------------------------------------------------------ 3. one swap, one run, never a mix


def test_swap_is_one_exchange_never_two_renames(tmp_path, monkeypatch):
    """With an existing folder, swap_in must not pass through a moment without ``out``."""
    out, tmp = tmp_path / "out", tmp_path / "out.tmp-1"
    out.mkdir()
    (out / "run.json").write_text('{"v": "old"}')
    tmp.mkdir()
    (tmp / "run.json").write_text('{"v": "new"}')
    if not swap.exchange(tmp, out):  # swapped them; swap back (and tell why the check cannot run)
        pytest.skip("this file system has no renameat2(RENAME_EXCHANGE)")
    swap.exchange(tmp, out)

    def no_rename(*a, **k):
        raise AssertionError("out was moved away: a kill here would leave no folder")

    monkeypatch.setattr(of.os, "replace", no_rename)
    monkeypatch.setattr(of.os, "rename", no_rename)
    swap.swap_in(tmp, out)
    assert json.loads((out / "run.json").read_text()) == {"v": "new"} and not tmp.exists()


def test_without_exchange_a_kill_between_the_renames_is_repaired(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADSCOPE_NO_EXCHANGE", "1")
    dead = int(
        subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout
    )
    out = tmp_path / "rep"
    old = tmp_path / f"rep.old-{dead}"
    old.mkdir()
    (old / "run.json").write_text(json.dumps({**kinds.manifest_header("report"), "seed": 3}))
    with of.claim_output(out, "report") as folder:
        assert folder.recovered and folder.recovered[0].startswith("restored the previous output")
        assert json.loads((out / "run.json").read_text())["seed"] == 3
        with folder.staging() as tmp:
            (tmp / "run.json").write_text(json.dumps({**kinds.manifest_header("report"), "seed": 4}))
    assert json.loads((out / "run.json").read_text())["seed"] == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep"]  # no old, no tmp, no lock file


def test_a_held_folder_is_refused_with_the_holder_pid(tmp_path, capsys, no_model):
    out = tmp_path / "roles"
    with of.claim_output(out, "roles"):
        code = subprocess.run(
            [sys.executable, "-m", "headscope.reports.cli", "roles", "minilm-l6", "--quiet", "--out", str(out)],
            capture_output=True,
            text=True,
            env=dict(os.environ, HF_HUB_OFFLINE="1"),
            timeout=120,
        )
    assert code.returncode == 2, code.stderr
    assert code.stderr.count("\n") == 1
    assert f"is being written by another headscope run (pid {os.getpid()})" in code.stderr
    assert not out.exists()
    with of.claim_output(out, "roles"):  # released: claimable again, and the lock file is gone after
        pass
    assert list(tmp_path.iterdir()) == []


def _roles_cli(out: Path, text: Path, seed: int) -> subprocess.Popen:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "headscope.reports.cli",
            "roles",
            "minilm-l6",
            "--roles",
            "positional,special",
            "--text",
            str(text),
            "--seed",
            str(seed),
            "--quiet",
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


@pytest.mark.slow
def test_two_concurrent_roles_runs_into_one_out_never_mix(tmp_path, text_file):
    """Reference outputs for seeds 1 and 2, then both at once into one --out: the folder
    ends as exactly one of the references (byte for byte, but for timings), and a run that
    did not write was refused with one line."""
    refs = {}
    for seed in (1, 2):
        p = _roles_cli(tmp_path / f"ref{seed}", text_file, seed)
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        refs[seed] = tmp_path / f"ref{seed}"

    def content(folder: Path) -> dict[str, object]:
        tree = _tree(folder)
        run = json.loads(tree.pop("run.json"))
        run.pop("timings")
        run.pop("memory", None)  # measured per run, like the timings (peak resident memory, what was free)
        return {**tree, "run.json": {k: v for k, v in run.items() if k != "inputs"}}

    assert content(refs[1]) != content(refs[2])  # the seeds must be told apart
    out = tmp_path / "shared"
    for attempt in range(2):  # once onto nothing, once onto an earlier output
        procs = {seed: _roles_cli(out, text_file, seed) for seed in (1, 2)}
        results = {seed: p.communicate(timeout=300) for seed, p in procs.items()}
        codes = {seed: p.returncode for seed, p in procs.items()}
        assert set(codes.values()) <= {0, 2} and 0 in codes.values(), (codes, results)
        for seed, code in codes.items():
            if code == 2:
                err = results[seed][1]
                assert err.count("\n") == 1 and "being written by another headscope run" in err, err
        final = content(out)
        assert final in (content(refs[1]), content(refs[2])), f"attempt {attempt}: a mix of two runs"
        winners = [s for s, c in codes.items() if c == 0]
        assert any(final == content(refs[s]) for s in winners)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["ref1", "ref2", "shared", "small.txt"]


# ------------------------------------------------------------------ orphans of killed writes


def test_orphan_tmp_files_of_killed_prune_writes_are_removed_and_user_files_kept(tmp_path):
    out = tmp_path / "prune"
    out.mkdir()
    write_json(
        {**kinds.manifest_header("prune"), "version": 1, "config": {}, "done": [], "curves": {}}, out / "state.json"
    )
    (out / ".curves.parquet.a1b2c3d4.tmp.parquet").write_bytes(b"PAR1 half")
    (out / ".state.json.x_9Yz0Qw.tmp").write_text("{")
    with of.claim_output(out, "prune") as folder:
        assert len(folder.recovered) == 2
    assert sorted(p.name for p in out.iterdir()) == ["state.json"]
    (out / ".notes.tmp").write_text("mine")  # not a name headscope writes: refused, kept
    with pytest.raises(ValueError, match=r"also .notes.tmp"):
        with of.claim_output(out, "prune"):
            pass
    assert (out / ".notes.tmp").read_text() == "mine"


# ------------------------------------------------------------------ 9. permissions


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o077])
def test_files_and_folders_follow_the_umask(tmp_path, mask):
    old = os.umask(mask)
    try:
        out = tmp_path / f"roles-{mask:o}"
        with of.claim_output(out, "roles") as folder, folder.staging() as tmp:
            write_json({**kinds.manifest_header("roles")}, tmp / "run.json")
            write_frame(pd.DataFrame({"a": [1.5]}), tmp / "roles")
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~mask
    for name in ("run.json", "roles.csv", "roles.parquet"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o666 & ~mask, name


# ------------------------------------------------------------------ 2. truncated pruning tables


def test_resume_refuses_a_curves_table_cut_short(tmp_path):
    from pruning_cases import alternating, planted_copy_model

    from headscope.analyses.pruning.metrics import LMLoss
    from headscope.analyses.pruning.study import PruneConfig, pruning_study
    from headscope.probes.errors import CheckpointError

    model = planted_copy_model()
    cfg = PruneConfig(metric="lm_loss", step=0.34, n_random_seeds=2, n_boot=20, studies=("curves",))
    metric = LMLoss(model, alternating(8, seed=2))
    out = tmp_path / "cut"
    first = pruning_study(model, cfg, out, metric=metric, step_limit=2)
    n = json.loads((out / "state.json").read_text())["rows"]["curves"]
    assert not first.complete and n > 5
    pd.read_parquet(out / "curves.parquet").iloc[:5].to_parquet(out / "curves.parquet")  # cut short
    with pytest.raises(CheckpointError, match=rf"curves.parquet holds 5 rows but state.json says {n} were committed"):
        pruning_study(model, cfg, out, metric=metric)
    (out / "curves.parquet").write_bytes(b"PAR1 not a parquet file")
    with pytest.raises(CheckpointError, match=r"curves.parquet: unreadable"):
        pruning_study(model, cfg, out, metric=metric)


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def minilm_report_frames():
    from headscope.probes.models.card import model_card, render_card
    from headscope.reports.stages import frames as stage_frames

    card = model_card("minilm-l6")
    frames = {"skipped": stage_frames.skipped_frame({})}
    meta = {"model": "minilm-l6", "backend": "inhouse", "seed": 0, "timings": {}, "config": {}}
    return frames, card, render_card(card), meta


# ------------------------------------------------------------------ 5. a full disk


@pytest.fixture
def small_disk(tmp_path):
    """A 512 KiB tmpfs (root only: skipped with the reason elsewhere)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(disk)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {proc.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_full_disk_is_one_line_and_the_earlier_output_stays(small_disk, text_file, capsys):
    out = small_disk / "roles"
    out.mkdir()
    write_json({**kinds.manifest_header("roles"), "model": "minilm-l6", "seed": "earlier"}, out / "run.json")
    before = _tree(out)
    fd = os.open(small_disk / "filler", os.O_WRONLY | os.O_CREAT)
    try:  # fill the disk, then leave ~8 KiB: the tables do not fit
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    os.truncate(small_disk / "filler", os.path.getsize(small_disk / "filler") - 8192)
    err = cli_error(capsys, "roles", "minilm-l6", "--roles", "positional", "--text", text_file, "--quiet", "--out", out)
    assert "no space left on device" in err, err
    assert _tree(out) == before
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler", "roles"]
