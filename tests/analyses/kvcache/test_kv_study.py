"""The KV-cache compression study: its arithmetic, its greedy choice on a known evaluator, the
planted model's truth (the study keeps exactly the copy head's cache), and ``headscope kv``."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from headscope.analyses.kvcache.bytes import group_bytes, groups_bytes
from headscope.analyses.kvcache.study import COLUMNS, KVConfig, curve_frame, kept_groups, kv_study, savings_at
from headscope.probes.models.card import kv_cache_bytes
from headscope.probes.models.spec import ArchSpec

GROUPS = [(l, g) for l in range(3) for g in range(2)]
NEEDED = (1, 0)  # the one group whose restriction breaks the known evaluator


def _known_evaluate(windows: dict) -> dict:
    """LM loss 2.0 unrestricted; +0.5 when NEEDED is restricted, +0.001 per other restricted group
    (0.05 % each: all five together stay within 1 %); copy accuracy 1 unless NEEDED is restricted."""
    others = sum(1 for g in windows if g != NEEDED)
    broken = NEEDED in windows
    return {"lm_loss": 2.0 + 0.5 * broken + 0.001 * others, "copy_accuracy": 0.0 if broken else 1.0}


def _bytes(context):
    return groups_bytes(GROUPS, {0: None, 1: None, 2: 8}, 4, context, kept=6)


def test_group_bytes_add_up_to_the_cards_kv_cache():
    arch = ArchSpec(
        model_type="llama", name="t", n_layers=3, d_model=16, n_heads=4, n_kv_heads=2, d_head=4, d_mlp=None,
        vocab_size=None, max_positions=64, encoder=False, positional="rope", rope_theta=None, rope_type=None,
        norm=None, norm_eps=None, activation=None, attention_bias=None, sliding_window=(None, None, 8),
        qk_norm=False, attn_softcap=None, final_softcap=None, tie_embeddings=False, type_vocab_size=None,
        pad_token_id=None, bos_token_id=None,
    )  # fmt: skip
    full = _bytes(64)
    assert sum(f for f, _ in full.values()) == kv_cache_bytes(arch, 64, 2)
    assert full[(0, 0)] == (2 * 64 * 4 * 2, 2 * 6 * 4 * 2) and full[(2, 1)] == (2 * 8 * 4 * 2, 2 * 6 * 4 * 2)
    assert group_bytes(4, None, 4, kept=6) == 2 * 4 * 4 * 2  # a cache shorter than sink + window saves nothing


@pytest.mark.parametrize("pool", [None, 1, 2])
def test_greedy_gives_back_the_needed_group_first(pool):
    cfg = KVConfig(tokens=64, sink=2, window=4, pool=pool, orders=3, points=None)
    frame, summary = kv_study(_known_evaluate, GROUPS, _bytes(64), _bytes(256), cfg)
    assert list(frame.columns) == COLUMNS
    assert summary["greedy_order"][0] == list(NEEDED)
    assert kept_groups(frame, summary) == [NEEDED]
    at = savings_at(frame)
    assert at["full_groups"] == 1 and at["quality_change"] == pytest.approx(0.0025)
    assert at["bytes_saved"] == sum(f - r for g, (f, r) in _bytes(64).items() if g != NEEDED)
    single = frame[(frame["study"] == "single") & (frame["metric"] == "copy_accuracy")]
    assert single.set_index(["layer", "kv_group"])["change"].idxmax() == NEEDED
    curve = curve_frame(frame)
    assert curve[curve["study"] == "random"]["draw"].nunique() == 3
    assert set(curve.groupby("study", observed=True)["step"].max()) == {len(GROUPS)}


def test_points_bound_what_is_measured():
    seen = []

    def evaluate(windows):
        seen.append(frozenset(windows))
        return _known_evaluate(windows)

    cfg = KVConfig(tokens=64, sink=2, window=4, pool=1, orders=2, points=(0.5,))
    frame, summary = kv_study(evaluate, GROUPS, _bytes(64), _bytes(64), cfg)
    points = frame[(frame["study"] != "single") & (frame["metric"] == "lm_loss")]
    steps = points.groupby(["study", "draw"], observed=True)["step"].agg(sorted)
    assert all(s == [0, 3, 6] for s in steps)
    assert len(seen) == len(set(seen))  # a configuration is measured once
    assert summary["evaluations"] == len(seen)


def test_planted_study_keeps_exactly_the_copy_heads_cache():
    from headscope.analyses.kvcache.stage import run_kv
    from headscope.probes.models.inhouse.planted_long import COPY_HEAD, planted_long_model

    model = planted_long_model()
    cfg = KVConfig(tokens=160, sink=2, window=16, items=1, texts=1, pool=None, orders=1)
    frames, summary = run_kv(model, cfg)
    assert summary["full"]["copy_accuracy"] == 1.0
    assert summary["greedy_order"][0] == list(COPY_HEAD)  # MHA: the copy head's KV group is its own
    assert kept_groups(frames["kv_study"], summary) == [COPY_HEAD]
    single = frames["kv_study"][frames["kv_study"]["study"] == "single"]
    broken = single[(single["metric"] == "copy_accuracy") & (single["value"] < 1.0)]
    assert list(zip(broken["layer"], broken["kv_group"])) == [COPY_HEAD]


def test_cli_refuses_an_encoder(capsys, tmp_path):
    from headscope.reports.cli.app import main

    assert main(["kv", "minilm-l6", "--out", str(tmp_path / "kv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "encoder" in err[0] and "decoder" in err[0]
    assert not (tmp_path / "kv").exists() or not any((tmp_path / "kv").iterdir())


def test_cli_writes_tables_and_run_json(capsys, tmp_path):
    from headscope.reports.cli.app import main
    from tests.tiny_models import tiny_model_dir

    model = tiny_model_dir(tmp_path, "llama")
    out = tmp_path / "kv"
    assert main(["kv", str(model), "--quick", "--tokens", "96", "--window", "16", "--out", str(out), "--quiet"]) == 0
    study = pd.read_parquet(out / "kv_study.parquet")
    assert list(study.columns) == COLUMNS and len(study)
    assert pd.read_csv(out / "kv_curve.csv")["study"].isin(["greedy", "random"]).all()
    run = json.loads((out / "run.json").read_text())
    assert run["output"]["kind"] == "kv" and run["kv_summary"]["settings"]["tokens"] == 96
    assert run["kv_summary"]["settings"]["pool"] == 1 and run["quick"] is True
    long = run["kv_summary"]["long_context"]
    assert (long["n_items"], long["n_tokens"], long["causal"]["n_items"]) == (16, 96, 4)  # the roles' 16 items
    assert len(long["causal"]["ratio_per_draw"]) == 5 and len(long["causal"]["ratio_ci"]) == 2
    md = (out / "kv.md").read_text()
    assert "1 needle item and 0 long texts" in md and "long-context roles: 16 needle items of 96 tokens" in md
    assert "causal check on 4 needle items of 96 tokens" in md
    assert main(["kv", str(model), "--tokens", "100000", "--out", str(tmp_path / "kv2")]) == 2
    # the README's figures come from such a folder (make figures): every quoted one is there
    from headscope.analyses.kvcache import figures

    figures.write(figures.figures_from(*figures.read(out)), tmp_path / "fig" / "kv.json", source=str(out))
    doc = json.loads((tmp_path / "fig" / "kv.json").read_text())
    assert doc["missing"] == [] and doc["figures"]["quality"]["full"]["text"].startswith("LM loss ")
    long = doc["figures"]["long"]  # the long-context roles and the causal check, with its spread
    assert long["items"]["value"] == [16, 96, 4] and long["retrieval"]["value"][1] == 2 * 4
    assert [w for w, _ in long["streaming"]["value"]] == [16, 64] and len(long["causal"]["value"]) == 7
    assert "bootstrap interval over 4 items" in long["causal"]["text"]


def test_report_stage_skips_an_encoder_with_its_reason_and_the_section_says_it(minilm):
    from headscope.reports.sections.long_context import long_context_section
    from headscope.reports.stages.base import RunContext
    from headscope.reports.stages.config import RunConfig
    from headscope.reports.stages.registry import STAGES
    from headscope.reports.stages.runner import turned_off

    kv = STAGES["kv"]
    absent = {"kv": kv.blocker(RunContext(name="minilm-l6", model=minilm), kv.Config())}
    assert "encoder" in absent["kv"] and "decoder" in absent["kv"]
    assert turned_off(RunConfig(kv=False))["kv"] == "turned off (--no-kv)"
    section = long_context_section({}, {"absent": absent})
    assert section.title == "Long context and the KV cache" and absent["kv"] in section.blocks[0].text
    assert long_context_section({}, {}) is None  # an older run: no section


def test_report_section_draws_the_curve_and_the_savings():
    from headscope.analyses.kvcache.stage import report_config, run_kv
    from headscope.probes.models.inhouse.planted_long import COPY_HEAD, planted_long_model
    from headscope.reports.document import Figure
    from headscope.reports.sections.long_context import long_context_section

    model = planted_long_model()
    cfg = report_config(model)
    assert (cfg.tokens, cfg.window, cfg.pool, cfg.unit) == (384, 48, 1, "layer")  # the planted context: 384 positions
    roles = pd.DataFrame(
        {"layer": [0, 1, 1], "head": [0, 1, 2], "role": ["retrieval"] * 3, "score": [0.1, 0.9, 0.2], "verdict": True}
    )
    frames, summary = run_kv(model, cfg, roles)
    join = frames["kv_roles"]
    assert join.loc[join["greedy_rank"] == 0, "layer"].tolist() == [COPY_HEAD[0]]  # the copy head's layer first
    assert summary["roles_join"]["overlap"] == 1
    section = long_context_section(frames, {"kv_summary": summary})
    assert any(isinstance(b, Figure) and b.name == "kv_curve" for b in section.blocks)
    text = " ".join(getattr(b, "text", "") for b in section.blocks)
    assert "Largest compression within a 1% quality change: 1 of 2 layers keep a full cache" in text


def test_a_configuration_resumed_from_its_first_restricted_layer_equals_a_whole_forward():
    from headscope.analyses.kvcache.quality import Evaluator, study_inputs
    from headscope.probes.models.inhouse.planted_long import planted_long_model

    model = planted_long_model()
    inputs = study_inputs(model.tokenizer, 160, n_items=1, n_texts=1, sink=2, window=16)
    windows = {(1, 1): (2, 16), (1, 2): (2, 16)}
    resumed = Evaluator(model, inputs)
    full = resumed({})
    got = resumed(windows)
    whole = Evaluator(model, inputs)(windows)  # no unrestricted run kept: every layer runs
    assert got == whole and got != full
    assert resumed.layers_run == 2 * 2 + 2 * 1  # two inputs: the unrestricted run, then layer 1 only


def test_the_long_roles_keep_a_window_as_long_as_their_items():
    # a study's window past the roles' items is measured (score 1, as its baseline), not left out
    from headscope.analyses.kvcache.stage import long_roles_config, run_long_roles
    from headscope.probes.models.inhouse.planted_long import planted_long_model

    lcfg = long_roles_config(KVConfig(tokens=96, window=128, sink=4), 2, causal_items=1)
    assert lcfg.windows == (16, 64, 128) and (lcfg.n_tokens, lcfg.causal_items) == (96, 1)
    frames, summary = run_long_roles(planted_long_model(), lcfg)
    s = frames["long_context_roles"].query("role == 'streaming'")
    assert sorted(set(s["window"])) == [16, 64, 128]
    assert (s[s["window"] == 128][["score", "baseline"]] == 1.0).all().all()
    assert summary["causal"]["n_items"] == 1 and summary["timings"]["roles_cpu_s"] > 0


def test_the_sink_figure_counts_the_heads_whose_top_key_moves_with_bos():
    from headscope.analyses.kvcache.figures import long_figures

    # main pass without BOS (SmolLM2's tokenizer adds none): L0H0 and L0H1 are sink heads; with BOS put in,
    # L0H0's top key stays at 0 and L0H1's moves to 1 (L1H0 is no sink head and does not count)
    rows = [
        ("retrieval", 0, 0, 0.9, True, None, None),
        ("retrieval", 0, 1, 0.1, False, None, None),
        ("retrieval", 1, 0, 0.0, False, None, None),
        ("sink", 0, 0, 0.9, True, False, 0),
        ("sink", 0, 1, 0.8, True, False, 0),
        ("sink", 1, 0, 0.1, False, False, 5),
        ("sink", 0, 0, 0.9, True, True, 0),
        ("sink", 0, 1, 0.9, True, True, 1),
        ("sink", 1, 0, 0.1, False, True, 0),
    ]
    roles = pd.DataFrame(rows, columns=["role", "layer", "head", "score", "verdict", "bos", "top_key"])
    roles = roles.astype({"bos": "boolean", "top_key": "Int64"}).assign(window=pd.NA)
    summary = {"long_context": {"n_items": 16, "n_tokens": 512, "copy_accuracy": 1.0, "bos": False}}
    f = long_figures(summary, roles)["long"]
    assert f["sink"]["value"] == [2, 1] and "1 move their top key when BOS is put in" in f["sink"]["text"]
    assert f["retrieval"]["value"][:2] == [1, 3] and f["retrieval"]["text"].startswith("1 of 3 heads")


def test_the_study_unembeds_a_block_of_rows_at_a_time_as_the_whole_logits():
    # the report's memory plan sets logit_rows where an input's logits are large (Qwen2-0.5B): the
    # loss summed over blocks of rows equals the whole logits' (float rounding apart), the copy hits
    # are the same; at least an input's length, the whole-logits path itself runs (bit-equal)
    from headscope.analyses.kvcache.quality import Evaluator, study_inputs
    from headscope.probes.models.inhouse.planted_long import planted_long_model

    model = planted_long_model()
    inputs = study_inputs(model.tokenizer, 160, n_items=1, n_texts=1, sink=2, window=16)
    windows = {(1, 1): (2, 16), (1, 2): (2, 16)}
    whole, blocks, long = (
        Evaluator(model, inputs),
        Evaluator(model, inputs, logit_rows=7),
        Evaluator(model, inputs, logit_rows=160),
    )
    for w in ({}, windows):
        a, b = whole(w), blocks(w)
        assert b["lm_loss"] == pytest.approx(a["lm_loss"], rel=1e-6) and b["copy_accuracy"] == a["copy_accuracy"]
        assert long(w) == a
    assert whole({})["copy_accuracy"] == 1.0  # the planted copy head copies: the hits are real ones
    with pytest.raises(ValueError, match="logit_rows"):
        Evaluator(model, inputs, logit_rows=0)
