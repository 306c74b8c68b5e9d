"""GPU workers under ``--ray --device cuda``: each worker asks Ray for ``num_gpus``
(:func:`~headscope.reports.stages.sharded.gpu_share`), Ray accepts the ask and gives the worker
its GPU through ``CUDA_VISIBLE_DEVICES``; a cluster without GPUs is refused in one line. No GPU
is needed: Ray schedules by logical GPUs, which ``ray.init(num_gpus=...)`` declares."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from headscope.reports.stages.sharded import RayConfig, ShardPool, gpu_share

LOAD = {"model": "minilm-l6", "backend": "inhouse", "dtype": "fp32", "trust_remote_code": False}


@pytest.mark.parametrize(
    ("workers", "gpus", "asked", "share"),
    [(1, 1, None, 1.0), (2, 4, None, 1.0), (4, 2, None, 0.5), (3, 1, None, 0.3333), (5, 2, None, 0.3333)],
)
def test_a_gpu_each_where_there_is_one_else_an_equal_share(workers, gpus, asked, share):
    got = gpu_share(workers, gpus, asked)
    assert got == share and workers * got <= gpus
    # each GPU hosts ceil(workers / gpus) workers at that share: Ray can place them all
    per_gpu = -(-workers // gpus)
    assert per_gpu * got <= 1.0


def test_an_asked_share_is_kept_or_refused_past_the_gpus():
    assert gpu_share(2, 1, 0.25) == 0.25
    with pytest.raises(ValueError, match="2 workers x 1 GPUs each exceed its 1 GPUs"):
        gpu_share(2, 1, 1.0)
    with pytest.raises(ValueError, match="gpus per worker"):
        RayConfig(gpus=1.5)  # Ray takes fractions up to 1, whole numbers above


def test_cuda_on_a_cluster_without_gpus_is_refused_in_one_line(ray_cluster):
    """The session's test cluster declares 4 CPUs and no GPU."""
    assert ray_cluster.cluster_resources().get("GPU", 0) == 0
    pool = ShardPool(RayConfig(workers=1, threads=1), {**LOAD, "device": "cuda"})
    with pytest.raises(ValueError) as e:
        pool.connect()
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and "has no GPUs" in msg and "--device cpu" in msg, msg
    assert pool._actors == []  # nothing started; the session's cluster is kept
    # a CPU run on the same cluster asks for no GPU
    assert ShardPool(RayConfig(workers=1, threads=1), {**LOAD, "device": "cpu"}).connect().asks() == {"num_cpus": 1}


_PROBE = r"""
import json, logging, os, ray
from headscope.reports.stages.sharded import RayConfig, ShardPool
ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
load = {"model": "minilm-l6", "backend": "inhouse", "dtype": "fp32", "trust_remote_code": False, "device": "cuda:0"}
pool = ShardPool(RayConfig(workers=2, threads=1), load).connect()

class Probe:  # StageWorker's resources, without loading a model
    def seen(self):
        return os.environ.get("CUDA_VISIBLE_DEVICES"), [str(g) for g in ray.get_gpu_ids()]

actors = [ray.remote(**pool.asks())(Probe).remote() for _ in range(pool.workers)]
seen = ray.get([a.seen.remote() for a in actors])
print(json.dumps({"asks": pool.asks(), "seen": seen, "free": ray.available_resources().get("GPU", 0)}))
ray.shutdown()
"""


def test_workers_share_one_gpu_and_ray_assigns_it():
    """Two workers on a cluster of one (logical) GPU: half a GPU each; Ray places both at once on
    GPU 0 and sets ``CUDA_VISIBLE_DEVICES`` in each (so ``cuda`` in the worker is its GPU)."""
    pytest.importorskip("ray")
    r = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["asks"] == {"num_cpus": 1, "num_gpus": 0.5}
    assert got["seen"] == [["0", ["0"]], ["0", ["0"]]]
    assert got["free"] == 0  # the two halves hold the whole GPU
