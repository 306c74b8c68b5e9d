"""Train small or prune big? Heads kept from the start vs heads pruned after training.

On :class:`~headscope.probes.corpora.synthetic_task.SyntheticTask` (induction + agreement with the
first token), a tiny in-house decoder (``n_layers`` layers, ``n_heads`` heads of
``d_head`` dims) is trained per seed in four conditions, for each ``k`` in ``keep``:

=============  ==========================================================================
``full``       ``n_heads`` heads per layer, trained ``steps`` steps (the reference)
``scratch``    ``k`` heads per layer (same ``d_head``), trained ``steps + finetune_steps``
               steps (as many optimiser steps as ``pruned_ft`` got in all)
``pruned``     the ``full`` model physically pruned to its ``k`` most important heads per
               layer (:func:`~headscope.probes.models.inhouse.physical.prune_heads`), no further training
``pruned_ft``  ``pruned``, then fine-tuned ``finetune_steps`` steps
=============  ==========================================================================

Importance (on a held-out batch): ``"ablation"`` — loss increase when the head alone is
zero-ablated; ``"gradient"`` — Michel et al.'s ``|∂loss/∂gate|``. All randomness comes
from ``torch.Generator`` objects seeded by the run's seed: the same config gives the same
frame.

>>> cfg = TrainTimeConfig(quick=True)
>>> cfg.resolved().steps, cfg.resolved().keep, cfg.resolved().seeds
(100, (1,), (0,))
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace

import pandas as pd
import torch
import torch.nn.functional as F

from headscope.probes.corpora.synthetic_task import AGREEMENT, INDUCTION, SyntheticTask, TaskBatch
from headscope.probes.models.backends.inhouse import InHouseModel
from headscope.probes.models.config import ModelConfig
from headscope.probes.models.inhouse.physical import prune_heads
from headscope.probes.models.inhouse.transformer import Transformer

log = logging.getLogger(__name__)

TRAIN_TIME_COLUMNS = ["condition", "k", "seed", "metric", "value", "n", "train_steps"]
CONDITIONS = ("full", "scratch", "pruned", "pruned_ft")
METRICS = ("accuracy", "loss", "induction_accuracy", "agreement_accuracy")
IMPORTANCE = ("ablation", "gradient")


@dataclass(frozen=True, kw_only=True)
class TrainTimeConfig:
    """Settings of :func:`train_time_experiment`. ``quick=True`` shrinks the run for tests
    (first seed only, ``keep=(1,)``, 100 + 30 steps); :meth:`resolved` gives the effective
    config. ``num_threads``: ``None`` leaves torch's thread count as it is; an int sets it
    for the run and restores it afterwards (one thread is fastest for these tiny matrices
    on a busy machine)."""

    seeds: tuple[int, ...] = (0, 1, 2)
    n_heads: int = 8
    keep: tuple[int, ...] = (1, 2)
    n_layers: int = 2
    d_model: int = 64
    d_head: int = 8
    steps: int = 300
    finetune_steps: int = 100
    batch_size: int = 64
    seq_len: int = 24
    lr: float = 3e-3
    weight_decay: float = 0.01
    warmup: int = 30
    importance: str = "ablation"
    n_eval: int = 512
    n_heldout: int = 256
    num_threads: int | None = None
    quick: bool = False

    def __post_init__(self):
        for k in ("n_heads", "n_layers", "d_model", "d_head", "steps", "batch_size", "seq_len", "n_eval", "n_heldout"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"The {k!r} parameter of TrainTimeConfig must be a positive int; got {v!r}.")
        for k in ("finetune_steps", "warmup"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"The {k!r} parameter of TrainTimeConfig must be an int >= 0; got {v!r}.")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds must be distinct and non-empty; got {self.seeds!r}.")
        bad = [k for k in self.keep if not isinstance(k, int) or not 1 <= k < self.n_heads]
        if not self.keep or bad:
            raise ValueError(f"keep must list head counts in 1..{self.n_heads - 1}; got {self.keep!r}.")
        if self.importance not in IMPORTANCE:
            raise ValueError(f"importance must be one of {IMPORTANCE}; got {self.importance!r}.")
        if self.num_threads is not None and (
            isinstance(self.num_threads, bool) or not isinstance(self.num_threads, int) or self.num_threads < 1
        ):
            raise ValueError(f"num_threads must be None or a positive int; got {self.num_threads!r}.")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0; got {self.lr!r}.")

    def resolved(self) -> TrainTimeConfig:
        if not self.quick:
            return self
        return replace(
            self, seeds=self.seeds[:1], keep=(1,), steps=100, finetune_steps=30, n_eval=256, n_heldout=128, quick=False
        )


# --- model, loss, training ------------------------------------------------------------


def make_model(cfg: TrainTimeConfig, task: SyntheticTask, n_heads: int, seed: int) -> Transformer:
    """A fresh decoder with ``n_heads`` heads of ``cfg.d_head`` dims, weights drawn from ``seed``."""
    mcfg = ModelConfig(
        family="llama",
        n_layers=cfg.n_layers,
        d_model=cfg.d_model,
        n_heads=n_heads,
        d_head=cfg.d_head,
        d_mlp=2 * cfg.d_model,
        vocab_size=task.vocab_size,
        max_positions=task.seq_len,
        tie_embeddings=False,
        name=f"synthetic-h{n_heads}",
    )
    model = Transformer(mcfg)
    model.init_weights(seed=seed)
    return model


def task_loss(logits: torch.Tensor, batch: TaskBatch) -> torch.Tensor:
    """Mean cross-entropy over scored positions (``logits [batch, pos, vocab]``)."""
    return F.cross_entropy(logits.flatten(0, 1), batch.targets.flatten(), ignore_index=-100)


def evaluate(model: Transformer, batch: TaskBatch) -> dict[str, tuple[float, int]]:
    """``{metric: (value, n scored positions)}`` for :data:`METRICS`."""
    with torch.inference_mode():
        logits = model(batch.input_ids)
    scored = batch.targets != -100
    correct = logits.argmax(-1) == batch.targets
    out = {
        "accuracy": (float(correct[scored].float().mean()), int(scored.sum())),
        "loss": (float(task_loss(logits, batch)), int(scored.sum())),
    }
    for name, kind in (("induction_accuracy", INDUCTION), ("agreement_accuracy", AGREEMENT)):
        m = batch.kind == kind
        out[name] = (float(correct[m].float().mean()), int(m.sum()))
    return out


def train(
    model: Transformer, task: SyntheticTask, cfg: TrainTimeConfig, steps: int, gen: torch.Generator
) -> Transformer:
    """AdamW with linear warm-up then cosine decay; batches drawn from ``gen``. In place."""
    if steps == 0:
        return model
    params = [p for n, p in model.named_parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.98))
    warm = min(cfg.warmup, steps // 4)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: (s + 1) / warm if s < warm else 0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, steps - warm))),
    )
    model.train()
    for _ in range(steps):
        batch = task.sample(cfg.batch_size, gen)
        loss = task_loss(model(batch.input_ids), batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
    return model.eval()


# --- importance and pruning --------------------------------------------------------------


def head_importance(model: Transformer, batch: TaskBatch, method: str = "ablation") -> torch.Tensor:
    """``[layer, head]`` importance on ``batch``: the loss increase when the head alone is
    zero-ablated (``"ablation"``), or ``|∂loss/∂gate|`` (``"gradient"``, Michel et al. 2019).
    Gates are restored afterwards."""
    if method not in IMPORTANCE:
        raise ValueError(f"importance method must be one of {IMPORTANCE}; got {method!r}.")
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    scores = torch.zeros(n_layers, n_heads)
    gates = model.gates
    if method == "gradient":
        try:
            for g in gates:
                g.requires_grad_(True)
                g.grad = None
            task_loss(model(batch.input_ids), batch).backward()
            for layer, g in enumerate(gates):
                scores[layer] = g.grad.abs().detach()
        finally:
            for g in gates:
                g.grad = None
                g.requires_grad_(False)
        model.zero_grad(set_to_none=True)
        return scores
    with torch.inference_mode():
        base = float(task_loss(model(batch.input_ids), batch))
    for layer, g in enumerate(gates):
        for h in range(n_heads):
            try:
                with torch.no_grad():
                    g[h] = 0.0
                with torch.inference_mode():
                    scores[layer, h] = float(task_loss(model(batch.input_ids), batch)) - base
            finally:
                with torch.no_grad():
                    g[h] = 1.0
    return scores


def heads_to_drop(scores: torch.Tensor, k: int) -> dict[int, list[int]]:
    """Per layer, every head but the ``k`` most important (ties: the lower index is kept).

    >>> heads_to_drop(torch.tensor([[0.1, 0.9, 0.5], [0.2, 0.2, 0.0]]), 1)
    {0: [0, 2], 1: [1, 2]}
    """
    out = {}
    for layer, row in enumerate(scores):
        order = sorted(range(len(row)), key=lambda h: (-float(row[h]), h))
        out[layer] = sorted(order[k:])
    return out


# --- the experiment ------------------------------------------------------------------------


def _rows(condition, k, seed, metrics, steps):
    return [
        {"condition": condition, "k": k, "seed": seed, "metric": m, "value": v, "n": n, "train_steps": steps}
        for m, (v, n) in metrics.items()
    ]


def _seed_gen(*parts: int) -> torch.Generator:
    s = 0
    for p in parts:
        s = (s * 1_000_003 + int(p)) % (2**62)
    return torch.Generator().manual_seed(s)


def train_time_experiment(cfg: TrainTimeConfig = TrainTimeConfig()) -> pd.DataFrame:
    """Run the four conditions for every seed and ``k``; one row per (condition, k, seed, metric).

    Columns :data:`TRAIN_TIME_COLUMNS`: ``condition`` (:data:`CONDITIONS`), ``k`` (heads per
    layer), ``seed``, ``metric`` (:data:`METRICS`, on ``n_eval`` fresh sequences per seed),
    ``value``, ``n`` (scored positions), ``train_steps`` (total optimiser steps behind the
    model). ``df.attrs["finding"]`` holds :func:`finding`; ``df.attrs["config"]`` the
    effective config.
    """
    if not isinstance(cfg, TrainTimeConfig):
        raise TypeError(f"cfg must be a TrainTimeConfig; got {type(cfg).__name__}.")
    run = cfg.resolved()
    threads = torch.get_num_threads()
    try:
        if run.num_threads is not None:
            torch.set_num_threads(run.num_threads)
        rows = _run(run)
    finally:
        torch.set_num_threads(threads)
    df = pd.DataFrame(rows, columns=TRAIN_TIME_COLUMNS)
    df["condition"] = pd.Categorical(df["condition"], categories=list(CONDITIONS))
    df["metric"] = pd.Categorical(df["metric"], categories=list(METRICS))
    df.attrs["config"] = {k: getattr(run, k) for k in run.__dataclass_fields__}
    df.attrs["finding"] = finding(df)
    return df


def _run(run: TrainTimeConfig) -> list[dict]:
    task = SyntheticTask(seq_len=run.seq_len)
    rows = []
    for seed in run.seeds:
        eval_batch = task.sample(run.n_eval, _seed_gen(seed, 1))
        heldout = task.sample(run.n_heldout, _seed_gen(seed, 2))
        full = train(make_model(run, task, run.n_heads, seed), task, run, run.steps, _seed_gen(seed, 3))
        rows += _rows("full", run.n_heads, seed, evaluate(full, eval_batch), run.steps)
        scores = head_importance(full, heldout, run.importance)
        for k in run.keep:
            n_scratch = run.steps + run.finetune_steps
            small = train(make_model(run, task, k, seed), task, run, n_scratch, _seed_gen(seed, 4, k))
            rows += _rows("scratch", k, seed, evaluate(small, eval_batch), n_scratch)
            pruned = prune_heads(InHouseModel(full), heads_to_drop(scores, k)).network
            rows += _rows("pruned", k, seed, evaluate(pruned, eval_batch), run.steps)
            if run.finetune_steps:
                train(pruned, task, run, run.finetune_steps, _seed_gen(seed, 5, k))
                rows += _rows("pruned_ft", k, seed, evaluate(pruned, eval_batch), run.steps + run.finetune_steps)
            log.info("seed %d k=%d done", seed, k)
    return rows


def condition_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Mean and spread over seeds: columns ``condition, k, metric, mean, std, min, max, n_seeds``."""
    g = df.groupby(["condition", "k", "metric"], observed=True)["value"]
    out = g.agg(mean="mean", std="std", min="min", max="max", n_seeds="count").reset_index()
    out["std"] = out["std"].fillna(0.0)
    return out


def finding(df: pd.DataFrame, metric: str = "accuracy") -> str:
    """One line stating, per ``k``, how training with ``k`` heads from the start compares to
    pruning the full model to ``k`` heads (with and without fine-tuning), whichever way it goes."""
    s = condition_summary(df)
    s = s[s["metric"] == metric].set_index(["condition", "k"])
    wide = df[df["metric"] == metric].pivot_table(
        index="seed", columns=["condition", "k"], values="value", observed=True
    )

    def fmt(cond, k):
        r = s.loc[(cond, k)]
        return f"{r['mean']:.3f}±{r['std']:.3f}"

    full_k = int(df.loc[df["condition"] == "full", "k"].iloc[0])
    parts = [
        f"{metric} (mean±sd over {int(s.loc[('full', full_k), 'n_seeds'])} seeds): full H={full_k} {fmt('full', full_k)}"
    ]
    for k in sorted(df.loc[df["condition"] == "scratch", "k"].unique()):
        line = f"k={k}: scratch {fmt('scratch', k)}, pruned {fmt('pruned', k)}"
        if ("pruned_ft", k) in s.index:
            line += f", pruned+FT {fmt('pruned_ft', k)}"
            wins = int((wide[("pruned_ft", k)] > wide[("scratch", k)]).sum())
            diff = s.loc[("pruned_ft", k), "mean"] - s.loc[("scratch", k), "mean"]
            spread = s.loc[("pruned_ft", k), "std"] + s.loc[("scratch", k), "std"]
            verdict = "prune-then-finetune beats scratch" if diff > 0 else "scratch beats prune-then-finetune"
            if abs(diff) <= spread:
                verdict = "no clear difference between scratch and prune-then-finetune"
            line += f" ({verdict}: {diff:+.3f}, pruned+FT higher in {wins}/{len(wide)} seeds)"
        parts.append(line)
    return "; ".join(parts)
