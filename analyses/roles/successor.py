"""Successor heads (Gould et al. 2023, "Successor Heads: Recurring, Interpretable Attention Heads
In The Wild"): heads whose output maps an ordinal token to its successor (1 → 2, Monday → Tuesday,
January → February, A → B).

Probe: sequences of the members of an ordinal set (:data:`ORDINAL_SETS`, written here; only the
members the tokenizer keeps as one token take part), shuffled (seeded), after the tokenizer's
first token where it has one. At every position whose token has a successor in the set, the
head's direct write there (``z_h W_O[h]``, read through the unembedding ``W_U``, the final norm's
scale folded on the in-house stack) gives a logit to each member of the set; a **hit** is the
successor having the largest. The head's per-item value is its share of hits over the item's
scored positions (a shuffled sequence, so the successor is rarely the next token: the head must
map the token, not predict the text). Baseline: a uniform pick among the set's members
(``1 / members``). Verdict: score ``>= THRESHOLD`` and the adjusted p below ``cfg.alpha``.

Rows ``successor:ov`` score the same from the weights (:mod:`.successor_ov`): per ordinal token with a
successor, whether the head's effective OV circuit ``W_U W_OV MLP0(W_E)`` puts the successor first
among the set's members (Gould et al.'s succession score), one item per token, the same baseline.

The role reads the logits: an encoder (no unembedding) or a backend without per-head weights
gives no rows, with a note saying why. Options: ``sets`` (``{name: [words in order]}``, default
:data:`ORDINAL_SETS`), ``items`` (:class:`OrdinalItem` s to use instead). Sizes:
``cfg.induction_n_sequences`` sequences of at most ``cfg.induction_seq_len`` members.

>>> successor_map([10, 11, 12])
{10: 11, 11: 12}
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch

from headscope.analyses.frames import roles_frame
from headscope.analyses.roles.base import Role, RoleContext
from headscope.analyses.roles.config import RoleOutput
from headscope.analyses.roles.pattern_stats import ItemValuesReducer, check_layers
from headscope.analyses.roles.sequences import feed_sequences
from headscope.analyses.stats.verdicts import layered_rows
from headscope.probes.capture import Capture, StreamReport
from headscope.probes.errors import ModelIncompatibleError

ROLE = "successor"
SCORE_KIND = "share"
#: the share of hits a successor head reaches at least
THRESHOLD = 0.5
#: ordinal sets, each in order (the project's own lists)
ORDINAL_SETS = {
    "numbers": [str(i) for i in range(1, 21)],
    "days": ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"],
    "months": [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ],
    "letters": [chr(c) for c in range(ord("A"), ord("Z") + 1)],
}


@dataclass(frozen=True)
class OrdinalItem:
    """One probe sequence: ``ids``, ``special`` marks, the set's member ids in order
    (``members``: the logits compared), and the scored ``positions`` with their ``targets``
    (the successor of the token there)."""

    ids: tuple[int, ...]
    special: tuple[bool, ...]
    members: tuple[int, ...]
    positions: tuple[int, ...]
    targets: tuple[int, ...]


def successor_map(members) -> dict[int, int]:
    """``{id: next id}`` of consecutive members (a member None breaks the chain)."""
    return {a: b for a, b in zip(members, members[1:], strict=False) if a is not None and b is not None}


def single_token_ids(tokenizer, words) -> list[int | None]:
    """Each word's id where the tokenizer keeps it as one token (with a leading space first, as
    in running text, then bare); None where it does not."""
    out = []
    for w in words:
        ids = None
        for text in (" " + w, w):
            got = tokenizer(text, add_special_tokens=False)["input_ids"]
            if len(got) == 1:
                ids = got[0]
                break
        out.append(ids)
    return out


def _first(tokenizer) -> list[int]:
    first = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    return [] if first is None else [first]


def probe_items(ctx: RoleContext) -> list[OrdinalItem]:
    """The role's items (module docstring); ``ValueError`` for an empty ``items`` option or a
    tokenizer that keeps no set's members as single tokens; ``[]`` for a model without logits."""
    given = ctx.options.get("items")
    if given is not None:
        items = list(given)
        if not items or not all(isinstance(it, OrdinalItem) for it in items):
            raise ValueError("successor: items must be a non-empty list of OrdinalItem")
        return items
    if _no_logits(ctx.model) is not None:
        return []
    from headscope.analyses.roles.successor_ov import chains as ordinal_chains

    tok, cfg = ctx.model.tokenizer, ctx.cfg
    chains = ordinal_chains(tok, ctx.options.get("sets", ORDINAL_SETS))
    if not chains:
        raise ValueError("successor: no ordinal set has two consecutive pairs of single tokens in this tokenizer")
    gen = torch.Generator().manual_seed(cfg.seed)
    first, items = _first(tok), []
    for n in range(cfg.induction_n_sequences):
        members, succ = chains[n % len(chains)]
        order = torch.randperm(len(members), generator=gen)[: cfg.induction_seq_len].tolist()
        body = [members[i] for i in order]
        if not any(t in succ for t in body):
            body[0] = next(iter(succ))
        ids = first + body
        pos = tuple(p for p, t in enumerate(ids) if p >= len(first) and t in succ)
        items.append(
            OrdinalItem(
                ids=tuple(ids),
                special=tuple([True] * len(first) + [False] * len(body)),
                members=members,
                positions=pos,
                targets=tuple(succ[ids[p]] for p in pos),
            )
        )
    return items


def _no_logits(model) -> str | None:
    """Why the model has no logits to read (None: it has). The unembedding's weights are what is read,
    so an hf decoder whose rows cannot be unembedded alone still has them (its output embedding)."""
    out = getattr(model, "unembedding", None)
    if out is None and model.spec.causal and hasattr(model, "_output_embedding"):
        try:
            out = model._output_embedding()
        except AttributeError:
            out = None
    if not model.spec.causal or out is None:
        return "successor: no unembedding (an encoder): successor heads are read through the logits"
    return None


def readout(model, layers, ids) -> dict[int, torch.Tensor]:
    """``{layer: W_O[h] @ W_U[:, ids] [head, d_head, len(ids)]}`` (float32, CPU; only the columns
    of ``ids``); ``ModelIncompatibleError`` where the model has no per-head weights."""
    from headscope.probes.models.weights_provider import model_weights

    w = model_weights(model)
    w_u = w.W_U_columns(list(ids))
    return {l: torch.einsum("hed,dv->hev", w.layer(l).W_O, w_u) for l in layers}


class SuccessorReducer(ItemValuesReducer):
    """Per item and head, the share of scored positions whose largest member logit is the
    successor's (module docstring). ``result()`` -> ``({role: [n, layer, head]}, {role: [n]}, layers)``."""

    def __init__(self, model, items: list[OrdinalItem]):
        super().__init__(causal=True)
        self.model, self.items = model, items
        self._columns = sorted({m for it in items for m in it.members})  # the readout's vocabulary columns
        self._readout: dict | None = None
        self.refused: str | None = None  # why the head outputs cannot be read as logits

    def update(self, cap: Capture) -> None:
        self.layers = check_layers(cap.layers, self.layers)
        if self.refused is not None:
            return
        dev = cap["z", cap.layers[0]].device  # computed where the capture is, read back to the host
        if self._readout is None:
            try:
                self._readout = {l: r.to(dev) for l, r in readout(self.model, cap.layers, self._columns).items()}
            except ModelIncompatibleError as e:
                self.refused = f"successor: {str(e).strip().splitlines()[0]}"
                return
        n_l, n_h = len(cap.layers), self.model.spec.n_heads
        hits = torch.zeros(len(cap.item_ids), n_l, n_h, device="cpu")
        base = torch.zeros(len(cap.item_ids), device="cpu")
        for b, item_id in enumerate(cap.item_ids):
            it = self.items[item_id]
            pos = list(it.positions)
            members = torch.tensor([self._columns.index(m) for m in it.members], device=dev)
            target = torch.tensor([it.members.index(t) for t in it.targets], device=dev)
            for li, layer in enumerate(cap.layers):
                z = cap["z", layer][b][:, pos].float()  # [head, n_pos, d_head]
                readout_m = self._readout[layer][:, :, members]  # [head, d_head, member]
                logits = torch.einsum("hpe,hem->hpm", z, readout_m)
                hits[b, li] = (logits.argmax(-1) == target).float().mean(-1).cpu()
            base[b] = 1.0 / len(it.members)
        self.values.add(ROLE, cap.item_ids, hits)
        self.values.add("baseline:" + ROLE, cap.item_ids, base)

    def __getstate__(self) -> dict:
        """Pickled (a Ray part's result, on its way to the driver) without the model and what was read
        from its weights: merging, ``result()`` and the role's finish read the values alone (the finish
        reads the driver's own model), while the model would ship a copy of every weight with each part
        (SmolLM2-135M: 0.5 GiB a part, held by the driver in the object store and again unpickled).
        An unpickled reducer merges and finishes; it is not fed again."""
        return {**self.__dict__, "model": None, "_readout": None}

    def merge(self, other: SuccessorReducer) -> SuccessorReducer:
        super().merge(other)
        self.refused = self.refused or other.refused
        return self

    def result(self):
        return self._by_role((ROLE,))


def feed(ctx: RoleContext, reducers, progress=None) -> StreamReport:
    """Run ``ctx.model`` over ``ctx.items``, ``cfg.batch_size`` at a time, capturing ``z``."""
    return feed_sequences(ctx, reducers, progress, kinds=("z",))


def finish(reducer: SuccessorReducer, report, ctx: RoleContext) -> RoleOutput:
    """A filled reducer -> :class:`RoleOutput` (no rows, with the reason, for a model without logits)."""
    why = _no_logits(ctx.model) or reducer.refused
    if why is None and not ctx.items:
        why = "successor: no item"
    if why is not None:
        return RoleOutput(frame=roles_frame([]), n_items=0, extra={"notes": [why]})
    values, base, layers = reducer.result()
    rows = layered_rows(
        values[ROLE],
        base[ROLE],
        layers,
        role=ROLE,
        score_kind=SCORE_KIND,
        cfg=ctx.cfg,
        threshold_kind="absolute",
        threshold=THRESHOLD,
    )
    notes: list[str] = []
    rows += _ov_rows(ctx, layers, notes)
    return RoleOutput(
        frame=roles_frame(rows), skipped=Counter(report.skipped), n_items=report.n_used, extra={"notes": notes}
    )


def _ov_rows(ctx: RoleContext, layers, notes: list[str]) -> list[dict]:
    """The ``successor:ov`` rows (:mod:`.successor_ov`: the effective OV circuit on the ordinal tokens),
    or none with a note saying why."""
    from headscope.analyses.roles import successor_ov as ov

    if ctx.options.get("items") is not None:
        chain_list = ov.chains_of_items(ctx.items)
    else:
        chain_list = ov.chains(ctx.model.tokenizer, ctx.options.get("sets", ORDINAL_SETS))
    try:
        hits, base, _ = ov.ov_hits(ctx.model, chain_list, layers)
    except (ModelIncompatibleError, ValueError) as e:
        notes.append(f"{ov.ROLE}: {str(e).strip().splitlines()[0]}")
        return []
    return layered_rows(
        hits,
        base,
        layers,
        role=ov.ROLE,
        score_kind="hit",
        cfg=ctx.cfg,
        threshold_kind="absolute",
        threshold=ov.THRESHOLD,
    )


def _reducer(ctx: RoleContext) -> SuccessorReducer:
    return SuccessorReducer(ctx.model, ctx.items)


ROLE_DEF = Role(
    name=ROLE,
    corpus="generated",
    score_kind=SCORE_KIND,
    reducer=_reducer,
    finish=finish,
    items=probe_items,
    feed=feed,
    needs_logits=True,
    shards=True,
    options=("sets", "items"),
    generated=lambda cfg: (cfg.induction_seq_len + 1, cfg.induction_n_sequences),
    description=(
        "successor heads (Gould et al. 2023): on shuffled members of ordinal sets (numbers, days, months, "
        "letters), the share of positions where the head's direct logits over the set's members put the "
        "successor of the token there first, against a uniform pick among the members (1 / members); rows "
        "successor:ov: the same from the weights, the effective OV circuit W_U W_OV MLP0(W_E) on each ordinal "
        "token alone (Gould et al.'s score), one item per token. Options: "
        "sets ({name: [words in order]}), items (OrdinalItem sequences to use instead)."
    ),
)
