"""SmolLM2-135M's function-vector heads and what their function vector does to zero-shot prompts,
regenerated from code (``make function-vectors``).

``python -m headscope.reports.tools.experiments.function_vectors`` loads ``smollm2-135m`` (in-house)
and runs the ``function-vector`` role (:mod:`headscope.analyses.roles.function_vector`) on the
project's six tasks (``--n-prompts`` mean and scored prompts per task, 10 demonstrations, seed 0).
The **function vector** of a task is Todd et al.'s: the sum, over the ``--top-k`` heads of largest
causal indirect effect averaged over tasks, of each head's mean output at the last position of the
task's mean prompts, written through its ``W_O`` into the residual. It is added to the residual
stream entering one layer, at the last position of **zero-shot** prompts ``"Q: x\\nA:"``; accuracy is
the answer's first token coming first. The layer is chosen among :data:`LAYERS` on the zero-shot
prompts of the pairs the mean prompts were drawn from (validation), and every accuracy reported is
on the other half of the pairs (held out: never in a prompt the vector was built from). Beside it:
the same sum over ``--top-k`` random heads (seeded), and the role's shuffled-label accuracy.

Writes ``data/figures/function_vectors_smollm2.json``; :func:`markdown_table` of it is quoted in
``docs/guide/roles.md`` (``tests/analyses/roles/test_function_vector_figures.py`` checks it).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch

log = logging.getLogger(__name__)

FIGURES = Path(__file__).resolve().parents[3] / "data" / "figures"
OUT = FIGURES / "function_vectors_smollm2.json"
MODEL = "smollm2-135m"
#: layers the function vector may be added at (SmolLM2 has 30; Todd et al. use about a third of the depth)
LAYERS = (4, 6, 8, 10, 12, 15)


def _heads(frame, k):
    return [(int(l), int(h)) for l, h in frame[["layer", "head"]].head(k).values.tolist()]


def function_vector(model, prompts, heads) -> torch.Tensor:
    """``[d_model]``: the sum over ``heads`` of each head's mean ``z`` at the last position of
    ``prompts`` (token-id lists) written through its ``W_O``."""
    from headscope.analyses.roles.function_vector import task_means
    from headscope.probes.models.inhouse.layer_ops import head_write

    total, z, _ = task_means(model, prompts, 8)
    mean = total / z.shape[0]  # [layer, head, d_head]
    fv = torch.zeros(model.spec.d_model)
    for l, h in heads:
        zh = torch.zeros(1, model.spec.n_heads, 1, model.spec.d_head)
        zh[0, h, 0] = mean[l, h]
        with torch.no_grad():
            fv += head_write(model.network, l, zh.to(model.device))[0, 0].float().cpu()
    return fv


def zero_shot_accuracy(model, queries, answers, fv=None, layer=None) -> float:
    """The share of zero-shot prompts ``"Q: x\\nA:"`` whose next token is the answer's first token,
    with ``fv`` added to the residual entering ``layer`` at the last position (None: nothing added)."""
    from headscope.analyses.roles.function_vector import _batch
    from headscope.analyses.roles.icl_tasks import TEMPLATE, prompt_ids
    from headscope.probes.tokens import pad_id

    prompts = [prompt_ids(model.tokenizer, TEMPLATE[1].format(x=x)) for x in queries]
    ids, mask = _batch(prompts, pad_id(model.tokenizer))
    last = mask.sum(1) - 1
    rows = torch.arange(len(prompts))

    def add(t, name):
        t = t.clone()
        t[rows, last] += fv.to(t.dtype).to(t.device)
        return t

    fns = {} if fv is None else {f"blocks.{layer}.hook_resid_pre": add}
    with torch.inference_mode(), model.point_hooks(fns):
        logits = model.network(ids.to(model.device), mask.to(model.device))
    pred = logits[rows, last].argmax(-1).cpu()
    return float((pred == torch.tensor(answers)).float().mean())


def halves(model, tasks, seed: int):
    """Per task, ``(inputs, answer ids)`` of the mean prompts' half and of the held-out half, as the role splits them."""
    from headscope.analyses.roles.function_vector import split_halves
    from headscope.analyses.roles.icl_tasks import task_pairs

    out = {}
    for name, pairs in tasks.items():
        a, b = split_halves(task_pairs(model.tokenizer, name, pairs), seed)
        out[name] = tuple(([x for (x, _), _ in h], [i for _, i in h]) for h in (a, b))
    return out


def measure(n_prompts: int, top_k: int, seed: int = 0) -> dict:
    from headscope.analyses.roles.config import RolesConfig
    from headscope.analyses.roles.function_vector import ROLE, THRESHOLD
    from headscope.analyses.roles.icl_tasks import TASKS
    from headscope.analyses.roles.pipeline import run_role
    from headscope.probes.models.loading import load_model

    model = load_model(MODEL, "inhouse")
    cfg = RolesConfig(seed=seed, batch_size=8)
    default = default_run(model, seed)
    t0 = time.process_time()
    out = run_role(ROLE, model, None, cfg, n_prompts=n_prompts)
    cpu = time.process_time() - t0
    log.info("function-vector role: %.0f s of CPU", cpu)
    stats = out.stats
    cie = stats[stats.metric == f"{ROLE}:cie"].sort_values("value", ascending=False)
    top = _heads(cie, top_k)
    gen = torch.Generator().manual_seed(seed)
    every = [(l, h) for l in range(model.spec.n_layers) for h in range(model.spec.n_heads)]
    rand = [every[i] for i in torch.randperm(len(every), generator=gen)[:top_k].tolist()]
    frame = out.frame.sort_values("margin", ascending=False)
    items_by_task: dict[str, list] = {}
    for it in _items(model, cfg, n_prompts):
        items_by_task.setdefault(it.task, []).append(list(it.mean_ids))
    split = halves(model, TASKS, seed)
    tasks = {}
    for name, info in out.extra["tasks"].items():
        ((qa, aa), (qb, ab)), prompts = split[name], items_by_task[name]
        fv, fv_rand = function_vector(model, prompts, top), function_vector(model, prompts, rand)
        valid = {l: zero_shot_accuracy(model, qa, aa, fv, l) for l in LAYERS}
        layer = max(LAYERS, key=lambda l: (valid[l], -l))
        task_cie = stats[stats.metric == f"{ROLE}:cie:{name}"].sort_values("value", ascending=False)
        tasks[name] = {
            "pairs": info["kept"],
            "dropped": info["dropped"],
            "multi_token_answers": info["multi_token"],
            "held_out": len(qb),
            "icl_accuracy": info["icl_accuracy"],
            "shuffled_accuracy": info["shuffled_accuracy"],
            "zero_shot": zero_shot_accuracy(model, qb, ab),
            "layer": layer,
            "validation": {str(l): v for l, v in valid.items()},
            "with_fv": zero_shot_accuracy(model, qb, ab, fv, layer),
            "with_random_heads": zero_shot_accuracy(model, qb, ab, fv_rand, layer),
            "fv_norm": float(fv.norm()),
            "top_heads": [f"L{l}H{h}" for l, h in _heads(task_cie, 3)],
        }
        tasks[name]["gain"] = tasks[name]["with_fv"] - tasks[name]["zero_shot"]
        log.info("%s: %s", name, tasks[name])
    return {
        "model": MODEL,
        "settings": {
            "n_prompts": n_prompts,
            "n_demos": 10,
            "top_k": top_k,
            "seed": seed,
            "layers": list(LAYERS),
            "threshold": THRESHOLD,
        },
        "top_heads": [{"head": f"L{l}H{h}", "cie": float(v)} for (l, h), v in zip(top, cie.value.head(top_k).tolist())],
        "random_heads": [f"L{l}H{h}" for l, h in rand],
        "role": {
            "verdicts": int(out.frame.verdict.sum()),
            "best": {
                "head": f"L{int(frame.iloc[0].layer)}H{int(frame.iloc[0]['head'])}",
                "score": float(frame.iloc[0].score),
                "baseline": float(frame.iloc[0].baseline),
                "margin": float(frame.iloc[0].margin),
                "p_value": float(frame.iloc[0].p_value),
            },
            "n_items": out.n_items,
            "cpu_seconds": cpu,
        },
        "default_run": default,
        "tasks": tasks,
        "best_gain": max(t["gain"] for t in tasks.values()),
    }


def _best(frame) -> dict:
    top = frame.sort_values("margin", ascending=False).iloc[0]
    return {
        "head": f"L{int(top.layer)}H{int(top['head'])}",
        **{k: float(top[k]) for k in ("score", "baseline", "margin", "p_value")},
    }


def default_run(model, seed: int) -> dict:
    """The role as ``headscope roles`` runs it by default (``RolesConfig()``: ``fv_prompts`` prompts per
    task, batches of 32): its CPU seconds (one thread where ``make function-vectors`` runs it), the heads
    with a verdict and the best head."""
    from headscope.analyses.roles.config import RolesConfig
    from headscope.analyses.roles.function_vector import ROLE, default_prompts
    from headscope.analyses.roles.pipeline import run_role

    cfg = RolesConfig(seed=seed)
    t0 = time.process_time()
    out = run_role(ROLE, model, None, cfg)
    cpu = time.process_time() - t0
    log.info("function-vector role, default settings: %.0f s of CPU", cpu)
    f = out.frame
    return {
        "n_prompts": default_prompts(cfg),
        "n_items": out.n_items,
        "cpu_seconds": cpu,
        "verdicts": [f"L{int(r.layer)}H{int(r['head'])}" for _, r in f[f.verdict].iterrows()],
        "best": _best(f),
    }


def default_line(data: dict) -> str:
    """The docs' sentence on the default run (its cost and what it finds)."""
    d, study = data["default_run"], data["role"]
    b = d["best"]
    heads = ", ".join(d["verdicts"]) or "no head"
    return (
        f"By default ({d['n_prompts']} prompts per task, {d['n_items']} items) the role took {d['cpu_seconds']:.0f} s "
        f"of one core on SmolLM2 ({study['cpu_seconds']:.0f} s at the study's {data['settings']['n_prompts']} "
        f"prompts) and gives the verdict to {heads}; the best is {b['head']} (margin {b['margin']:.3f}, adjusted p "
        f"{b['p_value']:.4f})"
    )


def _items(model, cfg, n_prompts):
    from headscope.analyses.roles.base import RoleContext
    from headscope.analyses.roles.function_vector import probe_items

    return probe_items(RoleContext(model, cfg, options={"n_prompts": n_prompts}))


def _pct(v: float) -> str:
    return f"{100 * v:.0f}%"


def markdown_table(data: dict) -> str:
    """The docs' table of the figures (``docs/guide/roles.md`` quotes it verbatim)."""
    lines = [
        "| task | pairs (held out) | in context | shuffled labels | zero-shot | + function vector (layer) "
        "| + random heads | top heads (CIE) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, t in data["tasks"].items():
        lines.append(
            f"| {name} | {t['pairs']} ({t['held_out']}) | {_pct(t['icl_accuracy'])} | {_pct(t['shuffled_accuracy'])} "
            f"| {_pct(t['zero_shot'])} | {_pct(t['with_fv'])} (L{t['layer']}) | {_pct(t['with_random_heads'])} "
            f"| {', '.join(t['top_heads'])} |"
        )
    return "\n".join(lines)


def headline(data: dict) -> str:
    """The docs' one-sentence finding: the largest gain, and whether it reaches the issue's 20 points."""
    name, t = max(data["tasks"].items(), key=lambda kv: kv[1]["gain"])
    move = f"{_pct(t['zero_shot'])} to {_pct(t['with_fv'])} on {name}"
    n = sum(x["gain"] >= 0.2 for x in data["tasks"].values())
    if n:
        return (
            f"the function vector raises held-out zero-shot accuracy by at least 20 points on {n} of "
            f"{len(data['tasks'])} tasks; the largest gain is {100 * t['gain']:.0f} points ({move})"
        )
    return (
        f"no task gains 20 points: the largest gain of held-out zero-shot accuracy is "
        f"{100 * t['gain']:.0f} points ({move})"
    )


def role_line(data: dict) -> str:
    """The docs' sentence on the role's verdicts over SmolLM2's heads."""
    r, top = data["role"], data["top_heads"]
    b = r["best"]
    return (
        f"{r['verdicts']} head{'' if r['verdicts'] == 1 else 's'} of SmolLM2 {'gets' if r['verdicts'] == 1 else 'get'} "
        f"the verdict; the best is {b['head']}: the answer's probability "
        f"{b['score']:.3f} with its mean output against {b['baseline']:.3f} with the control's (margin "
        f"{b['margin']:.3f}, adjusted p {b['p_value']:.4f}; its indirect effect {top[0]['cie']:.3f}, the next head's "
        f"{top[1]['cie']:.3f})"
    )


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n-prompts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=10)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    data = measure(args.n_prompts, args.top_k)
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    log.info(
        "wrote %s\n%s\n%s\n%s\n%s", args.out, markdown_table(data), headline(data), role_line(data), default_line(data)
    )


if __name__ == "__main__":
    main()
