"""Function-vector heads (Todd et al. 2024, "Function Vectors in Large Language Models"): heads whose
mean output at the last position of in-context-learning prompts carries the task, so that patching
it into prompts whose demonstrations do not show the task brings the answer back.

Tasks: the project's own (:mod:`.icl_tasks`: antonyms, country → capital, capitalisation, next
letter, English → French, present → past), the answer scored by its first token, pairs a tokenizer
cannot score dropped and counted. Each task's usable pairs are split in two halves (seeded):

* **mean prompts**: ``n_prompts`` clean prompts of ``n_demos`` demonstrations and a query, all from
  the first half, in Todd et al.'s format ``"Q: x\\nA: y\\n\\n" … "Q: x\\nA:"``; a head's **mean
  output** for the task is its ``z`` (its per-head output before the output projection; per query
  head under GQA) at the last position, averaged over them;
* **scored prompts** (the items): ``n_prompts`` prompts from the other half (so no answer scored
  was ever in a prompt the means came from), their demonstration labels **shuffled** (a seeded
  derangement: no demonstration keeps its own label, the task cannot be read from them).

Per scored prompt and head, the head's mean output replaces its ``z`` at the last position (only
there; :mod:`headscope.probes.models.inhouse.last_position` re-runs that position alone) and the
value is the probability of the correct answer token. Todd et al.'s **causal indirect effect** is
that minus the probability without the patch (statistic ``function-vector:cie``, per task
``function-vector:cie:<task>``). **Baseline**: the same patch with the head's mean output over the
task's *other* shuffled prompts (leave-one-out): an output of the same format, the same answer
vocabulary, no task. So ``score`` is the patched probability, ``baseline`` the control's and
``margin`` the indirect effect beyond the control, averaged over prompts of every task (equal
numbers per task). Verdict: ``margin >= THRESHOLD`` and the adjusted p (paired permutation over
prompts) below ``cfg.alpha``.

Decoders on the in-house backend only: an encoder (no answer to read) or another backend gets no
rows, with a note. ``skipped`` counts the pairs each task dropped, by reason; ``extra["tasks"]``: per task, the pairs kept and dropped (by reason), answers
scored by their first token, the mean prompts' accuracy (the model doing the task in context) and
the scored prompts' accuracy without a patch. Options: ``tasks`` (``{name: [(x, y), ...]}``,
default :data:`~headscope.analyses.roles.icl_tasks.TASKS`), ``template`` (``(demonstration,
query)`` format strings), ``n_demos`` (default :data:`N_DEMOS`), ``n_prompts`` (per task, default
:func:`default_prompts`), ``layers`` (the layers whose heads are scored, default all: each costs a
re-run of the last position per head), ``items`` (:class:`ICLItem` s to use instead).

>>> derangement(4, torch.Generator().manual_seed(0))
[3, 0, 1, 2]
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pandas as pd
import torch

from headscope.analyses.frames import roles_frame
from headscope.analyses.roles.base import Role, RoleContext
from headscope.analyses.roles.config import RoleOutput
from headscope.analyses.roles.icl_tasks import TASKS, TEMPLATE, prompt_ids, prompt_text, task_pairs
from headscope.analyses.roles.pattern_stats import ItemValues, check_layers, stats_frame
from headscope.analyses.stats.verdicts import layered_rows
from headscope.probes.capture import Capture, StreamReport, in_part
from headscope.probes.capture import feed as feed_capture
from headscope.probes.errors import ModelIncompatibleError

ROLE = "function-vector"
SCORE_KIND = "share"
#: the indirect effect beyond the control (probability of the answer) a function-vector head reaches at least
THRESHOLD = 0.05
#: demonstrations per prompt (Todd et al.: 10)
N_DEMOS = 10
#: rows (patched replicas × prompts) one re-run of the last position holds at most (its logits: rows × vocab)
MAX_ROWS = 512
#: the longest prompt's tokens the time estimate plans for (SmolLM2: 80-110 at 10 demonstrations)
LONGEST = 128
#: a replica's layer-position of the patched re-runs against one of a prompt's forward (the unembedding each
#: replica reads per layer patched, small batches): measured on SmolLM2-135M (69 s of one core for 30 items)
REPLICA_COST = 2.0


@dataclass(frozen=True)
class ICLItem:
    """One scored prompt of ``task``: ``ids`` (labels shuffled) and its query's ``answer`` (first
    token id); with one mean prompt of the task, ``mean_ids`` (clean) and its ``mean_answer``."""

    task: str
    ids: tuple[int, ...]
    answer: int
    mean_ids: tuple[int, ...]
    mean_answer: int


def derangement(n: int, gen: torch.Generator) -> list[int]:
    """A seeded permutation of ``range(n)`` without a fixed point (``n >= 2``; Sattolo's cycle)."""
    if n < 2:
        raise ValueError(f"a derangement needs at least 2 elements; got {n}")
    out = list(range(n))
    for i in range(n - 1, 0, -1):
        j = int(torch.randint(i, (1,), generator=gen))
        out[i], out[j] = out[j], out[i]
    return out


def default_prompts(cfg) -> int:
    """Prompts per task without the ``n_prompts`` option: ``cfg.fv_prompts`` (default 5; SmolLM2: ~2 s
    of one core per prompt and its mean prompt), fewer (at least 2) where ``cfg.induction_n_sequences``
    (the generated roles' sequences) shared by the tasks is smaller."""
    return max(2, min(cfg.fv_prompts, cfg.induction_n_sequences // len(TASKS)))


def _no_logits(model) -> str | None:
    if not model.spec.causal or getattr(model, "unembedding", None) is None:
        return f"{ROLE}: no unembedding (an encoder): a function vector is read through the answer's probability"
    return None


def _options(ctx: RoleContext):
    o = ctx.options
    n_demos, n_prompts = int(o.get("n_demos", N_DEMOS)), int(o.get("n_prompts", default_prompts(ctx.cfg)))
    if n_demos < 2 or n_prompts < 2:
        raise ValueError(f"{ROLE}: n_demos and n_prompts must be at least 2; got {n_demos}, {n_prompts}")
    return o.get("tasks", TASKS), tuple(o.get("template", TEMPLATE)), n_demos, n_prompts


def _layers(ctx: RoleContext) -> tuple[int, ...]:
    n = ctx.model.spec.n_layers
    layers = tuple(sorted({int(l) for l in ctx.options.get("layers", range(n))}))
    if not layers or not all(0 <= l < n for l in layers):
        raise ValueError(f"{ROLE}: layers must be a non-empty subset of 0..{n - 1}; got {ctx.options.get('layers')}")
    return layers


def task_table(ctx: RoleContext) -> dict[str, dict]:
    """Per task: ``kept``, ``dropped`` ({reason: n}), ``multi_token`` and whether it ``runs`` (two
    halves of at least ``n_demos + 1`` pairs each)."""
    tasks, _, n_demos, _ = _options(ctx)
    out = {}
    for name, pairs in tasks.items():
        tp = task_pairs(ctx.model.tokenizer, name, pairs)
        out[name] = {
            "kept": len(tp.pairs),
            "dropped": dict(tp.dropped),
            "multi_token": tp.multi_token,
            "runs": len(tp.pairs) >= 2 * (n_demos + 1),
        }
    return out


def split_halves(tp, seed: int) -> tuple[list, list]:
    """A task's usable pairs (:class:`~headscope.analyses.roles.icl_tasks.TaskPairs`) in two halves,
    ``[((x, y), answer id), ...]`` each: the mean prompts' and the held-out one (seeded, the same
    split whatever the other tasks)."""
    order = torch.randperm(len(tp.pairs), generator=torch.Generator().manual_seed(seed)).tolist()
    half = len(order) // 2
    return [(tp.pairs[i], tp.answers[i]) for i in order[:half]], [(tp.pairs[i], tp.answers[i]) for i in order[half:]]


def _prompt(tok, half, q: int, n_demos: int, template, gen, shuffled: bool) -> list[int]:
    others = [i for i in range(len(half)) if i != q]
    pick = [others[i] for i in torch.randperm(len(others), generator=gen)[:n_demos].tolist()]
    demos = [half[i] for i in pick]
    if shuffled:
        labels = [demos[j][1] for j in derangement(len(demos), gen)]
        demos = [(x, y) for (x, _), y in zip(demos, labels)]
    return prompt_ids(tok, prompt_text(demos, half[q][0], template))


def probe_items(ctx: RoleContext) -> list[ICLItem]:
    """The role's items (module docstring), grouped by task; ``ValueError`` for an empty ``items``
    option or given ``tasks`` of which none has enough usable pairs; ``[]`` for a model without logits
    or a tokenizer that scores none of the shipped tasks (``finish`` says so in a note)."""
    given = ctx.options.get("items")
    if given is not None:
        items = list(given)
        if not items or not all(isinstance(it, ICLItem) for it in items):
            raise ValueError(f"{ROLE}: items must be a non-empty list of ICLItem")
        return sorted(items, key=lambda it: list(dict.fromkeys(i.task for i in items)).index(it.task))
    if _no_logits(ctx.model) is not None:
        return []
    tasks, template, n_demos, n_prompts = _options(ctx)
    tok = ctx.model.tokenizer
    gen = torch.Generator().manual_seed(ctx.cfg.seed)
    items = []
    for name, pairs in tasks.items():
        tp = task_pairs(tok, name, pairs)
        if len(tp.pairs) < 2 * (n_demos + 1):
            continue  # counted in task_table
        a, b = split_halves(tp, ctx.cfg.seed)
        qa, qb = torch.randperm(len(a), generator=gen).tolist(), torch.randperm(len(b), generator=gen).tolist()
        for i in range(n_prompts):
            ia, ib = qa[i % len(a)], qb[i % len(b)]
            mean_ids = _prompt(tok, [p for p, _ in a], ia, n_demos, template, gen, shuffled=False)
            ids = _prompt(tok, [p for p, _ in b], ib, n_demos, template, gen, shuffled=True)
            items.append(ICLItem(name, tuple(ids), b[ib][1], tuple(mean_ids), a[ia][1]))
    if not items and "tasks" in ctx.options:  # tasks the caller gave: refused; the shipped ones: a note
        raise ValueError(f"{ROLE}: {_too_few(n_demos)}")
    return items


def _too_few(n_demos: int) -> str:
    return f"no task has {2 * (n_demos + 1)} pairs this tokenizer can score (two halves of n_demos + 1)"


def _batch(ids_list, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    n = max(len(i) for i in ids_list)
    ids = torch.full((len(ids_list), n), pad, dtype=torch.long)
    mask = torch.zeros((len(ids_list), n), dtype=torch.long)
    for r, i in enumerate(ids_list):
        ids[r, : len(i)], mask[r, : len(i)] = torch.tensor(i), 1
    return ids, mask


def _prob(logits: torch.Tensor, answers: torch.Tensor) -> torch.Tensor:
    return logits.float().softmax(-1).gather(-1, answers[:, None])[:, 0]


def task_means(model, prompts, chunk: int) -> tuple[torch.Tensor, torch.Tensor, list]:
    """``(sum of z at the last position [layer, head, d_head], per-prompt z [n, layer, head, d_head],
    the prompts' :class:`PrefixRun` s)`` over ``prompts`` (token-id lists), ``chunk`` at a time."""
    from headscope.probes.models.inhouse.last_position import prefix_run
    from headscope.probes.tokens import pad_id

    runs, zs = [], []
    for s in range(0, len(prompts), chunk):
        ids, mask = _batch(prompts[s : s + chunk], pad_id(model.tokenizer))
        run = prefix_run(model.network, ids.to(model.device), mask.to(model.device))
        runs.append(run)
        zs.append(torch.stack(run.z_last, 1).float())  # [b, layer, head, d_head]
    z = torch.cat(zs)
    return z.sum(0), z, runs


def patched_probs(model, run, answers: torch.Tensor, sources, layers, max_rows: int = MAX_ROWS) -> torch.Tensor:
    """``[source, b, layer, head]``: the answer's probability at the last position of the prompts of
    ``run`` with head ``h``'s ``z`` there set to ``sources[s][b, layer, h]`` (each ``[b, layer, head,
    d_head]``). One re-run of the last position per layer serves every source and head (one replica
    each), at most ``max_rows`` rows (replicas × prompts) at a time."""
    from headscope.probes.models.inhouse.last_position import last_position_logits

    dev = answers.device
    k, b, n_h = len(sources), len(answers), sources[0].shape[2]
    stacked = torch.stack([s.to(dev) for s in sources])  # [source, b, layer, head, d_head]
    n_calls = -(-k * n_h // max(1, max_rows // b))
    per_call = -(-k * n_h // n_calls)  # replicas per re-run, as even as the calls allow
    out = torch.zeros(k * n_h, b, len(layers))  # replica r = s * n_h + h
    for r0 in range(0, k * n_h, per_call):
        reps = torch.arange(r0, min(r0 + per_call, k * n_h), device=dev)
        rows = torch.arange(b, device=dev).repeat(len(reps))  # replica j: rows j * b + i, prompt i
        src, heads = (reps // n_h).repeat_interleave(b), (reps % n_h).repeat_interleave(b)
        at = torch.arange(len(rows), device=dev)
        for li, layer in enumerate(layers):
            new = stacked[:, :, li][src, rows, heads]  # [replica rows, d_head]

            def z_fn(z, new=new, at=at, heads=heads):
                z = z.clone()
                z[at, heads] = new.to(z.dtype)
                return z

            logits = last_position_logits(model.network, run, layer, z_fn, replicas=len(reps))
            out[reps.cpu(), :, li] = _prob(logits, answers[rows]).view(len(reps), b).cpu()
    return out.view(k, n_h, b, len(layers)).permute(0, 2, 3, 1)


def task_groups(items: list[ICLItem], size: int) -> list[list[str]]:
    """The tasks of ``items`` in order, in consecutive groups whose scored prompts together number at
    most ``size`` (a task with more forms a group alone): one group's prompts are patched together."""
    groups: list[list[str]] = []
    n = 0
    for task, k in Counter(it.task for it in items).items():
        if not groups or n + k > size:
            groups.append([])
            n = 0
        groups[-1].append(task)
        n += k
    return groups


def _group_data(model, its: list[ICLItem], size: int):
    """For the scored prompts ``its`` of some tasks: ``(mean [row, layer, head, d_head]`` (each row's
    task mean over its mean prompts), ``control`` (the leave-one-out mean over the row's task's other
    shuffled prompts), the in-context hits of the mean prompts ``[row]``, the shuffled prompts'
    :class:`PrefixRun` s)."""
    _, m_z, mean_runs = task_means(model, [list(it.mean_ids) for it in its], size)
    icl_hit = torch.cat([r.logits.argmax(-1).cpu() for r in mean_runs]) == torch.tensor([it.mean_answer for it in its])
    _, s_z, runs = task_means(model, [list(it.ids) for it in its], size)
    mean, control = torch.empty_like(m_z), torch.empty_like(s_z)
    for task in dict.fromkeys(it.task for it in its):
        rows = [i for i, it in enumerate(its) if it.task == task]
        if len(rows) < 2:
            raise ValueError(f"{ROLE}: task {task!r} has {len(rows)} item; the control's mean needs at least 2")
        mean[rows] = m_z[rows].mean(0)
        control[rows] = (s_z[rows].sum(0)[None] - s_z[rows]) / (len(rows) - 1)
    return mean, control, icl_hit, runs


def feed(ctx: RoleContext, reducers, progress=None) -> StreamReport:
    """Per group of tasks (:func:`task_groups`, ``cfg.batch_size`` scored prompts): the mean prompts'
    and the scored prompts' forwards, then each layer's heads patched at the scored prompts' last
    position with the task's mean output and with the control's, in one re-run per layer (module
    docstring); one capture per ``cfg.batch_size`` scored prompts, holding ``("patched", layer)`` and
    ``("control", layer)`` ``[batch, head]``, and ``("shuffled", None)``, ``("icl", None)``,
    ``("shuffled_hit", None)`` ``[batch]``; ``progress(done, total)`` counts :func:`work`."""
    items, size = ctx.items, ctx.cfg.batch_size
    # under a sharded run's part: its groups of tasks (each group's means need all its prompts)
    groups = [g for i, g in enumerate(task_groups(items, size)) if in_part(ctx.part, i)]
    mine = [it for it in items if any(it.task in g for g in groups)]
    report = StreamReport(n_items=len(items), n_used=len(mine), n_batches=0)
    report.real_tokens = sum(len(it.ids) + len(it.mean_ids) for it in mine)
    if not items:
        return report
    try:
        from headscope.probes.models.inhouse.last_position import check_network

        check_network(ctx.model.network)
    except ModelIncompatibleError as e:
        for r in reducers:
            if hasattr(r, "refused"):
                r.refused = f"{ROLE}: {str(e).strip().splitlines()[0]}"
        return report
    layers = _layers(ctx)
    dev, spec = ctx.model.device, ctx.model.spec
    total, done = work(ctx.cfg, spec, len(items)), 0
    for group in groups:
        idx = [i for i, it in enumerate(items) if it.task in group]
        its = [items[i] for i in idx]
        mean, control, icl_hit, runs = _group_data(ctx.model, its, size)
        for c, run in enumerate(runs):
            lo, hi = c * size, min((c + 1) * size, len(its))
            answers = torch.tensor([it.answer for it in its[lo:hi]], device=dev)
            patched, ctrl = patched_probs(ctx.model, run, answers, [mean[lo:hi], control[lo:hi]], layers)
            data = {("patched", l): patched[:, li] for li, l in enumerate(layers)}
            data.update({("control", l): ctrl[:, li] for li, l in enumerate(layers)})
            data[("shuffled", None)] = _prob(run.logits, answers).cpu()
            data[("shuffled_hit", None)] = (run.logits.argmax(-1) == answers).float().cpu()
            data[("icl", None)] = icl_hit[lo:hi].float()
            cap = Capture(tokens=None, data=data, layers=layers, spec=ctx.model.spec, item_ids=idx[lo:hi])
            feed_capture(cap, reducers)
            report.n_batches += 1
            done += hi - lo
            if progress is not None:
                progress(work(ctx.cfg, spec, done), total)
    return report


class FunctionVectorReducer:
    """Per scored prompt and head, the patched and control probabilities of the answer and the
    indirect effect (module docstring). ``result()`` -> ``(values, baseline [n, layer, head], layers)``."""

    def __init__(self, items: list[ICLItem]):
        self.items = items
        self.values = ItemValues()
        self.layers = None
        self.refused: str | None = None  # why the heads cannot be patched at the last position

    def update(self, cap: Capture) -> None:
        self.layers = check_layers(cap.layers, self.layers)
        patched, control = cap.stack("patched").permute(1, 0, 2), cap.stack("control").permute(1, 0, 2)
        shuffled = cap["shuffled", None]
        self.values.add(ROLE, cap.item_ids, patched)
        self.values.add("baseline", cap.item_ids, control)
        cie = patched - shuffled[:, None, None]
        self.values.add("cie", cap.item_ids, cie)
        for task in dict.fromkeys(self.items[i].task for i in cap.item_ids):
            rows = [b for b, i in enumerate(cap.item_ids) if self.items[i].task == task]
            self.values.add(f"cie:{task}", [cap.item_ids[b] for b in rows], cie[rows])
        for k in ("shuffled", "shuffled_hit", "icl"):
            self.values.add(k, cap.item_ids, cap[k, None])

    def merge(self, other: FunctionVectorReducer) -> FunctionVectorReducer:
        self.layers = self.layers or other.layers
        self.values.merge(other.values)
        self.refused = self.refused or other.refused
        return self

    def result(self):
        return self.values.get(ROLE)[1], self.values.get("baseline")[1], self.layers or ()

    def per_task(self) -> dict[str, dict]:
        """Per task: prompts, the mean prompts' accuracy (in context), the shuffled prompts' accuracy
        and answer probability without a patch."""
        ids, icl = self.values.get("icl")
        _, hit = self.values.get("shuffled_hit")
        _, prob = self.values.get("shuffled")
        out: dict[str, dict] = {}
        for task in dict.fromkeys(self.items[i].task for i in ids):
            rows = [b for b, i in enumerate(ids) if self.items[i].task == task]
            out[task] = {
                "prompts": len(rows),
                "icl_accuracy": float(icl[rows].mean()),
                "shuffled_accuracy": float(hit[rows].mean()),
                "shuffled_probability": float(prob[rows].mean()),
            }
        return out


def finish(reducer: FunctionVectorReducer, report, ctx: RoleContext) -> RoleOutput:
    """A filled reducer -> :class:`RoleOutput` (no rows, with the reason, for an encoder or another backend)."""
    why = _no_logits(ctx.model) or reducer.refused
    if why is None and not ctx.items:
        why = f"{ROLE}: {_too_few(_options(ctx)[2])}"
    if why is not None:
        return RoleOutput(frame=roles_frame([]), n_items=0, extra={"notes": [why]})
    values, base, layers = reducer.result()
    rows = layered_rows(
        values,
        base,
        layers,
        role=ROLE,
        score_kind=SCORE_KIND,
        cfg=ctx.cfg,
        threshold_kind="margin",
        threshold=THRESHOLD,
    )
    metrics = {f"{ROLE}:{k}": reducer.values.get(k)[1] for k in reducer.values.names() if k.startswith("cie")}
    tasks = task_table(ctx) if ctx.options.get("items") is None else {}
    for name, row in reducer.per_task().items():
        tasks.setdefault(name, {}).update(row)
    notes = [
        f"{ROLE}: task {n!r} skipped: {t['kept']} usable pairs, fewer than two halves of n_demos + 1"
        for n, t in tasks.items()
        if t.get("runs") is False
    ]
    skipped = Counter(report.skipped)  # the pairs each task could not score, by reason (skipped.json)
    for name, t in tasks.items():
        for reason, n in t.get("dropped", {}).items():
            skipped[f"pairs of {name}: {reason}"] += n
    return RoleOutput(
        frame=roles_frame(rows),
        stats=stats_frame(metrics, layers) if metrics else pd.DataFrame(),
        skipped=skipped,
        n_items=report.n_used,
        extra={"notes": notes, "tasks": tasks},
    )


def work(cfg, spec, n_items: int | None = None) -> int:
    """The group's work in forwards of one prompt (the time estimate's unit): per scored prompt, its
    forward and its mean prompt's, and where the model's shape ``spec`` is known the patched re-runs:
    ``2 × heads`` replicas of the last position from each layer on, ``layers × (layers + 1) / 2``
    layer-positions each, against a forward's ``layers ×`` :data:`LONGEST`, at :data:`REPLICA_COST`."""
    n = default_prompts(cfg) * len(TASKS) if n_items is None else n_items
    if spec is None:
        return n
    layers, heads = spec.n_layers, spec.n_heads
    return round(n * (2 + REPLICA_COST * 2 * heads * (layers + 1) / (2 * LONGEST)))


def plan(shape, cfg) -> list:
    """The memory plan's working sets of :func:`feed` (``shape`` a :class:`~headscope.probes.budget.Shape`):
    the prompts' forwards (a group of at most ``cfg.batch_size`` prompts of :data:`LONGEST` tokens: each
    layer's residual, keys, values and ``z`` the hooks read, and the keys and values of the mean
    prompts' run kept while the shuffled ones run) and the patched re-runs (their rows, replicas ×
    prompts up to :data:`MAX_ROWS`: the logits and their softmax, the shuffled run's keys and values kept)."""
    from headscope.probes.budget import WorkingSet

    b = min(cfg.batch_size, default_prompts(cfg) * len(TASKS))
    kv = shape.n_layers * LONGEST * 2 * shape.n_kv_heads * shape.d_head * shape.bytes_per  # a prompt's keys, values
    hooked = shape.n_layers * LONGEST * (shape.d_model + shape.n_heads * shape.d_head) * shape.bytes_per + kv
    replicas = 2 * shape.n_heads  # the mean's and the control's patch of every head
    calls = -(-replicas // max(1, MAX_ROWS // b))
    rows = -(-replicas // calls) * b
    return [
        # at the batch asked (a group holds at most that many prompts): roles fit one batch to all corpora
        WorkingSet(
            name=ROLE,
            batch_size=cfg.batch_size,
            longest=LONGEST,
            logits="last",
            statistics=True,
            cache_per_row=hooked + kv,
        ),
        WorkingSet(
            name=f"{ROLE} patches", batch_size=rows, longest=1, loss=True, loss_copies=1, cache_per_row=kv, cache_rows=b
        ),
    ]


def _reducer(ctx: RoleContext) -> FunctionVectorReducer:
    return FunctionVectorReducer(ctx.items)


def _generated(cfg) -> tuple[int, int]:
    """``(longest tokens, items)``: the scored prompts of every task (each also runs a mean prompt and a
    last position per head and layer: :func:`work` counts what they cost)."""
    return LONGEST, default_prompts(cfg) * len(TASKS)


ROLE_DEF = Role(
    name=ROLE,
    corpus="generated",
    score_kind=SCORE_KIND,
    reducer=_reducer,
    finish=finish,
    items=probe_items,
    feed=feed,
    needs_logits=True,
    plan=plan,
    options=("tasks", "template", "n_demos", "n_prompts", "layers", "items"),
    shards=True,
    generated=_generated,
    work=work,
    description=(
        "function-vector heads (Todd et al. 2024): the head's mean output at the last position of clean "
        "in-context prompts of a task (antonyms, capitals, capitalisation, next letter, English-French, "
        "present-past; 10 demonstrations; 5 prompts per task, --fv-prompts N) patched into held-out prompts whose "
        "labels are shuffled: the answer's "
        "probability, against the same patch with its mean output over the other shuffled prompts (no task); "
        "margin = indirect effect beyond that control. Statistics: Todd et al.'s causal indirect effect, over all "
        "and per task. Options: tasks, template, n_demos, n_prompts, layers, items."
    ),
)
