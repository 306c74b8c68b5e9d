"""Why SmolLM2's induction head L18H6 attends where it does, regenerated from code (``make qk``).

``python -m headscope.reports.tools.experiments.qk_figures`` loads ``smollm2-135m`` (in-house),
draws the induction task (``--n-items`` items of ``seq_len`` 10, seed 0: the items
``headscope patch`` uses, more of them) and splits L18H6's score difference at the induction
position (the answer's key minus the mean of the other keys, and minus the runner-up key) over
(query component, key component) pairs; L16H0 and L17H8's key-side shares sit beside the earlier
evidence read from the committed ``patching.json`` (path patching through K) and
``weights_smollm2.json`` (K-composition). Writes ``data/figures/qk_smollm2.json`` in the format of
``patching.json``; ``tests/analyses/qk/test_qk_figures.py`` checks it and ``docs/guide/qk.md``'s quotes.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from headscope.reports.tools.experiments.figures_doc import write_figures

FIGURES = Path(__file__).resolve().parents[3] / "data" / "figures"
MODEL = "smollm2-135m"
HEAD = (18, 6)
#: the two previous-token candidates the earlier evidence disagrees on
CANDIDATES = ("L16H0", "L17H8")
QUOTED = (
    "l18h6.key_top",
    "l18h6.query_top",
    "l18h6.pair_top",
    "l18h6.L16H0",
    "l18h6.L17H8",
    "l18h6.key_kinds",
    "l18h6.error",
    "l18h6.difference",
    "runner_up.key_top",
    "earlier.path_k",
    "earlier.k_composition",
)


def _fig(out: dict, name: str, value, text: str) -> None:
    group, key = name.split(".")
    out.setdefault(group, {})[key] = {"value": value, "text": text}


def _side(result, side: str):
    f = result.frame
    return f[(f.side == side) & (f.layer == HEAD[0]) & (f["head"] == HEAD[1])]


def _attribution_figures(out: dict, group: str, result) -> None:
    s = result.summary[f"{HEAD[0]}.{HEAD[1]}"]
    key = _side(result, "key").set_index("key_component")
    top = key.sort_values("rank").head(5)
    _fig(
        out,
        f"{group}.key_top",
        [[c, float(r.share)] for c, r in top.iterrows()],
        ", ".join(f"{c} {r.share:.1%}" for c, r in top.iterrows()),
    )
    for c in CANDIDATES:
        _fig(
            out,
            f"{group}.{c}",
            [float(key.share[c]), int(key["rank"][c])],
            f"{key.share[c]:.1%} (rank {key['rank'][c]})",
        )
    if group != "l18h6":
        return
    query = _side(result, "query").sort_values("rank").head(3)
    _fig(
        out,
        f"{group}.query_top",
        [[r.query_component, float(r.share)] for _, r in query.iterrows()],
        ", ".join(f"{r.query_component} {r.share:.1%}" for _, r in query.iterrows()),
    )
    pairs = _side(result, "pair").sort_values("rank").head(3)
    _fig(
        out,
        f"{group}.pair_top",
        [[r.query_component, r.key_component, float(r.share)] for _, r in pairs.iterrows()],
        ", ".join(f"{r.query_component} x {r.key_component} {r.share:.1%}" for _, r in pairs.iterrows()),
    )
    kinds = _kind_shares(key)
    _fig(out, f"{group}.key_kinds", kinds, ", ".join(f"{k} {v:.1%}" for k, v in kinds.items()))
    _fig(
        out,
        f"{group}.difference",
        [s["mean_difference"], s["n_items"], s["n_skipped"]],
        f"{s['mean_difference']:.2f} over {s['n_items']} items",
    )
    _fig(out, f"{group}.error", s["max_relative_error"], f"{s['max_relative_error']:.1e}")


def _kind_shares(key) -> dict:
    from headscope.analyses.qk.frames import component_kind

    kinds: dict = {}
    for comp, share in key.share.items():
        k = component_kind(comp)
        kinds[k] = kinds.get(k, 0.0) + float(share)
    return dict(sorted(kinds.items(), key=lambda kv: -kv[1]))


def _earlier(out: dict) -> None:
    """The two earlier figures, read from their committed JSONs."""
    try:
        path = json.loads((FIGURES / "patching.json").read_text())["figures"]["path"]
        _fig(
            out,
            "earlier.path_k",
            [path["k_head_lead"]["value"], path["k_head_lead_effect"]["value"], path["k_head_sum"]["value"]],
            f"{path['k_head_lead']['text']} leads path patching through K "
            f"({path['k_head_lead_effect']['text']} of {path['k_head_sum']['text']})",
        )
    except (OSError, KeyError):
        pass
    try:
        kc = json.loads((FIGURES / "weights_smollm2.json").read_text())["figures"]["k_composition"]["first"]
        _fig(out, "earlier.k_composition", kc["value"], kc["text"])
    except (OSError, KeyError):
        pass


def figures(n_items: int) -> dict:
    from headscope.analyses.patching.generated import induction_task
    from headscope.analyses.qk.study import QKConfig, induction_items, qk_study
    from headscope.probes.models.loading import load_model

    model = load_model(MODEL, "inhouse")
    items = induction_items(induction_task(model.tokenizer, n_items=n_items, seq_len=10, seed=0))
    out: dict = {}
    for group, baseline in (("l18h6", "mean"), ("runner_up", "runner_up")):
        start = time.perf_counter()
        result = qk_study(model, [HEAD], items, QKConfig(baseline=baseline, batch_size=8))
        _attribution_figures(out, group, result)
        _fig(out, f"{group}.cost", [result.forwards, time.perf_counter() - start], f"{result.forwards} forwards")
    _earlier(out)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n-items", type=int, default=32, help="induction items (default 32)")
    p.add_argument("--out", type=Path, default=FIGURES, help=f"the folder the JSON goes to (default {FIGURES})")
    args = p.parse_args(argv)
    write_figures(
        args.out / "qk_smollm2.json",
        figures(args.n_items),
        model=MODEL,
        generated_by="python -m headscope.reports.tools.experiments.qk_figures",
        source=f"induction task, {args.n_items} items of seq_len 10, seed 0; head L18H6",
        quoted=QUOTED,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
