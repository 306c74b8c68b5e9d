"""The IOI roles on SmolLM2-135M, regenerated from code (``make ioi-roles``).

``python -m headscope.reports.tools.experiments.ioi_figures`` loads ``smollm2-135m`` (in-house) and
runs the role groups ``induction``, ``successor`` and ``copy-suppression`` (default settings), then
``ioi`` twice on the IOI task's 32 items (seed 0): by default (name movers, negative name movers)
and with S-inhibition (path patching into the name movers' queries), each timed; joins the IOI
verdicts with the other roles (:func:`~headscope.analyses.roles.ioi.ioi_heads`) and attributes the
top heads' attention (:func:`~headscope.analyses.qk.roles.role_drivers`). Writes
``data/figures/ioi_smollm2.json`` in the format of ``patching.json``;
``tests/analyses/roles/test_ioi_figures.py`` checks it and ``docs/guide/roles.md``'s quotes (the
tutorial ``docs/tutorials/qk-induction.md`` reads it too). Timings are of the machine that ran it.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from headscope.reports.tools.experiments.figures_doc import write_figures

FIGURES = Path(__file__).resolve().parents[3] / "data" / "figures"
MODEL = "smollm2-135m"
QUOTED = (
    "ioi.logit_diff",
    "ioi.name_movers",
    "ioi.negative_name_movers",
    "ioi.s_inhibition",
    "ioi.s_inhibition_p",
    "ioi.receivers",
    "ioi.cost",
    "joined.also",
    "others.successor",
    "others.copy_suppression",
    "qk.drivers",
)


def _fig(out: dict, name: str, value, text: str) -> None:
    group, key = name.split(".")
    out.setdefault(group, {})[key] = {"value": value, "text": text}


def _top(frame, role: str, k: int = 4) -> list[list]:
    """``[[head, score, baseline, p_value, verdict]]`` of the ``k`` best heads of ``role``."""
    f = frame[frame.role == role].sort_values(["score", "layer", "head"], ascending=[False, True, True]).head(k)
    return [
        [
            f"L{r.layer}H{r.head}",
            round(float(r.score), 3),
            round(float(r.baseline), 3),
            float(r.p_value),
            bool(r.verdict),
        ]
        for r in f.itertuples(index=False)
    ]


def _heads_text(rows) -> str:
    return "; ".join(f"{h} {s:.3f} vs {b:.3f}{'' if v else ' (no verdict)'}" for h, s, b, _p, v in rows)


def figures() -> dict:
    import pandas as pd

    from headscope.analyses.qk.roles import driver_sentences, role_drivers
    from headscope.analyses.roles.config import RolesConfig
    from headscope.analyses.roles.ioi import ioi_heads
    from headscope.analyses.roles.pipeline import head_roles
    from headscope.probes.models.loading import load_model

    model = load_model(MODEL, "inhouse")
    out: dict = {}
    others = head_roles(model, roles=["induction", "successor", "copy-suppression"], cfg=RolesConfig(), examples=False)
    start = time.perf_counter()
    head_roles(model, roles=["ioi"], cfg=RolesConfig(), examples=False)  # the default run's cost
    t_plain = time.perf_counter() - start
    start = time.perf_counter()
    full = head_roles(model, roles=["ioi"], cfg=RolesConfig(ioi_s_inhibition=True), examples=False)
    t_full = time.perf_counter() - start
    f, extra = full.frame, full.outputs["ioi"].extra
    ld = [round(extra["clean_logit_diff"], 3), round(extra["corrupted_logit_diff"], 3), full.n_items["ioi"]]
    _fig(out, "ioi.logit_diff", ld, f"clean {ld[0]:.2f}, ABC {ld[1]:.2f} over {ld[2]} items")
    for name, role in (
        ("name_movers", "ioi:name-mover"),
        ("negative_name_movers", "ioi:negative-name-mover"),
        ("s_inhibition", "ioi:s-inhibition"),
    ):
        top = _top(f, role)
        _fig(out, f"ioi.{name}", top, _heads_text(top))
    s_top = _top(f, "ioi:s-inhibition", 1)[0]
    _fig(out, "ioi.s_inhibition_p", s_top[3], f"{s_top[3]:.3f}")
    recv = extra["s_inhibition"]["receivers"]
    _fig(out, "ioi.receivers", recv, ", ".join(f"L{r.replace('.', 'H')}" for r in recv))
    _fig(out, "ioi.cost", [round(t_plain, 1), round(t_full, 1)], f"{t_plain:.0f} s, {t_full:.0f} s with --s-inhibition")
    both = pd.concat([others.frame, f], ignore_index=True)
    joined = ioi_heads(both)
    also = [[r.role, f"L{r.layer}H{r.head}", r.also] for r in joined.itertuples(index=False)]
    _fig(
        out,
        "joined.also",
        also,
        "; ".join(f"{h} ({role.removeprefix('ioi:')}) also {a}" for role, h, a in also if a) or "none",
    )
    for name, role in (
        ("successor", "successor"),
        ("copy_suppression", "copy-suppression"),
        ("induction", "induction"),
    ):
        top = _top(others.frame, role, 3)
        _fig(out, f"others.{name}", top, _heads_text(top))
    start = time.perf_counter()
    drivers, notes = role_drivers(model, both)
    _fig(
        out,
        "qk.drivers",
        drivers.to_dict("records"),
        " ".join(s for s in driver_sentences(drivers) if s.startswith("ioi:")),
    )
    _fig(out, "qk.cost", round(time.perf_counter() - start, 1), f"{time.perf_counter() - start:.0f} s")
    _fig(out, "qk.notes", notes, "; ".join(notes) or "none")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=FIGURES, help=f"the folder the JSON goes to (default {FIGURES})")
    args = p.parse_args(argv)
    write_figures(
        args.out / "ioi_smollm2.json",
        figures(),
        model=MODEL,
        generated_by="python -m headscope.reports.tools.experiments.ioi_figures",
        source="IOI task, 32 items, seed 0 (ioi group, default RolesConfig); induction, successor, copy-suppression "
        "groups with their defaults",
        quoted=QUOTED,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
