"""Patching tasks: minimal pairs (a clean and a corrupted input of equal token length) and
a metric read from the model's output (:func:`~headscope.analyses.patching.activation.readout`:
a decoder's next-token logits at the last position, an encoder's mean-pooled last hidden state).

A :class:`~headscope.analyses.patching.items.Task` holds tokenised
:class:`~headscope.analyses.patching.items.PairItem` s and the name of its metric, one of the
patching metrics of the one registry, :data:`headscope.analyses.metrics.METRICS` (its
``definition`` says in words what each measures):

* ``"logprob"``: ``log p(answer)`` at the last position;
* ``"logit_diff"``: ``logit(answer) - logit(wrong)`` at the last position (the answer and
  the wrong token are the clean input's; on the corrupted input the difference is
  usually negative); equal to ``log p(answer) - log p(wrong)``;
* ``"embedding_cosine"`` (embedding models): the cosine similarity between the run's sentence
  embedding (the model's own pooling and Dense layers) and the clean run's, so the clean run scores 1
  and the corrupted run less (its "answer" is the clean run's readout, not a token: it reads
  ``"embedding"``). :func:`load_task` gives every task this metric on an embedding model.

Shipped tasks (:data:`TASKS`, built for the model's own tokenizer):

* ``induction``, ``duplicate_token``: random tokens (:mod:`~headscope.analyses.patching.generated`:
  :func:`~headscope.analyses.patching.generated.induction_task`, metric ``logprob`` of the token the
  induction rule predicts; :func:`~headscope.analyses.patching.generated.duplicate_token_task`, one
  repeated token, carried by a previous-token head writing ``x`` into the position of ``y`` and the
  head that reads it from the repeated ``x``), at most
  :data:`~headscope.analyses.patching.generated.MAX_GENERATED_ITEMS` items;
* ``ioi`` (:mod:`~headscope.analyses.patching.ioi`, Wang et al. 2022): ``"When Mary and John
  went to the store, John gave a drink to"`` -> ``" Mary"``, the project's templates in the
  ABBA and BABA orders, names, places and objects that are single tokens in the model's
  tokenizer; corrupted: the ABC corruption (three other names); metric ``logit_diff`` (IO
  minus S); decoders only;
* ``greater_than`` (:mod:`~headscope.analyses.patching.greater_than`, Hanna et al. 2023):
  ``"The war lasted from the year 17YY to the year 17"``, corrupted ``YY = 01``; metric
  ``greater_than`` (two-digit tokens: ``P(> YY) - P(<= YY)``) or ``greater_than_tens``
  (tokenizers that split digits, as SmolLM2's: ``P(tens > Y) - P(tens < Y)``); decoders only;
* ``agreement`` (``data/tasks/agreement.jsonl``, written by
  :func:`~headscope.analyses.patching.sentence_tasks.agreement_rows`):
  ``"The author of the books"`` / ``"The authors of the books"``, answer ``" is"``,
  wrong ``" are"`` (and the reverse); metric ``logit_diff``.
* ``coreference`` (:func:`~headscope.analyses.patching.sentence_tasks.coreference_rows`, from the
  roles' ``data/coref/coref.jsonl``): each minimal pair of coreference items (Winograd, gender,
  number) in both directions: clean ``'The cat didn't climb on the table because it was too
  tired. "it" refers to the'``, corrupted the partner (``... too tall ...``), answer the clean
  item's antecedent head word (``" cat"``), wrong the other candidate's (``" table"``); metric
  ``logit_diff`` (the log-prob difference of the two candidates). Candidates that are not
  single tokens, and pairs whose prompts differ in length, are unusable (counted, with
  the reason).

Users' tasks are JSONL files (format and reader: :mod:`~headscope.analyses.patching.task_files`).
The names of those modules that callers in other areas (reports, the bench, their tests) import
from here are re-exported (:data:`__all__`); new code imports them from their modules.

>>> sorted(TASKS)
['agreement', 'coreference', 'duplicate_token', 'greater_than', 'induction', 'ioi']
"""

from __future__ import annotations

from pathlib import Path

from headscope.analyses.metrics import get_metric, metrics_for
from headscope.analyses.patching.generated import (
    MAX_GENERATED_ITEMS,
    duplicate_token_task,
    induction_task,
    leading_specials,
)
from headscope.analyses.patching.items import UNUSABLE_KINDS, PairItem, Task
from headscope.analyses.patching.sentence_tasks import coreference_rows
from headscope.analyses.patching.task_files import read_task_jsonl, tokenize_rows
from headscope.probes.errors import ModelIncompatibleError
from headscope.probes.models.purpose import purpose_of

__all__ = [
    "MAX_GENERATED_ITEMS",
    "REFERENCE_METRICS",
    "TASKS",
    "UNUSABLE_KINDS",
    "PairItem",
    "Task",
    "check_decoder",
    "coreference_rows",
    "duplicate_token_task",
    "induction_task",
    "leading_specials",
    "load_task",
    "metric_fn",
    "read_task_jsonl",
    "task_size",
    "tokenize_rows",
]


# ----------------------------------------------------------------------------- metrics
def metric_fn(name: str):
    """The pure function of the patching metric registered as ``name``
    (:data:`headscope.analyses.metrics.METRICS`); ``ValueError`` listing the valid ones."""
    return get_metric(name, "patching").fn


#: patching metrics whose second argument is the clean run's readout (per item), not an answer
#: token: those that read an embedding (kept for ``reports/tools/bench/patching_paths.py``)
REFERENCE_METRICS = frozenset(n for n, m in metrics_for("patching").items() if m.reads == "embedding")


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


def _ioi(model, *, n_items=None, seed=0, **_):
    from headscope.analyses.patching.ioi import ioi_task

    return ioi_task(model, n_items=n_items or 16, seed=seed)


def _greater_than(model, *, n_items=None, seed=0, **_):
    from headscope.analyses.patching.greater_than import greater_than_task

    return greater_than_task(model, n_items=n_items or 16, seed=seed)


def _duplicate_token(model, *, n_items=None, seed=0, seq_len=10, **_):
    _check_fits(model, "duplicate_token", seq_len, per_token=1, extra=1)
    return duplicate_token_task(model.tokenizer, n_items=n_items or 16, seq_len=seq_len, seed=seed)


#: shipped tasks: name -> ``builder(model, n_items=, seed=, seq_len=) -> Task``
TASKS = {
    "induction": _induction,
    "agreement": _agreement,
    "coreference": _coreference,
    "duplicate_token": _duplicate_token,
    "ioi": _ioi,
    "greater_than": _greater_than,
}


#: tokens of a generated task's longest sequence, from its ``seq_len`` (the memory plan reads it)
GENERATED_LONGEST = {
    "induction": lambda seq_len: 2 * seq_len + 2,
    "duplicate_token": lambda seq_len: seq_len + 3,
    "ioi": lambda seq_len: 40,  # the longest template with single-token words: ~20 tokens
    "greater_than": lambda seq_len: 32,  # one token per digit: ~17 tokens
}
#: the shipped data file of each file task (under :mod:`headscope.data`)
TASK_FILES = {"agreement": "tasks/agreement.jsonl", "coreference": "coref/coref.jsonl"}


def task_size(task: str) -> int | None:
    """How many items ``task`` can give at most, without a model: the rows of a shipped
    file task (agreement) or of a JSONL file, the minimal pairs of coreference; ``None`` for
    a generated task (any number up to :data:`MAX_GENERATED_ITEMS`). Tokenisation may leave
    fewer usable (:attr:`Task.unusable`)."""
    from headscope.data import path

    if task in ("induction", "duplicate_token", "ioi"):
        return None
    if task == "greater_than":
        from headscope.analyses.patching.greater_than import NOUNS, YEARS

        return len(NOUNS) * len(YEARS)
    if task == "agreement":
        return len(read_task_jsonl(path("tasks/agreement.jsonl")))
    if task == "coreference":
        return len(coreference_rows()[0])
    return len(read_task_jsonl(task))


def check_decoder(model) -> None:
    """For metrics that read next-token logits: ``ModelIncompatibleError`` for a model that is not
    a language model (:func:`~headscope.probes.models.purpose.purpose_of`)."""
    p = purpose_of(model)
    if p.kind != "lm":
        raise ModelIncompatibleError(
            f"this metric scores next-token log-probs at the last position; {model.spec.name!r} is {p.words} "
            f"({p.reason}): use the embedding_cosine metric or a language model (e.g. smollm2-135m)"
        )


def load_task(model, task: str, *, n_items: int | None = None, seed: int = 0, seq_len: int = 10) -> Task:
    """A shipped task by name (:data:`TASKS`) or a JSONL file (``*.jsonl``), tokenised for
    ``model``; ``n_items`` keeps the first ``n_items`` usable items (a generated task makes that
    many; default 16 induction/duplicate_token items, the first 32 agreement/coreference rows,
    every item of a file). On an embedding model (:func:`~headscope.probes.models.purpose.purpose_of`)
    every task is measured by ``embedding_cosine``."""
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
    if purpose_of(model).kind != "lm" and out.metric != "embedding_cosine":
        out.items = [PairItem(it.clean, it.corrupted, 0) for it in out.items]
        out.metric = "embedding_cosine"
    return out
