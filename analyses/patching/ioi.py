"""Indirect object identification (IOI; Wang et al. 2022), written by this project for any
tokenizer.

A clean prompt names two people, then one of them (the subject, S) again, and ends where the
other (the indirect object, IO) is the natural next word::

    When Mary and John went to the store, John gave a drink to   ->  " Mary"

The first two names come in either order: ``ABBA`` (IO first, as above) and ``BABA`` (S
first: ``"When John and Mary went to the store, John gave a drink to"``). :data:`TEMPLATES`
holds the project's templates (each in both orders); names (:data:`NAMES`), places
(:data:`PLACES`) and objects (:data:`OBJECTS`) are drawn from the project's lists filtered to
those that are one token, with their leading space, in the model's tokenizer
(:func:`single_token_words`); fewer than :data:`MIN_NAMES` such names is refused in one line
naming how many were found.

The corrupted prompt is the **ABC** corruption: the three name slots get three distinct
other names (none of them IO or S), so the prompt keeps its shape but says nothing about who
the indirect object is. Metric ``logit_diff``: ``logit(IO) - logit(S)`` at the last position
(:func:`headscope.analyses.metrics.logit_diff_metric`). Items whose clean and corrupted
prompts tokenise to different lengths are unusable: counted in
:attr:`~headscope.analyses.patching.items.Task.unusable` (kind ``length_mismatch``), with a
warning (:func:`~headscope.analyses.patching.task_files.tokenize_rows`).

>>> rows = ioi_rows(["Mary", "John", "Anna", "Paul", "Kate"], ["store"], ["drink"], n_items=2)
>>> sorted(rows[0][1])
['answer', 'clean', 'corrupted', 'order', 'template', 'wrong']
"""

from __future__ import annotations

import random

from headscope.analyses.patching.items import Task

#: templates: ``{a}`` and ``{b}`` the first two names, ``{s}`` the subject's second mention,
#: ``{place}``, ``{object}``; every name slot follows a space
TEMPLATES = (
    "When {a} and {b} went to the {place}, {s} gave a {object} to",
    "When {a} and {b} got a {object} at the {place}, {s} decided to give it to",
    "Then, {a} and {b} went to the {place}. {s} gave a {object} to",
    "Then, {a} and {b} had a long argument, and afterwards {s} said to",
    "After {a} and {b} went to the {place}, {s} gave a {object} to",
    "While {a} and {b} were working at the {place}, {s} gave a {object} to",
    "Friends {a} and {b} found a {object} at the {place}. {s} gave it to",
    "The {place} was quiet when {a} and {b} arrived. {s} handed a {object} to",
    "Yesterday {a} and {b} walked to the {place}, and {s} threw a {object} to",
    "At the {place}, {a} and {b} found a {object}. Then {s} passed it to",
    "Since {a} and {b} were at the {place}, {s} brought a {object} to",
    "When {a} and {b} left the {place}, {s} sent a {object} to",
)

#: the two orders of the first two names: ``ABBA`` (IO, S, S) and ``BABA`` (S, IO, S)
ORDERS = ("ABBA", "BABA")

#: candidate names (each used with a leading space; the tokenizer's single tokens are kept)
NAMES = (
    "Mary", "John", "Tom", "James", "Dan", "Sarah", "Anna", "Paul", "Kate", "Mark", "Lisa", "David",
    "Michael", "Emma", "Jack", "Laura", "Peter", "Alice", "Chris", "Amy", "Robert", "Helen", "Steve",
    "Rachel", "Brian", "Julia", "Kevin", "Emily", "Jason", "Grace", "Eric", "Susan", "Adam", "Karen",
    "Ryan", "Linda", "Sam", "Jane", "Matt", "Rose", "George", "Lucy", "Henry", "Claire", "Frank",
    "Sophie", "Simon", "Diana", "Tim", "Ellen", "Joe", "Carl", "Nancy", "Bill", "Ruth", "Luke", "Amanda",
)  # fmt: skip
#: candidate places and objects (used with a leading space; single tokens kept)
PLACES = ("store", "garden", "restaurant", "school", "hospital", "station", "office", "park", "house", "market",
          "library", "beach", "church", "bank", "museum")  # fmt: skip
OBJECTS = ("drink", "ring", "book", "kiss", "bone", "basketball", "computer", "necklace", "letter", "bag",
           "snack", "pen", "ball", "key", "gift")  # fmt: skip

#: fewest single-token names the task is built with (each item needs five distinct ones)
MIN_NAMES = 8


def single_token_words(tokenizer, words) -> list[str]:
    """The ``words`` that are one token with a leading space (``" " + word``) in ``tokenizer``,
    in their order."""
    from headscope.probes.tokens import encode_plain

    return [w for w in words if len(encode_plain(tokenizer, " " + w, add_special_tokens=False)["input_ids"]) == 1]


def ioi_rows(names, places, objects, *, n_items: int = 16, seed: int = 0) -> list[tuple[int, dict]]:
    """``[(item number from 1, row)]``: ``n_items`` IOI rows (``clean``, ``corrupted``,
    ``answer`` = ``" " + IO``, ``wrong`` = ``" " + S``, ``template`` index, ``order``), the
    template and order cycling over :data:`TEMPLATES` × :data:`ORDERS`, names, place and object
    drawn with ``random.Random(seed)``; ``ValueError`` with fewer than five names (an item uses
    five distinct ones) or no place or object."""
    if len(set(names)) < 5 or not places or not objects:
        raise ValueError(
            f"ioi rows need at least 5 distinct names, a place and an object; got {len(set(names))} names, "
            f"{len(places)} places, {len(objects)} objects"
        )
    if n_items < 1:
        raise ValueError(f"n_items must be >= 1; got {n_items}")
    rng = random.Random(seed)
    names = sorted(set(names), key=list(names).index)
    rows = []
    for k in range(n_items):
        t, order = divmod(k, len(ORDERS))
        template, order = TEMPLATES[t % len(TEMPLATES)], ORDERS[order]
        io, s, c1, c2, c3 = rng.sample(names, 5)
        place, obj = rng.choice(places), rng.choice(objects)
        a, b = (io, s) if order == "ABBA" else (s, io)
        fill = {"place": place, "object": obj}
        clean = template.format(a=a, b=b, s=s, **fill)
        corrupted = template.format(a=c1, b=c2, s=c3, **fill)
        row = {"clean": clean, "corrupted": corrupted, "answer": " " + io, "wrong": " " + s}
        rows.append((k + 1, {**row, "template": t % len(TEMPLATES), "order": order}))
    return rows


def ioi_words(model) -> tuple[list[str], list[str], list[str]]:
    """``(names, places, objects)`` that ``model``'s tokenizer writes as single tokens (with the leading
    space); ``ValueError`` (the task's one-line refusal) when fewer than :data:`MIN_NAMES` names, or no
    place or object, are."""
    tok = model.tokenizer
    names = single_token_words(tok, NAMES)
    places, objects = single_token_words(tok, PLACES), single_token_words(tok, OBJECTS)
    if len(names) < MIN_NAMES or not places or not objects:
        raise ValueError(
            f"task ioi: {model.spec.name!r}'s tokenizer has {len(names)} of {len(NAMES)} names as single tokens "
            f"(needs {MIN_NAMES}), {len(places)} places and {len(objects)} objects (needs 1 each)"
        )
    return names, places, objects


def ioi_task(model, *, n_items: int = 16, seed: int = 0) -> Task:
    """The IOI task for ``model`` (a decoder): :func:`ioi_rows` of the single-token names,
    places and objects (:func:`single_token_words`), tokenised by
    :func:`~headscope.analyses.patching.task_files.tokenize_rows` (metric ``logit_diff``,
    IO minus S; unusable items counted). ``ModelIncompatibleError`` on a model that is not a
    language model; ``ValueError`` when fewer than :data:`MIN_NAMES` names (or no place or
    object) are single tokens."""
    from headscope.analyses.patching.tasks import check_decoder

    check_decoder(model)
    names, places, objects = ioi_words(model)
    rows = ioi_rows(names, places, objects, n_items=n_items, seed=seed)
    source = (
        f"generated (seed={seed}; {len(TEMPLATES)} templates x {ORDERS}; {len(names)} single-token names, "
        f"{len(places)} places, {len(objects)} objects; ABC corruption)"
    )
    return tokenize_ioi(model, rows, source=source)


def tokenize_ioi(model, rows: list[tuple[int, dict]], *, source: str = "") -> Task:
    """:func:`ioi_rows` tokenised for ``model`` by
    :func:`~headscope.analyses.patching.task_files.tokenize_rows` (metric ``logit_diff``;
    items of unequal length, or whose IO or S is not one token, counted in ``Task.unusable``
    with a warning; none usable: ``InputFileError``)."""
    from headscope.analyses.patching.task_files import tokenize_rows

    keys = ("clean", "corrupted", "answer", "wrong")
    return tokenize_rows(model, [(k, {c: r[c] for c in keys}) for k, r in rows], name="ioi", source=source)


def planted_ioi_task(model, *, n_items: int = 16, seed: int = 0):
    """The IOI task (:func:`ioi_rows`, ABC corruption) over the planted
    vocabulary: the nouns are the names, an adjective the place and the object (the templates' other
    words are ``[UNK]``), tokenised for ``model`` (a planted model)."""
    from headscope.probes.models.inhouse.planted import WORD_CLASSES

    rows = ioi_rows(WORD_CLASSES["noun"], ["big"], ["red"], n_items=n_items, seed=seed)
    return tokenize_ioi(model, rows, source=f"planted IOI (seed={seed}; nouns as names)")
