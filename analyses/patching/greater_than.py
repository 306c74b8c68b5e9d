"""Greater-than (Hanna et al. 2023), written by this project for any tokenizer.

Clean: ``"The war lasted from the year 17YY to the year 17"`` with ``YY`` from ``02`` to
``98`` (and other nouns than war, :data:`NOUNS`); corrupted: the same with ``YY = 01`` (the
paper's "01" corruption, which leaves no year below the start to prefer). A model that
understands the task puts its mass on years after ``17YY``.

The metric depends on how the tokenizer writes the two digits after ``17``
(:func:`digit_mode`, decided on the model's own tokenizer and stated in the task's
:attr:`~headscope.analyses.patching.items.Task.source`):

* ``greater_than`` (tokenizers with two-digit tokens, as GPT-2's: ``" 17"`` then ``"32"``):
  the paper's probability difference ``sum p(yy) for yy > YY - sum p(yy) for yy <= YY`` over
  the 100 tokens ``"00"`` … ``"99"`` at the last position
  (:func:`headscope.analyses.metrics.greater_than_metric`);
* ``greater_than_tens`` (tokenizers that split digits, as SmolLM2's and Llama's: ``"1"``,
  ``"7"``, ``"3"``, ``"2"``; no two-digit tokens exist): the next token is the tens digit, so
  the metric is ``P(tens digit > Y) - P(tens digit < Y)`` over the ten tokens ``"0"`` …
  ``"9"``, ``Y`` the tens digit of ``YY``; a tens digit equal to ``Y`` counts on neither side,
  because the ones digit that would decide it is a later token this metric does not read
  (:func:`headscope.analyses.metrics.greater_than_tens_metric`).

Any other tokenizer (one that merges ``"17"`` with the digits after it, or has only some
two-digit tokens) is refused in one line. Items whose clean and corrupted prompts tokenise
to different lengths are unusable: counted (kind ``length_mismatch``), with a warning.

>>> len(greater_than_rows(n_items=3)), greater_than_rows(n_items=1)[0]["corrupted"][-24:]
(3, 'year 1701 to the year 17')
"""

from __future__ import annotations

import random
import warnings

from headscope.analyses.patching.items import PairItem, Task, counts_text, unusable_counts

#: the event nouns of the prompts (Hanna et al. use a list of such nouns)
NOUNS = ("war", "expedition", "siege", "drought", "famine", "reign", "voyage", "strike", "journey", "occupation")
#: the years ``YY`` of the clean prompts (``01`` is the corruption)
YEARS = tuple(range(2, 99))
#: the prompt; ``{yy}`` the two digits after 17
TEMPLATE = "The {noun} lasted from the year 17{yy} to the year 17"
#: the year of the corrupted prompts
CORRUPT_YY = 1


def greater_than_rows(*, n_items: int | None = None, seed: int = 0) -> list[dict]:
    """Every (noun, ``YY``) pair as ``{"clean", "corrupted", "yy", "noun"}``, shuffled with
    ``random.Random(seed)``; the first ``n_items`` (default all, ``len(NOUNS) × 97``)."""
    rows = [
        {
            "clean": TEMPLATE.format(noun=n, yy=f"{yy:02d}"),
            "corrupted": TEMPLATE.format(noun=n, yy=f"{CORRUPT_YY:02d}"),
            "yy": yy,
            "noun": n,
        }
        for n in NOUNS
        for yy in YEARS
    ]
    random.Random(seed).shuffle(rows)
    return rows if n_items is None else rows[:n_items]


def _plain_ids(tokenizer, text: str) -> list[int]:
    from headscope.probes.tokens import encode_plain

    return encode_plain(tokenizer, text, add_special_tokens=False)["input_ids"]


def digit_mode(tokenizer) -> tuple[str, list[int]]:
    """``(metric, candidate ids in numeric order)``: ``("greater_than", ids of "00" … "99")``
    when the two digits after ``"…year 17"`` are one token from those 100 tokens,
    ``("greater_than_tens", ids of "0" … "9")`` when each digit is its own token; a
    ``ValueError`` naming what the tokenizer does otherwise."""
    prompt = TEMPLATE.format(noun="war", yy="32")
    head = _plain_ids(tokenizer, prompt)
    tail = {yy: _plain_ids(tokenizer, prompt + yy)[len(head) :] for yy in ("32", "45", "07")}
    prefix_ok = all(_plain_ids(tokenizer, prompt + yy)[: len(head)] == head for yy in tail)
    two = [_plain_ids(tokenizer, f"{d:02d}") for d in range(100)]
    one = [_plain_ids(tokenizer, str(d)) for d in range(10)]
    if prefix_ok and all(len(t) == 1 for t in two) and all(tail[yy] == two[int(yy)] for yy in tail):
        return "greater_than", [t[0] for t in two]
    if (
        prefix_ok
        and all(len(t) == 1 for t in one)
        and all(tail[yy] == one[int(yy[0])] + one[int(yy[1])] for yy in tail)
    ):
        return "greater_than_tens", [t[0] for t in one]
    shown = tokenizer.convert_ids_to_tokens(_plain_ids(tokenizer, prompt + "32")[-4:])
    raise ValueError(
        f"task greater_than: the tokenizer writes '...year 1732' as {shown}: neither one two-digit token after "
        "'17' nor one token per digit, so no answer set can be read at the last position"
    )


def greater_than_task(model, *, n_items: int = 16, seed: int = 0) -> Task:
    """The greater-than task for ``model`` (a decoder): :func:`greater_than_rows`, the
    metric and candidates of :func:`digit_mode`; ``answer`` the id of the clean ``YY`` (or its
    tens digit), ``wrong`` the candidates. ``ModelIncompatibleError`` on a model that is not a
    language model; items of unequal length counted in ``Task.unusable``."""
    from headscope.analyses.patching.tasks import check_decoder

    check_decoder(model)
    metric, cands = digit_mode(model.tokenizer)
    rows = greater_than_rows(n_items=n_items, seed=seed)
    batch = model.encode(texts=[t for r in rows for t in (r["clean"], r["corrupted"])])
    items, unusable = [], []
    for k, r in enumerate(rows):
        clean = batch.input_ids[2 * k, : batch.lengths[2 * k]].tolist()
        corrupted = batch.input_ids[2 * k + 1, : batch.lengths[2 * k + 1]].tolist()
        if len(clean) != len(corrupted):
            reason = f"clean has {len(clean)} tokens, corrupted {len(corrupted)}"
            unusable.append({"item": k, "line": None, "kind": "length_mismatch", "reason": reason})
            continue
        answer = cands[r["yy"]] if len(cands) == 100 else cands[r["yy"] // 10]  # two-digit tokens, or the tens digit
        items.append(PairItem(tuple(clean), tuple(corrupted), answer, tuple(cands)))
    if unusable:
        warnings.warn(
            f"task greater_than: {len(unusable)} of {len(rows)} items unusable "
            f"({counts_text(unusable_counts(unusable))}; first: {unusable[0]['reason']}); listed in Task.unusable",
            stacklevel=2,
        )
    if not items:
        raise ValueError(f"task greater_than: no usable items ({counts_text(unusable_counts(unusable))})")
    which = "two-digit tokens 00..99" if len(cands) == 100 else "one token per digit: the tens digit 0..9"
    source = f"generated (seed={seed}; {len(NOUNS)} nouns x YY 02..98, corrupted YY=01; {metric}: {which})"
    return Task(name="greater_than", items=items, metric=metric, unusable=unusable, source=source)
