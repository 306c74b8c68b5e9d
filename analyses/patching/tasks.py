"""Patching tasks: minimal pairs (a clean and a corrupted input of equal token length) and
a metric read from the model's output (:func:`~headscope.analyses.patching.activation.readout`:
a decoder's next-token logits at the last position, an encoder's mean-pooled last hidden state).

A :class:`Task` holds tokenised :class:`PairItem` s and the name of its metric
(:data:`METRICS`; :data:`MEASURES` says in words what each measures):

* ``"logprob"``: ``log p(answer)`` at the last position;
* ``"logit_diff"``: ``logit(answer) - logit(wrong)`` at the last position (the answer and
  the wrong token are the clean input's; on the corrupted input the difference is
  usually negative); equal to ``log p(answer) - log p(wrong)``;
* ``"embedding_cosine"`` (encoders, which have no LM head): the cosine similarity between
  the run's mean-pooled last hidden state and the clean run's, so the clean run scores 1
  and the corrupted run less (:data:`REFERENCE_METRICS`: its "answer" is the clean run's
  readout, not a token). :func:`load_task` gives every task this metric on an encoder.

Shipped tasks (:data:`TASKS`, built for the model's own tokenizer):

* ``induction`` (:func:`induction_task`): ``[first] + S + S[:-1]``, ``S`` ``seq_len``
  distinct ordinary token ids (seeded; ``first`` is BOS/CLS where the tokenizer has one,
  as the roles' induction probe); corrupted: the first copy of ``S`` replaced by other
  random ids (disjoint from ``S``); metric ``logprob`` of ``S[-1]``, the token the
  induction rule predicts after ``S[-2]``.
* ``agreement`` (``data/tasks/agreement.jsonl``, written by :func:`agreement_rows`):
  ``"The author of the books"`` / ``"The authors of the books"``, answer ``" is"``,
  wrong ``" are"`` (and the reverse); metric ``logit_diff``.
* ``coreference`` (:func:`coreference_rows`, from the roles' ``data/coref/coref.jsonl``):
  each minimal pair of coreference items (Winograd, gender, number) in both directions:
  clean ``'The cat didn't climb on the table because it was too tired. "it" refers to
  the'``, corrupted the partner (``... too tall ...``), answer the clean item's
  antecedent head word (``" cat"``), wrong the other candidate's (``" table"``); metric
  ``logit_diff`` (the log-prob difference of the two candidates). Candidates that are not
  single tokens, and pairs whose prompts differ in length, are unusable (counted, with
  the reason).
* ``duplicate_token`` (:func:`duplicate_token_task`): one token repeated in random
  context, ``[first] + A + [x, y] + B + [x]``, answer ``y`` (the token that followed the
  earlier ``x``); corrupted: the earlier ``x`` replaced by a fresh token, so nothing is
  repeated; metric ``logprob``. It is carried by a previous-token head (writing ``x``
  into the position of ``y``) and the head that reads it from the repeated ``x``
  (induction / duplicate-token), with one repeated token instead of a repeated sequence.

Users' tasks are JSONL files, one item per line, a JSON object with either texts::

    {"clean": "The key near the cabinet", "corrupted": "The keys near the cabinet", "answer": " is", "wrong": " are"}

or token ids (no tokenisation)::

    {"clean_ids": [1, 5, 6, 5], "corrupted_ids": [1, 7, 8, 5], "answer_id": 6}

``wrong``/``wrong_id`` is optional; every item of a file must agree on whether it has one
(with: ``logit_diff``, without: ``logprob``; on an encoder both are read but unused: the
metric is ``embedding_cosine``). ``answer`` and ``wrong`` must be single tokens
(tokenised without special tokens). Blank lines and lines starting with ``#`` are skipped.
A task file is UTF-8 text (as JSON Lines are), with or without a byte-order mark; any other
encoding (UTF-16, a binary file) is refused as ``file:line: not UTF-8 text (...)``.
A malformed line raises :class:`~headscope.probes.errors.InputFileError`
(``file:line:column: message``); an item whose clean and corrupted inputs tokenise to
different lengths, or whose answer is not one token, is *unusable*: it is counted and
listed in :attr:`Task.unusable` (with its line, its ``kind`` (:data:`UNUSABLE_KINDS`) and
the reason), never dropped silently; :meth:`Task.unusable_counts` tallies the kinds. A task
with no usable item is refused, with the count of each kind.

Generated tasks (``induction``, ``duplicate_token``) make at most
:data:`MAX_GENERATED_ITEMS` items.

>>> rows = agreement_rows()
>>> len(rows), sorted(rows[0])
(2304, ['answer', 'clean', 'corrupted', 'wrong'])
"""

from __future__ import annotations

import codecs
import io
import json
import logging
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

from headscope.probes.errors import InputFileError, ModelIncompatibleError

log = logging.getLogger(__name__)

#: most items a generated task (induction, duplicate_token) makes: past it the items alone
#: fill gigabytes, and patching them takes days (write a larger task to a JSONL file)
MAX_GENERATED_ITEMS = 100_000

#: why an item is unusable (the ``kind`` of each :attr:`Task.unusable` entry)
UNUSABLE_KINDS = {
    "id_past_vocab": "a token id past the vocabulary",
    "longer_than_context": "longer than the model's context",
    "not_single_token": "answer or wrong is not a single token",
    "length_mismatch": "clean and corrupted tokenise to different lengths",
    "no_partner": "no minimal-pair partner",
    "same_antecedent": "the partner has the same antecedent",
    "not_two_candidates": "not two candidates",
}


def unusable_counts(unusable: list[dict]) -> dict[str, int]:
    """``{kind: count}`` of :attr:`Task.unusable` entries, kinds sorted.

    >>> unusable_counts([{"kind": "not_single_token"}, {"kind": "length_mismatch"}, {"kind": "not_single_token"}])
    {'length_mismatch': 1, 'not_single_token': 2}
    """
    return dict(sorted(Counter(u.get("kind", "other") for u in unusable).items()))


def _counts_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {n}" for k, n in counts.items())


# ----------------------------------------------------------------------------- metrics
def logprob_metric(logits: torch.Tensor, answer: torch.Tensor, wrong: torch.Tensor | None = None) -> torch.Tensor:
    """``log p(answer)``: ``logits [batch, vocab]`` (the last position), ``answer [batch]`` -> ``[batch]`` (float32).

    >>> logprob_metric(torch.tensor([[0.0, 0.0]]), torch.tensor([1])).tolist()
    [-0.6931471824645996]
    """
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, answer.to(logits.device)[:, None])[:, 0]


def logit_diff_metric(logits: torch.Tensor, answer: torch.Tensor, wrong: torch.Tensor | None = None) -> torch.Tensor:
    """``logit(answer) - logit(wrong)``: ``[batch, vocab]``, ``[batch]``, ``[batch]`` -> ``[batch]`` (float32).

    >>> logit_diff_metric(torch.tensor([[1.0, 3.0]]), torch.tensor([1]), torch.tensor([0])).tolist()
    [2.0]
    """
    if wrong is None:
        raise ValueError("the logit_diff metric needs a wrong token per item; got none")
    lf = logits.float()
    answer, wrong = answer.to(lf.device), wrong.to(lf.device)
    return lf.gather(-1, answer[:, None])[:, 0] - lf.gather(-1, wrong[:, None])[:, 0]


def embedding_cosine_metric(
    pooled: torch.Tensor, reference: torch.Tensor, wrong: torch.Tensor | None = None
) -> torch.Tensor:
    """Cosine similarity of ``pooled [batch, d_model]`` (a run's mean-pooled last hidden
    state) to ``reference [batch, d_model]`` (the clean run's) -> ``[batch]`` (float32).

    >>> embedding_cosine_metric(torch.tensor([[1.0, 0.0], [1.0, 1.0]]), torch.tensor([[1.0, 0.0], [1.0, 0.0]])).tolist()
    [1.0, 0.7071067690849304]
    """
    return torch.nn.functional.cosine_similarity(pooled.float(), reference.to(pooled.device).float(), dim=-1)


METRICS = {"logprob": logprob_metric, "logit_diff": logit_diff_metric, "embedding_cosine": embedding_cosine_metric}

#: metrics whose second argument is the clean run's readout (per item), not an answer token
REFERENCE_METRICS = frozenset({"embedding_cosine"})

#: what each metric measures, in words (the summary's and run.json's ``"measures"``)
MEASURES = {
    "logprob": "log p(answer) at the last position (next-token log-prob of the clean answer)",
    "logit_diff": "logit(answer) - logit(wrong) at the last position (= log p(answer) - log p(wrong))",
    "embedding_cosine": (
        "cosine similarity of the run's mean-pooled last hidden state to the clean run's "
        "(an encoder has no LM head; clean = 1, corrupted < 1)"
    ),
}


def metric_fn(name: str):
    """The metric registered as ``name``; ``ValueError`` listing the valid ones."""
    if name not in METRICS:
        raise ValueError(f"unknown metric {name!r}; valid metrics: {', '.join(METRICS)}")
    return METRICS[name]


# ----------------------------------------------------------------------------- items
@dataclass(frozen=True)
class PairItem:
    """One minimal pair, tokenised: ``clean`` and ``corrupted`` ids of equal length, the
    ``answer`` id (and ``wrong`` id for ``logit_diff``) read at the last position."""

    clean: tuple[int, ...]
    corrupted: tuple[int, ...]
    answer: int
    wrong: int | None = None

    def __post_init__(self):
        if len(self.clean) != len(self.corrupted) or not self.clean:
            raise ValueError(
                f"clean and corrupted must have the same, non-zero length; got {len(self.clean)} and "
                f"{len(self.corrupted)}"
            )


@dataclass
class Task:
    """A patching task: ``items`` (usable :class:`PairItem` s), ``metric`` (a :data:`METRICS`
    name), and ``unusable``: ``[{"item": index, "line": line or None, "reason": ...}]``."""

    name: str
    items: list[PairItem]
    metric: str
    unusable: list[dict] = field(default_factory=list)
    source: str = ""

    def __post_init__(self):
        metric_fn(self.metric)
        if self.metric == "logit_diff" and any(it.wrong is None for it in self.items):
            raise ValueError(f"task {self.name!r}: the logit_diff metric needs a wrong token in every item")

    @property
    def n_unusable(self) -> int:
        return len(self.unusable)

    def unusable_counts(self) -> dict[str, int]:
        """``{kind: count}`` of the unusable items (:data:`UNUSABLE_KINDS`)."""
        return unusable_counts(self.unusable)

    def batches(self, batch_size: int):
        """Yield ``(clean [batch, pos], corrupted [batch, pos], answer [batch], wrong [batch] | None,
        item indices)`` of items of equal length (no padding), at most ``batch_size`` per batch,
        in item order within each length."""
        by_len: dict[int, list[int]] = {}
        for i, it in enumerate(self.items):
            by_len.setdefault(len(it.clean), []).append(i)
        for length in sorted(by_len):
            idx = by_len[length]
            for s in range(0, len(idx), batch_size):
                rows = idx[s : s + batch_size]
                its = [self.items[i] for i in rows]
                clean = torch.tensor([it.clean for it in its], dtype=torch.long)
                corrupted = torch.tensor([it.corrupted for it in its], dtype=torch.long)
                answer = torch.tensor([it.answer for it in its], dtype=torch.long)
                wrong = (
                    torch.tensor([it.wrong for it in its], dtype=torch.long) if self.metric == "logit_diff" else None
                )
                yield clean, corrupted, answer, wrong, rows

    def summary(self) -> dict:
        return {
            "name": self.name,
            "source": self.source,
            "metric": self.metric,
            "n_items": len(self.items),
            "n_unusable": self.n_unusable,
            "unusable_counts": self.unusable_counts(),
            "unusable": self.unusable[:20],
        }


# ----------------------------------------------------------------------------- induction
def leading_specials(tokenizer) -> list[int]:
    """The ids the tokenizer itself puts in front of a text ([CLS], a BOS), found by encoding a
    probe word with and without special tokens: ``[]`` for a tokenizer that adds none, as
    SmolLM2's, whose ``bos_token`` (``<|im_start|>``) never starts an encoded text."""
    with_specials = tokenizer("a", add_special_tokens=True)["input_ids"]
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    for start in range(len(with_specials) - len(plain) + 1):
        if with_specials[start : start + len(plain)] == plain:
            return list(with_specials[:start])
    return []


def _first_convention(first: list[int], tokenizer) -> str:
    """How a generated task's items start, in words (its :attr:`Task.source`)."""
    if not first:
        return "no BOS: the tokenizer adds none to a text"
    return f"starts with {', '.join(tokenizer.convert_ids_to_tokens(first))} as the tokenizer's own texts do"


def _random_items_setup(tokenizer, vocab_ids, need: int, task: str, seed: int):
    """``(vocab ids [n], first tokens (what the tokenizer puts in front of a text: [CLS], a BOS,
    or nothing; :func:`leading_specials`), seeded generator)`` of a task drawn from random
    tokens; ``ValueError`` when fewer than ``need`` ids can be drawn."""
    from headscope.analyses.roles.induction import ordinary_vocab

    vocab = torch.tensor(list(vocab_ids) if vocab_ids is not None else ordinary_vocab(tokenizer), dtype=torch.long)
    if vocab.numel() < need:
        raise ValueError(f"{task} needs {need} distinct ordinary token ids; the tokenizer has {vocab.numel()}")
    return vocab, leading_specials(tokenizer), torch.Generator().manual_seed(seed)


def induction_task(tokenizer, *, n_items: int = 16, seq_len: int = 10, seed: int = 0, vocab_ids=None) -> Task:
    """Repeated random tokens (see the module docstring): ``n_items`` pairs of
    ``[first] + S + S[:-1]`` vs ``[first] + T + S[:-1]`` (``len(S) = len(T) = seq_len``,
    all ``2 seq_len`` ids distinct), answer ``S[-1]``, metric ``logprob``. ``vocab_ids``:
    the ids to draw from (default the roles' ordinary vocabulary). Seeded, no global state."""

    if not 1 <= n_items <= MAX_GENERATED_ITEMS or seq_len < 2:
        raise ValueError(f"n_items must be in [1, {MAX_GENERATED_ITEMS}] and seq_len >= 2; got {n_items}, {seq_len}")
    vocab, first, gen = _random_items_setup(tokenizer, vocab_ids, 2 * seq_len, "induction", seed)
    items = []
    for _ in range(n_items):
        draw = vocab[torch.randperm(vocab.numel(), generator=gen)[: 2 * seq_len]].tolist()
        s, t = draw[:seq_len], draw[seq_len:]
        items.append(PairItem(tuple(first + s + s[:-1]), tuple(first + t + s[:-1]), s[-1]))
    source = f"generated (seq_len={seq_len}, seed={seed}; {_first_convention(first, tokenizer)})"
    return Task(name="induction", items=items, metric="logprob", source=source)


# ----------------------------------------------------------------------------- agreement
_AGREEMENT_SUBJECTS = [
    ("author", "authors"),
    ("key", "keys"),
    ("teacher", "teachers"),
    ("dog", "dogs"),
    ("friend", "friends"),
    ("player", "players"),
    ("doctor", "doctors"),
    ("student", "students"),
    ("painting", "paintings"),
    ("house", "houses"),
    ("car", "cars"),
    ("girl", "girls"),
    ("boy", "boys"),
    ("bird", "birds"),
    ("book", "books"),
    ("road", "roads"),
]
_AGREEMENT_ATTRACTORS = ["the books", "the cabinet", "the city", "the old man", "the farmers", "my sister"]
_AGREEMENT_LINKS = ["of", "near", "behind", "with"]
_VERBS = [(" is", " are"), (" was", " were"), (" has", " have")]


def agreement_rows(seed: int = 0) -> list[dict]:
    """The rows of ``data/tasks/agreement.jsonl``: every subject pair × link × attractor
    × verb pair, singular-clean and plural-clean, shuffled with ``random.Random(seed)`` (so
    the first ``n`` rows are a mixed sample). Each row: ``{"clean", "corrupted", "answer", "wrong"}``."""
    import random

    rows = []
    for sg, pl in _AGREEMENT_SUBJECTS:
        for link in _AGREEMENT_LINKS:
            for attractor in _AGREEMENT_ATTRACTORS:
                for v_sg, v_pl in _VERBS:
                    a, b = f"The {sg} {link} {attractor}", f"The {pl} {link} {attractor}"
                    rows.append({"clean": a, "corrupted": b, "answer": v_sg, "wrong": v_pl})
                    rows.append({"clean": b, "corrupted": a, "answer": v_pl, "wrong": v_sg})
    random.Random(seed).shuffle(rows)
    return rows


def write_agreement(path) -> int:
    """Write :func:`agreement_rows` as JSONL to ``path``; returns the number of rows."""
    from headscope.probes.outputs.atomic import atomic_write

    rows = agreement_rows()
    with atomic_write(path) as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return len(rows)


# ----------------------------------------------------------------------------- JSONL
_TEXT_KEYS = ("clean", "corrupted", "answer")
_ID_KEYS = ("clean_ids", "corrupted_ids", "answer_id")


def _utf8_text(path: Path) -> str:
    """The text of a task file: UTF-8, a leading byte-order mark dropped; ``InputFileError``
    ``file:line: not UTF-8 text (...)`` for anything else (UTF-16/32, a binary file)."""
    from headscope.probes.corpora.text import sniff_encoding

    raw = path.read_bytes()
    if raw.startswith(codecs.BOM_UTF8):
        raw = raw[len(codecs.BOM_UTF8) :]
    else:
        enc = sniff_encoding(raw[:4096])
        if enc.codec != "utf-8":
            raise InputFileError(
                path,
                1,
                None,
                f"not UTF-8 text (it reads as {enc.name}); JSON Lines are UTF-8: re-save the file as UTF-8",
            )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        before = io.StringIO(raw[: err.start].decode("utf-8"), newline=None).read()  # line ends as read below
        line, col = before.count("\n") + 1, len(before) - (before.rfind("\n") + 1) + 1
        raise InputFileError(
            path,
            line,
            None,
            f"not UTF-8 text (byte 0x{raw[err.start]:02x} at column {col}: {err.reason}); "
            "a task file is UTF-8 JSON Lines: re-save it as UTF-8",
        ) from None


def read_task_jsonl(path) -> list[tuple[int, dict]]:
    """``[(line number, item dict)]`` of a task file (format: module docstring), checked for
    structure; :class:`InputFileError` (``file:line:col``) on the first bad line, or
    ``file:line: not UTF-8 text (...)`` for a file that is not UTF-8 (a leading byte-order
    mark is fine)."""
    path = Path(path)
    rows: list[tuple[int, dict]] = []
    with_wrong: bool | None = None
    text = _utf8_text(path)
    with io.StringIO(text, newline=None) as f:  # LF, CRLF or CR line ends, as open() reads them
        for lineno, line in enumerate(f, start=1):
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                continue
            try:
                obj = json.loads(stripped)
            except json.JSONDecodeError as e:
                indent = len(line) - len(line.lstrip())
                raise InputFileError(path, lineno, indent + e.colno, f"not valid JSON ({e.msg})") from None
            if not isinstance(obj, dict):
                raise InputFileError(path, lineno, 1, f"an item must be a JSON object; got {type(obj).__name__}")
            ids = "clean_ids" in obj
            keys = _ID_KEYS if ids else _TEXT_KEYS
            missing = [k for k in keys if k not in obj]
            if missing:
                raise InputFileError(
                    path,
                    lineno,
                    1,
                    f"missing key {missing[0]!r}; an item needs {', '.join(keys)} (and optionally wrong)",
                )
            for k in keys:
                want_list = k.endswith("_ids")
                v = obj[k]
                ok = (
                    isinstance(v, list) and v and all(_is_id(x) for x in v)
                    if want_list
                    else (_is_id(v) if k.endswith("_id") else isinstance(v, str) and v != "")
                )
                if not ok:
                    what = (
                        "a non-empty list of token ids"
                        if want_list
                        else ("a token id" if k.endswith("_id") else "a non-empty string")
                    )
                    raise InputFileError(path, lineno, _column(line, k), f"{k!r} must be {what}; got {v!r}")
            wrong_key = "wrong_id" if ids else "wrong"
            has_wrong = wrong_key in obj
            if has_wrong:
                w = obj[wrong_key]
                if not _is_id(w) if ids else not (isinstance(w, str) and w):
                    raise InputFileError(
                        path, lineno, _column(line, wrong_key), f"{wrong_key!r} is malformed; got {w!r}"
                    )
            if with_wrong is None:
                with_wrong = has_wrong
            elif with_wrong != has_wrong:
                raise InputFileError(
                    path,
                    lineno,
                    1,
                    f"every item must {'have' if with_wrong else 'lack'} {wrong_key!r} like the first item "
                    "(with: logit_diff metric, without: logprob)",
                )
            rows.append((lineno, obj))
    if not rows:
        raise InputFileError(path, None, None, "no items (the file is empty or only comments)")
    return rows


def _is_id(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _column(line: str, key: str) -> int:
    """1-based column of ``"key"`` in ``line`` (1 when not found)."""
    at = line.find(f'"{key}"')
    return at + 1 if at >= 0 else 1


def _single_token(tokenizer, text: str) -> int | None:
    """The one id ``text`` is as plain text (a special token's string typed as an answer is not
    the special), or ``None`` when it is not a single token."""
    from headscope.probes.tokens import encode_plain

    ids = encode_plain(tokenizer, text, add_special_tokens=False)["input_ids"]
    return ids[0] if len(ids) == 1 else None


def tokenize_rows(model, rows: list[tuple[int, dict]], *, name: str, source: str = "") -> Task:
    """Tokenise :func:`read_task_jsonl` rows with ``model.encode`` (its tokenizer, context and
    vocabulary); items that cannot be used are counted in ``Task.unusable``, with a warning."""
    tok = model.tokenizer
    items: list[PairItem] = []
    unusable: list[dict] = []
    texts = [r for _, r in rows if "clean_ids" not in r]
    encoded = {}
    if texts:
        batch = model.encode(texts=[t for r in texts for t in (r["clean"], r["corrupted"])])
        for j, r in enumerate(texts):
            encoded[id(r)] = (
                batch.input_ids[2 * j, : batch.lengths[2 * j]].tolist(),
                batch.input_ids[2 * j + 1, : batch.lengths[2 * j + 1]].tolist(),
            )
    vocab = model.vocab_size
    for k, (lineno, r) in enumerate(rows):
        if "clean_ids" in r:
            clean, corrupted = list(r["clean_ids"]), list(r["corrupted_ids"])
            answer, wrong = r["answer_id"], r.get("wrong_id")
            too_big = [
                x for x in [*clean, *corrupted, answer, *([wrong] if wrong is not None else [])] if vocab and x >= vocab
            ]
            if too_big:
                reason = f"token id {too_big[0]} >= vocab size {vocab}"
                unusable.append({"item": k, "line": lineno, "kind": "id_past_vocab", "reason": reason})
                continue
            if len(clean) > model.spec.max_positions or len(corrupted) > model.spec.max_positions:
                reason = f"{max(len(clean), len(corrupted))} tokens; the model's context is {model.spec.max_positions}"
                unusable.append({"item": k, "line": lineno, "kind": "longer_than_context", "reason": reason})
                continue
        elif not model.spec.causal:  # an encoder's metric reads no answer token
            clean, corrupted = encoded[id(r)]
            answer, wrong = 0, None
        else:
            clean, corrupted = encoded[id(r)]
            answer = _single_token(tok, r["answer"])
            wrong = _single_token(tok, r["wrong"]) if "wrong" in r else None
            if answer is None or ("wrong" in r and wrong is None):
                bad = r["answer"] if answer is None else r["wrong"]
                unusable.append(
                    {"item": k, "line": lineno, "kind": "not_single_token", "reason": f"{bad!r} is not a single token"}
                )
                continue
        if len(clean) != len(corrupted):
            reason = f"clean has {len(clean)} tokens, corrupted {len(corrupted)}"
            unusable.append({"item": k, "line": lineno, "kind": "length_mismatch", "reason": reason})
            continue
        items.append(PairItem(tuple(clean), tuple(corrupted), int(answer), None if wrong is None else int(wrong)))
    metric = "logit_diff" if ("wrong" in rows[0][1] or "wrong_id" in rows[0][1]) else "logprob"
    if not model.spec.causal:
        metric = "embedding_cosine"
        items = [PairItem(it.clean, it.corrupted, 0) for it in items]
    if unusable:
        first = unusable[0]
        warnings.warn(
            f"task {name}: {len(unusable)} of {len(rows)} items unusable ({_counts_text(unusable_counts(unusable))}; "
            f"first: line {first['line']}: {first['reason']}); they are listed in Task.unusable",
            stacklevel=2,
        )
    if not items:
        raise InputFileError(
            source or name,
            None,
            None,
            f"no usable items: read {len(rows)} item{'s' if len(rows) != 1 else ''}, all unusable "
            f"({_counts_text(unusable_counts(unusable))}; "
            f"first at line {unusable[0]['line']}: {unusable[0]['reason']})",
        )
    return Task(name=name, items=items, metric=metric, unusable=unusable, source=source)


# ----------------------------------------------------------------------------- duplicate token
def duplicate_token_task(
    tokenizer, *, n_items: int = 16, seq_len: int = 10, seed: int = 0, vocab_ids=None, first_at: int | None = None
) -> Task:
    """One repeated token (see the module docstring): ``n_items`` pairs of ``[first] + A + [x,
    y] + B + [x]`` vs the same with the earlier ``x`` replaced by a fresh token ``z``;
    ``len(A) + 2 + len(B) = seq_len``, all ids distinct except the repeated ``x``; answer
    ``y``, metric ``logprob``. ``first_at``: the earlier ``x`` is the ``first_at``-th token of
    ``A + [x, y] + B`` counting from 1 (so its index in an input with ``[first]`` is
    ``first_at``; default ``seq_len // 2``); the same in every item, so positions line up.
    Seeded, no global state.

    >>> from headscope.probes.models.planted import planted_tokenizer
    >>> it = duplicate_token_task(planted_tokenizer(), n_items=1, seq_len=6).items[0]
    >>> len(it.clean), it.clean[3] == it.clean[-1], it.clean[4] == it.answer, it.corrupted[3] != it.clean[3]
    (8, True, True, True)
    """

    at = seq_len // 2 if first_at is None else first_at
    if not 1 <= n_items <= MAX_GENERATED_ITEMS or seq_len < 3 or not 1 <= at <= seq_len - 2:
        raise ValueError(
            f"n_items must be in [1, {MAX_GENERATED_ITEMS}], seq_len >= 3 and 1 <= first_at <= seq_len - 2; "
            f"got {n_items}, {seq_len}, {at}"
        )
    vocab, first, gen = _random_items_setup(tokenizer, vocab_ids, seq_len + 1, "duplicate_token", seed)
    items = []
    for _ in range(n_items):
        draw = vocab[torch.randperm(vocab.numel(), generator=gen)[: seq_len + 1]].tolist()
        x, y, z, rest = draw[0], draw[1], draw[2], draw[3:]
        a, b = rest[: at - 1], rest[at - 1 :]
        body = a + [x, y] + b
        clean = first + body + [x]
        corrupted = first + a + [z, y] + b + [x]
        items.append(PairItem(tuple(clean), tuple(corrupted), y))
    return Task(
        name="duplicate_token",
        items=items,
        metric="logprob",
        source=f"generated (seq_len={seq_len}, seed={seed}; {_first_convention(first, tokenizer)})",
    )


# ----------------------------------------------------------------------------- coreference
_DETERMINERS = {"the", "a", "an"}


def _detokenize(words) -> str:
    """Words joined with spaces, without the space before punctuation and clitics."""
    out = ""
    for w in words:
        glue = not out or w in {".", ",", "!", "?", ";", ":"} or w.startswith("'") or w == "n't"
        out += w if glue else " " + w
    return out


def coreference_prompt(item) -> tuple[str, str, str] | str:
    """``(prompt, answer, wrong)`` for a :class:`~headscope.probes.corpora.coref.CorefItem` with
    two candidates: ``'<sentence> "<pronoun>" refers to[ the]'``, the antecedent's and the
    other candidate's head words with a leading space; a reason string when it cannot be
    made (not two candidates).

    >>> from headscope.probes.corpora.coref import CorefItem
    >>> it = CorefItem(words=("The", "cat", "chased", "the", "dog", "because", "it", "was", "hungry", "."),
    ...     pronoun=6, candidates=((0, 2), (3, 5)), antecedent=0)
    >>> coreference_prompt(it)
    ('The cat chased the dog because it was hungry. "it" refers to the', ' cat', ' dog')
    """
    if len(item.candidates) != 2:
        return f"{len(item.candidates)} candidates (needs 2)"
    det = all(item.words[s].lower() in _DETERMINERS and e - s > 1 for s, e in item.candidates)
    prompt = f'{_detokenize(item.words)} "{item.words[item.pronoun]}" refers to' + (" the" if det else "")
    heads = [item.words[h] for h in item.heads]
    return prompt, " " + heads[item.antecedent], " " + heads[1 - item.antecedent]


def coreference_rows(path=None, *, seed: int = 0) -> tuple[list[tuple[int, dict]], list[dict]]:
    """``([(line, row)], unusable)``: the task rows of a coreference file (default the
    shipped ``data/coref/coref.jsonl``): for every minimal pair (``id``/``pair``) whose
    two items have different antecedents, both directions (clean = one item's prompt,
    corrupted = its partner's, answer/wrong = the clean item's antecedent/other head word;
    :func:`coreference_prompt`), shuffled with ``random.Random(seed)``; items without a
    usable partner are listed in ``unusable`` with the reason."""
    import random

    from headscope.data import path as data_path
    from headscope.probes.corpora.coref import read_coref

    src = data_path("coref/coref.jsonl") if path is None else path
    cs = read_coref(src)
    by_id = {it.id: it for it in cs.items if it.id}
    rows, unusable = [], []
    for k, it in enumerate(cs.items):
        partner = by_id.get(it.pair) if it.pair else None
        reason = kind = None
        if partner is None:
            reason, kind = "no minimal-pair partner", "no_partner"
        elif partner.antecedent == it.antecedent:
            reason, kind = f"the partner {partner.id} has the same antecedent", "same_antecedent"
        else:
            a, b = coreference_prompt(it), coreference_prompt(partner)
            reason = a if isinstance(a, str) else (b if isinstance(b, str) else None)
            kind = "not_two_candidates"
        if reason is not None:
            unusable.append({"item": k, "line": it.source_line, "kind": kind, "reason": reason})
            continue
        rows.append((it.source_line, {"clean": a[0], "corrupted": b[0], "answer": a[1], "wrong": a[2]}))
    random.Random(seed).shuffle(rows)
    return rows, unusable


# ----------------------------------------------------------------------------- registry
def _agreement(model, *, n_items=None, seed=0, **_):
    from headscope.data import path

    p = path("tasks/agreement.jsonl")
    rows = read_task_jsonl(p)[: n_items or 32]  # the file is shuffled: the first rows are a mixed sample
    return tokenize_rows(model, rows, name="agreement", source=str(p))


def _check_fits(model, task: str, seq_len: int, *, per_token: int, extra: int) -> None:
    """``ValueError`` before generating when ``seq_len`` makes items (``per_token × seq_len +
    extra`` tokens, plus [CLS]/BOS) longer than the model's context, naming the largest
    ``seq_len`` that fits."""
    tok, context = model.tokenizer, model.spec.max_positions
    first = len(leading_specials(tok))
    n = first + per_token * seq_len + extra
    if context and n > context:
        raise ValueError(
            f"task {task}: seq_len {seq_len} makes items of {n} tokens; the model's context is {context} positions "
            f"(seq_len at most {(context - first - extra) // per_token})"
        )


def _induction(model, *, n_items=None, seed=0, seq_len=10, **_):
    _check_fits(model, "induction", seq_len, per_token=2, extra=-1)
    return induction_task(model.tokenizer, n_items=n_items or 16, seq_len=seq_len, seed=seed)


def _coreference(model, *, n_items=None, seed=0, **_):
    from headscope.data import path

    rows, unusable = coreference_rows(seed=seed)
    task = tokenize_rows(model, rows, name="coreference", source=str(path("coref/coref.jsonl")))
    task.unusable = unusable + task.unusable  # over every pair of the file
    task.items = task.items[: n_items or 32]  # shuffled: the first items mix Winograd, gender and number pairs
    return task


def _duplicate_token(model, *, n_items=None, seed=0, seq_len=10, **_):
    _check_fits(model, "duplicate_token", seq_len, per_token=1, extra=1)
    return duplicate_token_task(model.tokenizer, n_items=n_items or 16, seq_len=seq_len, seed=seed)


#: shipped tasks: name -> ``builder(model, n_items=, seed=, seq_len=) -> Task``
TASKS = {
    "induction": _induction,
    "agreement": _agreement,
    "coreference": _coreference,
    "duplicate_token": _duplicate_token,
}


def task_size(task: str) -> int | None:
    """How many items ``task`` can give at most, without a model: the rows of a shipped
    file task (agreement) or of a JSONL file, the minimal pairs of coreference; ``None`` for
    a generated task (any number up to :data:`MAX_GENERATED_ITEMS`). Tokenisation may leave
    fewer usable (:attr:`Task.unusable`)."""
    from headscope.data import path

    if task in ("induction", "duplicate_token"):
        return None
    if task == "agreement":
        return len(read_task_jsonl(path("tasks/agreement.jsonl")))
    if task == "coreference":
        return len(coreference_rows()[0])
    return len(read_task_jsonl(task))


def check_decoder(model) -> None:
    """For metrics that read next-token logits: ``ModelIncompatibleError`` for an encoder."""
    if not model.spec.causal:
        raise ModelIncompatibleError(
            f"this metric scores next-token log-probs at the last position; {model.spec.name!r} is an encoder "
            "(no LM head): use the embedding_cosine metric or a decoder (e.g. smollm2-135m)"
        )


def load_task(model, task: str, *, n_items: int | None = None, seed: int = 0, seq_len: int = 10) -> Task:
    """A shipped task by name (:data:`TASKS`) or a JSONL file (``*.jsonl``), tokenised for
    ``model``; ``n_items`` keeps the first ``n_items`` usable items (a generated task makes that
    many; default 16 induction/duplicate_token items, the first 32 agreement/coreference rows,
    every item of a file). On an encoder every task is measured by ``embedding_cosine``."""
    if task in TASKS:
        out = TASKS[task](model, n_items=n_items, seed=seed, seq_len=seq_len)
    elif str(task).endswith(".jsonl") or Path(task).is_file():
        p = Path(task)
        if not p.is_file():
            raise FileNotFoundError(
                f"task file {p} does not exist; pass a shipped task ({', '.join(TASKS)}) or a JSONL file"
            )
        out = tokenize_rows(model, read_task_jsonl(p), name=p.stem, source=str(p))
    else:
        raise ValueError(f"unknown task {task!r}; valid tasks: {', '.join(TASKS)}, or a .jsonl file")
    if n_items is not None and len(out.items) > n_items:
        out.items = out.items[:n_items]
    if not model.spec.causal and out.metric != "embedding_cosine":
        out.items = [PairItem(it.clean, it.corrupted, 0) for it in out.items]
        out.metric = "embedding_cosine"
    return out
