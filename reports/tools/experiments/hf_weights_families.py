"""Which text families of the installed transformers have per-head weights on the hf backend: for each,
the sweep's tiny random model (:func:`~headscope.reports.tools.sweep.tiny_config.save_tiny`) loaded on
the hf backend and its weights read and checked against its forward
(:func:`~headscope.probes.models.weights_provider.model_weights`).

``python -m headscope.reports.tools.experiments.hf_weights_families`` (``make weights-families``;
``--families a,b``: those alone, merged into the file) writes ``data/figures/hf_weights_families.json``:
per family ``status`` (``pass``; ``refused``: the weights' reason; ``no model``: the tiny model does
not build or load on hf, so no stage of the sweep runs there either), ``layout``, ``positions``, what the
matrices hold ``frozen`` at the forward's values (norm scales, output gates), the worst relative
``errors`` per part and ``reason``; ``counts`` per status. One core, a few seconds a family.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import signal
import tempfile
import time
from pathlib import Path

OUT = Path(__file__).resolve().parents[3] / "data" / "figures" / "hf_weights_families.json"
#: seconds one family may take (build, load, check)
TIMEOUT_S = 120


def _line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300] if text else ''}"


def _alarm(signum, frame):
    raise TimeoutError(f"over {TIMEOUT_S} s")


def check_family(model_type: str, root: Path) -> dict:
    """One family's row (see the module doc)."""
    from headscope.probes.models.loading import load_model
    from headscope.probes.models.weights_provider import model_weights, weights_refusal
    from headscope.reports.tools.sweep.tiny_config import save_tiny

    try:
        with contextlib.redirect_stderr(io.StringIO()):
            _, folder = save_tiny(model_type, root / model_type)
            model = load_model(str(folder), backend="hf")
            model.layout  # noqa: B018 - the capture layout the weights start from
    except Exception as e:  # noqa: BLE001 - a family with no hf model: no stage of the sweep runs there
        return {"status": "no model", "reason": _line(e)}
    why = weights_refusal(model)
    if why is not None:
        return {"status": "refused", "reason": why[:400]}
    w = model_weights(model)
    return {
        "status": "pass",
        "layout": w.check["layout"],
        "positions": w.positions,
        "norm": w.norm,
        "frozen": list(getattr(w, "frozen", [])),
        "errors": {k: float(f"{v:.3g}") for k, v in w.check["errors"].items()},
    }


def run(families: list[str]) -> dict[str, dict]:
    """``{family: row}`` for ``families``, each under :data:`TIMEOUT_S`."""
    import torch

    torch.set_num_threads(1)
    rows = {}
    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        for ft in families:
            t0 = time.perf_counter()
            with tempfile.TemporaryDirectory() as tmp:
                signal.alarm(TIMEOUT_S)
                try:
                    rows[ft] = check_family(ft, Path(tmp))
                except Exception as e:  # noqa: BLE001 - one family never stops the others
                    rows[ft] = {"status": "refused", "reason": _line(e)}
                finally:
                    signal.alarm(0)
            rows[ft]["seconds"] = round(time.perf_counter() - t0, 1)
    finally:
        signal.signal(signal.SIGALRM, old)
    return rows


def main(argv=None) -> int:
    import transformers

    from headscope.reports.tools.sweep.tiny_config import text_families

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", help="comma-separated model types (default: every text family)")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    text = sorted(ft for ft, (kind, _) in text_families().items() if kind is not None)
    chosen = args.families.split(",") if args.families else text
    old = json.loads(args.out.read_text()) if args.families and args.out.exists() else {}
    rows = {**old.get("families", {}), **run(chosen)}
    counts: dict[str, int] = {}
    for row in rows.values():
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    result = {
        "transformers": transformers.__version__,
        "text_families": len(text),
        "checked": len(rows),
        "counts": dict(sorted(counts.items())),
        "families": dict(sorted(rows.items())),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
