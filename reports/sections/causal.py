"""The "Causal evidence" section (patching): per role with a task, attention's top heads next
to the heads whose patched output restores most of the task's clean - corrupted gap, the
task, the agreement of attribution with activation patching and the effect per head.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from headscope.analyses.roles.base import per_relation_roles, task_notes
from headscope.reports import figures as F
from headscope.reports.document import Block, Figure, Note, Paragraph, Section, Table, counted, head_name, slug

#: attribution is called a trustworthy stand-in for activation patching at and above these
TRUST_SPEARMAN, TRUST_OVERLAP = 0.7, 0.6


def attention_top(roles: pd.DataFrame, role: str, relation: str = "", k: int = 10) -> pd.DataFrame:
    """A role's heads with a verdict (of ``relation`` when given), ranked by attention score
    (a head once, on its best row): ``layer, head, score``, at most ``k`` rows."""
    d = roles[(roles["role"].astype(str) == role) & roles["verdict"].astype(bool)]
    if relation:
        d = d[d["relation"].astype(str) == relation]
    d = d.sort_values(["score", "layer", "head"], ascending=[False, True, True]).drop_duplicates(["layer", "head"])
    return d[["layer", "head", "score"]].head(k).reset_index(drop=True)


def patching_top(patching: pd.DataFrame, task: str, method: str, k: int = 10) -> pd.DataFrame:
    """The ``k`` heads with the largest ``effect`` of ``method`` on ``task``: ``layer, head,
    effect, ci_low, ci_high, significant`` (ties: lower layer, head first)."""
    d = patching[(patching["task"].astype(str) == task) & (patching["method"].astype(str) == method)]
    if "position" in d:
        d = d[d["position"].isna()]
    d = d.dropna(subset=["effect"]).sort_values(["effect", "layer", "head"], ascending=[False, True, True])
    return d[["layer", "head", "effect", "ci_low", "ci_high", "significant"]].head(k).reset_index(drop=True)


def causal_comparison(att: pd.DataFrame, pat: pd.DataFrame) -> pd.DataFrame:
    """Attention's top heads next to patching's, rank by rank (a side shorter than the other
    is left blank), with ``in other`` marking a head both lists hold.

    >>> att = pd.DataFrame({"layer": [1], "head": [1], "score": [0.6]})
    >>> pat = pd.DataFrame({"layer": [1, 0], "head": [1, 0], "effect": [0.9, 0.1], "ci_low": [0.8, 0.0],
    ...     "ci_high": [1.0, 0.2], "significant": [True, False]})
    >>> causal_comparison(att, pat)[["rank", "by attention", "by patching", "in both"]].values.tolist()
    [[1, 'L1H1', 'L1H1', 'yes'], [2, '', 'L0H0', '']]
    """
    a = [head_name(l, h) for l, h in zip(att["layer"], att["head"])]
    p = [head_name(l, h) for l, h in zip(pat["layer"], pat["head"])]
    both = set(a) & set(p)
    rows = []
    for i in range(max(len(a), len(p))):
        ra = att.iloc[i] if i < len(a) else None
        rp = pat.iloc[i] if i < len(p) else None
        rows.append(
            {
                "rank": i + 1,
                "by attention": a[i] if ra is not None else "",
                "attention score": float(ra["score"]) if ra is not None else math.nan,
                "by patching": p[i] if rp is not None else "",
                "effect": float(rp["effect"]) if rp is not None else math.nan,
                "CI low": float(rp["ci_low"]) if rp is not None else math.nan,
                "CI high": float(rp["ci_high"]) if rp is not None else math.nan,
                "significant": bool(rp["significant"]) if rp is not None else "",
                "in both": "yes" if {a[i] if ra is not None else None, p[i] if rp is not None else None} & both else "",
            }
        )
    return pd.DataFrame(rows)


def causal_sentence(label: str, att: pd.DataFrame, pat: pd.DataFrame, *, k: int, n_heads: int) -> str:
    """What the two top lists mean, in words.

    >>> att = pd.DataFrame({"layer": [1, 2, 3], "head": [1, 1, 1], "score": [0.9, 0.8, 0.7]})
    >>> pat = pd.DataFrame({"layer": [1, 3], "head": [1, 1], "effect": [0.5, 0.2], "significant": [True, False]})
    >>> causal_sentence("induction", att, pat, k=10, n_heads=72)
    '2 of 3 heads labelled induction by attention (L1H1, L3H1) are among the 10 heads with the largest patching effect (of 72); 1 of those 2 is significant.'
    """
    a = [(int(l), int(h)) for l, h in zip(att["layer"], att["head"])]
    sig = {(int(l), int(h)) for l, h, s in zip(pat["layer"], pat["head"], pat["significant"]) if bool(s)}
    p = {(int(l), int(h)) for l, h in zip(pat["layer"], pat["head"])}
    hits = [x for x in a if x in p]
    if not a:
        return (
            f"No head holds {label} by attention, so there is nothing to compare with the heads patching singles out."
        )
    text = (
        f"{len(hits)} of {counted(len(a), f'head labelled {label}', f'heads labelled {label}')} by attention"
        + (f" ({', '.join(head_name(*x) for x in hits)})" if hits else "")
        + f" {'is' if len(hits) == 1 else 'are'} among the {k} heads with the largest patching effect (of {n_heads})"
    )
    if hits:
        n_sig = sum(x in sig for x in hits)
        if len(hits) == 1:
            text += "; its effect is significant." if n_sig else "; its effect is not significant."
        else:
            text += f"; {n_sig} of those {len(hits)} {'is' if n_sig == 1 else 'are'} significant."
    else:
        text += ": patching does not single out the heads attention labels for this task."
    return text


def _agreement_sentence(agree: dict | None, k: int) -> str:
    if not agree or agree.get("spearman") is None or math.isnan(float(agree.get("spearman", math.nan))):
        return "Attribution vs activation patching: no agreement figure (too few heads with an effect)."
    rho, ov = float(agree["spearman"]), float(agree["top_k_overlap"])
    trust = (
        "the cheap first-order estimate ranks heads like activation patching here"
        if rho >= TRUST_SPEARMAN and ov >= TRUST_OVERLAP
        else "the cheap first-order estimate is not a reliable stand-in for activation patching on this task"
    )
    return (
        f"Attribution vs activation patching over {agree.get('n_heads')} heads: Spearman {rho:.2f}, top-{agree.get('k', k)} "
        f"overlap {ov:.2f}: {trust}."
    )


def _task_paragraph(task: str, s: dict) -> str:
    t = s.get("task") or {}
    measures = s.get("measures") or f"the {t.get('metric', '?')} metric"
    gap = float(s.get("gap", math.nan))
    text = (
        f"Task {task} ({counted(int(t.get('n_items', 0)), 'item', 'items')}"
        + (f", {t['n_unusable']} unusable" if t.get("n_unusable") else "")
        + f"): the metric is {measures}. Clean run {float(s.get('metric_clean', math.nan)):.3f}, corrupted "
        f"{float(s.get('metric_corrupted', math.nan)):.3f}, gap {gap:.3f}. An effect is the share of that gap a head "
        "restores when its output from the clean run is patched into the corrupted run (0 = corrupted, 1 = clean); "
        "CI: bootstrap over items; significant: sign-flip test, Benjamini-Hochberg adjusted."
    )
    if not gap > 1e-6:
        text += " The task does not separate clean from corrupted on this model, so its effects say nothing."
    if t.get("metric") == "embedding_cosine":
        text += (
            f" On this encoder the task is measured by embedding_cosine: how far the pooled embedding moves when the "
            f"input changes, not whether the model gets the {task} right (an encoder has no LM head)."
        )
    if str(t.get("source", "")).startswith("generated"):  # how a generated task's items start (its BOS convention)
        text += f" Items: {t['source']}."
    notes = task_notes()
    if task in notes:
        text += " " + notes[task]
    return text


#: why an induction head by attention score need not be one by patching effect (the report's induction paragraph)


def causal_sections(
    frames: dict[str, pd.DataFrame], meta: dict, n_layers: int, n_heads: int, top_k: int = 10
) -> list[Section]:
    """The "Causal evidence" section (and one subsection per role with a task): attention's top
    heads next to patching's, their overlap, the task, the metric gap, attribution vs
    activation agreement and a heatmap of the effect per head. ``frames["patching"]`` (task +
    PATCH_COLUMNS) and ``meta["patching_summary"]`` (``roles``: records of label, role,
    relation, task (:func:`~headscope.analyses.run_patching.causal_roles`); ``tasks``:
    per-task summaries, ``refused``); roles without a task are listed.

    >>> [p.text for p in causal_sections({}, {"absent": {"patching": "no hooks"}}, 2, 2)[0].blocks]
    ['No patching on this model: no hooks.']
    """
    roles = frames.get("roles")
    s = Section(id="causal", title="Causal evidence")
    why = (meta.get("absent") or {}).get("patching")
    if why:
        s.blocks.append(Paragraph(f"No patching on this model: {why}."))
        return [s]
    summ = meta.get("patching_summary") or {}
    patching = frames.get("patching")
    if patching is None or not summ:
        s.blocks.append(Paragraph("No patching in this run."))
        return [s]
    mapping = {r["label"]: r for r in summ.get("roles") or []}
    run = _Run(
        roles=roles,
        patching=patching,
        method=summ.get("method", "activation_denoising"),
        tasks=summ.get("tasks") or {},
        refused=summ.get("refused") or {},
        n_layers=n_layers,
        n_heads=n_heads,
        k=min(int(summ.get("top_k", top_k)), n_layers * n_heads),
        grouped=summ.get("unit") == "kv_group",
    )
    s.blocks.append(Paragraph(_method_paragraph(summ, run.k, run.grouped)))
    without = _roles_without_task(roles, mapping)
    if without:
        s.blocks.append(Paragraph(f"Roles without a patching task: {', '.join(without)}."))
    out = [s]
    first: dict[str, str] = {}  # task -> the label of the subsection that shows it in full
    for label, r in mapping.items():
        sub = Section(id=f"causal-{slug(label)}", title=f"Causal evidence: {label}", level=3)
        out.append(sub)
        sub.blocks += _role_blocks(label, r, run, first)
    return out


def _method_paragraph(summ: dict, k: int, grouped: bool) -> str:
    """What was patched, how, and what the section compares."""
    what = (
        "every KV group: the query heads sharing a key/value head patched together, each head given its group's "
        "effect (quick mode on a GQA model; --full patches each head)"
        if grouped
        else "every head"
    )
    return (
        "Attention says where a head looks; patching says whether the model uses it. For each role with a task, "
        f"the task's clean input is run, then its corrupted input with one head's output taken from the clean run "
        f"(activation patching, denoising, {what}; {summ.get('n_items')} items per task), and the head's effect "
        f"is how much of the metric's clean - corrupted gap it restores. The role's top {k} heads by attention score "
        f"(heads with a verdict) stand next to the top {k} by effect; attribution patching (a first-order estimate from "
        "one backward pass) is compared with it."
    )


def _roles_without_task(roles: pd.DataFrame | None, mapping: dict[str, dict]) -> list[str]:
    """The run's roles no patching task covers (syntactic: the relations other than those that have one)."""
    all_roles = sorted(set(roles["role"].astype(str))) if roles is not None and not roles.empty else []
    without = [r for r in all_roles if r not in mapping]
    for role in sorted(per_relation_roles() & set(without)):
        covered = [lab.split(":", 1)[1] for lab in mapping if lab.startswith(f"{role}:")]
        if not covered:
            continue
        without[without.index(role)] = f"{role} (relations other than " + ", ".join(covered) + ")"
    return without


@dataclass(frozen=True)
class _Run:
    """What every role's subsection reads of the patching run."""

    roles: pd.DataFrame | None
    patching: pd.DataFrame  # task + PATCH_COLUMNS
    method: str
    tasks: dict  # task -> its summary
    refused: dict  # task -> why
    n_layers: int
    n_heads: int
    k: int  # top heads compared on each side
    grouped: bool  # patched per KV group


def _role_blocks(label: str, r: dict, run: _Run, first: dict[str, str]) -> list[Block]:
    """The blocks of one role's subsection; a task shown before (``first``) gets its figures
    once, and this role adds its own attention heads."""
    task, role, relation = r["task"], r["role"], r.get("relation") or ""
    k, total = run.k, run.n_layers * run.n_heads
    if task in run.refused:
        return [Paragraph(f"Task {task} was refused on this model: {run.refused[task]}.")]
    if task not in run.tasks:
        return [Paragraph(f"Task {task} has no result in this run.")]
    ts = run.tasks[task]
    att = (
        attention_top(run.roles, role, relation, k)
        if run.roles is not None
        else pd.DataFrame(columns=["layer", "head"])
    )
    pat = patching_top(run.patching, task, run.method, k)
    if task in first:  # the task's figures are shown once; this role adds its own attention heads
        blocks: list[Block] = [Paragraph(f"Task {task}: the same run as in the subsection on {first[task]}.")]
        if len(att):
            blocks.append(_causal_table(label, task, att, pat))
        blocks.append(Paragraph(causal_sentence(label, att, pat, k=k, n_heads=total)))
        return blocks
    first[task] = label
    blocks = [
        Paragraph(_task_paragraph(task, ts)),
        _causal_table(label, task, att, pat),
        Paragraph(causal_sentence(label, att, pat, k=k, n_heads=total)),
        Paragraph(_agreement_sentence((ts.get("agreement") or {}).get("denoising"), k)),
    ]
    if ts.get("warnings"):
        blocks.append(Note("; ".join(ts["warnings"])))
    fig = _patching_map(run.patching, task, run.method, run.n_layers, run.n_heads, att, label, run.grouped)
    if fig is not None:
        blocks.append(fig)
    return blocks


def _causal_table(label: str, task: str, att: pd.DataFrame, pat: pd.DataFrame) -> Table:
    return Table(
        name=f"causal_{slug(label)}",
        frame=causal_comparison(att, pat),
        caption=f"{label}: top heads by attention score vs by patching effect on task {task}",
    )


def _patching_map(
    patching: pd.DataFrame,
    task: str,
    method: str,
    n_layers: int,
    n_heads: int,
    att: pd.DataFrame,
    label: str,
    grouped: bool = False,
) -> Figure | None:
    d = patching[(patching["task"].astype(str) == task) & (patching["method"].astype(str) == method)]
    if d.empty or d["effect"].isna().all():
        return None
    marked = [(int(l), int(h)) for l, h in zip(att["layer"], att["head"])]
    fig = F.patching_effect_figure(
        d,
        n_layers=n_layers,
        n_heads=n_heads,
        title=f"Activation patching on {task}: effect per {'KV group' if grouped else 'head'}",
        marked=marked,
    )
    best = d.loc[d["effect"].idxmax()]
    return Figure(
        name=f"patching_{slug(task)}",
        png=F.png_bytes(fig),
        alt=f"Heatmap of {n_layers} layers by {n_heads} heads: the normalised effect of patching each head on task "
        f"{task}; the largest is {head_name(best['layer'], best['head'])} ({best['effect']:.3f}). Heads labelled {label} by "
        "attention are outlined.",
        caption=f"Effect of each head on task {task} (0 = corrupted run, 1 = clean run); outlined: the heads labelled "
        f"{label} by attention.",
    )
