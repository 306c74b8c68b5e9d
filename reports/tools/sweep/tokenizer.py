"""A small fast tokenizer trained on the shipped corpora, deterministic and offline: what a tiny
random checkpoint saves beside its weights (the sweep's folders and ``tests/tiny_models.py``).

Byte-level BPE for decoders, WordPiece with ``[CLS]``/``[SEP]`` for encoders; a few hundred
tokens, so a tiny model's logits stay cheap.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["corpus_texts", "train_tokenizer"]


def corpus_texts() -> list[str]:
    """The lines a tokenizer is trained on: the shipped plain texts and the CoNLL-U sentences."""
    from headscope.data import path

    lines = []
    for rel in ("text/sentences.txt", "heldout/lm_text.txt"):
        lines += [t for t in Path(path(rel)).read_text(encoding="utf-8").splitlines() if t and not t.startswith("#")]
    for rel in ("syntax/generated.conllu", "syntax/handwritten.conllu"):
        for t in Path(path(rel)).read_text(encoding="utf-8").splitlines():
            if t.startswith("# text = "):
                lines.append(t.removeprefix("# text = "))
    return lines


def train_tokenizer(encoder: bool, vocab_size: int):
    """A ``PreTrainedTokenizerFast`` of at most ``vocab_size`` tokens: WordPiece with BERT's
    special tokens (``encoder``) or byte-level BPE with ``<|endoftext|>`` as BOS, EOS and pad."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if encoder:
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        tok.train_from_iterator(
            corpus_texts(), trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=special)
        )
        cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        tok.post_processor = processors.BertProcessing(("[SEP]", sep), ("[CLS]", cls))
        return PreTrainedTokenizerFast(
            tokenizer_object=tok,
            unk_token="[UNK]",
            pad_token="[PAD]",
            cls_token="[CLS]",
            sep_token="[SEP]",
            mask_token="[MASK]",
        )
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
    )
    tok.train_from_iterator(corpus_texts(), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )
