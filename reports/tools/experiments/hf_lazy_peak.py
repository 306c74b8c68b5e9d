"""The peak memory of reading a non-in-house hf folder's per-head weights one layer at a time
(:func:`~headscope.probes.models.hf_lazy_weights.hf_lazy_weights`): a random-weight bf16 OLMo 2
checkpoint of :data:`SHAPE` written shard by shard (never the whole model in memory), then every
layer read in a fresh process whose RSS growth over the reads is measured.

``python -m headscope.reports.tools.experiments.hf_lazy_peak`` (``make hf-lazy-peak``, ~1 minute on
one core) writes ``data/figures/hf_lazy_weights.json``; docs/guide/weights.md quotes its figures
(tests/test_readme_figures.py).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

log = logging.getLogger(__name__)

OUT = Path(__file__).resolve().parents[3] / "data" / "figures" / "hf_lazy_weights.json"
#: the measured checkpoint: OLMo 2 (not in-house: QK-norm, post-norms), 24 layers
SHAPE = dict(
    hidden_size=512, num_hidden_layers=24, num_attention_heads=8, num_key_value_heads=8, intermediate_size=1024
)
#: the tokenizer's vocabulary, and the embedding's rows (a table larger than a layer: the reader holds
#: only the check text's rows of it)
TOKENIZER_VOCAB, VOCAB = 600, 16384


def write_random_hf_checkpoint(
    directory: Path, model_type: str, *, shard_bytes: int, vocab_size: int | None = None, **config
) -> Path:
    """A random-weight bf16 checkpoint of ``model_type`` (names and shapes from its causal LM built on the
    meta device) written one shard at a time, never the whole model in memory, with a small tokenizer
    (``vocab_size``: the embedding's rows, default the tokenizer's); weights N(0, 0.02²), 1-D tensors
    1 + N(0, 0.1²). Returns ``directory``."""
    from accelerate import init_empty_weights
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    from headscope.reports.tools.sweep.tokenizer import train_tokenizer

    tok = train_tokenizer(False, TOKENIZER_VOCAB)
    ids = dict(pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    cfg = AutoConfig.for_model(model_type, vocab_size=vocab_size or len(tok), **ids, **config)
    with init_empty_weights():
        shapes = [(n, tuple(t.shape)) for n, t in AutoModelForCausalLM.from_config(cfg).state_dict().items()]
    shards, current, size = [], [], 0
    for name, s in shapes:
        n = 2 * int(torch.Size(s).numel())
        if current and size + n > shard_bytes:
            shards.append(current)
            current, size = [], 0
        current.append((name, s))
        size += n
    shards.append(current)
    gen = torch.Generator().manual_seed(0)
    weight_map = {}
    directory.mkdir(parents=True)
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        state = {
            name: ((1 + 0.1 * torch.randn(s, generator=gen)) if len(s) == 1 else 0.02 * torch.randn(s, generator=gen))
            .to(torch.bfloat16)
            .contiguous()
            for name, s in shard
        }
        weight_map.update(dict.fromkeys(state, fname))
        save_file(state, str(directory / fname), metadata={"format": "pt"})
        del state
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    cfg.save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


_CHILD = r"""
import gc, json, sys
from headscope.probes.models.hf_lazy_weights import hf_lazy_weights

def kib(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

w = hf_lazy_weights(sys.argv[1])  # layer 0 read and checked: every library and kernel loaded
w.layer(0), w.W_E
gc.collect()
base = kib("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # VmHWM := VmRSS: the peak from here on
for layer in range(w.n_layers):
    lw = w.layer(layer)
    del lw
print(json.dumps({"grew": kib("VmHWM") - base, "bytes_read": w.source.bytes_read, "passed": w.check["passed"],
                  "layers_checked": len(w.check["layers_checked"])}))
"""


def measure_peak(folder: Path) -> dict:
    """Read every layer of ``folder`` in a fresh process: ``{"grew": peak RSS bytes over the reads,
    "bytes_read", "passed", "layers_checked"}``. glibc is made to return every block over 64 KiB on
    free (``MALLOC_MMAP_THRESHOLD_``), so the peak is that of what the reader holds, not the allocator's
    history (as the in-house lazy test measures). ``RuntimeError`` with the child's error where it fails."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0", "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-c", _CHILD, str(folder)], capture_output=True, text=True, env=env)
    if res.returncode != 0:
        raise RuntimeError(res.stderr.strip()[-2000:])
    return json.loads(res.stdout.strip().splitlines()[-1])


def sizes(shape: dict = SHAPE) -> dict:
    """Float32 bytes of one layer, of a one-layer model (the layer, the whole embedding and the final
    norm: what a reader filling every embedding row would hold) and of the whole model (every layer,
    the embedding and unembedding), of an OLMo 2 ``shape``."""
    d, f, n = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    layer = 4 * (4 * d * d + 3 * d * f + 4 * d)  # attention, MLP, QK-norms and the two post-norms
    return {"layer": layer, "one_layer_model": layer + 4 * (VOCAB * d + d), "whole": n * layer + 4 * 2 * VOCAB * d}


def figures(got: dict, shape: dict = SHAPE) -> dict:
    """data/figures/hf_lazy_weights.json of one measurement."""
    s = sizes(shape)

    def mb(v: int) -> dict:
        return {"value": v, "text": f"{v / 1e6:.1f} MB"}

    return {
        "shape": shape,
        "figures": {
            "hf_lazy": {
                "layers": {"value": shape["num_hidden_layers"], "text": f"{shape['num_hidden_layers']}-layer"},
                "peak_grew": mb(got["grew"]),
                "layer": mb(s["layer"]),
                "one_layer_model": mb(s["one_layer_model"]),
                "whole": mb(s["whole"]),
            }
        },
        "quoted": ["hf_lazy.layers", "hf_lazy.peak_grew", "hf_lazy.layer", "hf_lazy.one_layer_model", "hf_lazy.whole"],
        "passed": got["passed"],
    }


def main(argv=None) -> int:
    logging.basicConfig(format="%(message)s")  # others' records as before: warnings and up
    log.setLevel(logging.INFO)  # this script's own lines
    with tempfile.TemporaryDirectory(prefix="headscope-hf-lazy-") as tmp:
        folder = write_random_hf_checkpoint(Path(tmp) / "ckpt", "olmo2", shard_bytes=8 << 20, vocab_size=VOCAB, **SHAPE)
        doc = figures(measure_peak(folder))
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    log.info("%s", json.dumps(doc["figures"]))
    log.info("wrote %s", OUT)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
