"""Tasks written as sentences: ``agreement`` (the rows of ``data/tasks/agreement.jsonl``,
:func:`agreement_rows`) and ``coreference`` (minimal pairs of the roles' ``data/coref/coref.jsonl``,
:func:`coreference_rows`); both are tokenised like a user's file
(:func:`~headscope.analyses.patching.task_files.tokenize_rows`).

>>> rows = agreement_rows()
>>> len(rows), sorted(rows[0])
(2304, ['answer', 'clean', 'corrupted', 'wrong'])
"""

from __future__ import annotations

import json

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
