"""QK attribution of chosen heads over items: one forward per batch of items serves every head.

An item is a token sequence, a query position and the key whose attention is explained (None:
the key the head attends most). :func:`induction_items` makes them from the induction task (the
query at the second copy's last token, the key the token that followed it in the first copy);
:func:`sentence_items` from a text and two tokens.

Cost: one forward per batch of equal-length items (:func:`~headscope.probes.qk_parts.residual_run`,
stopped after the deepest head's layer), whatever the number of heads; the split itself is
arithmetic on what that forward kept (``QKResult.forwards`` counts the forwards).

>>> from headscope.probes.models.inhouse.planted import planted_model, writing_induction
>>> from headscope.analyses.patching.generated import induction_task
>>> m = writing_induction(planted_model())
>>> r = qk_study(m, [(1, 1)], induction_items(induction_task(m.tokenizer, n_items=4, seq_len=6)))
>>> r.summary["1.1"]["top_key"]["component"], r.forwards
('L0H0', 1)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import torch

from headscope.analyses.patching.generated import duplicate_token_task, induction_task
from headscope.analyses.qk.attribution import BASELINES, Attribution, attribute
from headscope.analyses.qk.frames import QK_COLUMNS, qk_frame, qk_summary
from headscope.probes.qk_parts import FROZEN, head_parts, residual_run

__all__ = [
    "TASK_ITEMS",
    "QKConfig",
    "QKItem",
    "QKResult",
    "duplicate_items",
    "induction_items",
    "qk_study",
    "sentence_items",
    "task_items",
]


@dataclass(frozen=True, kw_only=True)
class QKConfig:
    """``baseline`` (:data:`~headscope.analyses.qk.attribution.BASELINES`), items per forward
    (``batch_size``), pairs kept per head (``top_pairs``)."""

    baseline: str = "mean"
    batch_size: int = 16
    top_pairs: int = 20

    def __post_init__(self):
        if self.baseline not in BASELINES:
            raise ValueError(f"baseline must be one of {BASELINES}; got {self.baseline!r}")
        for name in ("batch_size", "top_pairs"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive int; got {v!r}")


@dataclass(frozen=True)
class QKItem:
    """Token ``ids``, the ``query`` position and the attended ``key`` (None: the head's argmax)."""

    ids: tuple[int, ...]
    query: int
    key: int | None = None


@dataclass
class QKResult:
    """``frame`` (:data:`~headscope.analyses.qk.frames.QK_COLUMNS`), ``summary`` per head
    (``"L.H"`` -> :func:`~headscope.analyses.qk.frames.qk_summary`), ``forwards`` run,
    ``attributions`` per head."""

    frame: pd.DataFrame
    summary: dict
    forwards: int
    attributions: dict = field(default_factory=dict)


def induction_items(task) -> list[QKItem]:
    """The induction task's clean items at the induction position: query the last token
    (``S[-2]`` of the second copy), key the answer ``S[-1]`` in the first copy."""
    return [QKItem(tuple(it.clean), len(it.clean) - 1, list(it.clean).index(it.answer)) for it in task.items]


def duplicate_items(task) -> list[QKItem]:
    """The duplicate-token task's clean items: query the repeated token (the last), key its
    earlier copy."""
    return [QKItem(tuple(it.clean), len(it.clean) - 1, list(it.clean).index(it.clean[-1])) for it in task.items]


#: the tasks whose items say which key a head of the role attends: name -> (its generator, its items)
TASK_ITEMS = {
    "induction": (induction_task, induction_items),
    "duplicate_token": (duplicate_token_task, duplicate_items),
}


def task_items(name: str, tokenizer, *, n_items: int, seq_len: int, seed: int) -> list[QKItem]:
    """The items of generated task ``name`` (:data:`TASK_ITEMS`); ``ValueError`` naming the tasks."""
    if name not in TASK_ITEMS:
        raise ValueError(f"task must be one of {sorted(TASK_ITEMS)}; got {name!r}")
    make, items = TASK_ITEMS[name]
    return items(make(tokenizer, n_items=n_items, seq_len=seq_len, seed=seed))


def _find(tokens: list[str], want: str | int, before: int | None, what: str) -> int:
    if isinstance(want, int) or str(want).lstrip("-").isdigit():
        i = int(want)
        if not -len(tokens) <= i < len(tokens):
            raise ValueError(f"{what} must be a token index in [0, {len(tokens)}) or a token; got {want}")
        return i % len(tokens)
    clean = [t.lstrip("Ġ▁").removeprefix("##").lower() for t in tokens]
    hits = [i for i, t in enumerate(clean) if t == str(want).lower() and (before is None or i <= before)]
    if not hits:
        raise ValueError(
            f"{what} {want!r} is not a token of the sentence{' before the query' if before else ''}; "
            f"its tokens: {tokens}"
        )
    return hits[-1]


def sentence_items(model, sentence: str, query: str | int | None = None, key: str | int | None = None):
    """Items of one ``sentence``: the query token ``query`` (its last occurrence; an index also
    works; None: every position) and the key ``key`` (its last occurrence up to the query; None:
    the key the head attends most). ``ValueError`` naming the sentence's tokens when one is absent."""
    batch = model.encode(texts=[sentence])
    ids = tuple(int(i) for i in batch.input_ids[0][batch.attention_mask[0].bool()].tolist())
    tokens = batch.tokens[0] if batch.tokens and batch.tokens[0] else [str(i) for i in ids]
    if query is None:
        if key is not None:
            raise ValueError("--key-token needs --query-token")
        return [QKItem(ids, i, None) for i in range(len(ids))], tokens
    q = _find(tokens, query, None, "--query-token")
    k = None if key is None else _find(tokens, key, q, "--key-token")
    return [QKItem(ids, q, k)], tokens


def _batches(items: list[QKItem], size: int):
    by_len: dict[int, list[QKItem]] = {}
    for it in items:
        by_len.setdefault(len(it.ids), []).append(it)
    for length in sorted(by_len):
        group = by_len[length]
        for s in range(0, len(group), size):
            yield group[s : s + size]


def qk_study(model, heads, items: list[QKItem], cfg: QKConfig | None = None) -> QKResult:
    """Attribute each head of ``heads`` (``(layer, head)`` pairs) over ``items``: one forward per
    batch of equal-length items. ``ValueError`` for a head outside the model or no item."""
    cfg = cfg or QKConfig()
    spec = model.spec
    heads = [(int(l), int(h)) for l, h in heads]
    for l, h in heads:
        if not (0 <= l < spec.n_layers and 0 <= h < spec.n_heads):
            raise ValueError(
                f"--head {l}.{h} is outside {spec.name}: {spec.n_layers} layers (0-{spec.n_layers - 1}) x "
                f"{spec.n_heads} heads (0-{spec.n_heads - 1})"
            )
    if not items or not heads:
        raise ValueError(f"QK attribution needs at least one head and one item; got {len(heads)} and {len(items)}")
    deepest = max(l for l, _ in heads)
    done: dict[tuple[int, int], Attribution] = {}
    forwards = 0
    for group in _batches(items, cfg.batch_size):
        ids = torch.tensor([it.ids for it in group], dtype=torch.long)
        run = residual_run(model, ids, torch.ones_like(ids), layers=[deepest])
        forwards += 1
        queries = [(b, it.query, it.key) for b, it in enumerate(group)]
        for l, h in heads:
            done[l, h] = attribute(head_parts(run, l, h), queries, baseline=cfg.baseline, into=done.get((l, h)))
    frames, summary = [], {}
    for (l, h), a in done.items():
        if not a.n:
            summary[f"{l}.{h}"] = {"head": f"{l}.{h}", "n_items": 0, "n_skipped": a.skipped}
            continue
        f = qk_frame(a, top_pairs=cfg.top_pairs)
        frames.append(f)
        summary[f"{l}.{h}"] = {**qk_summary(a, f), "frozen": FROZEN}
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=QK_COLUMNS)
    return QKResult(frame, summary, forwards, done)
