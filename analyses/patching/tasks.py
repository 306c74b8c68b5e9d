"""Patching tasks: minimal pairs (a clean and a corrupted input of equal token length) and
a metric read from the model's next-token logits at the last position.

A :class:`Task` holds tokenised :class:`PairItem` s and the name of its metric
(:data:`METRICS`):

* ``"logprob"``: ``log p(answer)`` at the last position;
* ``"logit_diff"``: ``logit(answer) - logit(wrong)`` at the last position (the answer and
  the wrong token are the clean input's; on the corrupted input the difference is
  usually negative).

Shipped tasks (:data:`TASKS`, built for the model's own tokenizer):

* ``induction`` (:func:`induction_task`): ``[first] + S + S[:-1]``, ``S`` ``seq_len``
  distinct ordinary token ids (seeded; ``first`` is BOS/CLS where the tokenizer has one,
  as the roles' induction probe); corrupted: the first copy of ``S`` replaced by other
  random ids (disjoint from ``S``); metric ``logprob`` of ``S[-1]``, the token the
  induction rule predicts after ``S[-2]``.
* ``agreement`` (``data/tasks/agreement.jsonl``, written by :func:`agreement_rows`):
  ``"The author of the books"`` / ``"The authors of the books"``, answer ``" is"``,
  wrong ``" are"`` (and the reverse); metric ``logit_diff``.

Users' tasks are JSONL files, one item per line, a JSON object with either texts::

    {"clean": "The key near the cabinet", "corrupted": "The keys near the cabinet", "answer": " is", "wrong": " are"}

or token ids (no tokenisation)::

    {"clean_ids": [1, 5, 6, 5], "corrupted_ids": [1, 7, 8, 5], "answer_id": 6}

``wrong``/``wrong_id`` is optional; every item of a file must agree on whether it has one
(with: ``logit_diff``, without: ``logprob``). ``answer`` and ``wrong`` must be single tokens
(tokenised without special tokens). Blank lines and lines starting with ``#`` are skipped.
A malformed line raises :class:`~headscope.probes.errors.InputFileError`
(``file:line:column: message``); an item whose clean and corrupted inputs tokenise to
different lengths, or whose answer is not one token, is *unusable*: it is counted and
listed in :attr:`Task.unusable` (with its line and reason), never dropped silently.

>>> rows = agreement_rows()
>>> len(rows), sorted(rows[0])
(2304, ['answer', 'clean', 'corrupted', 'wrong'])
"""

from __future__ import annotations

import json
import logging
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from headscope.probes.errors import InputFileError, ModelIncompatibleError

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- metrics
def logprob_metric(logits: torch.Tensor, answer: torch.Tensor, wrong: torch.Tensor | None = None) -> torch.Tensor:
    """``log p(answer)``: ``logits [batch, vocab]`` (the last position), ``answer [batch]`` -> ``[batch]`` (float32).

    >>> logprob_metric(torch.tensor([[0.0, 0.0]]), torch.tensor([1])).tolist()
    [-0.6931471824645996]
    """
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, answer[:, None])[:, 0]


def logit_diff_metric(logits: torch.Tensor, answer: torch.Tensor, wrong: torch.Tensor | None = None) -> torch.Tensor:
    """``logit(answer) - logit(wrong)``: ``[batch, vocab]``, ``[batch]``, ``[batch]`` -> ``[batch]`` (float32).

    >>> logit_diff_metric(torch.tensor([[1.0, 3.0]]), torch.tensor([1]), torch.tensor([0])).tolist()
    [2.0]
    """
    if wrong is None:
        raise ValueError("the logit_diff metric needs a wrong token per item; got none")
    lf = logits.float()
    return lf.gather(-1, answer[:, None])[:, 0] - lf.gather(-1, wrong[:, None])[:, 0]


METRICS = {"logprob": logprob_metric, "logit_diff": logit_diff_metric}


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
            "unusable": self.unusable[:20],
        }


# ----------------------------------------------------------------------------- induction
def induction_task(tokenizer, *, n_items: int = 16, seq_len: int = 10, seed: int = 0, vocab_ids=None) -> Task:
    """Repeated random tokens (see the module docstring): ``n_items`` pairs of
    ``[first] + S + S[:-1]`` vs ``[first] + T + S[:-1]`` (``len(S) = len(T) = seq_len``,
    all ``2 seq_len`` ids distinct), answer ``S[-1]``, metric ``logprob``. ``vocab_ids``:
    the ids to draw from (default the roles' ordinary vocabulary). Seeded, no global state."""
    from headscope.analyses.roles.induction import ordinary_vocab

    if n_items < 1 or seq_len < 2:
        raise ValueError(f"n_items must be >= 1 and seq_len >= 2; got {n_items}, {seq_len}")
    vocab = torch.tensor(list(vocab_ids) if vocab_ids is not None else ordinary_vocab(tokenizer), dtype=torch.long)
    if vocab.numel() < 2 * seq_len:
        raise ValueError(
            f"induction needs {2 * seq_len} distinct ordinary token ids; the tokenizer has {vocab.numel()}"
        )
    first_id = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    first = [first_id] if first_id is not None else []
    gen = torch.Generator().manual_seed(seed)
    items = []
    for _ in range(n_items):
        draw = vocab[torch.randperm(vocab.numel(), generator=gen)[: 2 * seq_len]].tolist()
        s, t = draw[:seq_len], draw[seq_len:]
        items.append(PairItem(tuple(first + s + s[:-1]), tuple(first + t + s[:-1]), s[-1]))
    return Task(name="induction", items=items, metric="logprob", source=f"generated (seq_len={seq_len}, seed={seed})")


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


def read_task_jsonl(path) -> list[tuple[int, dict]]:
    """``[(line number, item dict)]`` of a task file (format: module docstring), checked for
    structure; :class:`InputFileError` (``file:line:col``) on the first bad line."""
    path = Path(path)
    rows: list[tuple[int, dict]] = []
    with_wrong: bool | None = None
    with open(path, encoding="utf-8") as f:
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
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
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
                unusable.append({"item": k, "line": lineno, "reason": f"token id {too_big[0]} >= vocab size {vocab}"})
                continue
            if len(clean) > model.spec.max_positions or len(corrupted) > model.spec.max_positions:
                reason = f"{max(len(clean), len(corrupted))} tokens; the model's context is {model.spec.max_positions}"
                unusable.append({"item": k, "line": lineno, "reason": reason})
                continue
        else:
            clean, corrupted = encoded[id(r)]
            answer = _single_token(tok, r["answer"])
            wrong = _single_token(tok, r["wrong"]) if "wrong" in r else None
            if answer is None or ("wrong" in r and wrong is None):
                bad = r["answer"] if answer is None else r["wrong"]
                unusable.append({"item": k, "line": lineno, "reason": f"{bad!r} is not a single token"})
                continue
        if len(clean) != len(corrupted):
            unusable.append(
                {"item": k, "line": lineno, "reason": f"clean has {len(clean)} tokens, corrupted {len(corrupted)}"}
            )
            continue
        items.append(PairItem(tuple(clean), tuple(corrupted), int(answer), None if wrong is None else int(wrong)))
    metric = "logit_diff" if ("wrong" in rows[0][1] or "wrong_id" in rows[0][1]) else "logprob"
    if unusable:
        first = unusable[0]
        warnings.warn(
            f"task {name}: {len(unusable)} of {len(rows)} items unusable (first: line {first['line']}: "
            f"{first['reason']}); they are listed in Task.unusable",
            stacklevel=2,
        )
    if not items:
        raise InputFileError(
            source or name,
            None,
            None,
            f"no usable items: all {len(rows)} unusable (first: line {unusable[0]['line']}: {unusable[0]['reason']})",
        )
    return Task(name=name, items=items, metric=metric, unusable=unusable, source=source)


# ----------------------------------------------------------------------------- registry
def _agreement(model, *, n_items=None, seed=0, **_):
    from headscope.data import path

    p = path("tasks/agreement.jsonl")
    rows = read_task_jsonl(p)[: n_items or 32]  # the file is shuffled: the first rows are a mixed sample
    return tokenize_rows(model, rows, name="agreement", source=str(p))


def _induction(model, *, n_items=None, seed=0, seq_len=10, **_):
    return induction_task(model.tokenizer, n_items=n_items or 16, seq_len=seq_len, seed=seed)


#: shipped tasks: name -> ``builder(model, n_items=, seed=, seq_len=) -> Task``
TASKS = {"induction": _induction, "agreement": _agreement}


def check_decoder(model) -> None:
    """Patching metrics read next-token logits: ``ModelIncompatibleError`` for an encoder."""
    if not model.spec.causal:
        raise ModelIncompatibleError(
            f"patching scores next-token log-probs at the last position; {model.spec.name!r} is an encoder "
            "(no LM head), which patching does not support yet: use a decoder (e.g. smollm2-135m)"
        )


def load_task(model, task: str, *, n_items: int | None = None, seed: int = 0, seq_len: int = 10) -> Task:
    """A shipped task by name (:data:`TASKS`) or a JSONL file (``*.jsonl``), tokenised for
    ``model``; ``n_items`` keeps the first ``n_items`` usable items (a generated task makes that
    many; default 16 induction items, the first 32 agreement rows, every item of a file)."""
    check_decoder(model)
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
    return out
