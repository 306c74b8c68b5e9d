"""One subsection per role some head holds ("Role: ..."): its top heads, the best head per
relation, the roles-vs-importance ablation in words, the caveat and the role's example maps;
then "Roles no head holds", each such role's best head for reference.

>>> roles = pd.DataFrame({"role": ["a", "a"], "layer": [0, 1], "head": [0, 0], "verdict": [True, False],
...     "margin": [0.2, 0.5], "score": [0.6, 0.9]})
>>> top_heads(roles, 1)["a"][["layer", "head"]].values.tolist()
[[0, 0]]
"""

from __future__ import annotations

import math

import pandas as pd

from headscope.reports.document import Note, Paragraph, Section, Table, counted, fmt, head_name, slug
from headscope.reports.head_view import ROLE_VIEW_COLUMNS
from headscope.reports.sections.examples import example_block, role_examples


def top_heads(roles: pd.DataFrame, top: int = 3) -> dict[str, pd.DataFrame]:
    """Per role, the ``top`` heads by margin among those with a verdict (a head counted
    once per role, on its best relation); roles with no verdict get their best-scoring
    heads instead (the caller says so)."""
    out = {}
    if roles is None or roles.empty:
        return out
    for role, d in roles.groupby("role", sort=True, observed=True):
        held = d[d["verdict"].astype(bool)]
        pool = held if not held.empty else d
        key = "margin" if not held.empty else "score"
        best = pool.sort_values([key, "score"], ascending=False).drop_duplicates(["layer", "head"])
        out[str(role)] = best.head(top).reset_index(drop=True)
    return out


def _role_table(best: pd.DataFrame) -> pd.DataFrame:
    cols = ["layer", "head", *ROLE_VIEW_COLUMNS[1:]]  # the head view's columns, role implied by the section
    t = best[[c for c in cols if c in best]].copy()
    for c in ("relation", "direction"):
        if c in t and (t[c].astype(str) == "").all():
            t = t.drop(columns=c)
    t.insert(0, "head_id", [head_name(l, h) for l, h in zip(t["layer"], t["head"])])
    return t.drop(columns=["layer", "head"]).rename(
        columns={"head_id": "head", "ci_low": "CI low", "ci_high": "CI high", "p_value": "p (adj.)"}
    )


def _relation_table(d: pd.DataFrame, max_rows: int = 15) -> Table | None:
    """Best head per relation and direction (roles that have relations)."""
    if (d["relation"].astype(str) == "").all():
        return None
    best = d.sort_values(["verdict", "margin"], ascending=False, kind="stable").drop_duplicates(
        ["relation", "direction"]
    )
    best = best.sort_values(["verdict", "margin"], ascending=False, kind="stable").head(max_rows)
    t = best[["relation", "direction", "layer", "head", "score", "baseline", "margin", "n", "verdict"]].copy()
    t.insert(2, "best head", [head_name(l, h) for l, h in zip(t["layer"], t["head"])])
    return Table(
        name="relations",
        frame=t.drop(columns=["layer", "head"]),
        caption=f"Best head per relation and direction (the {len(t)} with the largest margins; all in tables/roles.csv)",
    )


def _causal_rows(rvi: pd.DataFrame | None, role: str) -> pd.DataFrame:
    if rvi is None or rvi.empty:
        return pd.DataFrame()
    return rvi[rvi["role"].astype(str) == role]


def _causal_sentence(rows: pd.DataFrame) -> str:
    parts = []
    for r in rows.itertuples(index=False):
        sd = r.value_random_std if not pd.isna(r.value_random_std) else 0.0
        z = (r.value_role - r.value_random_mean) / sd if sd > 0 else float("nan")
        if math.isnan(z):
            zs = ""
        elif abs(z) < 2:
            zs = f", {z:+.1f} sd from random: within 2 sd, so this ablation does not single these heads out"
        else:
            zs = f", {z:+.1f} sd from random"
        parts.append(
            f"ablating its top {counted(int(r.k), 'head', 'heads')} gives {r.metric} = {fmt(r.value_role)}; "
            f"ablating {counted(int(r.k), 'random head', 'random heads')} gives {fmt(r.value_random_mean)} ± {fmt(sd)} "
            f"(mean ± sd over {int(r.n_draws)} draws{zs})"
        )
    return "Causal evidence: " + "; ".join(parts) + "."


def _unheld_section(roles: pd.DataFrame, tops: dict[str, pd.DataFrame]) -> Section | None:
    """One table for the roles no head holds: each role's best head, for reference."""
    rows = []
    for role, best in tops.items():
        d = roles[roles["role"].astype(str) == role]
        if d["verdict"].astype(bool).any():
            continue
        r = best.iloc[0]
        rows.append(
            {
                "role": role,
                "best head": head_name(r["layer"], r["head"]),
                "score": r["score"],
                "baseline": r["baseline"],
                "margin": r["margin"],
                "p (adj.)": r["p_value"],
                "n": r["n"],
            }
        )
    if not rows:
        return None
    s = Section(id="roles-unheld", title="Roles no head holds", level=3)
    s.blocks.append(
        Paragraph(
            f"No head passes the threshold for {counted(len(rows), 'role', 'roles')} ({', '.join(r['role'] for r in rows)}); "
            "the best-scoring head of each is listed for reference. A role absent here may still be carried by several heads "
            "together, or only on inputs unlike the probe corpora."
        )
    )
    s.blocks.append(
        Table(name="roles_unheld", frame=pd.DataFrame(rows), caption="Best head of each role that no head holds")
    )
    return s


def role_sections(
    roles: pd.DataFrame, examples: pd.DataFrame | None, rvi: pd.DataFrame | None, top: int
) -> list[Section]:
    """A "Role: ..." subsection per role some head holds (its ``top`` heads by margin, from
    ``roles``: ROLE_COLUMNS), with its ``examples`` (EXAMPLE_COLUMNS) and its rows of ``rvi``
    (roles vs importance); then "Roles no head holds" when any role has no verdict."""
    out = []
    tops = top_heads(roles, top)
    for role, best in tops.items():
        d = roles[roles["role"].astype(str) == role]
        n_held = d[d["verdict"].astype(bool)].drop_duplicates(["layer", "head"]).shape[0]
        if not n_held:
            continue
        s = Section(id=f"role-{slug(role)}", title=f"Role: {role}", level=3)
        s.blocks.append(
            Paragraph(
                f"{counted(n_held, 'head holds', 'heads hold')} this role. Top {len(best)} by margin over the baseline:"
            )
        )
        s.blocks.append(
            Table(
                name=f"top_{slug(role)}",
                frame=_role_table(best),
                caption=f"Top heads for {role}: score, baseline, margin, bootstrap CI of the score, adjusted p",
            )
        )
        rel = _relation_table(d)
        if rel is not None:
            s.blocks.append(rel)
        causal = _causal_rows(rvi, role)
        if not causal.empty:
            s.blocks.append(Paragraph(_causal_sentence(causal)))
        else:
            s.blocks.append(
                Paragraph(
                    "Causal evidence: no ablation of this role's heads was run; the verdict rests on attention alone."
                )
            )
        s.blocks.append(Note("Attention maps are clues, not proofs (Jain & Wallace 2019; Wiegreffe & Pinter 2019)."))
        for ex in role_examples(examples, role):
            s.blocks.append(example_block(ex))
        out.append(s)
    unheld = _unheld_section(roles, tops)
    if unheld is not None:
        out.append(unheld)
    return out
