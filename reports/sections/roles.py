"""The "Head roles" section: how many heads hold each role, the attention caveat, how the
statistics were made, the first-token roles' overlap, coreference pair consistency and the
layer × head role map (the interactive head view follows it: :mod:`headscope.reports.head_view`).

>>> print(statistics_sentence(pd.DataFrame({"role": ["a"]}), {"correction": "by", "family": "global"}))
p-values are one-sided (score above baseline), adjusted by Benjamini-Yekutieli; every row of this run (all heads × roles × relations × directions) is one family.
"""

from __future__ import annotations

import pandas as pd

from headscope.reports import figures as F
from headscope.reports.document import Figure, Note, Paragraph, Section, Table, counted, head_name
from headscope.reports.sections.known_truth import known_truth_sentence

CAVEAT = (
    "Attention maps are clues, not proofs: where a head looks need not be what the model uses "
    "(Jain & Wallace 2019; Wiegreffe & Pinter 2019). The ablation numbers beside each role are the "
    "causal evidence: the model's behaviour with that role's top heads removed, against removing as "
    "many heads drawn at random."
)


CORRECTIONS = {"bh": "Benjamini-Hochberg", "by": "Benjamini-Yekutieli", "none": "no correction"}


FIRST_TOKEN_ROLES = ("positional:first", "sink:first-token", "special")


def statistics_sentence(roles: pd.DataFrame, roles_config: dict) -> str:
    """How the p-values and intervals of ``roles`` were made, read from its own columns
    (``test``, ``interval``, ``family``) and the run's roles configuration."""
    correction = CORRECTIONS.get(roles_config.get("correction", "bh"), roles_config.get("correction", "bh"))
    family = roles_config.get("family", "role")
    scope = (
        "every row of this run (all heads × roles × relations × directions) is one family"
        if family == "global"
        else "each role (and relation and direction) over the model's heads is one family"
    )
    parts = [f"p-values are one-sided (score above baseline), adjusted by {correction}; {scope}."]
    if "test" in roles and "interval" in roles:
        kinds = roles.assign(_t=roles["test"].astype(str).str.replace(r" \(.*", "", regex=True))
        tests = kinds.groupby("_t")["role"].nunique()
        if len(tests):
            parts.append(
                "Tests: "
                + "; ".join(f"{t or 'n/a'} ({counted(int(n), 'role', 'roles')})" for t, n in tests.items())
                + "."
            )
        tail = int(roles["test"].astype(str).str.contains("normal tail").sum())
        refined = int(roles["test"].astype(str).str.contains("refined").sum())
        if refined or tail:
            parts.append(
                f"{counted(refined, 'head row was', 'head rows were')} redrawn with more permutations so that the "
                f"Monte-Carlo floor sits below what the correction needs; {counted(tail, 'row uses', 'rows use')} the "
                "normal approximation of the sign-flip null where even that was not enough."
            )
        intervals = sorted(set(roles["interval"].astype(str)) - {""})
        if intervals:
            parts.append(
                f"{roles_config.get('ci_level', 0.95):.0%} intervals: "
                + ", ".join(intervals)
                + " (Wilson for 0/1 hits, bootstrap percentile over items for shares)."
            )
    return " ".join(parts)


def overlap_sentence(roles: pd.DataFrame) -> str | None:
    """How many heads the three first-token roles share (they measure different things:
    where the maximum goes, the mass on position 0, the mass on special tokens)."""
    from headscope.analyses.roles.pipeline import verdict_overlap

    present = [r for r in FIRST_TOKEN_ROLES if (roles["role"] == r).any()]
    if len(present) < 2:
        return None
    ov = verdict_overlap(roles, roles=present)
    if ov.empty or int(ov["n_both"].sum()) == 0:
        return None
    pairs = "; ".join(
        f"{a} and {b}: {int(nb)} shared of {int(na)} and {int(nbb)} (Jaccard {j:.2f})"
        for a, b, na, nbb, nb, j in ov[["role_a", "role_b", "n_a", "n_b", "n_both", "jaccard"]].itertuples(index=False)
    )
    return (
        "Three roles look at the first token in different ways: positional:first counts query rows whose maximum "
        "weight lands on position 0, sink:first-token is the attention mass on position 0, special the mass on every "
        "[CLS]/[SEP]/BOS token. On an encoder position 0 is [CLS], so they flag many of the same heads: " + pairs + "."
    )


def pairs_sentence(roles: pd.DataFrame, pairs: pd.DataFrame | None) -> str | None:
    """Pair consistency on the coreference minimal pairs: the best head of each kind."""
    if pairs is None or pairs.empty:
        return None
    out = []
    for kind, g in pairs.groupby("kind", sort=True):
        best = g.sort_values(["pair_accuracy", "layer", "head"], ascending=[False, True, True]).iloc[0]
        role = f"coreference:{kind}" if kind else "coreference"
        rows = roles[(roles["role"] == role)]
        top = rows.sort_values("score", ascending=False).iloc[0] if len(rows) else None
        item = (
            f"; best item accuracy {top['score']:.2f} ({head_name(top['layer'], top['head'])}) vs {top['baseline']:.2f}"
            if top is not None
            else ""
        )
        out.append(
            f"{kind or 'no kind'}: best {head_name(best['layer'], best['head'])} with both items right in "
            f"{int(best['both_right'])} of {int(best['n_pairs'])} pairs ({best['pair_accuracy']:.2f}){item}"
        )
    return (
        "Coreference is scored per kind of item, each against its own baseline. On minimal pairs (two items that "
        "differ in the word that decides the antecedent) a head that ignores that word gets exactly one item of each "
        "pair right, so pair accuracy is 0 for it (and for both simple rules): " + "; ".join(out) + "."
    )


def roles_section(
    roles: pd.DataFrame,
    n_layers: int,
    n_heads: int,
    model: str,
    roles_config: dict | None = None,
    coref_pairs: pd.DataFrame | None = None,
) -> Section:
    """The overview from ``roles`` (ROLE_COLUMNS, not empty), the run's ``roles_config``
    (correction, family, ci_level) and ``coref_pairs`` (kind, layer, head, pair_accuracy,
    both_right, n_pairs)."""
    s = Section(id="roles", title="Head roles")
    held = F.held_roles(roles)
    counts = roles[roles["verdict"].astype(bool)].drop_duplicates(["layer", "head", "role"])["role"].value_counts()
    multi = sum(1 for v in held.values() if len(v) > 1)
    common = ", ".join(f"{r} ({c} heads)" for r, c in counts.items()) or "none"
    total = n_layers * n_heads
    s.blocks.append(
        Paragraph(
            f"{len(held)} of {model}'s {total} heads hold at least one role at the configured thresholds; "
            f"{counted(multi, 'holds', 'hold')} more than one. Heads per role: {common}."
        )
    )
    s.blocks.append(Note(f"{CAVEAT} {known_truth_sentence()}".strip()))
    s.blocks.append(Paragraph(statistics_sentence(roles, roles_config or {})))
    overlap = overlap_sentence(roles)
    if overlap:
        s.blocks.append(Paragraph(overlap))
    pairs = pairs_sentence(roles, coref_pairs)
    if pairs:
        s.blocks.append(Paragraph(pairs))
    fig = F.role_map_figure(roles, n_layers=n_layers, n_heads=n_heads)
    s.blocks.append(
        Figure(
            name="role_map",
            png=F.png_bytes(fig),
            alt=f"Grid of {n_layers} layers by {n_heads} heads coloured by role. {len(held)} heads hold a role, {multi} several. "
            f"Heads per role: {common}.",
            caption="Layer × head map of roles. Each coloured stripe is a role the head holds (verdict: margin over the baseline "
            "and adjusted p below alpha); a cell with several stripes holds several roles; stronger colour means a larger "
            "margin relative to the role's best head. Grey: no role.",
        )
    )
    return s


def qk_drivers_blocks(drivers: pd.DataFrame | None) -> list:
    """What drives the attention of each task role's top head (the stage's ``qk_drivers`` table:
    exact QK attribution over up to 16 items of the role's task): one sentence per role and the
    table; nothing where there is no row."""
    if drivers is None or drivers.empty:
        return []
    from headscope.analyses.qk.roles import driver_sentences

    text = (
        "Why the top head of each role attends where it does (exact QK attribution: the attended key's score minus "
        "the mean of the other keys, split over the components that write the query and the key, norms frozen at "
        "their clean scale): " + " ".join(driver_sentences(drivers))
    )
    table = drivers.assign(head=[head_name(l, h) for l, h in zip(drivers["layer"], drivers["head"])])
    return [
        Paragraph(text),
        Table(
            name="qk_drivers",
            frame=table[["role", "head", "side", "rank", "component", "share", "n"]].round({"share": 3}),
            caption="Top query-side and key-side components of each role's top head, as shares of its score difference",
        ),
    ]
