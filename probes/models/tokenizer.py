"""A checkpoint's tokenizer: loaded from an HF directory, and checked against the model's embedding."""

from __future__ import annotations

import warnings
from pathlib import Path

from headscope.probes.errors import CheckpointError
from headscope.probes.models.quiet import quiet_transformers

# files that hold a vocabulary: fast (tokenizer.json), WordPiece, BPE, SentencePiece
TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "vocab.json",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
)


def load_tokenizer(directory: Path, *, trust_remote_code: bool = False):
    """The tokenizer of an HF directory. Refuses a folder without vocabulary files (transformers
    would build an empty tokenizer that maps every word to [UNK]). ``trust_remote_code``: let
    code shipped with the checkpoint run (``--trust-remote-code``; off by default)."""
    from transformers import AutoTokenizer

    directory = Path(directory)
    if not any((directory / f).is_file() for f in TOKENIZER_FILES) and not any(directory.glob("*.tiktoken")):
        raise CheckpointError(
            f"{directory}: no tokenizer files (expected one of {', '.join(TOKENIZER_FILES)}); "
            "copy the tokenizer files of the model's release into the folder"
        )
    try:
        with quiet_transformers():
            tok = AutoTokenizer.from_pretrained(str(directory), trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{directory}: no usable tokenizer ({str(e).splitlines()[0][:160]})") from None
    if len(tok) <= len(set(tok.all_special_ids)):
        raise CheckpointError(
            f"{directory}: the tokenizer holds only its {len(tok)} special tokens; "
            "copy the tokenizer files of the model's release into the folder"
        )
    return tok


def gguf_tokenizer(path: Path):
    """The tokenizer a GGUF file's metadata holds (``tokenizer.ggml.*``), built by transformers from
    the metadata alone: no tensor is read or dequantised. For counting lengths before the load
    (the memory plan and the time estimate); None when the file holds none it can build."""
    from transformers import AutoTokenizer

    path = Path(path)
    try:
        with quiet_transformers(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception:  # noqa: BLE001 - lengths are then bounded by bytes, as before; the load reports what is wrong
        return None


def check_tokenizer_vocab(tokenizer, vocab_size: int, where) -> None:
    """Refuse a tokenizer whose ordinary vocabulary reaches past the model's embedding
    (``vocab_size`` rows). Ids past it that are only *added* tokens (a pad token added
    without resizing the embedding, say) are common in real checkpoints: they warn, and
    :func:`~headscope.probes.tokens.encode` refuses an input that produces one."""
    try:
        vocab = tokenizer.get_vocab()
        n = max(vocab.values()) + 1
    except (AttributeError, NotImplementedError, ValueError):
        vocab, n = None, len(tokenizer)
    if n <= vocab_size:
        return
    try:
        added = set(tokenizer.get_added_vocab().values())
    except (AttributeError, NotImplementedError):
        added = set()
    past = sorted(i for i in vocab.values() if i >= vocab_size) if vocab is not None else list(range(vocab_size, n))
    if past and all(i in added for i in past):
        warnings.warn(
            f"{where}: {len(past)} added token(s) have ids {past[0]:,}–{past[-1]:,}, past config.json's "
            f"vocab_size {vocab_size:,} (no embedding); an input that produces one is refused",
            stacklevel=2,
        )
        return
    raise CheckpointError(
        f"{where}: the tokenizer has ids up to {n - 1:,} but config.json's vocab_size is {vocab_size:,} "
        f"(ids from {vocab_size:,} on have no embedding); use the model's own tokenizer files or fix vocab_size"
    )
