"""A GGUF file's header and tensor table checked before anything reads its tensors: cut or
corrupt files (:func:`check_gguf`), tensors whose declared types and shapes do not account for
the bytes (:func:`check_gguf_layout`), and a tensor table that disagrees with the metadata's
sizes (:func:`check_gguf_tensors`).
"""

from __future__ import annotations

import contextlib
import struct
from pathlib import Path
from typing import TYPE_CHECKING

from headscope.probes.errors import CheckpointError

if TYPE_CHECKING:  # annotations only
    from headscope.probes.models.families import GGUF
    from headscope.probes.models.gguf.metadata import _GGUFSizes


#: readers kept by :func:`kept_gguf_readers` while it is open, by (file, size, mtime); else None
_KEPT: dict | None = None


@contextlib.contextmanager
def kept_gguf_readers():
    """While open, :func:`check_gguf` parses each unchanged file once and hands back the same
    ``GGUFReader`` (SmolLM2's metadata, a 49,152-token vocabulary, takes ~10 s to parse): for a
    caller that reads the config and then the tensors of one file. Nothing is kept after it."""
    global _KEPT
    outer, _KEPT = _KEPT, {} if _KEPT is None else _KEPT
    try:
        yield
    finally:
        _KEPT = outer


def check_gguf(path: Path):
    """Open a GGUF file's header and tensor table; refuse one that is not GGUF or is cut
    short, naming the file and what it was expected to hold. Returns the ``GGUFReader`` (the
    same one again for an unchanged file inside :func:`kept_gguf_readers`)."""
    path = Path(path)
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if _KEPT is not None and key in _KEPT:
        return _KEPT[key]
    reader = _check_gguf(path, st.st_size)
    if _KEPT is not None:
        _KEPT[key] = reader
    return reader


def _check_gguf(path: Path, size: int):
    from gguf import GGUFReader

    with open(path, "rb") as f:
        head = f.read(24)
    if head[:4] != b"GGUF":
        raise CheckpointError(f"{path}: not a GGUF file (expected the magic bytes b'GGUF' first; got {head[:4]!r})")
    if len(head) < 24:
        raise CheckpointError(f"{path}: truncated GGUF file ({size} bytes; the fixed header alone needs 24)")
    _, n_tensors, n_kv = struct.unpack("<IQQ", head[4:24])
    try:
        reader = GGUFReader(str(path))
    except Exception as e:  # noqa: BLE001 - any parse failure is a cut or corrupt file
        raise CheckpointError(
            f"{path}: truncated or corrupt GGUF file ({size:,} bytes): the {n_kv:,} metadata entries and "
            f"{n_tensors:,} tensors its header announces cannot be read ({type(e).__name__}); copy or download it again"
        ) from None
    end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    if end > size:
        raise CheckpointError(
            f"{path}: truncated GGUF file ({size:,} bytes; its tensors end at byte {end:,}); copy or download it again"
        )
    check_gguf_layout(reader, path, size)
    return reader


def _ne(tensor) -> str:
    """A GGUF tensor's shape as llama.cpp prints it: ``[ne0, ne1, ...]``, the row length first."""
    return "[" + ", ".join(str(int(n)) for n in tensor.shape) + "]"


def check_gguf_layout(reader, path: Path, size: int) -> None:
    """Refuse a GGUF file whose tensors' declared types and shapes do not account for its bytes,
    as llama.cpp's loader does (``gguf.cpp``): each tensor's data starts where the one before
    it ends, padded to the file's alignment, and the last one ends the file (gguf's reader
    already refuses a quantised tensor whose rows are not whole blocks). A tensor declared
    ``Q4_0`` whose bytes are F32 (its type lies) is caught by the gap it leaves; the message
    names the tensor, its declared type and shape, the bytes these imply and those it has."""
    align = int(reader.alignment)
    tensors = list(reader.tensors)
    expected = 0  # offset of the next tensor's data from the start of the data section
    for i, t in enumerate(tensors):
        start = int(t.data_offset) - int(reader.data_offset)
        if start != expected:
            if i == 0:
                raise CheckpointError(
                    f"{path}: tensor {t.name!r}, the first, starts {start:,} bytes into the data section; expected 0 "
                    "(the tensor table is corrupt)"
                )
            prev = tensors[i - 1]
            given = start - (int(prev.data_offset) - int(reader.data_offset))
            raise CheckpointError(
                f"{path}: tensor {prev.name!r} is declared {prev.tensor_type.name} {_ne(prev)} ({int(prev.n_bytes):,} "
                f"bytes), but the file gives it {given:,} bytes before {t.name!r} starts; its declared type or shape "
                "does not match its data"
            )
        expected = start + -(-int(t.n_bytes) // align) * align
    if tensors:
        last = tensors[-1]
        given = size - int(last.data_offset)
        if given > -(-int(last.n_bytes) // align) * align:
            raise CheckpointError(
                f"{path}: tensor {last.name!r} (the last) is declared {last.tensor_type.name} {_ne(last)} "
                f"({int(last.n_bytes):,} bytes), but {given:,} bytes follow its start to the end of the file; its "
                "declared type or shape does not match its data"
            )


_NORMS = ("attn_norm", "ffn_norm", "post_attention_norm", "post_ffw_norm")


def check_gguf_tensors(reader, hf: dict, sizes: _GGUFSizes, gguf_arch: str, path: Path, rec: GGUF) -> None:
    """Refuse a GGUF file whose tensor table disagrees with its metadata, before transformers
    reads it (it would stop on the first mismatch with a ``RuntimeError`` naming neither file nor
    key): a tensor of a layer past ``block_count``, a layer without tensors, or a tensor whose
    shape is not the one the sizes imply: the embedding and the output ``[embedding_length,
    vocab_size]``, learned positions ``[embedding_length, context_length]`` (``rec.positions``:
    GPT-2) and, where the family's record says llama.cpp lays its layers out the common way
    (``rec.common_layout``), each layer's attention, MLP and norms. Shapes are given as llama.cpp
    prints them (``ne0`` first: a linear map's input width, then its output width)."""
    import re

    tensors = list(reader.tensors)
    n_layers = sizes.values.get("block_count")
    layer_of = {t.name: int(m.group(1)) for t in tensors if (m := re.match(r"blk\.(\d+)\.", t.name))}
    if n_layers and layer_of:
        past = [name for name, i in layer_of.items() if i >= n_layers]
        if past:
            raise CheckpointError(
                f"{path}: tensor {past[0]!r} belongs to layer {layer_of[past[0]]}, but {gguf_arch}.block_count is "
                f"{n_layers} (layers 0–{n_layers - 1}); the metadata and the tensors disagree"
            )
        empty = sorted(set(range(n_layers)) - set(layer_of.values()))
        if empty:
            raise CheckpointError(
                f"{path}: {gguf_arch}.block_count is {n_layers}, but the file holds no tensor of layer {empty[0]} "
                f"(blk.{empty[0]}.*; {len(empty)} layer(s) without tensors); the metadata and the tensors disagree"
            )
    d_model, vocab = sizes.values.get("embedding_length"), hf.get("vocab_size")
    said_d, said_v = f"{gguf_arch}.embedding_length {d_model}", f"vocab_size {vocab}"
    expected: dict[str, tuple[tuple[int, ...], str]] = {}
    if d_model and vocab:
        for name in ("token_embd.weight", "output.weight"):
            expected[name] = ((d_model, vocab), f"{said_d}, {said_v}")
    if d_model:
        expected["output_norm.weight"] = expected["output_norm.bias"] = ((d_model,), said_d)
    ctx = sizes.values.get("context_length")
    if rec.positions and d_model and ctx:
        expected["position_embd.weight"] = ((d_model, ctx), f"{said_d}, {gguf_arch}.context_length {ctx}")
    heads = sizes.layers("attention.head_count")
    if rec.common_layout and d_model and heads and n_layers:
        kv_heads = sizes.layers("attention.head_count_kv") or heads
        d_k = sizes.values.get("attention.key_length") or hf.get("head_dim") or d_model // max(heads)
        d_v = sizes.values.get("attention.value_length") or d_k
        d_mlp = sizes.layers("feed_forward_length")
        for i in range(n_layers):
            h, kv = heads[i], kv_heads[i]
            q, k, v = h * d_k, kv * d_k, kv * d_v
            hs = f"head_count {h} × d_head {d_k}"
            kvs = f"head_count_kv {kv} × d_head {d_k}"
            rows = {
                "attn_q": ((d_model, q), q, f"{said_d}; {hs}"),
                "attn_k": ((d_model, k), k, f"{said_d}; {kvs}"),
                "attn_v": ((d_model, v), v, f"{said_d}; {kvs}"),
                "attn_qkv": ((d_model, q + k + v), q + k + v, f"{said_d}; q, k, v of {hs}, {kvs}"),
                "attn_output": ((h * d_v, d_model), d_model, f"{hs}; {said_d}"),
            }
            if d_mlp:
                f_i = d_mlp[i]
                up = rec.ffn_up_blocks * f_i
                ff = f"{gguf_arch}.feed_forward_length {f_i}"
                rows |= {
                    "ffn_gate": ((d_model, f_i), f_i, f"{said_d}; {ff}"),
                    "ffn_up": ((d_model, up), up, f"{said_d}; {f'{rec.ffn_up_blocks} × ' if up != f_i else ''}{ff}"),
                    "ffn_down": ((f_i, d_model), d_model, f"{ff}; {said_d}"),
                }
            for stem, (shape, out, why) in rows.items():
                expected[f"blk.{i}.{stem}.weight"] = (shape, why)
                expected[f"blk.{i}.{stem}.bias"] = ((out,), why)
            for stem in _NORMS:
                expected[f"blk.{i}.{stem}.weight"] = expected[f"blk.{i}.{stem}.bias"] = ((d_model,), said_d)
    for t in tensors:
        if t.name not in expected:
            continue
        shape, why = expected[t.name]
        got = tuple(int(n) for n in t.shape)
        if got != shape:
            raise CheckpointError(
                f"{path}: tensor {t.name!r} has shape [{', '.join(map(str, got))}]; the metadata implies "
                f"[{', '.join(map(str, shape))}] ({why}; ne0 first, as llama.cpp prints it)"
            )
