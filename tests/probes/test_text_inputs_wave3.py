"""User text as it comes (issues #23, #29): lines that show nothing, special-token strings
typed in a sentence, and long files.

- A line of zero-width or other invisible characters is skipped as blank, counted and
  reported; it is never scored as an item.
- ``[MASK]``, ``<|im_start|>``... typed in user text are plain text: ordinary pieces, never
  the special ids; the specials the tokenizer adds itself stay.
- Reading, tokenising and streaming do work linear in the lines (counted, not timed); a
  long stage prints progress lines on a log.
"""

from __future__ import annotations

import json
import sys
from collections import Counter

import pytest
from rich.console import Console

from headscope.data import path as data_path
from headscope.probes.capture import stream
from headscope.probes.corpora import read_text
from headscope.probes.corpora.text import BLANK, is_blank
from headscope.probes.models.checkpoints import hf_dir, load_tokenizer, resolve
from headscope.probes.models.inhouse.planted import WORD_CLASSES, planted_model
from headscope.probes.tokens import encode_plain, tokenize_one
from headscope.reports.cli import terminal
from headscope.reports.cli.app import main

#: lines that show nothing: zero-width space / non-joiner / joiner, BOM, word joiner, bidi
#: marks and isolates, soft hyphen, variation selector, Hangul filler, braille blank, tag
#: characters, controls, and plain or exotic whitespace
INVISIBLE_LINES = [
    "\u200b",
    "\u200b\u200c\u200d\ufeff\u2060",
    "\u200e\u200f\u2066\u2069\u202a\u202c",
    "\u00ad\ufe0f\u034f",
    "\u3164\u115f\u2800",
    "\U000e0041\U000e007f",
    "\x0b\x0c\x1f\x7f\x85",
    " \t\u00a0\u2003\u3000 \u200b ",
]
VISIBLE_LINES = ["The cat sat on the mat .", "\u200bA zero-width space before me .", "It purred ."]


@pytest.fixture(scope="module")
def tokenizers():
    """The shipped models' tokenizers (SmolLM2's from the cached HF folder of its GGUF, as
    tests/probes/test_alignment.py loads it; no model weights are loaded)."""
    return {name: load_tokenizer(hf_dir(resolve(name))) for name in ("minilm-l6", "smollm2-135m")}


class ItemCounter:
    """A reducer that counts the items and batches it is given (a consumer of the stream)."""

    def __init__(self):
        self.items: list[int] = []
        self.batches = 0

    def update(self, cap) -> None:
        self.items.extend(cap.item_ids)
        self.batches += 1

    def merge(self, other):
        self.items += other.items
        return self

    def result(self):
        return self.items


# ------------------------------------------------------------------- 1. invisible-only lines


def test_is_blank_covers_every_default_ignorable_and_whitespace_code_point():
    regex = pytest.importorskip("regex")  # Unicode properties (a dependency of transformers)
    shows_nothing = regex.compile(r"[\p{White_Space}\p{Default_Ignorable_Code_Point}\p{Cc}]")
    chars = [chr(cp) for cp in range(sys.maxunicode + 1) if not 0xD800 <= cp <= 0xDFFF]
    missed = [f"U+{ord(c):04X}" for c in chars if shows_nothing.fullmatch(c) and not is_blank(c)]
    assert missed == []
    for line in INVISIBLE_LINES:
        assert is_blank(line), ascii(line)
    for visible in ("a", "7", ".", "\u00e9", "e\u0301", "\u0301", "\U0001f468\u200d\U0001f469", "\u0600", "\u05d0"):
        assert not is_blank(visible) and not is_blank(f"\u200b{visible}\u200d"), ascii(visible)


def test_invisible_only_lines_are_skipped_counted_and_noted(tmp_path):
    lines = [VISIBLE_LINES[0], *INVISIBLE_LINES, VISIBLE_LINES[1], "", VISIBLE_LINES[2]]
    p = tmp_path / "t.txt"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    ts = read_text(p)
    assert ts.lines == tuple(VISIBLE_LINES)
    assert ts.line_numbers == (1, 10, 12)
    n_blank = len(INVISIBLE_LINES) + 1
    assert ts.skipped.entries == tuple((n, BLANK) for n in [*range(2, 10), 11])
    assert ts.blank == n_blank == 9
    assert ts.note() == "9 lines skipped: 9 blank or invisible-only"


def test_roles_cli_never_scores_an_invisible_line(tmp_path, capsys):
    """Before: each invisible line became an item of [CLS] [SEP] alone (4 + 8 items scored)."""
    p = tmp_path / "t.txt"
    p.write_text("\n".join(VISIBLE_LINES + INVISIBLE_LINES + ["Dogs bark ."]) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    rc = main(["roles", "minilm-l6", "--roles", "positional", "--text", str(p), "--out", str(out)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    run = json.loads((out / "run.json").read_text(encoding="utf-8"))
    assert run["n_items"] == {"positional": 4}
    skipped = json.loads((out / "skipped.json").read_text(encoding="utf-8"))
    (file_skips,) = [reasons for reasons in skipped.values() if BLANK in reasons]  # the text file's entry
    assert file_skips == {BLANK: len(INVISIBLE_LINES)}
    assert f"{BLANK} {len(INVISIBLE_LINES)}" in captured.out  # the summary's "skipped:" lines


def test_stream_and_encode_refuse_texts_that_show_nothing(tokenizers):
    """Texts given as a list (no reader in front): an invisible text is an empty item."""
    model = planted_model()
    counter = ItemCounter()
    texts = ["the cat sat .", "\u200b\u200d", "\ufeff\u2060", "a dog ran ."]
    report = stream(model, texts, [counter])
    assert counter.items == [0, 3]
    assert report.skipped == Counter({"empty": 2}) and report.skipped_items == [(1, "empty"), (2, "empty")]
    with pytest.raises(ValueError, match="empty text"):
        model.encode(texts=["\u200b\u200c"])
    # a visible text the tokenizer drops whole (BERT strips a lone combining accent): its specials alone
    with pytest.raises(ValueError, match="only its own special tokens"):
        tokenize_one(tokenizers["minilm-l6"], text="\u0301")


# ------------------------------------------------------------ 2. special-token strings in text

GENERIC_SPECIALS = ["[CLS]", "[SEP]", "[MASK]", "[PAD]", "[UNK]", "<s>", "</s>", "<pad>", "<unk>", "<|im_start|>"]


@pytest.mark.parametrize("name", ["minilm-l6", "smollm2-135m"])
def test_special_token_strings_in_user_text_are_plain_text(tokenizers, name):
    tok = tokenizers[name]
    special_ids = set(tok.all_special_ids)
    plain = tokenize_one(tok, text="the word")
    n = len(plain["ids"])
    added = [(k - n if k else 0, i) for k, (i, s) in enumerate(zip(plain["ids"], plain["special"])) if s]
    assert len(added) == (2 if name == "minilm-l6" else 0)  # [CLS] ... [SEP]; SmolLM2 adds nothing
    for literal in sorted(set(tok.all_special_tokens) | set(GENERIC_SPECIALS)):
        text = f"the {literal} word"
        it = tokenize_one(tok, text=text)
        m = len(it["ids"])
        # the tokenizer's own specials, where they were (counted from the start / the end)
        assert [(k - m if k else 0, i) for k, (i, s) in enumerate(zip(it["ids"], it["special"])) if s] == added
        assert not special_ids & {i for i, s in zip(it["ids"], it["special"]) if not s}, (literal, it["tokens"])
        a = text.index(literal)
        # the literal's characters are covered by ordinary tokens (a byte-level token may carry the space before it)
        over = [(x, y) for x, y in it["offsets"] if x < a + len(literal) and y > a]
        assert over and min(x for x, _ in over) <= a and max(y for _, y in over) >= a + len(literal), literal
    # the literal is read as text before the fix: the tokenizer's default call gives the special id
    mask = "[MASK]" if name == "minilm-l6" else "<|im_start|>"
    assert tok.convert_tokens_to_ids(mask) in tok(f"the {mask} word")["input_ids"]


@pytest.mark.parametrize("name", ["minilm-l6", "smollm2-135m"])
def test_plain_text_encoding_leaves_ordinary_text_as_it_was(tokenizers, name):
    """The shipped sentences hold no special-token string: their ids are those of the default call."""
    tok = tokenizers[name]
    lines = list(read_text(data_path("text/sentences.txt")).lines)
    assert encode_plain(tok, lines)["input_ids"] == tok(lines)["input_ids"]


def test_rare_word_counts_read_text_as_the_stream_does(tokenizers):
    from headscope.analyses.roles.rareword import count_tokens

    tok = tokenizers["minilm-l6"]
    texts = ["a [MASK] sat on the [SEP] mat", "\u200b\u200c", "the [CLS] end"]
    want = Counter()
    for t in texts:
        if not is_blank(t):
            it = tokenize_one(tok, text=t)
            want.update(i for i, s in zip(it["ids"], it["special"]) if not s)
    assert count_tokens(tok, texts) == want
    assert tok.mask_token_id not in want


def test_planted_model_reads_its_bos_string_as_text():
    batch = planted_model().encode(texts=["the [BOS] cat"])
    assert batch.tokens == [["[BOS]", "the", "[UNK]", "[UNK]", "[UNK]", "cat"]]
    assert batch.special == [[True, False, False, False, False, False]]


# -------------------------------------------------------------------------- 3. long inputs


class CountingTokenizer:
    """The real tokenizer, with its calls and the characters it was given counted."""

    def __init__(self, tok):
        self._tok = tok
        self.calls = 0
        self.chars = 0

    def __call__(self, text, *args, **kwargs):
        self.calls += 1
        self.chars += len(text) if isinstance(text, str) else sum(len(t) for t in text)
        return self._tok(text, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tok, name)


def _planted_lines(n: int) -> list[str]:
    words = [w for cls in ("det", "noun", "verb", "adj", "other") for w in WORD_CLASSES[cls]]
    return [" ".join(words[(i * 7 + k * 3) % len(words)] for k in range(3 + i % 9)) + " ." for i in range(n)]


def test_reading_tokenising_and_streaming_do_work_linear_in_the_lines(tmp_path):
    """Each line is read once, tokenised once (one call, its own characters only: no prefix
    is tokenised again) and reaches the reducers once; 4x the lines is exactly 4x the work."""
    work = {}
    for n in (100, 400):
        lines = _planted_lines(n)
        p = tmp_path / f"lines{n}.txt"
        p.write_text("\n".join(lines[: n // 2] + ["\u200b"] + lines[n // 2 :]) + "\n", encoding="utf-8")
        ts = read_text(p)
        assert ts.lines == tuple(lines) and ts.blank == 1
        model = planted_model()
        model.tokenizer = CountingTokenizer(model.tokenizer)
        counter, seen = ItemCounter(), []
        report = stream(model, ts.lines, [counter], progress=lambda done, total, log=seen: log.append((done, total)))
        assert sorted(counter.items) == list(range(n)) and report.n_used == n and not report.skipped
        assert seen[-1] == (n, n) and len(seen) == report.n_batches == counter.batches
        assert model.tokenizer.calls == n and model.tokenizer.chars == sum(map(len, lines))
        work[n] = (model.tokenizer.calls, model.tokenizer.chars, len(counter.items))
    assert work[400][0] == 4 * work[100][0] and work[400][2] == 4 * work[100][2]


def _console():
    import io

    buf = io.StringIO()
    return buf, Console(file=buf, force_terminal=False, width=200)


def test_long_stage_prints_progress_lines_on_a_log(monkeypatch):
    """A log (stderr not a terminal) gets a line every HEARTBEAT_S seconds for a stage of many
    items; with long_only (the roles command's setting), short stages print nothing."""
    monkeypatch.setattr(terminal, "HEARTBEAT_S", 0.0)  # every batch past the first is due
    monkeypatch.setattr(terminal, "LONG_STAGE_ITEMS", 150)  # a long stage of few items, to keep the test short
    model = planted_model()
    lines = _planted_lines(200)
    buf, console = _console()
    sp = terminal.StageProgress(console=console, long_only=True)
    with sp:
        stream(model, lines[:100], [ItemCounter()], batch_size=32, progress=lambda d, t: sp("short", d, t))
        stream(model, lines, [ItemCounter()], batch_size=32, progress=lambda d, t: sp("text", d, t))
    out = buf.getvalue().splitlines()
    n = len(lines)
    assert out[0] == "headscope: text started" and out[-1].startswith("headscope: text done in ")
    beats = out[1:-1]
    assert beats and all(line.startswith("headscope: text ") and f"/{n} items, " in line for line in beats)
    done = [int(line.split()[2].split("/")[0]) for line in beats]
    assert done == sorted(done) and done[-1] < n
    assert not any("short" in line for line in out)


def test_short_stages_keep_their_two_lines_and_no_heartbeat(monkeypatch):
    monkeypatch.setattr(terminal, "HEARTBEAT_S", 0.0)
    buf, console = _console()
    sp = terminal.StageProgress(console=console)
    with sp:
        for done in (32, 64, 100):
            sp("syntactic", done, 100)
    out = buf.getvalue().splitlines()
    assert out[0] == "headscope: syntactic started" and out[1].startswith("headscope: syntactic done in ")
    assert len(out) == 2


def test_roles_on_a_log_prints_progress_for_a_long_text(tmp_path, capsys, monkeypatch):
    """capsys' stderr is no terminal, as a log: before, roles printed no progress there at all
    (short stages staying silent is checked on StageProgress above)."""
    p = tmp_path / "t.txt"
    p.write_text("\n".join(f"Sentence number {i} is here ." for i in range(12)) + "\n", encoding="utf-8")
    monkeypatch.setattr(terminal, "LONG_STAGE_ITEMS", 10)  # 12 lines count as a long text
    monkeypatch.setattr(terminal, "HEARTBEAT_S", 0.0)
    argv = ["roles", "minilm-l6", "--roles", "positional", "--text", str(p), "--batch-size", "4"]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("headscope: text")]
    assert err[0] == "headscope: text started" and err[-1].startswith("headscope: text done in ")
    assert [line.rsplit(",", 1)[0] for line in err[1:-1]] == [
        "headscope: text 4/12 items",
        "headscope: text 8/12 items",
    ]
