"""SmolLM2-135M's successor heads by the weights (``make successor-ov``): the ``successor:ov`` rows
(:mod:`headscope.analyses.roles.successor_ov`, Gould et al.'s effective OV circuit on each ordinal
token alone) beside the ``successor`` rows read on text, on the in-house backend and on the hf one.

``python -m headscope.reports.tools.experiments.successor_ov`` loads ``smollm2-135m`` on both backends,
runs the ``successor`` role (``RolesConfig()``, seed 0) and writes ``data/figures/successor_ov_smollm2.json``:
per backend the top heads by the weights score (share of hits, baseline, adjusted p, verdict), the
verdicts of both scores, and per ordinal set the tokens scored and its best head by the weights.
:func:`summary` of it is quoted in ``docs/guide/roles.md``
(``tests/analyses/roles/test_successor_ov.py`` checks it).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

log = logging.getLogger(__name__)

FIGURES = Path(__file__).resolve().parents[3] / "data" / "figures"
OUT = FIGURES / "successor_ov_smollm2.json"
MODEL = "smollm2-135m"
TOP = 5


def _head(r) -> str:
    return f"L{int(r.layer)}H{int(r['head'])}"


def _top(frame, role: str, k: int) -> list[dict]:
    f = frame[frame.role == role].sort_values(["score", "layer", "head"], ascending=[False, True, True])
    return [
        {"head": _head(r), **{c: float(r[c]) for c in ("score", "baseline", "p_value")}, "verdict": bool(r.verdict)}
        for _, r in f.head(k).iterrows()
    ]


def per_set(model) -> dict:
    """Per ordinal set: tokens scored, members, and the best head by the weights score on that set alone."""
    from headscope.analyses.roles import successor_ov as ov
    from headscope.analyses.roles.successor import ORDINAL_SETS

    layers = list(range(model.spec.n_layers))
    out = {}
    for name, words in ORDINAL_SETS.items():
        chain = ov.chains(model.tokenizer, {name: words})
        if not chain:
            out[name] = {"tokens": 0, "members": 0}
            continue
        hits, _, tokens = ov.ov_hits(model, chain, layers)
        share = hits.mean(0)  # [layer, head]
        best = int(share.flatten().argmax())
        l, h = divmod(best, model.spec.n_heads)
        out[name] = {
            "tokens": len(tokens),
            "members": len(chain[0][0]),
            "best": f"L{l}H{h}",
            "score": float(share[l, h]),
        }
    return out


def measure(backend: str) -> dict:
    from headscope.analyses.roles.config import RolesConfig
    from headscope.analyses.roles.pipeline import run_role
    from headscope.probes.models.loading import load_model

    model = load_model(MODEL, backend)
    t0 = time.process_time()
    out = run_role("successor", model, None, RolesConfig())
    cpu = time.process_time() - t0
    f = out.frame
    return {
        "cpu_seconds": cpu,
        "notes": out.extra.get("notes", []),
        "tokens": int(f[f.role == "successor:ov"].n.max()),
        "verdicts": {role: int(f[f.role == role].verdict.sum()) for role in ("successor:ov", "successor")},
        "top_ov": _top(f, "successor:ov", TOP),
        "top_text": _top(f, "successor", TOP),
        "per_set": per_set(model),
    }


def summary(data: dict) -> str:
    """The docs' paragraph of the figures."""
    d = data["inhouse"]
    tops = "; ".join(f"{t['head']} {t['score']:.2f}" for t in d["top_ov"])
    sets = "; ".join(
        f"{n} {s['tokens']} tokens of {s['members']} members, best {s['best']} {s['score']:.2f}"
        for n, s in d["per_set"].items()
        if s["tokens"]
    )
    hf = ", ".join(t["head"] for t in data["hf"]["top_ov"][:3])
    b = d["top_ov"][0]
    return (
        f"On SmolLM2-135M the weights score reads {d['tokens']} ordinal tokens; the top heads (share of hits, "
        f"baseline {b['baseline']:.3f}): {tops}; {d['verdicts']['successor:ov']} verdicts "
        f"(the text score: {d['verdicts']['successor']}). Per set: {sets}. On the hf backend, whose W_U "
        f"carries no final-norm scale, the top three are {hf}."
    )


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    data = {"model": MODEL, "seed": 0, "inhouse": measure("inhouse"), "hf": measure("hf")}
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    log.info("wrote %s\n%s", args.out, summary(data))


if __name__ == "__main__":
    main()
