"""The "Long context and the KV cache" section: the KV-cache compression study's curve (KV bytes
saved against the quality change, greedy order against the random-order band), the savings at
the 1 % point, at the run's and at the model's maximum context, and, where the run has them, the
long-context head roles (retrieval, streaming, sink) and their join with the study
(:mod:`headscope.analyses.kvcache`).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from headscope.reports import figures as F
from headscope.reports.document import Block, Figure, Note, Paragraph, Section, Table

#: the long-context roles the section lists where the run has them (helper roles of #27)
LONG_ROLES = ("retrieval", "streaming", "sink")


def _mb(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def _sentence(text: str) -> str:
    """``text`` with its first letter upper-case and a full stop."""
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


def unit_words(summary: dict) -> str:
    """What one step of the study restricts: ``KV groups``, or ``layers`` (each with all its KV groups)."""
    return "layers" if summary.get("unit") == "layer" else "KV groups"


def _inputs(summary: dict) -> str:
    n = summary.get("inputs") or {}
    items, texts = n.get("needle_items", 0), n.get("long_texts", 0)
    return f"{items} needle item{'s' * (items != 1)} and {texts} long text{'s' * (texts != 1)}"


def long_lines(summary: dict) -> list[str]:
    """Markdown bullet lines: the long-context roles' and the causal check's items, heads passing and ratio."""
    long = summary.get("long_context") or {}
    if not long:
        return []
    lines = [f"- long-context roles: {long.get('n_items')} needle items of {long.get('n_tokens')} tokens"]
    c = long.get("causal") or {}
    if c:
        lines.append(
            f"- causal check on {c['n_items']} needle items of {c['n_tokens']} tokens: masking the top {c['k']} "
            f"retrieval heads hurts copying {c['ratio']:.2f}x as much as {c['n_draws']} random sets (per draw "
            f"{', '.join(f'{r:.2f}' for r in c['ratio_per_draw'])}; {c['ci_level']:.0%} interval over items "
            f"{c['ratio_ci'][0]:.2f} to {c['ratio_ci'][1]:.2f})"
        )
    return lines


def savings_lines(summary: dict) -> list[str]:
    """Markdown bullet lines: the settings, the unrestricted quality and the savings at the 1 % point."""
    s, full = summary.get("settings", {}), summary.get("full", {})
    at = summary.get("savings_at_tolerance")
    loss, acc = full.get("lm_loss"), full.get("copy_accuracy")
    lines = [
        f"- restricted cache: first {s.get('sink')} + last {s.get('window')} tokens; {summary.get('groups')} KV groups, "
        f"restricted and given back by {'layer' if summary.get('unit') == 'layer' else 'KV group'}; "
        f"inputs of {summary.get('context'):,} tokens (maximum context {summary.get('max_context'):,}): "
        f"{_inputs(summary)}",
        "- unrestricted: LM loss "
        + ("–" if loss is None else f"{loss:.4f}")
        + ", copy accuracy "
        + ("–" if acc is None else f"{acc:.3f}"),
        f"- full KV cache (16-bit): {_mb(summary.get('kv_bytes_full', 0))} at {summary.get('context'):,} tokens, "
        f"{_mb(summary.get('kv_bytes_full_max', 0))} at {summary.get('max_context'):,}",
    ]
    if at is None:
        lines.append("- no measured point stays within a 1 % quality change")
    else:
        lines.append(
            f"- largest compression within a {at['tolerance']:.0%} quality change: {at['full_groups']} of "
            f"{summary.get('units', summary.get('groups'))} {unit_words(summary)} keep a full cache; saves {_mb(at['bytes_saved'])} "
            f"({at['fraction_saved']:.1%}) at {summary.get('context'):,} tokens and {_mb(at['bytes_saved_max'])} "
            f"({at['fraction_saved_max']:.1%}) at {summary.get('max_context'):,} (quality change {at['quality_change']:.4f})"
        )
    return lines


def kv_figure(curve: pd.DataFrame) -> Figure:
    """Fraction of the KV cache saved against the quality change: the greedy order as a line,
    the random orders' band (min to max at each point)."""
    g = curve[curve["study"] == "greedy"].sort_values("fraction_saved")
    r = curve[curve["study"] == "random"]
    band = (
        r.groupby("step")[["fraction_saved", "quality_change"]]
        .agg(["min", "max", "mean"])
        .sort_values(("fraction_saved", "mean"))
    )
    with F.theme():
        fig, ax = plt.subplots(figsize=(4.6, 3.2))
        if len(band):
            x = band[("fraction_saved", "mean")].to_numpy(float)
            ax.fill_between(
                x,
                band[("quality_change", "min")],
                band[("quality_change", "max")],
                color="#bbbbbb",
                alpha=0.6,
                label=f"random orders ({r['draw'].nunique()})",
            )
        ax.plot(g["fraction_saved"], g["quality_change"], marker="o", color="#c0392b", label="greedy")
        ax.axhline(0.01, color="#555555", lw=0.8, ls="--", label="1 %")
        ax.set_xlabel("fraction of the KV cache saved")
        ax.set_ylabel("quality change")
        ax.set_yscale("symlog", linthresh=0.01)
        ax.legend(fontsize=7)
        ax.set_title("KV cache: sink + window per KV group")
    return Figure(
        name="kv_curve",
        png=F.png_bytes(fig),
        alt=f"Line and band: fraction of the KV cache saved (x) against the quality change (y) for the greedy order "
        f"({len(g)} points) and {r['draw'].nunique()} random orders; dashed line at 1 %.",
        caption="Each point restricts the KV groups not yet given back to sink + window; quality change: the worse "
        "of the LM loss's relative increase and the copy accuracy's drop. Grey: the random orders' range.",
    )


def _roles_blocks(frames: dict, meta: dict) -> list[Block]:
    roles = frames.get("long_context_roles")
    blocks: list[Block] = []
    long = (meta.get("kv_summary") or {}).get("long_context") or {}
    if long:
        blocks.append(
            Paragraph(
                f"Long-context roles on {long.get('n_items')} needle item(s) of {long.get('n_tokens')} tokens "
                f"(copy accuracy {long.get('copy_accuracy', float('nan')):.3f}; pattern statistics: "
                f"{long.get('pattern_statistics')})."
            )
        )
    c = long.get("causal") or {}
    if c:
        blocks.append(
            Paragraph(
                f"Causal check: masking the top {c['k']} retrieval heads ({c['share']:.0%} of {c['n_heads']}) takes copy "
                f"accuracy from {c['accuracy_unmasked']:.3f} to {c['accuracy_top']:.3f}; as many random heads "
                f"({c['n_draws']} draws) to {sum(c['accuracy_random_per_draw']) / max(1, len(c['accuracy_random_per_draw'])):.3f}. "
                f"Ratio of damages {c['ratio']:.2f} (per draw {', '.join(f'{r:.2f}' for r in c['ratio_per_draw'])}; "
                f"{c['ci_level']:.0%} interval {c['ratio_ci'][0]:.2f} to {c['ratio_ci'][1]:.2f} over {c['n_items']} "
                f"item(s) of {c['n_tokens']} tokens)."
            )
        )
    if roles is not None and not roles.empty:
        names = roles["role"].astype(str)
        for role in LONG_ROLES:
            d = roles[names.str.startswith(role)]
            if "window" in d and d["window"].notna().any():  # streaming: the largest window measured
                d = d[d["window"] == d["window"].max()]
            if len(d):
                cols = [c for c in ("layer", "head", "role", "window", "score", "baseline", "verdict") if c in d]
                top = d.sort_values(["score", "layer", "head"], ascending=[False, True, True]).head(10)[cols]
                n = int(d["verdict"].fillna(False).astype(bool).sum())
                blocks.append(
                    Table(
                        f"long_context_{role}",
                        top.reset_index(drop=True),
                        f"The 10 heads with the highest {role} score ({n} pass the verdict).",
                    )
                )
    join = frames.get("kv_roles")
    kv = meta.get("kv_summary") or {}
    if join is not None and kv.get("roles_join"):
        j, summary = kv["roles_join"], kv
        blocks.append(
            Paragraph(
                f"{_sentence(unit_words(summary))[:-1]} kept full at the 1 % point against those holding the top {j['top_retrieval_heads']} "
                f"retrieval heads: {j['overlap']} of {j['groups_kept_full']} in common; Spearman's rho between "
                f"need (greedy rank) and retrieval score: {j['spearman_need_vs_retrieval']}."
            )
        )
    return blocks


def long_context_section(frames: dict, meta: dict) -> Section | None:
    """The section, a short one saying why the stage did not run (``meta["absent"]["kv"]``), or
    None (an older run, no such stage)."""
    from headscope.analyses.kvcache.study import curve_frame

    why = (meta.get("absent") or {}).get("kv")
    study = frames.get("kv_study")
    if study is None or study.empty:
        if not why:
            return None
        return Section("long_context", "Long context and the KV cache", [Note(f"Not computed for this model: {why}.")])
    summary = meta.get("kv_summary") or {}
    curve = curve_frame(study)
    blocks: list[Block] = [
        Paragraph(
            "A KV-cache compression study (a pruning study of the cache, not of the heads): a KV group's cache keeps "
            "only its first sink tokens and a recent window (StreamingLLM), and the groups are given their full cache "
            "back greedily, the one that helps most first, against random orders. Bytes from the card's arithmetic."
        ),
        *(Paragraph(_sentence(line.removeprefix("- "))) for line in savings_lines(summary)),
        kv_figure(curve),
        Table(
            "kv_curve_points", curve[curve["study"] == "greedy"].reset_index(drop=True), "The greedy order's points."
        ),
    ]
    return Section("long_context", "Long context and the KV cache", blocks + _roles_blocks(frames, meta))
