"""The pruning paths: single-head ablation, a physically pruned forward, gate-gradient
importance and the report's quick pruning stage.

Every public function but :func:`stand_in_roles` is a bench path ``(bench: BenchState)
-> Prepared`` (registered in :data:`~headscope.analyses.bench.registry.PATHS`, which says
what each runs). The quick pruning paths build their study from
:data:`~headscope.reports.stages.quick.QUICK_PRUNING`, the settings the report's quick
stage uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
import torch

from headscope.analyses.bench.counts import linear_params, model_gflop
from headscope.analyses.bench.state import BenchState, Prepared
from headscope.probes.tokens import tokenize_one
from headscope.reports.stages.quick import QUICK_PRUNING

if TYPE_CHECKING:
    from headscope.probes.models.arch import ArchSpec

__all__ = [
    "ablation_batched",
    "ablation_hf",
    "ablation_hf_whole",
    "ablation_separate",
    "hook_gates",
    "inhouse_gates",
    "pruning_50",
    "quick_pruning",
    "stand_in_roles",
]

#: sentences of the ablation and gate paths' metric (the separate way costs layers x heads forwards)
METRIC_SENTENCES = 32


def _sentence_metric(model, sentences: list[str], batch_size: int):
    """``(name, metric)``: the default impact metric of the model's family over ``sentences``."""
    from headscope.analyses.pruning import metrics as im

    name = im.default_metric(model.spec)
    kw = {"batch_size": batch_size}
    if name == "lm_loss":
        return name, im.LMLoss(model, list(sentences), **kw)
    return name, im.EmbeddingCosine(model, list(sentences), **kw)


def _lengths(model, sentences: list[str]) -> list[int]:
    return [len(tokenize_one(model.tokenizer, text=t)["ids"]) for t in sentences]


def _ablation(bench: BenchState, batched: bool, kind: str = "inhouse", whole: bool = False) -> Prepared:
    from headscope.analyses.pruning import ablation as abl

    model = bench.model(kind)
    spec = model.spec
    by_layer = [
        abl.head_masks(n_layers=spec.n_layers, n_heads=spec.n_heads, heads=group)
        for group in abl._group_heads(spec, "layer")
    ]  # as single_head_ablation groups them; each [heads of the layer, layer, head]
    sents = bench.sentences[: min(len(bench.sentences), METRIC_SENTENCES)]
    metric_name, metric = _sentence_metric(model, sents, len(sents))

    if kind != "inhouse":  # the hf backend's own check, once, outside the timed passes
        model._resume_checked = None
        checked = model._check_resume()

    def as_run():  # the hf backend, resumed (where its check allows) or run whole
        if kind != "inhouse":
            model._resume_checked = (False, False) if whole else checked

    def one_pass():
        as_run()
        if batched:  # every head in one call: replicas, each from its own layer, the prefix run once
            abl.evaluate(model, metric, torch.cat(by_layer))
            return
        for masks in by_layer:  # a full forward per head
            for r in range(len(masks)):
                with abl.gates_as(model, masks[r]):
                    abl.evaluate(model, metric)

    def warm():
        as_run()
        abl.evaluate(model, metric, by_layer[-1][:2])

    n_heads = spec.n_layers * spec.n_heads
    gflop = n_heads * model_gflop(
        linear=bench.linear, n_layers=spec.n_layers, d_model=spec.d_model, lengths=_lengths(model, sents)
    )
    return Prepared(
        one_pass,
        warm,
        gflop,
        f"{n_heads} heads x the first {len(sents)} sentences ({metric_name}); gflop as separate forwards",
    )


def ablation_separate(bench: BenchState) -> Prepared:
    return _ablation(bench, False)


def ablation_batched(bench: BenchState) -> Prepared:
    return _ablation(bench, True)


def ablation_hf(bench: BenchState) -> Prepared:
    return _ablation(bench, True, "hf_eager")


def ablation_hf_whole(bench: BenchState) -> Prepared:
    return _ablation(bench, True, "hf_eager", whole=True)


def pruning_50(bench: BenchState) -> Prepared:
    from headscope.probes.models.inhouse import physical as phys

    model = bench.model("inhouse")
    heads = phys.half_of_heads(model, seed=bench.cfg.seed)
    pruned = phys.prune_heads(model, heads).to(bench.device).network.eval()
    ratio = phys.count_params(pruned) / phys.count_params(model.network)

    def step(ids, mask):
        with torch.inference_mode():
            pruned(ids, mask)

    width = sum(len(hs) * bench.spec.d_head for hs in phys.heads_held(pruned).values())
    gflop = model_gflop(linear=linear_params(pruned), n_layers=1, d_model=width, lengths=bench.lengths)
    return Prepared(
        *bench.over_batches(step), gflop, f"{sum(map(len, heads.values()))} heads pruned; params x{ratio:.3f}"
    )


def _gates(bench: BenchState, hook: bool) -> Prepared:
    from headscope.analyses.pruning import ablation as abl

    model = bench.model("inhouse")
    spec = model.spec
    sents = bench.sentences[: min(len(bench.sentences), METRIC_SENTENCES)]
    metric_name, metric = _sentence_metric(model, sents, bench.cfg.batch_size)
    mask = torch.ones(spec.n_layers, spec.n_heads)  # [layer, head]

    def one_pass():
        gates = (
            abl.head_gates(model, mask, requires_grad=True) if hook else abl.gates_as(model, mask, requires_grad=True)
        )
        with gates as g, torch.enable_grad():  # importance.gate_gradients, gates of either kind
            for u in metric.units:
                out = model.forward(u.batch.input_ids, u.batch.attention_mask)
                torch.autograd.grad(metric.loss(out, u), g, allow_unused=True)

    gflop = 2 * model_gflop(
        linear=bench.linear, n_layers=spec.n_layers, d_model=spec.d_model, lengths=_lengths(model, sents)
    )
    return Prepared(
        one_pass, one_pass, gflop, f"the first {len(sents)} sentences ({metric_name} loss); counted 2x forward"
    )


def hook_gates(bench: BenchState) -> Prepared:
    return _gates(bench, True)


def inhouse_gates(bench: BenchState) -> Prepared:
    return _gates(bench, False)


def stand_in_roles(spec: ArchSpec, *, n_roles: int = 9, k: int = 3, seed: int = 0) -> pd.DataFrame:
    """A seeded roles frame for the ``quick_pruning`` paths (``n_roles`` roles of ``k`` heads
    with a True verdict, as SmolLM2's report has 9): role ablation's cost without running
    roles. Columns ``layer``, ``head``, ``role``, ``score``, ``verdict``; ``spec`` needs
    ``n_layers`` and ``n_heads``.

    >>> from types import SimpleNamespace
    >>> df = stand_in_roles(SimpleNamespace(n_layers=2, n_heads=3), n_roles=2, k=2)
    >>> len(df), sorted(df["role"].unique()), bool(df["verdict"].all())
    (4, ['role0', 'role1'], True)
    """
    gen = torch.Generator().manual_seed(seed)
    n = spec.n_layers * spec.n_heads
    rows = []
    for r in range(n_roles):
        for rank, i in enumerate(torch.randperm(n, generator=gen)[: min(k, n)].tolist()):
            rows.append(
                {
                    "layer": i // spec.n_heads,
                    "head": i % spec.n_heads,
                    "role": f"role{r}",
                    "score": 1.0 - rank / 10,
                    "verdict": True,
                }
            )
    return pd.DataFrame(rows)


def quick_pruning(bench: BenchState) -> Prepared:
    from headscope.analyses.pruning import ablation as abl
    from headscope.analyses.pruning.metrics import build_metric, default_metric
    from headscope.analyses.pruning.study import PruneConfig, pruning_study

    model = bench.model("inhouse")
    pcfg = PruneConfig(**QUICK_PRUNING, seed=bench.cfg.seed, n_items=bench.cfg.prune_items)
    roles = stand_in_roles(model.spec, seed=bench.cfg.seed)

    def one_pass():
        pruning_study(model, pcfg, None, roles=roles)

    def warm():
        metric = build_metric(default_metric(model.spec), model, n_items=pcfg.items, batch_size=pcfg.batch_size)
        abl.evaluate(model, metric, torch.ones(2, model.spec.n_layers, model.spec.n_heads))

    return Prepared(one_pass, warm, None, f"{pcfg.items} items; roles: {roles['role'].nunique()} seeded stand-in roles")
