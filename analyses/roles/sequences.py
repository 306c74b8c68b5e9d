"""Role items that are token-id sequences the role wrote itself (successor, copy suppression):
captured whole, ``cfg.batch_size`` at a time, without text, words or offsets.

An item needs ``ids`` (token ids) and ``special`` (one flag per id). :func:`feed_sequences` is
a role's ``feed``: it runs the model over ``ctx.items`` in order, fills the reducers, counts
real and padded tokens, and reports progress in items, as the text corpora's capture does.
"""

from __future__ import annotations

from headscope.probes.capture import Capture, StreamReport, check_finite, in_part, on_model_device, run_batch
from headscope.probes.capture import feed as feed_capture
from headscope.probes.tokens import collate, pad_id


def capture_sequences(model, items, item_ids, kinds: tuple[str, ...]) -> Capture:
    """One padded batch of ``items`` through every layer of ``model``, keeping ``kinds``
    (e.g. ``("z",)`` or ``("z", "pattern")``), its rows named by ``item_ids``."""
    tok = model.tokenizer
    rows = [
        {
            "ids": list(it.ids),
            "text": "",
            "words": [],
            "tokens": tok.convert_ids_to_tokens(list(it.ids)),
            "offsets": [(0, 0)] * len(it.ids),
            "word_ids": [None] * len(it.ids),
            "special": list(it.special),
        }
        for it in items
    ]
    batch = on_model_device(collate(rows, pad_id(tok)), model)
    layers = tuple(range(model.spec.n_layers))
    cap = Capture(tokens=batch, data=run_batch(model, batch, kinds, layers, None), layers=layers, spec=model.spec)
    cap.item_ids = list(item_ids)
    check_finite(cap)
    return cap


def feed_sequences(ctx, reducers, progress=None, *, kinds: tuple[str, ...] = ("z",)) -> StreamReport:
    """Run ``ctx.model`` over ``ctx.items``, ``ctx.cfg.batch_size`` at a time, into ``reducers``
    (under ``ctx.part``, a sharded run's, only its batches: :func:`~headscope.probes.capture.in_part`);
    ``progress(done, total)`` counts items."""
    items, size = ctx.items, ctx.cfg.batch_size
    starts = [s for b, s in enumerate(range(0, len(items), size)) if in_part(ctx.part, b)]  # a sharded run's part
    ends = [min(s + size, len(items)) for s in starts]
    report = StreamReport(n_items=len(items), n_used=sum(e - s for s, e in zip(starts, ends)), n_batches=len(starts))
    report.real_tokens = sum(len(it.ids) for s, e in zip(starts, ends) for it in items[s:e])
    for s, e in zip(starts, ends):
        feed_capture(capture_sequences(ctx.model, items[s:e], range(s, e), kinds), reducers)
        report.padded_tokens += max(len(it.ids) for it in items[s:e]) * (e - s) - sum(len(it.ids) for it in items[s:e])
        if progress is not None:
            progress(e, len(items))
    return report
