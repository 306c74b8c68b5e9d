"""Two processes that need the same dequantised GGUF at once (two Ray workers on one node, two
pytest workers): one dequantises under the cache entry's lock, the other waits and reads the
finished folder; both succeed on one folder, and no temporary copy is left (a killed writer's
included)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("gguf")

from gguf_writer import write_tiny_gguf  # noqa: E402

from headscope.probes.models.source import file_sha256  # noqa: E402

CHILD = """
import hashlib, logging, sys
logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
from headscope.probes.models.gguf import gguf_as_hf_dir
out = gguf_as_hf_dir(sys.argv[1])
print(out, hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest())
"""


def test_two_processes_dequantise_one_gguf_once(tmp_path):
    path, _ = write_tiny_gguf(tmp_path / "tiny-llama.gguf", "llama")
    cache = tmp_path / "cache"
    entry = cache / "gguf" / file_sha256(Path(path))[:16]
    left = entry.with_name(entry.name + ".tmp4242")  # what a writer killed mid-copy leaves
    (left / "sub").mkdir(parents=True)
    (left / "model.safetensors").write_bytes(b"half")
    env = dict(os.environ, HEADSCOPE_CACHE=str(cache), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(path)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]  # started together, before either has imported anything
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    lines = [out.strip().splitlines()[-1].split() for out, _ in outs]
    assert lines[0] == lines[1] and Path(lines[0][0]) == entry
    assert lines[0][1] == hashlib.sha256((entry / "model.safetensors").read_bytes()).hexdigest()
    said = sum(err.count("dequantising tiny-llama.gguf") for _, err in outs)
    assert said == 1  # one process dequantised; the other waited on the lock and read its folder
    assert sorted(p.name for p in entry.parent.iterdir()) == [entry.name, entry.name + ".lock"]
    assert {p.name for p in entry.iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json"}
