"""The roles of the IOI circuit (Wang et al. 2022, "Interpretability in the Wild"): name movers,
negative name movers and S-inhibition heads, on the IOI task (:mod:`headscope.analyses.patching.ioi`:
``"When Mary and John went to the store, John gave a drink to"`` -> ``" Mary"``).

**Direct effect.** A head's direct effect on an item is what its output at the final position adds
to the logit difference ``logit(IO) - logit(S)`` through the unembedding alone: its write there
``z_h W_O[h]`` (through a sandwich norm's post-attention norm, frozen), through the final norm
frozen at the run's own scale at that position, read by ``W_U[:, IO] - W_U[:, S]`` (a final soft
cap is not additive: the effect is on the logits before it).

* ``ioi:name-mover``: an item is a **hit** when the head's direct effect is positive and at least
  :data:`SHARE` (10%) of the size of the item's clean logit difference;
* ``ioi:negative-name-mover``: a hit when it is negative and at most ``-SHARE`` of that size.

Score: the share of items that are hits. Baseline: the same hit, per item, on the task's corrupted
input (the ABC corruption: the three name slots hold three other names, so IO and S are absent from
the sentence and the head has no name to move), against the same clean threshold; the exact sign
test (McNemar) compares the two per item. Verdict: score ``>= THRESHOLD`` (half the items, chosen
before any data was read) and the adjusted p below ``cfg.alpha``.

* ``ioi:s-inhibition`` (only with ``cfg.ioi_s_inhibition``, ``headscope roles --s-inhibition``:
  path patching costs about one forward per head below the name movers per item): path patching
  (:func:`~headscope.analyses.patching.path.path_deltas`, noising) of each head below the name
  movers' layer into the **queries** of the name movers with a verdict in that layer (the top name
  mover's), all at once; a hit when the head's ABC output, patched into those queries, lowers the
  logit difference by at least ``SHARE`` of the item's clean-minus-corrupted gap. Baseline: the same
  path raising it by as much (a head whose path does nothing systematic moves the difference either
  way equally often). Without a name mover there is nothing to patch into: a note says so.

The duplicate-token and induction heads IOI uses are the roles headscope finds already
(``induction`` group): :func:`ioi_heads` joins the IOI rows with every other verdict of the head.

Statistics (STAT_COLUMNS, ``metric`` ``ioi:direct_effect``): a head's mean direct effect over items,
as a share of the mean clean logit difference. ``RoleOutput.extra``: ``clean_logit_diff`` and
``corrupted_logit_diff`` (means over items), ``notes``.

Decoders on the in-house backend only: an encoder (no unembedding) or another backend gives no
rows, with a note. Options: ``items`` (a :class:`~headscope.analyses.patching.items.Task` with
metric ``logit_diff``, or its :class:`~headscope.analyses.patching.items.PairItem` list, to use
instead of the IOI task of ``cfg.ioi_n_items`` items); ``paths``: what runs the S-inhibition path
patching, called as :func:`~headscope.analyses.patching.path.path_deltas` (default: that function;
a sharded report passes one that runs its patched forwards on the Ray workers).

>>> item_hits(torch.tensor([[1.0, -0.5, 0.05]]), torch.tensor([2.0]))
tensor([[1., 0., 0.]])
>>> item_hits(torch.tensor([[1.0, -0.5, 0.05]]), torch.tensor([2.0]), negative=True)
tensor([[0., 1., 0.]])
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pandas as pd
import torch

from headscope.analyses.frames import STAT_COLUMNS, roles_frame
from headscope.analyses.roles.base import Role, RoleContext
from headscope.analyses.roles.config import RoleOutput
from headscope.analyses.roles.pattern_stats import ItemValues
from headscope.analyses.stats.verdicts import layered_rows, verdict_rows
from headscope.probes.capture import StreamReport, in_part
from headscope.probes.direct_effects import direct_effects

GROUP = "ioi"
NAME_MOVER = "ioi:name-mover"
NEGATIVE = "ioi:negative-name-mover"
S_INHIBITION = "ioi:s-inhibition"
SCORE_KIND = "hit"
#: a hit: the head's effect is at least this share of the item's clean logit difference (or gap)
SHARE = 0.10
#: the share of items that are hits a head of the role reaches at least (fixed before any data)
THRESHOLD = 0.5


def item_hits(effect: torch.Tensor, logit_diff: torch.Tensor, *, negative: bool = False) -> torch.Tensor:
    """``effect [item, ...]`` (a head's effect on the logit difference) and the item's clean
    ``logit_diff [item]`` -> 0/1 hits: positive and ``>= SHARE × |logit_diff|`` (``negative``:
    negative and ``<= -SHARE × |logit_diff|``); an item whose difference is 0 has no hit."""
    scale = (SHARE * logit_diff.abs()).reshape(-1, *([1] * (effect.dim() - 1)))
    e = -effect if negative else effect
    return ((e > 0) & (e >= scale)).float()


@dataclass
class IOIBatch:
    """One batch of the direct-effect pass: ``item_ids``, the clean and corrupted runs' per-head
    direct effects ``[batch, layer, head]`` and logit differences ``[batch]``."""

    item_ids: list
    effect_clean: torch.Tensor
    effect_corrupted: torch.Tensor
    logit_diff_clean: torch.Tensor
    logit_diff_corrupted: torch.Tensor


def _no_rows(model) -> str | None:
    if not model.spec.causal or getattr(model, "unembedding", None) is None:
        return f"{GROUP}: no unembedding (an encoder): the IOI roles read the logit difference"
    if getattr(model, "backend", None) != "inhouse" or getattr(model, "network", None) is None:
        return (
            f"{GROUP}: the direct effects read the in-house stack's hook points; got backend "
            f"{getattr(model, 'backend', '?')!r} (load with --backend inhouse)"
        )
    return None


def probe_items(ctx: RoleContext) -> list:
    """The IOI task's usable items (``cfg.ioi_n_items``, seeded by ``cfg.seed``), or the
    ``items`` option; ``ValueError`` for an empty or unreadable ``items``; ``[]`` for a model
    without rows (:func:`_no_rows`)."""
    from headscope.analyses.patching.items import PairItem, Task

    given = ctx.options.get("items")
    if given is not None:
        if isinstance(given, Task):
            if given.metric != "logit_diff":
                raise ValueError(f"{GROUP}: items must be a task with metric logit_diff; got {given.metric!r}")
            given = given.items
        items = list(given)
        if not items or not all(isinstance(it, PairItem) and isinstance(it.wrong, int) for it in items):
            raise ValueError(f"{GROUP}: items must be a non-empty list of PairItem with a wrong token (IO and S)")
        return items
    if _no_rows(ctx.model) is not None or _tokenizer_reason(ctx) is not None:
        return []
    from headscope.analyses.patching.tasks import load_task

    return list(load_task(ctx.model, "ioi", n_items=ctx.cfg.ioi_n_items, seed=ctx.cfg.seed).items)


def _tokenizer_reason(ctx: RoleContext) -> str | None:
    """Why the model's tokenizer cannot write the IOI task (too few names, places or objects that are
    single tokens: the task's one-line refusal), or None: such a model gets no rows and a note."""
    from headscope.analyses.patching.ioi import ioi_words

    try:
        ioi_words(ctx.model)
    except ValueError as e:
        return f"{GROUP}: {e}"
    return None


def _task(items):
    from headscope.analyses.patching.items import Task

    return Task(name="ioi", items=list(items), metric="logit_diff")


class IOIReducer:
    """Per item: each head's direct effect on the clean and the corrupted run, and both runs'
    logit differences (exact ``merge``). ``result()`` -> ``{name: [item, ...]}`` in item order."""

    def __init__(self):
        self.values = ItemValues()
        self.layers: tuple[int, ...] | None = None

    def update(self, batch: IOIBatch) -> None:
        self.layers = self.layers or tuple(range(batch.effect_clean.shape[1]))
        self.values.add("effect_clean", batch.item_ids, batch.effect_clean)
        self.values.add("effect_corrupted", batch.item_ids, batch.effect_corrupted)
        self.values.add("logit_diff_clean", batch.item_ids, batch.logit_diff_clean)
        self.values.add("logit_diff_corrupted", batch.item_ids, batch.logit_diff_corrupted)

    def merge(self, other: IOIReducer) -> IOIReducer:
        self.layers = self.layers or other.layers
        self.values.merge(other.values)
        return self

    def result(self) -> dict[str, torch.Tensor]:
        return {k: self.values.get(k)[1] for k in self.values.names()}


def feed(ctx: RoleContext, reducers, progress=None) -> StreamReport:
    """The direct-effect pass: each batch of equal-length items, clean and corrupted, one forward
    each, into ``reducers`` as :class:`IOIBatch` es; ``progress(done, total)`` counts items of
    that pass, the time estimate's unit (:func:`work`: with S-inhibition the total is larger, and the
    path patching in :func:`finish` counts on up to it from ``report.progress``, ``(progress, done,
    total)``)."""
    items = ctx.items
    batches = [b for i, b in enumerate(_task(items).batches(ctx.cfg.batch_size)) if in_part(ctx.part, i)]
    mine = [r for b in batches for r in b[4]]  # under a sharded run's part: the items of its batches
    report = StreamReport(n_items=len(items), n_used=len(mine), n_batches=0)
    report.real_tokens = 2 * sum(len(items[r].clean) for r in mine)
    total = work(ctx.cfg, ctx.model.spec, len(items))
    if not items or _no_rows(ctx.model) is not None:
        return report
    done = 0
    for clean, corrupted, answer, wrong, rows in batches:
        e_c, ld_c = direct_effects(ctx.model, clean, answer, wrong)
        e_x, ld_x = direct_effects(ctx.model, corrupted, answer, wrong)
        batch = IOIBatch(list(rows), e_c, e_x, ld_c, ld_x)
        for r in reducers:
            r.update(batch)
        report.n_batches += 1
        done += len(rows)
        if progress is not None:
            progress(done, total)
    report.progress = (progress, done, total)  # finish's path patching counts on from here
    return report


#: where the name movers sit, as a fraction of the depth (the time estimate's guess before they are found:
#: GPT-2 small's at 9-10 of 12 layers, SmolLM2-135M's at 23 of 30)
MOVER_DEPTH = 0.8
#: a replica row of the path patching against a row of the direct-effect pass, per layer run: measured on
#: SmolLM2-135M (8 items, 72 senders into L23's name movers: 0.25 of a direct-effect item per sender, where
#: the layers run predict 0.325; the replicas run as large stacked batches, the items in small equal-length ones)
REPLICA_COST = 0.77


def work(cfg, spec, n_items: int | None = None) -> int:
    """The group's work in items of the direct-effect pass (one item: its clean and its corrupted
    forward; the time estimate's unit): ``n`` items, and with ``cfg.ioi_s_inhibition`` the path
    patching's, with the name movers guessed at :data:`MOVER_DEPTH`: its own clean and corrupted
    runs (one item), and per sender (every head below the movers) a replica of one input that runs
    to the sender's layer (the middle on average), through the movers' block and on to the logits,
    at :data:`REPLICA_COST` of a direct-effect row per layer."""
    n = cfg.ioi_n_items if n_items is None else n_items
    total = n
    if cfg.ioi_s_inhibition and spec is not None:
        L, H = spec.n_layers, spec.n_heads
        movers = max(1, round(MOVER_DEPTH * (L - 1)))
        layers_per_sender = movers / 2 + 1 + (L - movers)  # to the sender's layer (mean), the movers' block, the rest
        total += round(n * (1 + movers * H * REPLICA_COST * layers_per_sender / L / 2))
    return total


def _s_inhibition(ctx: RoleContext, rows: list[dict], notes: list[str], counted) -> tuple[list[dict], dict]:
    """The ``ioi:s-inhibition`` rows (module docstring), and what was patched into."""
    from headscope.analyses.patching.activation import PatchConfig
    from headscope.analyses.patching.path import path_deltas

    movers = sorted((r for r in rows if r["role"] == NAME_MOVER and r["verdict"]), key=lambda r: -r["score"])
    if not movers:
        notes.append(f"{S_INHIBITION}: no name mover holds a verdict, so there is no query to patch into")
        return [], {}
    layer = movers[0]["layer"]
    heads = [r["head"] for r in movers if r["layer"] == layer]
    if layer == 0:
        notes.append(f"{S_INHIBITION}: the name movers sit in layer 0; no head sends into them")
        return [], {}
    if len(movers) > len(heads):
        others = ", ".join(f"L{r['layer']}H{r['head']}" for r in movers if r["layer"] != layer)
        notes.append(f"{S_INHIBITION}: patched into the name movers of layer {layer} only (not {others})")
    progress, done, total = counted
    step = None
    if progress is not None:
        step = lambda d, t: progress(done + round((total - done) * d / max(t, 1)), total)  # noqa: E731
    pcfg = PatchConfig(batch_size=ctx.cfg.batch_size, seed=ctx.cfg.seed)
    paths = ctx.options.get("paths") or path_deltas  # a sharded run's: the same call on its workers
    delta, run, senders, _ = paths(
        ctx.model,
        _task(ctx.items),
        receiver=(layer, heads[0]),
        via="q",
        also=tuple(heads[1:]),
        cfg=pcfg,
        progress=step,
    )
    gap = run.gap[:, None]  # [item, 1]
    hits = item_hits(delta, gap[:, 0])  # lowered by >= SHARE of the gap
    base = item_hits(-delta, gap[:, 0])
    cols = {s: i for i, s in enumerate(senders)}
    values = {s: hits[:, i] for s, i in cols.items()}
    baseline = {s: base[:, i] for s, i in cols.items()}
    out = verdict_rows(
        values,
        baseline,
        n_layers=ctx.model.spec.n_layers,
        n_heads=ctx.model.spec.n_heads,
        role=S_INHIBITION,
        cfg=ctx.cfg,
        score_kind=SCORE_KIND,
        threshold_kind="absolute",
        threshold=THRESHOLD,
    )
    return out, {"receivers": [f"{layer}.{h}" for h in heads], "clean_minus_corrupted": float(run.gap.mean())}


def finish(reducer: IOIReducer, report, ctx: RoleContext) -> RoleOutput:
    """A filled reducer -> :class:`RoleOutput` (no rows, with the reason, for a model without them)."""
    why = _no_rows(ctx.model)
    if why is None and not ctx.items:
        why = (_tokenizer_reason(ctx) if "items" not in ctx.options else None) or f"{GROUP}: no item"
    if why is not None:
        return RoleOutput(frame=roles_frame([]), n_items=0, extra={"notes": [why]})
    v = reducer.result()
    layers = reducer.layers
    ld = v["logit_diff_clean"]
    rows = []
    for role, negative in ((NAME_MOVER, False), (NEGATIVE, True)):
        rows += layered_rows(
            item_hits(v["effect_clean"], ld, negative=negative),
            item_hits(v["effect_corrupted"], ld, negative=negative),
            layers,
            role=role,
            score_kind=SCORE_KIND,
            cfg=ctx.cfg,
            threshold_kind="absolute",
            threshold=THRESHOLD,
        )
    notes: list[str] = []
    extra = {
        "clean_logit_diff": float(ld.mean()),
        "corrupted_logit_diff": float(v["logit_diff_corrupted"].mean()),
    }
    if ctx.cfg.ioi_s_inhibition:
        counted = getattr(report, "progress", (None, 0, 0))  # feed's progress callable and its count
        s_rows, patched = _s_inhibition(ctx, rows, notes, counted)
        rows += s_rows
        extra["s_inhibition"] = patched
    else:
        notes.append(f"{S_INHIBITION}: not measured (path patching: headscope roles --s-inhibition)")
    mean = v["effect_clean"].mean(0) / ld.mean() if float(ld.mean()) else v["effect_clean"].mean(0) * float("nan")
    stats = pd.DataFrame(
        [
            {"layer": l, "head": h, "metric": "ioi:direct_effect", "value": float(mean[li, h]), "n": len(ld)}
            for li, l in enumerate(layers)
            for h in range(mean.shape[1])
        ],
        columns=STAT_COLUMNS,
    )
    return RoleOutput(
        frame=roles_frame(rows),
        stats=stats,
        skipped=Counter(report.skipped),
        n_items=report.n_used,
        extra={**extra, "notes": notes},
    )


def ioi_heads(frame: pd.DataFrame) -> pd.DataFrame:
    """The IOI rows of a roles ``frame`` (ROLE_COLUMNS) with a verdict, best first, and ``also``:
    the head's other verdicts (``induction``, ``duplicate-token``, ``previous-token``, …), comma-
    separated ("" for none): the duplicate-token and induction heads IOI uses are those roles.

    >>> f = pd.DataFrame({"layer": [1, 1, 0], "head": [2, 2, 3], "role": ["ioi:name-mover", "induction", "ioi:name-mover"],
    ...                   "relation": "", "direction": "", "score": [0.9, 0.8, 0.1], "verdict": [True, True, False]})
    >>> ioi_heads(f)[["layer", "head", "role", "also"]].values.tolist()
    [[1, 2, 'ioi:name-mover', 'induction']]
    """
    held = frame[frame["verdict"].astype(bool)]
    ioi = held[held["role"].str.startswith(GROUP + ":")]
    others = held[~held["role"].str.startswith(GROUP + ":")]
    label = others["role"] + others["relation"].fillna("").map(lambda r: f":{r}" if r else "")
    also = label.groupby([others["layer"], others["head"]]).agg(lambda s: ", ".join(sorted(set(s))))
    out = ioi.sort_values(["role", "score"], ascending=[True, False]).reset_index(drop=True).copy()
    out["also"] = [also.get((l, h), "") for l, h in zip(out["layer"], out["head"])]
    return out


def _reducer(ctx: RoleContext) -> IOIReducer:
    return IOIReducer()


ROLE_DEF = Role(
    name=GROUP,
    corpus="generated",
    score_kind=SCORE_KIND,
    reducer=_reducer,
    finish=finish,
    items=probe_items,
    feed=feed,
    needs_logits=True,
    options=("items", "paths"),
    shards=True,
    generated=lambda cfg: (40, cfg.ioi_n_items),
    work=work,
    description=(
        "IOI roles (Wang et al. 2022) on the IOI task: name movers (negative name movers): the share of items "
        "where the head's direct effect on logit(IO) - logit(S) through the unembedding (final norm frozen) is "
        ">= 10% (<= -10%) of the clean difference, against the same on the ABC-corrupted input (no IO or S in the "
        "sentence); S-inhibition heads (--s-inhibition): path patching into the name movers' queries lowers the "
        "difference by >= 10% of the clean-corrupted gap, against raising it by as much. Options: items (a "
        "logit_diff Task or its PairItems)."
    ),
)
