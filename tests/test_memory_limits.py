"""Issue #38, limits: a real limit set on the process (``RLIMIT_AS`` through ``preexec_fn``, a
cgroup's memory limit where this machine lets a test make a child cgroup) below the estimated need
is refused in one line, exit 2, before any weight is read; above it the run completes, and run.json
records both high-water marks: ``VmHWM`` (resident, what the estimate and a cgroup bound) and
``VmPeak`` (address space, what ``RLIMIT_AS`` bounds).

Each command runs in a subprocess of its own (its own limits, its own peaks), waited for with
``os.wait4`` so the child's own peak resident set (``ru_maxrss``) is read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEADSCOPE = [sys.executable, "-m", "headscope.reports.cli"]
MiB = 1 << 20
#: MiniLM-L6's float32 weights (22,565,376 parameters x 4 bytes)
MINILM_WEIGHTS = 22_565_376 * 4

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="rlimits and /proc are Linux's")


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "HEADSCOPE_MEMORY_LIMIT"}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    return env


#: The launcher: a fresh interpreter forks the child. A forked child's ``ru_maxrss`` counts the
#: resident set it had before ``exec``: the forking process's, which in a pytest worker holding
#: session models is over 1 GiB; a fresh launcher holds ~10 MiB.
_LAUNCH = """
import json, os, resource, subprocess, sys
args, setup = json.loads(sys.argv[1])
p = subprocess.Popen(args, preexec_fn=lambda: exec(setup), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
err = p.stderr.read()
p.stderr.close()
_pid, status, usage = os.wait4(p.pid, 0)
sys.stderr.write(err)
print(json.dumps([os.waitstatus_to_exitcode(status), usage.ru_maxrss * 1024]))
"""


def _run(args, setup: str) -> tuple[int, str, int]:
    """``headscope ARGS`` with ``setup`` (Python source) run in the child before ``exec``, forked by
    a fresh launcher -> (exit status, stderr, the child's peak resident bytes)."""
    job = json.dumps([[*HEADSCOPE, *map(str, args)], setup])
    proc = subprocess.run(
        [sys.executable, "-c", _LAUNCH, job], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    code, peak = json.loads(proc.stdout.strip().splitlines()[-1])
    return code, proc.stderr, peak


def _after_imports() -> dict[str, int]:
    """VmSize and VmRSS (bytes) of a fresh interpreter holding what ``headscope report`` imports
    before its estimate."""
    code = (
        "from headscope.reports.cli import app; from headscope.reports import budget; budget.preload('report'); "
        "print(*[l.split()[1] for l in open('/proc/self/status') if l.startswith(('VmSize', 'VmRSS'))])"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    size, rss = proc.stdout.split()[-2:]
    return {"VmSize": int(size) * 1024, "VmRSS": int(rss) * 1024}


def _refused_before_the_load(code: int, err: str, peak: int, source: str) -> None:
    """Exit 2, one error line naming the limit, and no weight read: no load progress, and the
    child's resident peak below what it held at the estimate plus MiniLM's weights."""
    assert code == 2, err
    (line,) = [x for x in err.splitlines() if x.startswith("headscope: error:")]
    assert line.startswith("headscope: error: report needs ~") and f"({source}" in line, line
    assert not any("load" in x for x in err.splitlines() if not x.startswith("headscope: error:")), err
    held = float(line.split("(process ")[1].split(" GiB")[0]) * (1 << 30)  # "process 0.45 GiB"
    assert peak < held + 0.01 * (1 << 30) + MINILM_WEIGHTS, (peak, held)


def test_an_address_space_limit_below_the_need_refuses_the_report_before_the_load(tmp_path):
    """RLIMIT_AS at 200 MiB over the address space the imports map: MiniLM-L6's report (~0.7 GiB
    resident to load with its HF probe copy) is refused in one line naming RLIMIT_AS."""
    limit = _after_imports()["VmSize"] + 200 * MiB

    cap = f"resource.setrlimit(resource.RLIMIT_AS, ({limit}, resource.RLIM_INFINITY))"
    code, err, peak = _run(["report", "minilm-l6", "--out", tmp_path / "r"], cap)
    _refused_before_the_load(code, err, peak, "RLIMIT_AS")
    assert not (tmp_path / "r").exists()


def _child_cgroup() -> tuple[Path, str, str] | str:
    """A new memory cgroup under this process's own -> (its folder, the limit file, the use file),
    or why one cannot be made here (the test is skipped with it)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError as e:
        return f"no /proc/self/cgroup ({e})"
    for line in lines:
        hid, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):  # cgroup v1's memory hierarchy
            parent, files = Path(f"/sys/fs/cgroup/memory{path}"), ("memory.limit_in_bytes", "memory.max_usage_in_bytes")
            break
        if hid == "0" and controllers == "":
            parent, files = Path(f"/sys/fs/cgroup{path}"), ("memory.max", "memory.peak")
            try:
                given = (parent / "cgroup.subtree_control").read_text(errors="replace").split()
            except OSError:
                given = []
            if "memory" not in given:
                continue  # v2 without the memory controller given to children
            break
    else:
        return "this process is in no cgroup with a memory controller"
    child = parent / f"headscope-test-{os.getpid()}"
    try:
        child.mkdir()
        (child / files[0]).write_text(str(1 << 40))  # writable: the test sets its own below
    except OSError as e:
        if child.exists():
            child.rmdir()
        return f"cannot make a memory cgroup under {parent} ({e.strerror or e})"
    return child, *files


@pytest.fixture
def cgroup():
    made = _child_cgroup()
    if isinstance(made, str):
        pytest.skip(f"cgroup memory limit not testable here: {made}")
    yield made
    made[0].rmdir()  # empty again: the child process has exited


def _join(folder: Path, limit_file: str, limit: int):
    (folder / limit_file).write_text(str(limit))
    return f"open({str(folder / 'cgroup.procs')!r}, 'w').write('0')"


def test_a_cgroup_limit_below_the_need_refuses_the_report_before_the_load(tmp_path, cgroup):
    """The cgroup's limit (v1 ``memory.limit_in_bytes``, v2 ``memory.max``) at 600 MiB, under
    MiniLM-L6's report need: one line naming the cgroup limit, exit 2, nothing written; the
    cgroup's own peak charge says no weight was read either."""
    folder, limit_file, peak_file = cgroup
    code, err, peak = _run(["report", "minilm-l6", "--out", tmp_path / "r"], _join(folder, limit_file, 600 * MiB))
    _refused_before_the_load(code, err, peak, "cgroup limit 0.59 GiB")
    assert int((folder / peak_file).read_text()) < 600 * MiB
    assert not (tmp_path / "r").exists()


@pytest.fixture(scope="module")
def short_text(tmp_path_factory) -> Path:
    """20 lines of the shipped sentences (a roles run of seconds)."""
    from headscope.analyses.roles.pipeline import default_text

    path = tmp_path_factory.mktemp("text") / "short.txt"
    path.write_text("\n".join(default_text().read_text(encoding="utf-8").splitlines()[:20]) + "\n", encoding="utf-8")
    return path


def test_a_cgroup_limit_above_the_need_lets_the_run_complete_and_is_what_it_read(tmp_path, cgroup, short_text):
    """The other side: 2 GiB of cgroup, a MiniLM roles run needs well under it, completes, and its
    run.json says the cgroup was the tightest limit read. Its resident peak (VmHWM) is what the
    cgroup charged; the address space it mapped (VmPeak) is over twice that and not limited."""
    folder, limit_file, _peak_file = cgroup
    out = tmp_path / "roles"
    args = ["roles", "minilm-l6", "--roles", "positional", "--text", short_text, "--out", out]
    code, err, peak = _run(args, _join(folder, limit_file, 2 << 30))
    assert code == 0, err
    mem = json.loads((out / "run.json").read_text(encoding="utf-8"))["memory"]
    assert mem["available_source"] == "cgroup limit 2.00 GiB", mem["available_source"]
    # the room: what it held plus what the cgroup had left (pages shared with other cgroups, such as
    # the libraries' page cache, are resident here but charged there)
    assert mem["estimate_bytes"] < mem["available_bytes"]
    assert abs(mem["peak_rss_bytes"] - peak) <= 16 * MiB  # run.json's VmHWM is the child's ru_maxrss
    assert mem["peak_vm_bytes"] > 2 * mem["peak_rss_bytes"]
