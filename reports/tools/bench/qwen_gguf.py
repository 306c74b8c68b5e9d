"""A GGUF of Qwen2-0.5B's shape with random weights, for the estimates' calibration (issue #38: the
case a real 0.5B Qwen2 GGUF was over-planned on): :func:`qwen05_gguf` writes it once under the cache.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["QWEN05", "qwen05_gguf", "write_qwen05_gguf"]


#: the GGUF calibration shape: Qwen2-0.5B's sizes (494 M parameters, a 151,936-entry vocabulary)
QWEN05 = dict(
    n_layers=24, d_model=896, n_heads=14, n_kv_heads=2, d_head=64, d_mlp=4864, vocab=151936, rope_theta=1e6, eps=1e-6
)


def qwen05_gguf() -> Path:
    """A GGUF of Qwen2-0.5B's shape (:data:`QWEN05`), written once under the cache with the ``gguf``
    package: random F16 weights (normal, std 0.02, seed 0; norms 1), tied embeddings, q/k/v biases,
    and SmolLM2-135M's byte-level BPE tokenizer with its vocabulary padded to 151,936 entries
    (tokens no merge reaches), so texts tokenize as a real byte-level BPE tokenizes them. ~1 GB."""
    from headscope.probes.models.checkpoints import cache_dir

    out = cache_dir() / "calibration" / "qwen2-0.5b-shape-f16.gguf"
    if not out.exists():
        write_qwen05_gguf(out)
    return out


def write_qwen05_gguf(out: Path, *, weights: bool = True) -> Path:
    """Write :func:`qwen05_gguf`'s file to ``out`` -> ``out``. ``weights=False``: the same metadata and
    tensor table, the tensors' bytes left as a hole of zeros (a sparse file: nothing written, ~1 GB
    apparent) and SmolLM2-135M's 49,152 tokens unpadded (no text reaches the padding; the metadata's
    ``vocab_size`` still says 151,936), for what reads the header alone (a memory plan)."""
    import gguf

    from headscope.probes.models.checkpoints import resolve

    q = QWEN05
    smol = gguf.GGUFReader(str(resolve("smollm2-135m").path))

    def field(name):
        v = smol.fields[name].contents()
        return v.tolist() if hasattr(v, "tolist") else v

    tokens = field("tokenizer.ggml.tokens")
    types = field("tokenizer.ggml.token_type")
    pad = q["vocab"] - len(tokens) if weights else 0  # a header alone: vocab_size says 151,936
    tokens, types = tokens + [f"<|unused{i}|>" for i in range(pad)], types + [1] * pad
    tmp = out.with_suffix(".part")
    tmp.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(tmp), "qwen2")
    w.add_name("qwen2-0.5b-shape")
    w.add_context_length(32768)
    w.add_block_count(q["n_layers"])
    w.add_embedding_length(q["d_model"])
    w.add_feed_forward_length(q["d_mlp"])
    w.add_head_count(q["n_heads"])
    w.add_head_count_kv(q["n_kv_heads"])
    w.add_layer_norm_rms_eps(q["eps"])
    w.add_rope_freq_base(q["rope_theta"])
    w.add_vocab_size(q["vocab"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(field("tokenizer.ggml.merges"))
    for key in ("bos", "eos", "padding"):
        getattr(w, f"add_{'pad' if key == 'padding' else key}_token_id")(int(field(f"tokenizer.ggml.{key}_token_id")))
    w.add_add_bos_token(False)
    _add_tensors(w, q, weights)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    if weights:
        w.write_tensors_to_file()
    else:  # the table, its padding, then the tensors' padded bytes as a hole
        w.write_ti_data_to_file()
        fout = w.fout[0]
        w.write_padding(fout, fout.tell())
        size = sum(gguf.GGUFWriter.ggml_pad(t.nbytes, w.data_alignment) for t in w.tensors[0].values())
        fout.truncate(fout.tell() + size)
    w.close()
    tmp.rename(out)
    return out


def _add_tensors(w, q: dict, weights: bool) -> None:
    """Every tensor of shape ``q`` into writer ``w``: random F16 matrices (normal, std 0.02, seed 0),
    norms 1, q/k/v biases; ``weights=False``: their table entries alone."""
    import numpy as np

    rng = np.random.default_rng(0)
    d, k, f = q["d_model"], q["d_head"], q["d_mlp"]

    def normal(*shape):
        if not weights:
            return np.empty(0, dtype=np.float16), shape
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16), shape

    def add(name, made):
        array, shape = made if isinstance(made, tuple) else (made, made.shape)
        if weights:
            w.add_tensor(name, array)
        else:
            w.add_tensor_info(name, shape, array.dtype, int(np.prod(shape)) * array.itemsize)

    def bias(rows):
        return (rng.standard_normal(rows, dtype=np.float32) * 0.02) if weights else np.empty(0, np.float32), (rows,)

    add("token_embd.weight", normal(q["vocab"], d))
    add("output_norm.weight", np.ones(d, dtype=np.float32))
    for i in range(q["n_layers"]):
        b = f"blk.{i}"
        add(f"{b}.attn_norm.weight", np.ones(d, dtype=np.float32))
        add(f"{b}.ffn_norm.weight", np.ones(d, dtype=np.float32))
        for name, rows in (
            ("attn_q", q["n_heads"] * k),
            ("attn_k", q["n_kv_heads"] * k),
            ("attn_v", q["n_kv_heads"] * k),
        ):
            add(f"{b}.{name}.weight", normal(rows, d))
            add(f"{b}.{name}.bias", bias(rows))
        add(f"{b}.attn_output.weight", normal(d, q["n_heads"] * k))
        add(f"{b}.ffn_gate.weight", normal(f, d))
        add(f"{b}.ffn_up.weight", normal(f, d))
        add(f"{b}.ffn_down.weight", normal(d, f))
