"""The weights-only paths: per-head circuits and composition read from the checkpoint alone
(:mod:`headscope.analyses.circuits.weights`, the weights read lazily by
:func:`~headscope.probes.models.lazy_weights.lazy_weights`), and the large-checkpoint case.

:func:`weights_heads`, :func:`weights_composition` and :func:`weights_all` are bench paths
``(bench: BenchState) -> Prepared`` (registered in :data:`~headscope.reports.tools.bench.registry.PATHS`)
on the bench's model, with the ``headscope weights`` defaults (200 draws per head, 1000 per
composition null). :func:`large_checkpoint_case` is not a path: it times the per-head stage on a
random-weight checkpoint with Llama-3.1-8B's shapes (:data:`LLAMA_3_1_8B`, 16 GB of bf16 shards),
which :func:`write_random_checkpoint` writes only when asked (``python -m
headscope.reports.tools.bench.weights_paths DIR --write``; never in tests, never by default), in a
subprocess whose peak RSS is the measurement.

>>> round(checkpoint_bytes(**LLAMA_3_1_8B) / 1e9, 1)
16.1
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from headscope.reports.tools.bench.state import BenchState, PathSkipped, Prepared
from headscope.reports.tools.bench.targets import LARGE_CHECKPOINT_RSS_MB

__all__ = [
    "LLAMA_3_1_8B",
    "checkpoint_bytes",
    "large_checkpoint_case",
    "smollm2_figures_doc",
    "weights_all",
    "weights_composition",
    "weights_heads",
    "write_random_checkpoint",
]

#: the shapes of Llama-3.1-8B (untied embedding and head)
LLAMA_3_1_8B = dict(n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8, d_mlp=14336, vocab_size=128256)
#: the defaults of ``headscope weights``
DRAWS, NULL = 200, 1000


def _open(bench: BenchState):
    from headscope.probes.models.inhouse.head_weights import head_weights
    from headscope.probes.models.lazy_weights import lazy_weights, reads_lazily

    if reads_lazily(bench.source):
        return lazy_weights(bench.source)
    return head_weights(bench.model("inhouse"))


def _weights_path(bench: BenchState, heads: bool, composition: bool) -> Prepared:
    from headscope.analyses.circuits.weights.composition import composition_scores
    from headscope.analyses.circuits.weights.ov_qk import head_circuits

    weights = _open(bench)
    if weights.n_layers < 2 and composition:
        raise PathSkipped("one layer: no pair of heads in different layers")

    def one_pass():
        if heads:
            head_circuits(weights, n_draws=DRAWS)
        if composition:
            composition_scores(weights, n_null=NULL)

    def warm():  # the first layer's matrices read once (the reader and the linear algebra warmed up)
        weights.layer(0)

    return Prepared(one_pass, warm, None, f"{weights.reader}; {DRAWS} draws per head, {NULL} per null")


def weights_heads(bench: BenchState) -> Prepared:
    """Per-head circuits (OV copying, OV/QK norms, QK positional share) with their baselines."""
    return _weights_path(bench, True, False)


def weights_composition(bench: BenchState) -> Prepared:
    """Q/K/V composition of every pair of heads in different layers with the Gaussian nulls."""
    return _weights_path(bench, False, True)


def weights_all(bench: BenchState) -> Prepared:
    """Every weights-only analysis ``headscope weights`` runs: the two above."""
    return _weights_path(bench, True, True)


def _shapes(n_layers, d_model, n_heads, n_kv_heads, d_mlp, vocab_size, tie=False) -> list[tuple[str, tuple]]:
    """HF Llama tensor names and shapes, in file order."""
    d_head = d_model // n_heads
    out = [("model.embed_tokens.weight", (vocab_size, d_model))]
    for i in range(n_layers):
        p = f"model.layers.{i}."
        out += [
            (p + "input_layernorm.weight", (d_model,)),
            (p + "self_attn.q_proj.weight", (n_heads * d_head, d_model)),
            (p + "self_attn.k_proj.weight", (n_kv_heads * d_head, d_model)),
            (p + "self_attn.v_proj.weight", (n_kv_heads * d_head, d_model)),
            (p + "self_attn.o_proj.weight", (d_model, n_heads * d_head)),
            (p + "post_attention_layernorm.weight", (d_model,)),
            (p + "mlp.gate_proj.weight", (d_mlp, d_model)),
            (p + "mlp.up_proj.weight", (d_mlp, d_model)),
            (p + "mlp.down_proj.weight", (d_model, d_mlp)),
        ]
    out.append(("model.norm.weight", (d_model,)))
    if not tie:
        out.append(("lm_head.weight", (vocab_size, d_model)))
    return out


def checkpoint_bytes(*, dtype_bytes: int = 2, **shape) -> int:
    """Bytes of the tensors of a :func:`write_random_checkpoint` checkpoint of ``shape``."""
    total = 0
    for _, s in _shapes(**shape):
        n = 1
        for x in s:
            n *= x
        total += n * dtype_bytes
    return total


def write_random_checkpoint(
    directory,
    *,
    n_layers: int,
    d_model: int,
    n_heads: int,
    n_kv_heads: int,
    d_mlp: int,
    vocab_size: int,
    tie: bool = False,
    dtype: torch.dtype = torch.bfloat16,
    shard_bytes: int = 2 << 30,
    seed: int = 0,
) -> Path:
    """Write a random-weight Llama checkpoint (``config.json``, safetensors shards of at most
    ``shard_bytes`` and ``model.safetensors.index.json``) into ``directory``, one shard in memory
    at a time; weights N(0, 0.02²), norm weights 1 + N(0, 0.1²). Returns ``directory``.
    ``FileExistsError`` where ``directory`` already holds a ``config.json``."""
    from safetensors.torch import save_file

    out = Path(directory)
    if (out / "config.json").exists():
        raise FileExistsError(f"{out} already holds a checkpoint (config.json); pick an empty folder")
    out.mkdir(parents=True, exist_ok=True)
    shape = dict(n_layers=n_layers, d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads, d_mlp=d_mlp)
    tensors = _shapes(vocab_size=vocab_size, tie=tie, **shape)
    shards, current, size = [], [], 0
    per = torch.empty((), dtype=dtype).element_size()
    for name, s in tensors:
        n = per * int(torch.Size(s).numel())
        if current and size + n > shard_bytes:
            shards.append(current)
            current, size = [], 0
        current.append((name, s))
        size += n
    shards.append(current)
    gen = torch.Generator().manual_seed(seed)
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        state = {}
        for name, s in shard:
            if len(s) == 1:
                state[name] = (1 + 0.1 * torch.randn(s, generator=gen)).to(dtype)
            else:
                state[name] = (0.02 * torch.randn(s, generator=gen)).to(dtype)
            weight_map[name] = fname
        save_file(state, str(out / fname), metadata={"format": "pt"})
        del state
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": d_model,
        "intermediate_size": d_mlp,
        "num_hidden_layers": n_layers,
        "num_attention_heads": n_heads,
        "num_key_value_heads": n_kv_heads,
        "head_dim": d_model // n_heads,
        "vocab_size": vocab_size,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "tie_word_embeddings": tie,
        "hidden_act": "silu",
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


_CHILD = """
import json, resource, sys, time
from headscope.analyses.circuits.weights.ov_qk import head_circuits
from headscope.probes.models.lazy_weights import lazy_weights

def peak_mb():  # this image's own peak: ru_maxrss keeps the forking parent's across exec (Linux)
    try:
        with open("/proc/self/status") as f:
            return next(int(x.split()[1]) for x in f if x.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

w = lazy_weights(sys.argv[1])
t0 = time.perf_counter()
df = head_circuits(w, n_draws=int(sys.argv[2]))
print(json.dumps({"seconds": time.perf_counter() - t0, "rows": len(df), "bytes_read": w.source.bytes_read,
                  "peak_rss_mb": peak_mb()}))
"""


def large_checkpoint_case(directory, *, write: bool = False, draws: int = DRAWS, shape: dict | None = None) -> dict:
    """Per-head circuits on the random checkpoint of ``shape`` (default :data:`LLAMA_3_1_8B`) in
    ``directory``: written first when ``write`` (refused in one line where the disk lacks its
    bytes + 1 GiB, or where the folder holds another checkpoint), then timed in a fresh
    subprocess whose peak RSS (``VmHWM``: everything the process ever held; not ``ru_maxrss``, which
    on Linux keeps the parent's peak across ``exec``, here the writer's) is compared with
    the 4 GB target. Returns ``{seconds, peak_rss_mb, rows, bytes_read, bytes_on_disk, write_seconds,
    target_mb, met}``. ``FileNotFoundError`` where there is no checkpoint and ``write`` is off."""
    shape = dict(shape or LLAMA_3_1_8B)
    out = Path(directory)
    need = checkpoint_bytes(**shape)
    write_s = None
    if not (out / "config.json").exists():
        if not write:
            raise FileNotFoundError(f"{out}: no checkpoint; pass --write to write one ({need / 1e9:.1f} GB)")
        root = out if out.exists() else out.parent
        free = shutil.disk_usage(root).free
        if free < need + (1 << 30):
            raise OSError(
                f"{root}: {free / 1e9:.1f} GB free; the checkpoint needs {need / 1e9:.1f} GB (+1 GiB margin): not written"
            )
        t0 = time.perf_counter()
        write_random_checkpoint(out, **shape)
        write_s = time.perf_counter() - t0
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    res = subprocess.run(
        [sys.executable, "-c", _CHILD, str(out), str(draws)], capture_output=True, text=True, env=env, check=False
    )
    if res.returncode != 0:
        raise RuntimeError(f"the per-head stage failed on {out}: {res.stderr.strip().splitlines()[-1:]}")
    row = json.loads(res.stdout.strip().splitlines()[-1])
    on_disk = sum(p.stat().st_size for p in out.glob("*.safetensors"))
    target_mb = LARGE_CHECKPOINT_RSS_MB
    return {
        **row,
        "bytes_on_disk": on_disk,
        "write_seconds": write_s,
        "target_mb": target_mb,
        "met": row["peak_rss_mb"] <= target_mb,
    }


def _loadavg() -> list[float] | None:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except (OSError, ValueError):
        return None


def figures_doc(row: dict, *, load_before, load_after, shape: dict | None = None) -> dict:
    """The README's figures of one :func:`large_checkpoint_case` row, in the format of
    ``data/figures/*.json`` (``figures`` → group → name as ``{value, text}``, ``quoted``,
    ``missing``; ``tests/test_readme_figures.py`` checks the README quotes each ``text``).

    >>> doc = figures_doc({"seconds": 61.2, "peak_rss_mb": 1234.5, "target_mb": 4000.0, "met": True,
    ...                    "rows": 4096, "bytes_on_disk": 16e9, "write_seconds": None}, load_before=None, load_after=None)
    >>> [f["text"] for f in doc["figures"]["large_checkpoint"].values()]
    ['61 s', '1,234 MB (target 4,000 MB: met)', '4,096 rows']
    """
    met = "met" if row["met"] else "not met"
    fig = {
        "seconds": {"value": row["seconds"], "text": f"{row['seconds']:,.0f} s"},
        "peak_rss": {
            "value": row["peak_rss_mb"],
            "text": f"{row['peak_rss_mb']:,.0f} MB (target {row['target_mb']:,.0f} MB: {met})",
        },
        "rows": {"value": row["rows"], "text": f"{row['rows']:,} rows"},
    }
    return {
        "model": "random-weight checkpoint of Llama-3.1-8B's shapes, bf16 safetensors shards",
        "generated_by": "python -m headscope.reports.tools.bench.weights_paths DIR --write --record FILE",
        "shape": dict(shape or LLAMA_3_1_8B),
        "bytes_on_disk": row["bytes_on_disk"],
        "write_seconds": row["write_seconds"],
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "2"),
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "quoted": [f"large_checkpoint.{k}" for k in fig],
        "missing": [],
        "figures": {"large_checkpoint": fig},
    }


def smollm2_figures_doc(bench: dict) -> dict:
    """The README's figure of the ``weights_all`` path, from the JSON of ``headscope bench
    smollm2-135m --paths weights_all --json``: the fastest of its rounds, their median, the
    peak RSS and the load average the bench saw when it began.

    >>> doc = smollm2_figures_doc({"paths": [{"path": "weights_all", "status": "ok", "seconds": 29.9,
    ...     "median_seconds": 33.4, "peak_rss_mb": 1448.4, "repeats": 3}],
    ...     "info": {"model": "smollm2-135m", "machine": {"load_average": [3.45, 1.39, 1.02], "threads": 2}}})
    >>> [f["text"] for f in doc["figures"]["smollm2_weights_all"].values()]
    ['30 s (fastest of 3 rounds, median 33 s; target < 60 s: met)', '1,448 MB', 'load 3.5, 1.4, 1.0']
    """
    row = next(p for p in bench["paths"] if p["path"] == "weights_all")
    if row["status"] != "ok":
        raise RuntimeError(f"the bench's weights_all path did not run: {row.get('note', row['status'])}")
    machine = bench["info"]["machine"]
    met = "met" if row["seconds"] < 60 else "not met"
    load = ", ".join(f"{x:.1f}" for x in machine["load_average"])
    fig = {
        "seconds": {
            "value": row["seconds"],
            "text": f"{row['seconds']:,.0f} s (fastest of {row['repeats']} rounds, median "
            f"{row['median_seconds']:,.0f} s; target < 60 s: {met})",
        },
        "peak_rss": {"value": row["peak_rss_mb"], "text": f"{row['peak_rss_mb']:,.0f} MB"},
        "load": {"value": machine["load_average"], "text": f"load {load}"},
    }
    return {
        "model": bench["info"]["model"],
        "generated_by": "headscope bench smollm2-135m --paths weights_all --json > B; "
        "python -m headscope.reports.tools.bench.weights_paths --from-bench B --record FILE",
        "threads": machine["threads"],
        "quoted": [f"smollm2_weights_all.{k}" for k in fig],
        "missing": [],
        "figures": {"smollm2_weights_all": fig},
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m headscope.reports.tools.bench.weights_paths DIR [--write] [--draws N] [--record FILE]``:
    the large-checkpoint case (:func:`large_checkpoint_case`) as one JSON line, and with
    ``--record`` its figures (:func:`figures_doc`) into FILE; never run by default."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m headscope.reports.tools.bench.weights_paths", description=main.__doc__)
    p.add_argument("directory", nargs="?", help="folder of the checkpoint (written there with --write)")
    p.add_argument("--from-bench", type=Path, help="record the weights_all path of this `headscope bench --json` file")
    p.add_argument("--write", action="store_true", help="write the 16 GB checkpoint first if it is not there")
    p.add_argument("--draws", type=int, default=DRAWS, help=f"Gaussian draws per head baseline ({DRAWS})")
    p.add_argument("--record", type=Path, help="write the README's figures here (data/figures/bench_weights.json)")
    args = p.parse_args(argv)
    if args.from_bench is not None:
        try:
            doc = smollm2_figures_doc(json.loads(args.from_bench.read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError, StopIteration, RuntimeError) as e:
            what = "no weights_all path" if isinstance(e, StopIteration) else f"{type(e).__name__}: {e}"
            print(
                f"headscope: error: {args.from_bench}: not a `headscope bench --json` file with the weights_all path ({what})",
                file=sys.stderr,
            )
            return 2
        if args.record is not None:
            args.record.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        print(json.dumps(doc["figures"]))
        return 0
    if args.directory is None:
        p.error("give the checkpoint's folder, or --from-bench FILE")
    before = _loadavg()
    try:
        row = large_checkpoint_case(args.directory, write=args.write, draws=args.draws)
    except (OSError, RuntimeError) as e:
        print(f"headscope: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(row))
    if args.record is not None:
        doc = figures_doc(row, load_before=before, load_after=_loadavg())
        args.record.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
