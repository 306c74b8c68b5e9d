"""``headscope card MODEL``: the model's spec sheet, read from its config alone."""

from __future__ import annotations

import json


def register(sub) -> None:
    from headscope.reports.cli.argtypes import MAX_CONTEXT, int_in

    p = sub.add_parser(
        "card",
        help="spec sheet of a model from its config or GGUF metadata (heads, KV heads, GQA, sliding window, KV cache)",
    )
    p.add_argument(
        "model", nargs="?", default="minilm-l6", help="shipped name, directory, .gguf, config.json or hub id"
    )
    p.add_argument(
        "--context",
        type=int_in(1, MAX_CONTEXT, "tokens of context"),
        default=None,
        help="context length for the KV-cache figure (default: the model's)",
    )
    p.add_argument("--dtype", default="fp32", help="fp32, bf16, fp16, int8 (bytes per cached value)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from headscope.probes.models.card import model_card, render_card

    card = model_card(args.model, context=args.context, dtype=args.dtype)
    print(json.dumps(card, indent=2) if args.json else render_card(card))
    return 0
