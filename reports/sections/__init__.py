"""The report's sections, one module each, and :func:`build_document`, which puts them in order.

Each module turns frames into one section (or a few: a subsection per role, per task) of
:mod:`headscope.reports.document` blocks: :mod:`.card` (the model), :mod:`.roles` (head roles
and the head view), :mod:`.role_detail` (one subsection per role, with :mod:`.examples`),
:mod:`.stats` (attention statistics), :mod:`.causal` (patching), :mod:`.weights` (circuits
from the weights and their joins), :mod:`.long_context` (the KV-cache study), :mod:`.pruning`,
:mod:`.skipped` and :mod:`.run`. Nothing here renders; :mod:`headscope.reports.html` and
:mod:`headscope.reports.markdown` do.

>>> doc = build_document({}, card={"layers": 2, "heads": 2}, card_text="card", meta={"model": "m"})
>>> [s.id for s in doc.sections]
['model', 'pruning', 'skipped', 'run']
"""

from __future__ import annotations

import pandas as pd

from headscope.reports.document import Document
from headscope.reports.sections.card import card_section
from headscope.reports.sections.run import run_section
from headscope.reports.sections.skipped import skipped_section

__all__ = ["build_document"]


def build_document(
    frames: dict[str, pd.DataFrame], *, card: dict, card_text: str, meta: dict, top: int = 3
) -> Document:
    """The report's content from frames. ``frames`` keys used: ``roles`` (ROLE_COLUMNS),
    ``stats`` (STAT_COLUMNS), ``examples`` (EXAMPLE_COLUMNS), ``prune_*`` (IMPACT_COLUMNS; curves from
    ``prune_curve_summary`` / ``prune_curves``, single-head map from ``prune_ablation``,
    ``prune_prunable``, ``prune_baseline``),
    ``roles_vs_importance`` (role, k, metric, value_role, value_random_mean,
    value_random_std, n_draws), ``skipped`` (analysis, reason, count); any may be missing.
    ``card`` is :func:`headscope.probes.models.card.model_card`'s dict, ``card_text`` its rendering;
    ``meta``: model, backend, full, seed, sha256, versions, timings, n_items; with
    ``patching_summary`` or ``absent["patching"]`` the "Causal evidence" section
    (:func:`~headscope.reports.sections.causal.causal_sections`, from ``frames["patching"]``) follows the roles."""
    from headscope.reports.stages.registry import report_order

    n_layers, n_heads = int(card["layers"]), int(card["heads"])
    model = meta.get("model") or card.get("name", "model")
    view = {**meta, "layers": n_layers, "heads": n_heads, "model": model, "top": top}
    sections = [card_section(card, card_text)]
    for stage in report_order():
        sections += stage.section(frames, view)
    sections.append(skipped_section(frames.get("skipped"), meta.get("n_items") or {}))
    sections.append(run_section(meta))
    return Document(
        title=f"What the attention heads of {model} do",
        subtitle=f"{n_layers} layers × {n_heads} heads = {n_layers * n_heads} heads · backend {meta.get('backend')} · "
        f"{'full' if meta.get('full') else 'quick'} pruning studies · seed {meta.get('seed')}",
        sections=sections,
    )
