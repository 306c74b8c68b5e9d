"""A corpus streamed in interleaved parts (:func:`~headscope.probes.capture.in_part`, what a sharded
run's workers do) cuts the whole run's batches: the parts' per-item values are the whole run's
floats, their reducers and reports merge to the whole run's."""

from __future__ import annotations

import torch

from headscope.analyses.roles.pattern_stats import ItemValues
from headscope.data import path
from headscope.probes.capture import merge_reports, stream
from headscope.reports.tools.bench.reducers import AttentionMassReducer


class _PerItem:
    """Each item's mean attention on the first key, per head: ``[n_items, layer, head]`` by item id."""

    def __init__(self):
        self.values = ItemValues()

    def update(self, cap):
        rows = cap.key_mask.float()  # [batch, query_pos]
        first = torch.stack([cap["pattern", l][..., 0] for l in cap.layers], 1)  # [batch, layer, head, query_pos]
        self.values.add("first", cap.item_ids, (first * rows[:, None, None]).sum(-1) / rows.sum(-1)[:, None, None])

    def merge(self, other):
        self.values.merge(other.values)
        return self


def test_interleaved_parts_merge_to_the_whole_stream(minilm):
    items = [l for l in path("text/sentences.txt").read_text(encoding="utf-8").splitlines() if l.strip()][:30]
    items.insert(17, "   ")  # an empty item: skipped and counted once, by its corpus-wide index
    whole, per = AttentionMassReducer(), _PerItem()
    rep = stream(minilm, items, [whole, per], batch_size=4)
    parts = []
    for k in range(3):
        r = (AttentionMassReducer(), _PerItem())
        parts.append((r, stream(minilm, items, list(r), batch_size=4, part=(k, 3))))
    assert [p[1].n_batches for p in parts] == [3, 3, 2] and rep.n_batches == 8
    merged = merge_reports([p[1] for p in parts])
    assert (merged.n_items, merged.n_used, merged.n_batches) == (rep.n_items, rep.n_used, rep.n_batches) == (31, 30, 8)
    assert (merged.real_tokens, merged.padded_tokens) == (rep.real_tokens, rep.padded_tokens)
    assert merged.skipped_items == rep.skipped_items == [(17, "empty")]
    mass, values = parts[0][0]
    for (m, v), _ in parts[1:]:
        mass, values = mass.merge(m), values.merge(v)
    ids, got = values.values.get("first")
    want_ids, want = per.values.get("first")
    assert ids == want_ids and torch.equal(got, want)  # the same batches: the same floats
    ref = whole.result()
    assert (mass.result()["value"] - ref["value"]).abs().max() < 1e-12  # float64 sums added in another order
    # and the numbers are MiniLM's: some heads put much more of their mass on [CLS] than others
    first = ref[ref.metric == "first_token_mass"]["value"]
    assert first.max() - first.min() > 0.3
