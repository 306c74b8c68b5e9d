"""``--ray``, ``--workers``, ``--ray-address`` on the commands that run report stages: without
``--ray`` nothing imports Ray; bad input is one line and exit 2, before any model loads."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from headscope.reports.cli.app import main

ROOT = Path(__file__).resolve().parents[3]


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)


def test_without_ray_flag_nothing_imports_ray():
    r = _python(
        "import sys\n"
        "from headscope.reports.cli.app import build_parser\n"
        "from headscope.reports.cli.argtypes import ray_config\n"
        "from headscope.reports.stages import runner, sharded\n"
        "from headscope.reports.stages.config import RunConfig\n"
        "for argv in (['report', 'minilm-l6'], ['context', 'minilm-l6']):\n"
        "    args = build_parser().parse_args(argv)\n"
        "    assert ray_config(args) is None and runner._pool('minilm-l6', RunConfig(ray=ray_config(args))) is None\n"
        "print('ray' in sys.modules)\n"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_only_the_sharded_runner_imports_ray_and_only_inside_functions():
    """The package's runtime imports of Ray: inside functions of the sharded runner, never at
    module level."""
    found = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in ("tests", ".venv", "docs", "build") or "site-packages" in rel.parts:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n == "ray" or n.startswith("ray.") for n in names):
                found.append((str(rel), id(node) in top))
    assert found and all(not at_top for _, at_top in found), found
    assert {f for f, _ in found} == {"reports/stages/sharded.py"}, found


def test_ray_flag_without_ray_installed_is_one_line_naming_the_extra(tmp_path):
    r = _python(
        "import sys; sys.modules['ray'] = None  # import ray -> ImportError\n"
        "from headscope.reports.cli.app import main\n"
        f"sys.exit(main(['report', 'minilm-l6', '--ray', '--only', 'weights', '--out', {str(tmp_path / 'o')!r}]))\n"
    )
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'headscope[ray]'" in lines[0], r.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--ray", "--workers", "0"], "argument --workers: must be an integer >= 1; got '0'"),
        (["--workers", "2"], "--workers goes with --ray"),
        (["--ray", "--workers", "999"], "--workers 999:"),  # past this machine's (or the test cluster's) CPUs
        (["--ray", "--ray-address", "127.0.0.1:1"], "--ray-address 127.0.0.1:1: cannot reach the Ray cluster"),
    ],
)
def test_bad_ray_input_is_one_line_exit_2(argv, says, tmp_path, capsys):
    pytest.importorskip("ray")
    t0 = time.perf_counter()
    code = main(["report", "minilm-l6", "--only", "weights", "--out", str(tmp_path / "o"), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and says in err[0], err
    assert time.perf_counter() - t0 < 30 and not (tmp_path / "o").exists()


#: the hand-written commands that take --ray: name -> arguments of a run (the bad flags come after)
COMMANDS = {
    "roles": ["roles", "minilm-l6", "--roles", "positional", "--quiet"],
    "prune": ["prune", "minilm-l6", "--studies", "importance"],
    "circuit": ["circuit", "smollm2-135m", "--n-items", "4"],
    "weights": ["weights", "minilm-l6", "--quiet"],
    "patch": ["patch", "smollm2-135m", "--n-items", "4"],
    "kv": ["kv", "smollm2-135m", "--quick", "--quiet"],
    # the commands whose work has no stage split (not in SHARDED): the flags checked, the work in the driver (one line says so)
    "qk": ["qk", "smollm2-135m", "--head", "1.1"],
    "validate": ["validate", "tracr", "--quiet"],
}

#: the commands whose stage shards over the workers (the others run in the driver)
SHARDED = ("roles", "prune", "circuit", "weights", "patch", "kv")


def test_without_ray_flag_the_commands_import_no_ray():
    r = _python(
        "import sys\n"
        "from headscope.reports.cli.app import build_parser\n"
        "from headscope.reports.cli.argtypes import ray_config, ray_in_driver, ray_pool\n"
        f"for argv in {list(COMMANDS.values())!r}:\n"
        "    args = build_parser().parse_args(argv)\n"
        "    assert ray_config(args) is None and ray_in_driver(args, argv[0], 'no split') is None\n"
        f"    if argv[0] in {SHARDED!r}:\n"
        "        with ray_pool(args) as pool:\n"
        "            assert pool is None\n"
        "print('ray' in sys.modules)\n"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_each_command_without_ray_installed_is_one_line_naming_the_extra(tmp_path):
    """Every command's ``--ray`` where Ray is not installed: one line, exit 2, nothing written (one
    process for all of them)."""
    r = _python(
        "import contextlib, io, json, sys; sys.modules['ray'] = None  # import ray -> ImportError\n"
        "from headscope.reports.cli.app import main\n"
        "said = {}\n"
        f"for name, argv in {COMMANDS!r}.items():\n"
        "    err = io.StringIO()\n"
        "    with contextlib.redirect_stderr(err):\n"
        f"        code = main([*argv, '--out', {str(tmp_path)!r} + '/' + name, '--ray'])\n"
        "    said[name] = [code, err.getvalue().strip().splitlines()]\n"
        "print(json.dumps(said))\n"
    )
    assert r.returncode == 0, r.stderr
    for name, (code, lines) in json.loads(r.stdout.strip().splitlines()[-1]).items():
        assert code == 2 and len(lines) == 1 and "pip install 'headscope[ray]'" in lines[0], (name, lines)
        assert not (tmp_path / name).exists(), name


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--ray", "--workers", "0"], "argument --workers: must be an integer >= 1; got '0'"),
        (["--workers", "2"], "--workers goes with --ray"),
        (["--worker-threads", "1"], "--worker-threads goes with --ray"),
        (["--ray", "--workers", "999"], "--workers 999:"),
        (["--ray", "--ray-address", "127.0.0.1:1"], "--ray-address 127.0.0.1:1: cannot reach the Ray cluster"),
    ],
)
def test_each_command_refuses_bad_ray_input_in_one_line(command, argv, says, tmp_path, capsys):
    pytest.importorskip("ray")
    t0 = time.perf_counter()
    code = main([*COMMANDS[command], "--out", str(tmp_path / "o"), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and says in err[0], err
    assert time.perf_counter() - t0 < 30 and not (tmp_path / "o").exists()


def test_a_command_without_a_stage_split_says_in_one_line_that_it_runs_in_the_driver(tiny_llama_dir, tmp_path, capsys):
    pytest.importorskip("ray")
    argv = ["qk", str(tiny_llama_dir), "--head", "1.1", "--n-items", "2", "--json", "--out", str(tmp_path / "o")]
    assert main([*argv, "--ray", "--workers", "1"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [err[0]] and err[0].startswith("note: qk --ray: ") and "runs in the driver" in err[0], err
    assert not pd.read_parquet(tmp_path / "o" / "qk.parquet").empty
