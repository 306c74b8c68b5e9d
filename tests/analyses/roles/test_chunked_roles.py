"""Every role statistic reduced from pattern pieces (Q and K, recomputed per query chunk)
equals the one reduced from stored patterns within 1e-6, on every in-house family (sliding
windows shorter than the input, Gemma 2's soft cap, padding), for chunks of 1, 7 and more rows
than the input; the whole roles run on MiniLM gives the same tables chunked and stored; the
planted heads are recovered in chunks of 3; run.json says which path ran."""

from __future__ import annotations

import json
from collections import Counter
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from headscope.analyses.roles.clustering import JSReducer
from headscope.analyses.roles.config import RolesConfig
from headscope.analyses.roles.coreference import CorefReducer
from headscope.analyses.roles.induction import InductionReducer
from headscope.analyses.roles.pattern_stats import SummaryReducer
from headscope.analyses.roles.pipeline import head_roles, run_role
from headscope.analyses.roles.positional import PositionalReducer
from headscope.analyses.roles.rareword import RareWordReducer
from headscope.analyses.roles.special import SpecialReducer
from headscope.analyses.roles.syntactic import SyntacticReducer
from headscope.analyses.roles.wordlevel import WordRows, pooling_matrices, word_patterns
from headscope.probes.capture import feed
from headscope.probes.corpora.conllu import read_conllu
from headscope.probes.corpora.coref import read_coref
from headscope.probes.models.inhouse.planted import planted_model, planted_sentences
from headscope.reports.cli.app import main
from tests.chunk_cases import CASES, CHUNKS, chunk_batch, chunked_capture, family_model, stored_capture

TOL = 1e-6


def reducers(model, batch) -> dict:
    """One of every role reducer (both induction variants; every JS row), for ``batch``."""
    spec, causal = model.spec, model.spec.causal
    n = batch.input_ids.shape[0]
    sentences = [SimpleNamespace(heads=[-1, *range(len(w) - 1)], relations=["dep"] * len(w)) for w in batch.words]
    items = [
        SimpleNamespace(pronoun=len(w) - 1, heads=(0, 1), antecedent=0, candidates=((0, 1), (1, 2)), kind="")
        for w in batch.words
    ]
    return {
        "summary": SummaryReducer(causal=causal, smoothing=0.1),
        "positional": PositionalReducer(causal=causal),
        "special": SpecialReducer(causal=causal, include_special=True),
        "rare-word": RareWordReducer(Counter(batch.input_ids[0].tolist()), causal=causal, vocab_size=model.vocab_size),
        "induction": InductionReducer(causal=causal),
        "induction-excl": InductionReducer(causal=causal, exclude_bos=True, exclude_current_token=True),
        "clustering": JSReducer(rows_per_item=None),
        "syntactic": SyntacticReducer(sentences, spec.n_layers, spec.n_heads),
        "coreference": CorefReducer(items[:n], spec.n_layers, spec.n_heads),
    }


def flat(x) -> list[torch.Tensor]:
    """Every number of a reducer's result, as float tensors in a fixed order."""
    if isinstance(x, torch.Tensor):
        return [x.double()]
    if isinstance(x, pd.DataFrame):
        return [torch.tensor(x.select_dtypes("number").to_numpy(float))]
    if isinstance(x, dict):
        return [t for k in sorted(x) for t in flat(x[k])]
    if isinstance(x, (tuple, list)):
        return [t for v in x for t in flat(v)]
    if hasattr(x, "__dataclass_fields__"):
        return [t for k in x.__dataclass_fields__ for t in flat(getattr(x, k))]
    return []


@pytest.fixture(scope="module", params=CASES)
def family(request):
    model, encoder = family_model(request.param)
    batch = chunk_batch(model.vocab_size, 1, encoder=encoder)
    ref = reducers(model, batch)
    feed(stored_capture(model, batch), list(ref.values()))
    return request.param, model, batch, {k: flat(r.result()) for k, r in ref.items()}


@pytest.mark.parametrize("chunk", CHUNKS)
def test_every_statistic_chunked_equals_stored(family, chunk):
    case, model, batch, ref = family
    red = reducers(model, batch)
    cap = chunked_capture(model, batch, chunk, list(red.values()))
    assert cap.chunks is not None and not any(q == "pattern" for q, _ in cap.data)
    feed(cap, list(red.values()))
    for name, r in red.items():
        got = flat(r.result())
        assert len(got) == len(ref[name]) and got, name
        for g, e in zip(got, ref[name]):
            assert g.shape == e.shape, f"{case} {name}"
            assert torch.equal(g.isnan(), e.isnan()), f"{case} {name}: NaN cells differ"
            d = (g - e).nan_to_num().abs().max().item() if g.numel() else 0.0
            assert d <= TOL, f"{case} {name}, chunk {chunk}: differs by {d:.2e}"


def test_no_reducer_keeps_a_piece_alive(family):
    """What a reducer keeps of a piece is its own small tensor, never a view into the piece's
    pattern (which would keep every piece of every layer: the stored patterns again)."""
    case, model, batch, _ = family
    red = reducers(model, batch)
    feed(chunked_capture(model, batch, 7, list(red.values())), list(red.values()))
    kept = [
        (name, key, t)
        for name, r in red.items()
        if hasattr(r, "piece_rows")
        for key, ts in [*r.piece_rows.parts.items(), *((k, [b]) for k, b in r.piece_rows.buffers.items())]
        for t in ts
    ]
    assert kept
    for name, key, t in kept:
        assert t.untyped_storage().nbytes() == t.numel() * t.element_size(), f"{case} {name} {key}: a view"


@pytest.mark.parametrize("chunk", CHUNKS)
def test_word_patterns_from_pieces_equal_the_stored_ones(family, chunk):
    """The per-edge lookups of syntactic and coreference read word patterns: pooled from pieces
    they equal the word patterns of the stored patterns."""
    case, model, batch, _ = family
    stored = stored_capture(model, batch)
    pool = pooling_matrices(batch)
    expected = word_patterns(stored.stack("pattern"), pool)
    rows = WordRows(pool)
    cap = chunked_capture(model, batch, chunk)
    for layer in cap.layers:
        for piece in cap.pattern_pieces(layer):
            rows.add(piece)
    d = (rows.word_patterns(cap.layers) - expected).abs().max().item()
    assert d <= TOL, f"{case}, chunk {chunk}: word patterns differ by {d:.2e}"


def test_shipped_minilm_tables_are_the_same_chunked_and_stored(minilm, sentences):
    """Items longer than the chunk (chunks of 5 rows) give MiniLM's roles tables within 1e-6 of
    stored patterns; chunks longer than every item give them bit for bit."""
    groups = ("summary", "positional", "special", "rare-word", "clustering", "syntactic", "coreference")
    syntax = read_conllu("data/syntax/handwritten.conllu").sentences[:16]
    coref = list(read_coref("data/coref/coref.jsonl"))[:24]
    run = {
        q: head_roles(
            minilm,
            text=sentences[:16],
            conllu=syntax,
            coref=coref,
            roles=groups,
            cfg=RolesConfig(n_boot=20, n_perm=20, query_chunk=q, min_instances=1),
            examples=False,
        )
        for q in (None, 5, 512)
    }
    assert set(run[None].pattern_statistics.values()) == {"materialised (query chunks off)"}
    assert set(run[5].pattern_statistics.values()) == {"chunked (query chunk 5)"}
    assert len(run[None].frame) and len(run[None].coref_pairs) and len(run[None].clusters)
    for q in (5, 512):
        for name in ("frame", "stats", "clusters", "coref_pairs"):
            a, b = getattr(run[None], name), getattr(run[q], name)
            if q == 512:
                assert a.equals(b), name
            else:
                pd.testing.assert_frame_equal(a, b, check_exact=False, rtol=0, atol=TOL)


def test_planted_heads_are_recovered_in_chunks_of_three():
    model = planted_model(causal=True)
    cfg = RolesConfig(n_boot=200, n_perm=500, query_chunk=3)
    res = head_roles(
        model, text=planted_sentences(60, seed=0), roles=("positional", "special", "induction"), cfg=cfg, examples=False
    )
    assert set(res.pattern_statistics.values()) == {"chunked (query chunk 3)"}
    v = res.frame[res.frame["verdict"]]
    assert set(zip(v["layer"], v["head"], v["role"])) == {
        (0, 0, "positional:previous"),
        (0, 1, "positional:first"),
        (0, 1, "sink:first-token"),
        (0, 1, "special"),
        (1, 2, "punctuation"),
        (0, 0, "previous-token"),
        (1, 1, "induction"),
    }
    one = run_role("induction", model, cfg=RolesConfig(n_boot=200, n_perm=500, query_chunk=None))
    ind = res.outputs["induction"].frame
    pd.testing.assert_frame_equal(ind, one.frame, check_exact=False, rtol=0, atol=TOL)


def test_run_json_says_how_pattern_statistics_ran(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("The cat sat on the mat.\nA dog ran home.\n", encoding="utf-8")
    out = tmp_path / "r"
    assert main(["roles", "minilm-l6", "--roles", "summary", "--text", str(text), "--out", str(out), "--quiet"]) == 0
    doc = json.loads((out / "run.json").read_text(encoding="utf-8"))
    assert doc["pattern_statistics"] == {"text": "chunked (query chunk 128)"}
    assert doc["config"]["query_chunk"] == 128
