"""Patterns recomputed per query chunk from Q and K (probes/chunked.py) equal the patterns the
in-house forward stores, on every in-house family (tests/tiny_models.py PARITY: sliding windows
shorter than the input, Gemma 2's soft cap and query scale, MQA/GQA, QK-norm, encoders with
padding), for chunks of 1, 7 and more rows than the input; the forward run in chunks gives the
same output; a backend that cannot hand over Q and K keeps stored patterns and says so."""

from __future__ import annotations

import pytest
import torch

from headscope.probes.capture import stream
from headscope.probes.chunked import ChunkSource, chunk_support, mode_line, query_chunks
from headscope.probes.models.inhouse.attention import additive_mask, allowed_rows, query_spans
from tests.chunk_cases import CASES, CHUNKS, PieceShapes, chunk_batch, chunked_capture, family_model


@pytest.fixture(scope="module", params=CASES)
def family(request):
    model, encoder = family_model(request.param)
    return request.param, model, encoder


def test_pieces_equal_the_stored_pattern_on_every_family(family):
    case, model, encoder = family
    batch = chunk_batch(model.vocab_size, 1, encoder=encoder)
    stored = model.run(batch, ["pattern"])
    real = batch.attention_mask.bool()
    for chunk in CHUNKS:
        cap = chunked_capture(model, batch, chunk)
        assert not any(q == "pattern" for q, _ in cap.data), "a chunked capture stores no pattern"
        out = (cap.output - stored["output", None])[real].abs().max().item()
        # the forward multiplies at least 16 rows at a time (MIN_FORWARD_CHUNK): measured 0 here
        assert out <= 1e-6, f"{case}: the forward in chunks of {chunk} moved the output by {out:.2e}"
        for layer in cap.layers:
            pieces = list(cap.pattern_pieces(layer))
            assert all(p.stop - p.start <= chunk for p in pieces)
            got = torch.cat([p.pattern for p in pieces], 2)
            d = (got - stored["pattern", layer]).abs().amax(dim=(1, 3))[real].max().item()
            assert d <= 1e-6, f"{case} layer {layer}, chunk {chunk}: pattern differs by {d:.2e}"


def test_one_piece_is_the_stored_pattern_bit_for_bit(family):
    """A chunk at least as long as the input recomputes exactly the softmax the forward ran
    (the same function on the same Q and K): the shipped models' figures stay bit-equal."""
    _, model, encoder = family
    batch = chunk_batch(model.vocab_size, 1, encoder=encoder)
    stored = model.run(batch, ["pattern"])
    cap = chunked_capture(model, batch, 64)
    for layer in cap.layers:
        (piece,) = cap.pattern_pieces(layer)
        assert torch.equal(piece.pattern, stored["pattern", layer])
    assert torch.equal(cap.output, stored["output", None])


@pytest.mark.parametrize("causal,window", [(True, None), (True, 3), (False, None)])
def test_allowed_rows_are_the_additive_masks_rows(causal, window):
    km = torch.tensor([[1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1]])
    full = additive_mask(km, causal, window=window)[:, 0] == 0
    for s, e in ((0, 7), (0, 1), (2, 5), (6, 7)):
        assert torch.equal(allowed_rows(km, causal, s, e, window), full[:, s:e])


def test_query_chunks_restores_the_setting_and_refuses_a_bad_chunk(family):
    _, model, _ = family
    with pytest.raises(RuntimeError), query_chunks(model, 5):
        assert {b.attn.query_chunk for b in model.network.blocks} == {5}
        raise RuntimeError("inside")
    assert {b.attn.query_chunk for b in model.network.blocks} == {None}
    with pytest.raises(ValueError, match="positive int"), query_chunks(model, 0):
        pass


def test_stream_hands_over_pieces_of_at_most_one_chunk(minilm, sentences):
    red = PieceShapes()
    report = stream(minilm, sentences[:6], [red], batch_size=3, query_chunk=4)
    assert report.patterns == "chunked (query chunk 4)"
    n_layers = minilm.spec.n_layers
    assert red.shapes and all(stop - start <= 4 and shape[2] == stop - start for _, start, stop, shape in red.shapes)
    assert {layer for layer, *_ in red.shapes} == set(range(n_layers))
    off = stream(minilm, sentences[:2], [PieceShapes()], batch_size=3)
    assert off.patterns == "materialised (query chunks off)"


def test_a_backend_without_q_and_k_keeps_stored_patterns_and_says_so(minilm_hf, sentences):
    assert chunk_support(minilm_hf) == "backend hf cannot hand over Q and K"
    assert mode_line(minilm_hf, 128) == "materialised (backend hf cannot hand over Q and K)"
    red = PieceShapes()
    report = stream(minilm_hf, sentences[:2], [red], query_chunk=128)
    assert report.patterns == "materialised (backend hf cannot hand over Q and K)"
    n = max(len(minilm_hf.tokenizer(s)["input_ids"]) for s in sentences[:2])
    assert all(start == 0 and shape[2] == stop for _, start, stop, shape in red.shapes) and red.shapes
    assert max(stop for _, _, stop, _ in red.shapes) == n


def test_a_reducer_without_pieces_keeps_stored_patterns(minilm, sentences):
    class Whole:
        def __init__(self):
            self.n = 0

        def update(self, cap):
            self.n += int(cap["pattern", 0].shape[0])

    whole = Whole()
    report = stream(minilm, sentences[:3], [whole, PieceShapes()], query_chunk=8)
    assert whole.n == 3 and report.patterns == "materialised (Whole needs stored patterns)"


def test_chunk_source_reads_the_layers_rules(family):
    case, model, _ = family
    src = ChunkSource.of(model, 7)
    net = model.network
    for layer, block in enumerate(net.blocks):
        rule = src.rules[layer]
        assert rule.window == block.window and rule.causal == net.cfg.causal
        assert rule.softcap == block.attn.softcap and rule.scale == block.attn.scale
    if case == "gemma2":
        assert src.rules[0].softcap is not None and any(r.window for r in src.rules.values())


def test_query_spans_cover_every_row_without_a_short_tail():
    for n in (1, 5, 16, 17, 129, 300):
        for chunk in (1, 7, 16, 128):
            spans = query_spans(n, chunk)
            assert spans[0][0] == 0 and spans[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
            sizes = [e - s for s, e in spans]
            assert max(sizes) <= chunk and max(sizes) - min(sizes) <= 1 and len(spans) == -(-n // chunk)
