"""Output folders and export targets, issues #23 and #29: an empty ``--out`` folder is
claimed like a missing one; ``--export`` replaces only a headscope export (never a FIFO,
a device, a user's file); a killed run's staging folders are tidied only when they carry
headscope's marker; ``--out ''`` is refused; a symlinked ``--out`` is followed, never
replaced."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from cli_checks import cli_error

from headscope.probes.outputs import folder as of
from headscope.probes.outputs import kinds, markers
from headscope.probes.outputs.atomic import write_frame, write_json
from headscope.reports.cli.app import main

TEXT = ["The cat sat on the mat.", "Heads can be pruned, and often are.", "A dog barked at the old man."]

# every command with --out, as far as its --out check (a task, a model) needs
OUT_COMMANDS = {
    "report": ["report", "minilm-l6", "--quiet"],
    "roles": ["roles", "minilm-l6", "--quiet"],
    "prune": ["prune", "minilm-l6"],
    "patch": ["patch", "minilm-l6", "--task", "induction"],
}


class ReachedTheModel(ValueError):
    """Raised where a command loads its model: its --out was accepted."""


@pytest.fixture
def no_model(monkeypatch):
    """A command that gets as far as loading a model stops there with one line, exit 2."""
    import headscope.probes.models.loading as models

    def reached(*a, **k):
        raise ReachedTheModel("reached the model load")

    monkeypatch.setattr(models, "load_model", reached)


@pytest.fixture
def text_file(tmp_path):
    p = tmp_path / "small.txt"
    p.write_text("\n".join(TEXT) + "\n")
    return p


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(proc.stdout)


def _usage_error(capsys, *argv) -> str:
    """argparse's one line (``headscope roles: error: argument --out: ...``), exit 2."""
    rc = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


def _stage(out, run: str, kind: str = "roles") -> of.OutputFolder:
    """One run through the real claim and staging, writing a small ``kind`` output."""
    with of.claim_output(out, kind) as folder, folder.staging() as tmp:
        write_json({**kinds.manifest_header(kind), "run": run}, tmp / "run.json")
        write_frame(pd.DataFrame({"layer": [0], "head": [1]}), tmp / "roles")
    return folder


def _earlier_roles(out: Path, run: str = "earlier") -> dict[str, bytes]:
    out.mkdir(parents=True)
    write_json({**kinds.manifest_header("roles"), "run": run}, out / "run.json")
    write_frame(pd.DataFrame({"layer": [5], "head": [5]}), out / "roles")
    return _tree(out)


# ------------------------------------------------------------------ 1. an empty folder is claimed


@pytest.fixture(scope="module")
def roles_run(tmp_path_factory):
    """A real ``headscope roles`` run into an empty folder made first (as ``mktemp -d`` does),
    named through a symbolic link (as a folder on another disk is)."""
    base = tmp_path_factory.mktemp("roles-run")
    (base / "small.txt").write_text("\n".join(TEXT) + "\n")
    target = base / "made-first"
    target.mkdir(mode=0o700)
    link = base / "roles"
    link.symlink_to(target)
    args = ["roles", "minilm-l6", "--roles", "positional", "--text", base / "small.txt", "--quiet", "--out", link]
    rc = main([str(a) for a in args])
    return rc, link, target


def test_roles_claims_an_empty_folder_made_first(roles_run):
    rc, _, target = roles_run
    assert rc == 0
    assert kinds.output_kind_of(target) == "roles" and (target / "roles.parquet").is_file()
    assert sorted(p.name for p in target.parent.iterdir()) == ["made-first", "roles", "small.txt"]  # no tmp/old/lock


@pytest.mark.parametrize("command", sorted(OUT_COMMANDS))
def test_every_command_accepts_an_empty_out_folder(tmp_path, capsys, no_model, command):
    out = tmp_path / "empty"
    out.mkdir()
    assert cli_error(capsys, *OUT_COMMANDS[command], "--out", out).endswith("reached the model load")
    assert list(out.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["empty"]


@pytest.mark.parametrize("command", sorted(OUT_COMMANDS))
def test_dot_in_an_empty_working_folder_is_claimed(tmp_path, capsys, no_model, monkeypatch, command):
    """``cd "$(mktemp -d)" && headscope ... --out .``: used to fail with "PosixPath('.') has an empty name"."""
    cwd = tmp_path / "work"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    assert cli_error(capsys, *OUT_COMMANDS[command], "--out", ".").endswith("reached the model load")
    assert list(cwd.iterdir()) == []


def test_diff_report_and_prune_write_into_an_empty_folder(tmp_path, capsys, roles_run):
    from pruning_cases import alternating, planted_copy_model

    from headscope.analyses.pruning.metrics import LMLoss
    from headscope.analyses.pruning.study import PruneConfig, pruning_study
    from headscope.probes.models.card import model_card, render_card
    from headscope.reports import pipeline
    from headscope.reports.stages import frames as stage_frames

    _, _, run = roles_run
    diff_out = tmp_path / "diff"
    diff_out.mkdir()
    assert main(["diff", str(run), str(run), "--out", str(diff_out)]) == 0, capsys.readouterr().err
    assert kinds.output_kind_of(diff_out) == "diff" and (diff_out / "diff.json").is_file()

    card = model_card("minilm-l6")
    meta = {"model": "minilm-l6", "backend": "inhouse", "seed": 0, "timings": {}, "config": {}}
    rep = tmp_path / "report"
    rep.mkdir()
    pipeline.write_report(
        {"skipped": stage_frames.skipped_frame({})}, card=card, card_text=render_card(card), meta=meta, out_dir=rep
    )
    assert kinds.output_kind_of(rep) == "report" and (rep / "report.html").is_file()

    model = planted_copy_model()
    prune = tmp_path / "prune"
    prune.mkdir()
    cfg = PruneConfig(metric="lm_loss", step=0.34, n_random_seeds=1, n_boot=10, studies=("curves",))
    result = pruning_study(model, cfg, prune, metric=LMLoss(model, alternating(4, seed=2)))
    assert result.complete and (prune / "state.json").is_file() and (prune / "curves.parquet").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["diff", "prune", "report"]


def test_a_mount_point_is_refused_with_one_line(tmp_path, capsys, no_model):
    """A mount point cannot be renamed (EBUSY): it used to end in an internal error after the run."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        err = cli_error(capsys, *OUT_COMMANDS["roles"], "--out", mnt)
        assert f"--out {mnt} is a mount point" in err and f"--out {mnt / 'roles'}" in err
        assert list(mnt.iterdir()) == []
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


# ------------------------------------------------------------------ 2. export targets


@pytest.fixture(scope="module")
def cap(minilm):
    from headscope.probes.capture import capture

    return capture(minilm, TEXT[:2], quantities=["pattern"], layers=[0])


def _export_cli(capsys, target) -> str:
    return cli_error(capsys, "capture", "minilm-l6", "Hi there.", "--export", target)


def test_export_refuses_devices_fifos_sockets_and_folders_before_the_model_loads(tmp_path, capsys, no_model):
    """``--export /dev/full`` used to rename a temporary file over the device and exit 0."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    sock_path = tmp_path / "sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    try:
        for target, what in [
            ("/dev/full", "is a character device, not a regular file"),
            ("/dev/null", "is a character device, not a regular file"),
            (fifo, "is a FIFO (named pipe), not a regular file"),
            (sock_path, "is a socket, not a regular file"),
            (tmp_path, "is a folder"),
        ]:
            err = _export_cli(capsys, target)
            assert str(target) in err and what in err, err
    finally:
        sock.close()
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode) and stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert stat.S_ISSOCK(os.stat(sock_path).st_mode)


def test_export_of_a_link_to_a_device_is_refused_naming_both(tmp_path, capsys, no_model):
    link = tmp_path / "p.json"
    link.symlink_to("/dev/full")
    err = _export_cli(capsys, link)
    assert f"--export {link} (a symbolic link to /dev/full) is a character device" in err
    assert link.is_symlink() and os.readlink(link) == "/dev/full"


def test_empty_export_and_a_missing_folder_are_one_line(tmp_path, capsys, no_model):
    """``--export ''`` used to export nothing, silently, and exit 0."""
    assert "--export is empty; name a file" in _export_cli(capsys, "")
    assert "does not exist; create it first" in _export_cli(capsys, tmp_path / "missing" / "p.json")
    f = tmp_path / "a-file"
    f.write_text("x")
    assert f"{f} is a file, not a folder" in _export_cli(capsys, f / "p.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_an_existing_file_is_replaced_only_when_it_is_a_headscope_export(tmp_path, capsys, cap, no_model):
    from headscope.probes.export import EXPORT_MARK, write_patterns_json

    mine = tmp_path / "notes.json"
    mine.write_text('{"my": "notes"}\n')
    err = _export_cli(capsys, mine)
    assert f"--export {mine} exists and is not a headscope patterns export" in err and "move that one away" in err
    with pytest.raises(ValueError, match="is not a headscope patterns export"):
        write_patterns_json(cap, mine)
    assert mine.read_text() == '{"my": "notes"}\n'

    ours = tmp_path / "p.json"
    write_patterns_json(cap, ours, item=0)
    first = json.loads(ours.read_text())
    assert next(iter(first)) == "headscope" and first["headscope"] == EXPORT_MARK
    write_patterns_json(cap, ours, item=1)  # an earlier export: replaced
    assert json.loads(ours.read_text())["text"] == TEXT[1] != first["text"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.json", "p.json"]


def test_library_export_never_replaces_a_fifo(tmp_path, cap):
    from headscope.probes.export import write_patterns_json

    fifo = tmp_path / "p.json"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match=r"is a FIFO \(named pipe\), not a regular file"):
        write_patterns_json(cap, fifo)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and sorted(p.name for p in tmp_path.iterdir()) == ["p.json"]


def test_export_through_a_link_writes_its_target_and_keeps_the_link(tmp_path, cap):
    from headscope.probes.export import write_patterns_json

    target = tmp_path / "data" / "p.json"
    target.parent.mkdir()
    link = tmp_path / "p.json"
    link.symlink_to(target)
    write_patterns_json(cap, link, item=0)  # the link's target does not exist yet: created
    write_patterns_json(cap, link, item=1)  # and is now an earlier export: replaced
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert json.loads(target.read_text())["text"] == TEXT[1]
    assert sorted(p.name for p in target.parent.iterdir()) == ["p.json"]


def test_export_onto_a_full_disk_fails_with_one_line_and_leaves_nothing(tmp_path, capsys):
    disk = tmp_path / "disk"
    disk.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8k", "tmpfs", str(disk)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {proc.stderr.strip()}")
    try:  # an export of 12 heads x 6 layers is far more than 8 KiB
        assert "no space left on device" in _export_cli(capsys, disk / "p.json")
        assert list(disk.iterdir()) == []
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


# ------------------------------------------------------------------ 3. only what headscope wrote is tidied


def test_a_users_folders_named_like_staging_folders_are_left_alone(tmp_path, caplog):
    """A dead pid's ``roles.tmp-<pid>`` holding thesis.tex used to be deleted, and a
    ``roles.old-<pid>`` of the user's moved into ``--out``."""
    out = tmp_path / "roles"
    dead = _dead_pid()
    thesis = tmp_path / f"roles.tmp-{dead}"
    thesis.mkdir()
    (thesis / "thesis.tex").write_text("\\chapter{Heads}\n")
    old = tmp_path / f"roles.old-{dead}"
    (old / "figures").mkdir(parents=True)
    (old / "run.json").write_text("{}")  # a run.json that is not a headscope manifest
    (old / "figures" / "mine.png").write_bytes(b"\x89PNG")
    before = {p.name: _tree(p) for p in (thesis, old)}
    folder = _stage(out, "new")
    assert {p.name: _tree(p) for p in (thesis, old)} == before
    assert json.loads((out / "run.json").read_text())["run"] == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["roles", thesis.name, old.name])
    left = [line for line in folder.recovered if line.startswith("left ")]
    assert len(left) == 2, folder.recovered
    assert all("neither headscope's .headscope-staging marker nor the manifest" in line for line in left)
    assert any("(it holds thesis.tex)" in line for line in left)
    assert any("(it holds figures/, run.json)" in line for line in left)
    assert any(r.levelname == "WARNING" and "left roles.tmp-" in r.getMessage() for r in caplog.records)


def test_a_users_folder_at_this_pids_staging_name_is_refused_not_deleted(tmp_path):
    """Pid reuse: ``<out>.tmp-<our pid>`` was deleted before staging, whatever it held."""
    out = tmp_path / "roles"
    mine = tmp_path / f"roles.tmp-{os.getpid()}"
    mine.mkdir()
    (mine / "data.csv").write_text("a\n1\n")
    with pytest.raises(ValueError, match=r"is in the way \(headscope stages --out there\) and is not headscope's"):
        _stage(out, "new")
    assert (mine / "data.csv").read_text() == "a\n1\n" and not out.exists()


def test_without_exchange_a_users_old_folder_at_this_pid_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADSCOPE_NO_EXCHANGE", "1")
    out = tmp_path / "roles"
    earlier = _earlier_roles(out)
    mine = tmp_path / f"roles.old-{os.getpid()}"
    mine.mkdir()
    (mine / "data.csv").write_text("a\n1\n")
    with pytest.raises(ValueError, match=r"is in the way of the swap and is not headscope's"):
        _stage(out, "new")
    assert _tree(out) == earlier and (mine / "data.csv").read_text() == "a\n1\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["roles", mine.name]


def test_a_file_put_into_out_during_the_run_is_kept(tmp_path, caplog):
    """The previous folder was deleted whole after the swap, with what a user had put into it meanwhile."""
    out = tmp_path / "roles"
    _earlier_roles(out)
    with of.claim_output(out, "roles") as folder, folder.staging() as tmp:
        write_json({**kinds.manifest_header("roles"), "run": "new"}, tmp / "run.json")
        (out / "notes.txt").write_text("written while the run ran")
    kept = tmp_path / f"roles.tmp-{os.getpid()}"
    assert json.loads((out / "run.json").read_text())["run"] == "new"
    assert (kept / "notes.txt").read_text() == "written while the run ran" and not (kept / markers.MARKER).exists()
    assert any(f"kept what was in {out} before this run at {kept}" in r.getMessage() for r in caplog.records)


KILLED_RUN = r"""
import os, sys
from headscope.probes.outputs import folder as of
from headscope.probes.outputs import kinds, swap
from headscope.probes.outputs.atomic import write_json

out, point = sys.argv[1], sys.argv[2]


def die(*a, **k):
    os._exit(9)


with of.claim_output(out, "roles") as f, f.staging() as tmp:
    write_json({**kinds.manifest_header("roles"), "run": "killed"}, tmp / "run.json")
    (tmp / "roles.csv").write_text("layer\n0\n")
    if point == "writing":
        die()
    elif point == "before-exchange":
        swap.exchange = die
    elif point == "after-exchange":
        swap._discard = die
    elif point == "between-renames":
        os.environ["HEADSCOPE_NO_EXCHANGE"] = "1"
        replace = os.replace

        def replace_then_die(a, b):
            replace(a, b)
            if str(b).endswith(f".old-{os.getpid()}"):
                die()

        os.replace = replace_then_die
print("not killed")
"""


@pytest.mark.parametrize(
    "previous, point",
    [
        ("missing", "writing"),
        *(
            (p, k)
            for p in ("empty", "earlier")
            for k in ("writing", "before-exchange", "after-exchange", "between-renames")
        ),
    ],
)
def test_a_run_killed_anywhere_is_tidied_by_the_next(tmp_path, previous, point):
    """The markers leave every kill point recoverable: the next run ends with its own output
    and nothing beside it, and until then ``--out`` is the previous output or the killed
    run's complete one."""
    out = tmp_path / "roles"
    before = {"missing": None, "empty": {}, "earlier": None}[previous]
    if previous == "empty":
        out.mkdir()
    elif previous == "earlier":
        before = _earlier_roles(out)
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_RUN, str(out), point], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 9, proc.stdout + proc.stderr
    with of.claim_output(out, "roles") as folder:
        assert folder.recovered and not any(line.startswith("left ") for line in folder.recovered), folder.recovered
        if point == "after-exchange":  # the killed run had swapped its complete output in
            assert json.loads((out / "run.json").read_text())["run"] == "killed"
        elif before is None:
            assert not out.exists()
        else:
            assert _tree(out) == before
        with folder.staging() as tmp:
            write_json({**kinds.manifest_header("roles"), "run": "next"}, tmp / "run.json")
    assert sorted(_tree(out)) == ["run.json"] and json.loads((out / "run.json").read_text())["run"] == "next"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["roles"]


# ------------------------------------------------------------------ 4. --out ''


@pytest.mark.parametrize("command", [*sorted(OUT_COMMANDS), "diff"])
def test_an_empty_out_is_refused_by_every_command(tmp_path, capsys, no_model, monkeypatch, command):
    """``--out ''`` used to write to the default place (report, roles), into ``.`` (diff) or nowhere (prune, patch)."""
    monkeypatch.chdir(tmp_path)
    argv = ["diff", "a", "b"] if command == "diff" else OUT_COMMANDS[command]
    err = _usage_error(capsys, *argv, "--out", "")
    assert err.startswith(f"headscope {command}: error: argument --out: must name a folder; got ''"), err
    assert list(tmp_path.iterdir()) == []


def test_claim_output_refuses_an_empty_string(tmp_path):
    with pytest.raises(ValueError, match="--out is empty; name a folder"):
        with of.claim_output("", "roles"):
            pass


# ------------------------------------------------------------------ 5. a symlinked --out


def test_a_symlinked_out_is_followed_and_the_link_kept(roles_run, tmp_path):
    """The link used to be swapped out (the output put in its place) and left as ``<out>.tmp-<pid>``."""
    rc, link, target = roles_run
    assert rc == 0 and link.is_symlink() and os.readlink(link) == str(target)
    assert kinds.output_kind_of(target) == "roles" and sorted(p.name for p in link.parent.iterdir()) == [
        "made-first",
        "roles",
        "small.txt",
    ]
    target = tmp_path / "big-disk" / "roles-run"
    _earlier_roles(target)
    link = tmp_path / "roles"
    link.symlink_to(target)
    _stage(link, "again")  # an earlier roles output behind the link: replaced where it is
    assert link.is_symlink() and json.loads((target / "run.json").read_text())["run"] == "again"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big-disk", "roles"]
    assert sorted(p.name for p in target.parent.iterdir()) == ["roles-run"]


def test_a_link_to_a_users_folder_is_refused_naming_link_and_target(tmp_path, capsys, no_model):
    target = tmp_path / "thesis"
    target.mkdir()
    (target / "thesis.tex").write_text("mine")
    link = tmp_path / "out"
    link.symlink_to(target)
    err = cli_error(capsys, *OUT_COMMANDS["roles"], "--out", link)
    assert f"--out {link} (a symbolic link to {target}) exists and is not a headscope roles output" in err
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    assert "is a symbolic link that loops" in cli_error(capsys, *OUT_COMMANDS["roles"], "--out", loop)
    assert (target / "thesis.tex").read_text() == "mine" and link.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loop", "out", "thesis"]


def test_a_dangling_link_is_followed_and_the_link_and_its_target_share_one_lock(tmp_path):
    target = tmp_path / "later" / "roles"
    link = tmp_path / "out"
    link.symlink_to(target)
    _stage(link, "first")  # the target did not exist: made, like a missing --out
    assert link.is_symlink() and json.loads((target / "run.json").read_text())["run"] == "first"
    with of.claim_output(target, "roles"):  # a run on the target itself: another run through the link is refused
        proc = subprocess.run(
            [sys.executable, "-m", "headscope.reports.cli", *OUT_COMMANDS["roles"], "--out", str(link)],
            capture_output=True,
            text=True,
            env=dict(os.environ, HF_HUB_OFFLINE="1"),
            timeout=120,
        )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"is being written by another headscope run (pid {os.getpid()})" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["later", "out"]
