"""The report's examples: for each role's top head, one item and that head's pattern on it.

:func:`build_examples` picks the item (the group's :attr:`~headscope.analyses.roles.base.Role.example`
picker, else the first readable item of its corpus), runs it through the model once per
item (capturing only the layers its examples need) and returns JSON-ready records
(:attr:`~headscope.analyses.roles.pipeline.RolesResult.examples`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd
import torch

from headscope.analyses.roles.base import REGISTRY
from headscope.analyses.roles.wordlevel import pooling_matrices, word_patterns
from headscope.probes.tokens import display_token

if TYPE_CHECKING:
    from headscope.analyses.roles.pipeline import RolesResult


def _example_keys(frame: pd.DataFrame, max_syntactic: int = 8) -> list[tuple[str, pd.Series]]:
    """(key, top row) per role; for syntactic, per relation/direction with a verdict,
    the ``max_syntactic`` with the largest margin."""
    from headscope.analyses.roles.base import per_relation_roles

    keys = []
    if not len(frame):
        return keys
    many = per_relation_roles()  # syntactic: one role per relation and direction
    for role, g in frame[~frame.role.isin(many)].groupby("role", sort=True):
        top = g.sort_values(["verdict", "score"], ascending=[False, False], kind="stable").iloc[0]
        keys.append((role, top))
    for role in sorted(many):
        rel = frame[frame.role.eq(role) & frame.verdict]
        best = rel.sort_values("margin", ascending=False, kind="stable").drop_duplicates(["relation", "direction"])
        for _, row in best.head(max_syntactic).iterrows():
            keys.append((f"{role}:{row['relation']}:{row['direction']}", row))
    return keys


def _text_item(texts: list[str]) -> int | None:
    """A readable text item: the first with 8-20 words, else the first."""
    for i, t in enumerate(texts):
        if 8 <= len(t.split()) <= 20:
            return i
    return 0 if texts else None


@dataclass
class _Planned:
    """One example to draw: ``source`` is the corpus, or the group for a generated one."""

    key: str
    row: pd.Series
    source: str
    corpus: str
    item: int
    words: list | None
    marks: list


def _plan_examples(result: RolesResult, inputs: dict) -> list[_Planned]:
    """Which item to draw for each role's top head (see :func:`_example_keys`)."""
    group_of = {role: g for g, o in result.outputs.items() if o.frame is not None for role in o.frame["role"].unique()}
    plan = []
    for key, row in _example_keys(result.frame):
        group = group_of.get(row["role"])
        if group not in REGISTRY:
            continue
        corpus, out = REGISTRY[group].corpus, result.outputs[group]
        item, words, marks, source = None, None, [], corpus
        if REGISTRY[group].example is not None:
            item, marks, words = REGISTRY[group].example(out, row, inputs)
        elif corpus == "generated":
            if "sequences" not in out.extra:
                continue
            item, source = 0, group
        elif corpus == "text":
            item = _text_item(inputs["text"])
        elif inputs.get(corpus):
            item, words = 0, list(inputs[corpus][0].words)
        if item is not None:
            plan.append(_Planned(key, row, source, corpus, item, words, marks))
    return plan


def _capture_examples(model, result: RolesResult, inputs: dict, plan: list[_Planned]) -> dict:
    """``{(source, item): (TokenBatch, {layer: pattern [1, head, q, k]})}``: one forward
    pass per item, capturing only the layers its examples need."""
    captured = {}
    for source, item in dict.fromkeys((p.source, p.item) for p in plan):
        mine = [p for p in plan if (p.source, p.item) == (source, item)]
        layers = sorted({int(p.row["layer"]) for p in mine})
        if mine[0].corpus == "generated":
            from headscope.analyses.roles.induction import capture_ids

            cap = capture_ids(model, result.outputs[source].extra["sequences"][:1], layers=layers)
            captured[source, item] = (cap.tokens, {l: cap["pattern", l] for l in layers})
            continue
        words = mine[0].words
        try:
            batch = model.encode(words=[words]) if words is not None else model.encode(texts=[inputs["text"][item]])
        except ValueError:
            continue
        data = model.run(batch, ("pattern",), layers)
        captured[source, item] = (batch, {l: data[("pattern", l)] for l in layers})
    return captured


def _example_record(model, p: _Planned, batch, pattern) -> dict:
    """The JSON-ready example of one planned head (see :attr:`RolesResult.examples`)."""
    layer, head = int(p.row["layer"]), int(p.row["head"])
    wp = word_patterns(pattern, pooling_matrices(batch))[0, head] if batch.words[0] else torch.zeros(0, 0)
    n = batch.lengths[0]
    tokens = [display_token(model.tokenizer, t) for t in batch.tokens[0][:n]]
    tp = [[round(float(x), 6) for x in r[:n]] for r in pattern[0, head, :n]]
    wpl = [[round(float(x), 6) for x in r] for r in wp]
    word_level = p.source in ("conllu", "coref")
    return {
        "role": p.row["role"],
        "label": p.key,
        "relation": p.row["relation"],
        "direction": p.row["direction"],
        "layer": layer,
        "head": head,
        "score": float(p.row["score"]),
        "verdict": bool(p.row["verdict"]),
        "source": p.source,
        "item": int(p.item),
        "sentence": " ".join(batch.words[0]) if batch.words[0] else " ".join(tokens),
        "words": list(batch.words[0]),
        "word_pattern": wpl,
        "tokens": tokens,
        "token_pattern": tp,
        "pattern": wpl if word_level else tp,
        "query_words": list(batch.words[0]) if word_level else tokens,
        "key_words": list(batch.words[0]) if word_level else tokens,
        "marks": [list(m) for m in p.marks],
    }


def build_examples(model, result: RolesResult, inputs: dict) -> dict:
    """For each role's top head (see :func:`_example_keys`): one item with its word-level and
    token-level pattern of that head (lists, JSON-ready). Examples that share an item
    share one forward pass (capturing only the layers they need)."""
    plan = _plan_examples(result, inputs)
    captured = _capture_examples(model, result, inputs, plan)
    out = {}
    for p in plan:
        if (p.source, p.item) in captured:
            batch, pats = captured[p.source, p.item]
            out[p.key] = _example_record(model, p, batch, pats[int(p.row["layer"])])
    return out
