"""The long-context roles: planted truth (retrieval labels exactly the copy head, streaming
exactly the local-window head, no sink), chunked statistics equal to stored patterns, the
fallback of a backend without Q and K, and the skip on an encoder."""

from __future__ import annotations

import pandas as pd
import pytest

from headscope.analyses.longctx.config import LongContextConfig
from headscope.analyses.longctx.needle import needle_items
from headscope.analyses.longctx.passes import item_pass
from headscope.analyses.longctx.roles import LONG_COLUMNS, long_context_roles
from headscope.analyses.roles.config import RolesConfig
from headscope.probes.models.inhouse.planted_long import COPY_HEAD, LOCAL_HEAD, planted_long_model

#: enough items for a p below alpha after BH over 8 heads (the sign-flip floor is 2**-16)
PLANTED = LongContextConfig(n_tokens=160, n_items=16, windows=(8, 32, 64))


@pytest.fixture(scope="module")
def planted_long():
    return planted_long_model()


@pytest.fixture(scope="module")
def planted_frame(planted_long):
    return long_context_roles(planted_long, PLANTED)


def _heads(frame, role, **where):
    f = frame[(frame["role"] == role) & frame["verdict"]]
    for k, v in where.items():
        f = f[f[k] == v]
    return sorted({(int(l), int(h)) for l, h in zip(f["layer"], f["head"])})


def test_planted_roles_label_exactly_the_copy_and_local_heads(planted_frame):
    f = planted_frame
    assert list(f.columns) == LONG_COLUMNS and f.attrs["pattern_statistics"] == "chunked (query chunk 128)"
    assert f.attrs["copy_accuracy"] == 1.0 and f.attrs["bos"] is True and f.attrs["n_tokens"] == 160
    assert _heads(f, "retrieval") == [COPY_HEAD]
    for w in PLANTED.windows:
        assert _heads(f, "streaming", window=w) == [LOCAL_HEAD]
    assert _heads(f, "sink") == [] and set(f[f["role"] == "sink"]["bos"]) == {True, False}
    copy = f[(f["role"] == "retrieval") & (f["layer"] == 1) & (f["head"] == 1)].iloc[0]
    assert copy["score"] == 1.0 and copy["baseline"] < 0.01 and copy["n"] == 16
    local = f[(f["role"] == "streaming") & (f["layer"] == 0) & (f["head"] == 0)]
    assert local["score"].min() > 1 - 1e-6  # all its mass within the 3 keys before the query


def test_chunked_statistics_equal_the_stored_patterns(planted_long):
    small = dict(n_tokens=240, n_items=3, windows=(8, 64), sink_bos_pass=False)
    chunked = long_context_roles(planted_long, LongContextConfig(**small, query_chunk=48))
    stored = long_context_roles(planted_long, LongContextConfig(**small, query_chunk=None))
    assert stored.attrs["pattern_statistics"] == "materialised (query chunks off; one forward per layer)"
    num = ["score", "baseline", "top_key_mass"]
    pd.testing.assert_frame_equal(stored[num], chunked[num], atol=1e-6, rtol=0)
    rest = [c for c in LONG_COLUMNS if c not in num + ["ci_low", "ci_high", "p_value", "p_raw", "margin"]]
    pd.testing.assert_frame_equal(stored[rest], chunked[rest])


def test_a_backend_without_q_and_k_falls_back_and_says_so(tmp_path):
    from headscope.probes.models.loading import load_model
    from tests.tiny_models import tiny_model_dir

    where = str(tiny_model_dir(tmp_path, "llama"))
    cfg = LongContextConfig(n_tokens=100, n_items=2, windows=(8,), needle_len=4, sink_bos_pass=False)
    inhouse, hf = (long_context_roles(load_model(where, b), cfg) for b in ("inhouse", "hf"))
    assert hf.attrs["pattern_statistics"].startswith("materialised (backend hf cannot hand over Q and K")
    assert inhouse.attrs["pattern_statistics"] == "chunked (query chunk 128)"
    pd.testing.assert_frame_equal(hf[["score", "baseline"]], inhouse[["score", "baseline"]], atol=1e-5, rtol=0)


def test_an_encoder_is_skipped_with_the_reason(tmp_path):
    from headscope.probes.models.loading import load_model
    from tests.tiny_models import tiny_model_dir

    f = long_context_roles(load_model(str(tiny_model_dir(tmp_path, "bert")), "inhouse"))
    assert f.empty and list(f.columns) == LONG_COLUMNS
    assert "need a causal decoder" in f.attrs["skipped"] and "encoder" in f.attrs["skipped"]


def test_a_global_family_corrects_across_every_row(planted_long):
    cfg = LongContextConfig(
        n_tokens=160, n_items=16, windows=(8,), sink_bos_pass=False, stats=RolesConfig(family="global")
    )
    f = long_context_roles(planted_long, cfg)
    assert set(f["family"]) == {"global"} and _heads(f, "retrieval") == [COPY_HEAD]
    assert _heads(f, "streaming") == [LOCAL_HEAD]


def test_the_pieces_never_hold_more_than_a_chunk_of_query_rows(planted_long):
    item = needle_items(planted_long.tokenizer, 300, 1)[0]
    p = item_pass(planted_long, item, chunk=32)
    shapes = [tuple(pc.pattern.shape) for pc in p.pieces()]
    assert max(s[2] for s in shapes) <= 32 and {s[3] for s in shapes} == {300} and len(shapes) == 2 * 10


def test_a_window_as_long_as_the_items_holds_all_the_mass(planted_long):
    # sink + window >= the item length: every key is in the window (score 1, as the uniform baseline's), no
    # head is streaming there; a window shorter than the items keeps its own rows unchanged
    cfg = LongContextConfig(n_tokens=100, n_items=2, windows=(8, 100, 500), needle_len=4, sink_bos_pass=False)
    f = long_context_roles(planted_long, cfg)
    s = f[f["role"] == "streaming"]
    n = f.attrs["n_tokens"]
    for w in (100, 500):
        assert cfg.sink_tokens + w >= n
        rows = s[s["window"] == w]
        assert len(rows) == len(s[s["window"] == 8]) and (rows["score"] == 1.0).all()
        assert (rows["baseline"] == 1.0).all() and not rows["verdict"].any()
    short = long_context_roles(
        planted_long, LongContextConfig(**{**cfg.to_dict(), "windows": (8,), "stats": cfg.stats})
    )
    got = s[s["window"] == 8].reset_index(drop=True)
    want = short[short["role"] == "streaming"].reset_index(drop=True)
    pd.testing.assert_frame_equal(
        got[["layer", "head", "score", "baseline"]], want[["layer", "head", "score", "baseline"]]
    )
