"""The example of docs/guide/checkpoints.md, regenerated: ``headscope report`` on a folder of two
MiniLM checkpoints (the second with a planted difference) and a random model of another size.

:func:`write_example_checkpoints` writes, under a folder, what a training run leaves:
``out/checkpoint-100`` (MiniLM-L6 re-saved with ``save_pretrained``), ``out/checkpoint-200`` (the
same with the attention output W_O of heads :data:`PLANTED` zeroed, so those heads write nothing)
and ``tiny`` (a random 3-layer, 4-head BERT with MiniLM's tokenizer). :func:`main` runs the command
the page shows on them, with the report's default (quick) stage settings, ``--only roles,pruning``,
and writes ``data/figures/checkpoints_minilm.json`` (the figures the page quotes, checked by
tests/reports/test_checkpoints.py) and the two comparison figures into ``docs/_static/``.

``python -m headscope.reports.tools.experiments.checkpoint_figures`` (``make checkpoints``, a few
minutes on one core).
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[3]
log = logging.getLogger(__name__)
OUT = ROOT / "data" / "figures" / "checkpoints_minilm.json"
STATIC = ROOT / "docs" / "_static"
#: heads whose W_O is zeroed in checkpoint-200
PLANTED = ((1, 3), (4, 7))
#: the random model of another size
TINY = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=128)


def write_example_checkpoints(root: Path) -> Path:
    """``root/out/checkpoint-{100,200}`` and ``root/tiny`` (see the module); returns ``root``."""
    import torch
    from transformers import AutoModel, AutoTokenizer, BertConfig, BertModel

    from headscope.probes.models.checkpoints import resolve

    src = resolve("minilm-l6").path
    model, tok = AutoModel.from_pretrained(src), AutoTokenizer.from_pretrained(src)
    for step in (100, 200):
        if step == 200:
            d = model.config.hidden_size // model.config.num_attention_heads
            with torch.no_grad():
                for layer, head in PLANTED:
                    model.encoder.layer[layer].attention.output.dense.weight[:, head * d : (head + 1) * d] = 0
        model.save_pretrained(root / "out" / f"checkpoint-{step}")
        tok.save_pretrained(root / "out" / f"checkpoint-{step}")
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=tok.vocab_size, **TINY)).save_pretrained(root / "tiny")
    tok.save_pretrained(root / "tiny")
    return root


def _fig(value, text: str) -> dict:
    return {"value": value, "text": text}


def figures(out: Path, seconds: float) -> dict:
    """The page's figures from the comparison folder ``out``."""
    t = {n: pd.read_parquet(out / "tables" / f"{n}.parquet") for n in ("checkpoint_heads", "checkpoint_role_changes")}
    heads = t["checkpoint_heads"].drop_duplicates(["checkpoint", "layer", "head"])
    imp = heads.set_index(["checkpoint", "layer", "head"])["importance"]
    planted = {}
    for layer, head in PLANTED:
        a, b = float(imp[("checkpoint-100", layer, head)]), float(imp[("checkpoint-200", layer, head)])
        planted[f"L{layer}H{head}"] = _fig([a, b], f"| L{layer}H{head} | {a:.4f} | {b:.4f} |")
    zero = heads[heads["importance"] == 0]
    names = ", ".join(f"{r.checkpoint} L{r.layer}H{r.head}" for r in zero.itertuples()) or "none"
    planted["zero"] = _fig(len(zero), f"heads of importance 0, over every checkpoint: {names}")
    rc = t["checkpoint_role_changes"]
    moved = rc.groupby("layer")["delta"].apply(lambda s: float(s.abs().max()))
    upstream, downstream = float(moved[[0, 1]].max()), float(moved[[2, 3, 4, 5]].min())
    held = t["checkpoint_heads"].groupby("checkpoint")["verdict"].sum()
    tiny = heads[heads["checkpoint"] == "tiny"].drop_duplicates("layer").set_index("layer")["matched_layer"]
    return {
        "figures": {
            "planted": planted,
            "roles": {
                "upstream": _fig(upstream, f"the largest change of a role score in layers 0-1 is {upstream:.3g}"),
                "downstream": _fig(
                    downstream, f"every layer from 2 to 5 has a role score that moved by {downstream:.3f} or more"
                ),
                "held": _fig(
                    {k: int(v) for k, v in held.items()},
                    "heads × roles held: " + ", ".join(f"{k} {int(held[k])}" for k in sorted(held.index)),
                ),
            },
            "matching": {
                "tiny": _fig(
                    {int(k): int(v) for k, v in tiny.items()},
                    "tiny layers 0, 1, 2 → reference layers " + ", ".join(str(int(v)) for v in tiny.tolist()),
                )
            },
            "run": {"seconds": _fig(round(seconds), f"{round(seconds)} s")},
        },
        "quoted": [
            "planted.L1H3",
            "planted.L4H7",
            "planted.zero",
            "roles.upstream",
            "roles.downstream",
            "roles.held",
            "matching.tiny",
        ],
    }


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with tempfile.TemporaryDirectory() as tmp:
        root = write_example_checkpoints(Path(tmp))
        out = root / "compared"
        t0 = time.perf_counter()
        argv = [
            "report",
            str(root / "out"),
            str(root / "tiny"),
            "--only",
            "roles,pruning",
            "--quiet",
            "--out",
            str(out),
        ]
        code = subprocess.run([sys.executable, "-m", "headscope.reports.cli", *argv], check=False).returncode
        seconds = time.perf_counter() - t0
        if code != 0:
            raise SystemExit(f"headscope {' '.join(argv)} exited {code}")
        doc = {"command": "headscope report out/ tiny/ --only roles,pruning", **figures(out, seconds)}
        OUT.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        for name in ("role_emergence", "importance_by_step"):
            shutil.copyfile(out / "figures" / f"{name}.png", STATIC / f"checkpoints_{name}.png")
        log.info("%s", (out / "comparison.md").read_text(encoding="utf-8")[:3000])
    log.info("wrote %s", OUT)


if __name__ == "__main__":
    main()
