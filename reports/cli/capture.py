"""``headscope capture MODEL TEXT...``: run one capture and summarise what came out."""

from __future__ import annotations

import json
from pathlib import Path


def register(sub) -> None:
    from headscope.reports.cli.argtypes import add_backend, add_device, add_dtype, layer_list

    p = sub.add_parser("capture", help="capture Q/K/V/patterns for a few texts and summarise them")
    p.add_argument("model", nargs="?", default="minilm-l6")
    p.add_argument("texts", nargs="*", help="texts (default: two example sentences)")
    add_backend(p)
    add_dtype(p)
    add_device(p)
    p.add_argument(
        "--quantities",
        default="pattern,q,k,v,z",
        help="comma-separated: pattern,scores,q,k,v,q_rot,k_rot,z,out,resid_post",
    )
    p.add_argument(
        "--layers", type=layer_list, default=None, help="comma-separated layer indices, e.g. 0,2,5 (default: all)"
    )
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--export",
        metavar="FILE",
        default=None,
        help="write the first text's attention patterns to FILE as JSON (tokens, [layer][head][dest][src], kv_groups) "
        "for bertviz or CircuitsVis; adds 'pattern' to --quantities",
    )
    p.set_defaults(func=run)


EXAMPLES = [
    "The cat didn't climb on the table because it was too tired.",
    "Grouped-query attention lets several query heads share one key-value head.",
]


def capture_summary(cap) -> dict:
    """Per quantity: shape; per layer: mean pattern entropy (nats) and max weight."""
    mask = cap.key_mask
    out = {
        "tokens": cap.tokens.tokens,
        "word_ids": cap.tokens.word_ids,
        "shapes": {q: list(t.shape) for (q, l), t in cap.data.items() if l == cap.layers[0]},
        "kv_groups": {str(k): v for k, v in cap.kv_groups.items()},
        "layers": [],
    }
    if ("pattern", cap.layers[0]) in cap.data:
        for layer in cap.layers:
            p = cap["pattern", layer]  # [batch, head, query_pos, key_pos]
            ent = -(p.clamp_min(1e-12).log() * p).sum(-1)  # [batch, head, query_pos]
            rows = mask[:, None, :].expand_as(ent)
            out["layers"].append(
                {
                    "layer": layer,
                    "mean_entropy": round(float(ent[rows].mean()), 4),
                    "mean_max_weight": round(float(p.amax(-1)[rows].mean()), 4),
                }
            )
    return out


def _export_path(text: str) -> Path:
    """``--export FILE``: checked before the model loads, so a typo costs no time. Refused
    (one line): an empty FILE, a folder, a FIFO, a device, a socket, a missing folder, and
    an existing file that is not a headscope export (:func:`~headscope.probes.export.export_target`)."""
    from headscope.probes.export import export_target

    export_target(text, what="--export")
    return Path(text)


def run(args) -> int:
    from headscope.probes.capture import capture
    from headscope.probes.export import write_patterns_json
    from headscope.probes.models.backends.protocol import QUANTITIES
    from headscope.probes.models.card import model_card, render_card
    from headscope.reports.cli.argtypes import load_from_args, resolve_device

    device = resolve_device(args.device)
    export = _export_path(args.export) if args.export is not None else None
    quantities = [q.strip() for q in args.quantities.split(",") if q.strip()]
    bad = [q for q in quantities if q not in QUANTITIES] or ([] if quantities else [args.quantities])
    if bad:  # before the model loads
        raise ValueError(f"--quantities: unknown quantity {bad[0]!r}; choose from {','.join(QUANTITIES)}")
    if export is not None and "pattern" not in quantities:
        quantities.append("pattern")
    model = load_from_args(args, device)
    layers = list(args.layers) if args.layers else None
    past = [layer for layer in layers or () if layer >= model.spec.n_layers]
    if past:
        raise ValueError(f"--layers: {model.spec.name} has layers 0..{model.spec.n_layers - 1}; got layer {past[0]}")
    cap = capture(model, args.texts or EXAMPLES, quantities=quantities, layers=layers)
    if export is not None:
        write_patterns_json(cap, export, item=0, tokenizer=model.tokenizer)
    s = capture_summary(cap)
    if args.json:
        print(json.dumps(s, indent=2))
        return 0
    print(render_card(model_card(args.model)))
    print()
    print(
        f"captured {len(cap.tokens.texts)} texts, padded to {cap.tokens.shape[1]} tokens ({model.spec.backend} backend)"
    )
    for q, shape in s["shapes"].items():
        if q != "output":
            print(f"  {q:<10} {shape}")
    if model.spec.n_kv_heads != model.spec.n_heads:
        print("  KV groups: " + "; ".join(f"KV {k} <- heads {v}" for k, v in s["kv_groups"].items()))
    for row in s["layers"]:
        print(
            f"  layer {row['layer']:>2}: mean entropy {row['mean_entropy']:.3f} nats, mean max weight {row['mean_max_weight']:.3f}"
        )
    if export is not None:
        print(
            f"wrote the first text's patterns to {export} (bertviz / CircuitsVis input; see docs/guide/python-api.md)"
        )
    return 0
