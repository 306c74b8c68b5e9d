"""How often headscope's verdicts are right, on compiled transformers whose truth is known (issue #44).

For each compiled program (:mod:`headscope.probes.models.compiled`, distractors included) this
runs headscope's own analyses, unchanged and untuned:

* **roles**: :func:`~headscope.analyses.roles.pipeline.head_roles` with the ``positional``,
  ``special`` and ``induction`` groups, on texts drawn from the program's input space
  (:func:`role_texts`; induction's repeated random tokens sized to fit ``max_seq_len``);
* **causal methods**: activation patching (denoising and noising), attribution patching and
  zero/mean/resample ablation on the :func:`patch_task`: clean inputs drawn from the program's
  input space, corrupted ones resampled from it (the same length) until the output at the last
  position differs; the metric is the log-probability of the clean run's output at the last
  position (``logprob``; categorical outputs), or the output's value (``logit_diff`` against an
  unembedding row that is zero; numerical outputs, where the input of the pair with the higher
  value is the clean one).

The per-head table (:data:`HEAD_COLUMNS`) joins the truth (role, used) with the verdicts and the
effects; :func:`role_scores` pools precision and recall per verdict role, :func:`auroc_scores`
ranks the heads of each program with >= 2 used heads by ``|effect|`` for used vs not used
(the distractors; empty slots left out).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd
import torch

from headscope.analyses.patching import PatchConfig, ablation_patching, activation_patching, attribution_patching
from headscope.analyses.patching.items import PairItem, Task
from headscope.analyses.roles import RolesConfig, head_roles
from headscope.probes.models.compiled.relations import VERDICT_ROLES

log = logging.getLogger(__name__)

#: the role groups run on every compiled model
ROLE_GROUPS = ("positional", "special", "induction")
#: the causal methods, by the ``method`` column values they write
METHODS = {
    "activation": ("activation_denoising", "activation_noising"),
    "attribution": ("attribution_denoising",),
    "ablation": ("ablation_zero", "ablation_mean", "ablation_resample"),
}
#: verdict row -> the truth role it claims (from :data:`VERDICT_ROLES`)
CLAIMS = {v: role for role, rows in VERDICT_ROLES.items() for v in rows}
#: an |effect| (share of the clean - corrupted gap) below which a head counts as not moving the output
SMALL_EFFECT = 0.05
#: the per-head table's columns (plus one ``effect:<method>`` column per method run)
HEAD_COLUMNS = ["program", "layer", "head", "kind", "node", "relation", "role", "used", "verdicts", "why"]


@dataclass(frozen=True, kw_only=True)
class ValidateConfig:
    """Options of a validation run: ``n_texts`` role texts and ``n_items`` patching pairs per
    model, ``seed``, the statistics' ``n_boot``/``n_perm`` (roles and patching), ``methods``
    (keys of :data:`METHODS`)."""

    n_texts: int = 48
    n_items: int = 32
    seed: int = 0
    n_boot: int = 200
    n_perm: int = 1000
    methods: tuple[str, ...] = ("activation", "attribution", "ablation")

    def __post_init__(self):
        if self.n_texts < 2 or self.n_items < 2:
            raise ValueError(f"n_texts and n_items must be >= 2; got {self.n_texts}, {self.n_items}")
        bad = [m for m in self.methods if m not in METHODS]
        if bad or not self.methods:
            raise ValueError(f"methods must be a non-empty subset of {tuple(METHODS)}; got {self.methods}")


def role_texts(cm, n: int, seed: int) -> list[str]:
    """``n`` inputs of the program's input space, lengths 2..max_seq_len, as whitespace-joined text."""
    rng = random.Random(seed)
    s = cm.setting
    return [" ".join(str(t) for t in s.sample(rng, rng.randint(2, s.max_seq_len))) for _ in range(n)]


def _output(cm, ids: list[int]) -> float | int:
    """The model's output at the last position of ``ids``: the argmax row (categorical) or the value."""
    with torch.inference_mode():
        logits = cm.model.forward(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))[0, -1]
    if cm.output_values is None:
        return float(logits[0])
    return int(logits[: len(cm.output_values)].argmax())


def patch_task(cm, n_items: int, seed: int) -> Task:
    """The patching task of a compiled model (module docstring); pairs that no resampling
    separates within 50 draws are left out (``Task.unusable``)."""
    rng = random.Random(seed)
    s = cm.setting
    numerical = cm.output_values is None
    zero_row = len(cm.output_values or [0])  # an unembedding row past the output space: always 0
    items, unusable = [], []
    lo = max(2, (s.max_seq_len + 1) // 2)
    for i in range(n_items):
        length = rng.randint(lo, s.max_seq_len)
        a = cm.encode(s.sample(rng, length))
        out_a = _output(cm, a)
        for _ in range(50):
            b = cm.encode(s.sample(rng, length))
            out_b = _output(cm, b)
            if (abs(out_a - out_b) > 1e-4) if numerical else out_a != out_b:
                break
        else:
            unusable.append({"item": i, "line": None, "kind": "no_partner", "reason": "no input with another output"})
            continue
        if numerical:
            clean, corrupted = (a, b) if out_a > out_b else (b, a)
            items.append(PairItem(tuple(clean), tuple(corrupted), 0, zero_row))
        else:
            items.append(PairItem(tuple(a), tuple(b), out_a))
    metric = "logit_diff" if numerical else "logprob"
    return Task(name=s.label, items=items, metric=metric, unusable=unusable, source="tracr")


def _verdicts(frame: pd.DataFrame) -> dict[tuple[int, int], list[str]]:
    """``{(layer, head): verdict rows that claim a truth role}`` of a roles frame."""
    out: dict[tuple[int, int], list[str]] = {}
    hits = frame[frame["verdict"].astype(bool) & frame["role"].isin(list(CLAIMS))]
    for r in hits.itertuples():
        out.setdefault((int(r.layer), int(r.head)), []).append(str(r.role))
    return out


def _effects(cm, task: Task, cfg: ValidateConfig) -> pd.DataFrame:
    """The patching frames of every method in ``cfg.methods`` concatenated (:data:`PATCH_COLUMNS`);
    empty where the task has fewer than 2 items (a program whose output at the last position
    no same-length input changes, e.g. ``length``)."""
    if len(task.items) < 2:
        return pd.DataFrame(columns=["layer", "head", "method", "effect"])
    pcfg = PatchConfig(n_boot=cfg.n_boot, n_perm=cfg.n_perm, seed=cfg.seed, batch_size=32)
    runs = {
        "activation": lambda: activation_patching(cm.model, task, pcfg),
        "attribution": lambda: attribution_patching(
            cm.model, task, PatchConfig(directions=("denoising",), n_boot=cfg.n_boot, n_perm=cfg.n_perm, seed=cfg.seed)
        ),
        "ablation": lambda: ablation_patching(cm.model, task, pcfg),
    }
    return pd.concat([runs[m]()[0] for m in cfg.methods], ignore_index=True)


def _why(row) -> str:
    """Why a head's verdicts and truth disagree, in a phrase ("" where they agree)."""
    claimed = {CLAIMS[v] for v in row["verdicts"].split(",") if v}
    if row["role"] in VERDICT_ROLES and VERDICT_ROLES[row["role"]] and row["role"] not in claimed:
        return (
            f"missed: compiled {row['relation']} ({row['role']}) got no {'/'.join(VERDICT_ROLES[row['role']])} verdict"
        )
    wrong = sorted(claimed - {row["role"]})
    if wrong:
        return f"false: verdict {', '.join(wrong)} on a {row['role']} head ({row['kind']})"
    effect = row.get("effect:activation_denoising", float("nan"))
    if row["used"] and effect < SMALL_EFFECT:
        return f"used, yet activation patching moves the output by {effect:.2f} of the gap"
    if not row["used"] and effect >= SMALL_EFFECT:
        return f"not used, yet activation patching moves the output by {effect:.2f} of the gap"
    return ""


def validate_model(cm, cfg: ValidateConfig = ValidateConfig()) -> tuple[pd.DataFrame, dict]:
    """One compiled model -> (the per-head table, :data:`HEAD_COLUMNS` plus ``effect:<method>``
    columns of ``|effect|``; facts of the run: items, unusable pairs, the clean-corrupted gap)."""
    s = cm.setting
    rcfg = RolesConfig(
        seed=cfg.seed,
        n_boot=cfg.n_boot,
        n_perm=cfg.n_perm,
        induction_seq_len=max(1, s.max_seq_len // 2),
        induction_n_sequences=32,
        batch_size=32,
    )
    roles = head_roles(
        cm.model, text=role_texts(cm, cfg.n_texts, cfg.seed), roles=list(ROLE_GROUPS), cfg=rcfg, examples=False
    )
    verdicts = _verdicts(roles.frame)
    task = patch_task(cm, cfg.n_items, cfg.seed + 1)
    effects = _effects(cm, task, cfg)
    table = cm.truth.copy()
    table.insert(0, "program", s.label)
    table["verdicts"] = [",".join(sorted(verdicts.get((int(r.layer), int(r.head)), []))) for r in table.itertuples()]
    for method in effects["method"].unique():
        e = effects[effects["method"] == method].set_index(["layer", "head"])["effect"].abs()
        table[f"effect:{method}"] = [
            float(e.get((int(r.layer), int(r.head)), float("nan"))) for r in table.itertuples()
        ]
    table["why"] = table.apply(_why, axis=1)
    facts = {"program": s.label, "n_items": len(task.items), "n_unusable": task.n_unusable, "metric": task.metric}
    return table[[c for c in table.columns if c in HEAD_COLUMNS or c.startswith("effect:")]], facts


def role_scores(table: pd.DataFrame) -> pd.DataFrame:
    """Pooled precision and recall of each verdict row in :data:`CLAIMS`: columns ``verdict``,
    ``role`` (the truth role it claims), ``tp``, ``fp``, ``fn``, ``precision``, ``recall`` (NaN
    where undefined: nothing claimed, or no head holds the role)."""
    rows = []
    for verdict, role in CLAIMS.items():
        said = table["verdicts"].str.split(",").apply(lambda vs, v=verdict: v in vs)
        true = table["role"] == role
        tp, fp, fn = int((said & true).sum()), int((said & ~true).sum()), int((~said & true).sum())
        rows.append(
            {
                "verdict": verdict,
                "role": role,
                "tp": tp,
                "fp": fp,
                "fn": fn,
                "precision": tp / (tp + fp) if tp + fp else float("nan"),
                "recall": tp / (tp + fn) if tp + fn else float("nan"),
            }
        )
    return pd.DataFrame(rows)


def auroc(scores: list[float], labels: list[bool]) -> float:
    """Area under the ROC curve of ``scores`` for ``labels`` (ties count one half); NaN without
    both classes.

    >>> auroc([0.9, 0.8, 0.1, 0.1], [True, True, False, False]), auroc([0.5, 0.5], [True, False])
    (1.0, 0.5)
    """
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    if not pos or not neg:
        return float("nan")
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def auroc_scores(table: pd.DataFrame) -> pd.DataFrame:
    """Per program with >= 2 used heads and per method: ``program``, ``method``, ``auroc``,
    ``n_used``, ``n_unused`` (``|effect|`` ranks used heads against the not-used ones that have
    weights, the distractors; tracr's empty slots, all zeros, have no effect for any method to
    find and would only raise the figure, so they are left out)."""
    rows = []
    methods = [c.removeprefix("effect:") for c in table.columns if c.startswith("effect:")]
    for program, t in table[table["kind"] != "empty"].groupby("program", sort=False):
        used = t["used"].astype(bool).tolist()
        if sum(used) < 2:
            continue
        for m in methods:
            rows.append(
                {
                    "program": program,
                    "method": m,
                    "auroc": auroc(t[f"effect:{m}"].fillna(0.0).tolist(), used),
                    "n_used": sum(used),
                    "n_unused": len(used) - sum(used),
                }
            )
    return pd.DataFrame(rows, columns=["program", "method", "auroc", "n_used", "n_unused"])


def validate(models, cfg: ValidateConfig = ValidateConfig(), progress: Callable[[str], None] | None = None):
    """Every compiled model of the iterable ``models`` -> ``(heads table, facts per model)``."""
    tables, facts = [], []
    for cm in models:
        if progress is not None:
            progress(cm.setting.label)
        t, f = validate_model(cm, cfg)
        tables.append(t)
        facts.append(f)
    return pd.concat(tables, ignore_index=True), facts
