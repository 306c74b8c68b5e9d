"""Tiny randomly initialised checkpoints of many families, written as HF folders, for tests
that run headscope's commands on every family without a download; and the parity configs
(:data:`PARITY`) the in-house stack is compared with HF eager on.

Each model is built from transformers' own config class (``AutoConfig.for_model``) with
small sizes and the family's own options switched on (a sliding window shorter than the
sentences, soft-capping, QKV bias, QK-norm, …), seeded, and saved with a small tokenizer
trained here on the project's own corpora (byte-level BPE for decoders, WordPiece with
[CLS]/[SEP] for encoders; a few hundred tokens, so a tiny model's logits stay cheap).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import torch

from headscope.reports.tools.sweep.tokenizer import train_tokenizer as _train_tokenizer

#: model_type -> config options beyond the common sizes (the family's own features on)
DECODERS: dict[str, dict] = {
    "llama": {},
    "mistral": {"sliding_window": 6},
    "qwen2": {},
    "qwen3": {"head_dim": 16},
    "gemma2": {
        "head_dim": 32,
        "num_key_value_heads": 1,
        "sliding_window": 6,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
        "query_pre_attn_scalar": 24,
    },
    "gemma3_text": {"head_dim": 32, "sliding_window": 6, "query_pre_attn_scalar": 24},
    "phi3": {},
    "gpt2": {"n_inner": 128, "num_key_value_heads": None, "intermediate_size": None},
    "olmo2": {},
    "starcoder2": {"sliding_window": 6},
}
ENCODERS: dict[str, dict] = {"bert": {}, "roberta": {}, "distilbert": {"hidden_dim": 128, "intermediate_size": None}}
FAMILIES = (*DECODERS, *ENCODERS)

PARITY_VOCAB = 128
PARITY_PAD = 1  # every family's pad id here (RoBERTa's positions start after it)
_DEC = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=128,
    vocab_size=PARITY_VOCAB,
    max_position_embeddings=64,
    pad_token_id=PARITY_PAD,
    bos_token_id=2,
    eos_token_id=3,
)
_ENC = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    vocab_size=PARITY_VOCAB,
    max_position_embeddings=64,
    pad_token_id=PARITY_PAD,
)
#: the parity configs of the in-house families (tests/probes/test_families.py): case -> (kwargs of
#: AutoConfig.for_model, encoder?), a case being a model_type or "model_type:variant"; every in-house
#: family needs one (tests/probes/test_family_contract.py)
PARITY: dict[str, tuple[dict, bool]] = {
    "bert": (dict(_ENC), True),
    "llama": (dict(_DEC), False),
    "mistral": (dict(_DEC, sliding_window=8), False),
    "qwen2": (dict(_DEC, use_sliding_window=True, sliding_window=8, max_window_layers=1), False),
    "qwen3": (dict(_DEC, num_hidden_layers=3, attention_bias=True), False),
    "gemma2": (
        dict(
            _DEC,
            num_key_value_heads=1,  # MQA
            head_dim=32,  # n_heads * d_head = 128 != d_model
            sliding_window=8,
            attn_logit_softcapping=5.0,
            final_logit_softcapping=3.0,
            query_pre_attn_scalar=24,
        ),
        False,
    ),
    "gemma3_text": (
        dict(
            _DEC,
            num_hidden_layers=3,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            sliding_window=8,
            final_logit_softcapping=3.0,
            query_pre_attn_scalar=24,
            rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
            },
        ),
        False,
    ),
    "phi3": (dict(_DEC, sliding_window=9), False),
    # scaled RoPE (a variant is "model_type:what"): Llama 3.1's, with a band that splits d_head 16's
    # frequencies (original context 32: 1 kept, 1 interpolated, 6 divided by 8); Gemma 3's linear
    # ×8 on its global layer
    "llama:llama3-rope": (
        dict(
            _DEC,
            rope_parameters={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
                "rope_theta": 10_000.0,
            },
        ),
        False,
    ),
    "gemma3_text:linear-rope": (
        dict(
            _DEC,
            num_hidden_layers=3,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            sliding_window=8,
            query_pre_attn_scalar=24,
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
            },
        ),
        False,
    ),
    "gpt2": (
        dict(n_embd=64, n_layer=2, n_head=4, n_positions=64, vocab_size=PARITY_VOCAB, bos_token_id=2, eos_token_id=3),
        False,
    ),
    "roberta": (dict(_ENC, max_position_embeddings=64 + PARITY_PAD + 1, type_vocab_size=1), True),
    "distilbert": (
        dict(dim=64, n_layers=2, n_heads=4, hidden_dim=128, vocab_size=PARITY_VOCAB, pad_token_id=PARITY_PAD),
        True,
    ),
}


def parity_hf_model(case: str):
    """``(model, encoder?)``: the tiny random HF model of a :data:`PARITY` case (eager attention,
    eval, fp32), its weights large enough for peaked patterns."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    kwargs, encoder = PARITY[case]
    config = AutoConfig.for_model(case.split(":")[0], **kwargs)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = (AutoModel if encoder else AutoModelForCausalLM).from_config(config, attn_implementation="eager")
    with torch.no_grad():  # weights large enough for peaked patterns; norms and biases off their init
        for p in hf.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.2)
            else:  # a norm's weight stays near its init (1, or 0 for Gemma's 1 + w); biases near 0
                p.copy_(p + 0.1 * torch.randn_like(p))
    return hf.eval().float(), encoder


@cache
def tokenizer(encoder: bool, vocab_size: int = 600):
    """A small fast tokenizer trained on the shipped corpora (deterministic), saved and read
    back with ``AutoTokenizer`` as a user's tokenizer would be (transformer-lens reads the
    ``name_or_path`` only a loaded tokenizer has)."""
    import tempfile

    from transformers import AutoTokenizer

    where = tempfile.mkdtemp(prefix="headscope-tiny-tokenizer-")
    _train_tokenizer(encoder, vocab_size).save_pretrained(where)
    return AutoTokenizer.from_pretrained(where)


def tiny_mpnet(tok, max_positions: int = 128):
    """A tiny random MPNet encoder (``AutoConfig.for_model("mpnet")``: 2 layers, 4 heads, width 64,
    seed 0, eager attention) over ``tok``'s vocabulary."""
    from transformers import AutoConfig, AutoModel

    cfg = AutoConfig.for_model(
        "mpnet",
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        vocab_size=len(tok),
        max_position_embeddings=max_positions,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    return AutoModel.from_config(cfg, attn_implementation="eager")


def tiny_hf_model(model_type: str, *, seed: int = 0, **overrides):
    """``(model, tokenizer)``: a tiny random HF model of ``model_type`` (eager attention, eval, fp32)."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    encoder = model_type in ENCODERS
    tok = tokenizer(encoder)
    kw = dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        vocab_size=len(tok),
        max_position_embeddings=128,
        pad_token_id=tok.pad_token_id,
    )
    if encoder:
        kw.update(ENCODERS[model_type])
    else:
        kw.update(num_key_value_heads=2, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
        kw.update(DECODERS[model_type])
    kw.update(overrides)
    kw = {k: v for k, v in kw.items() if v is not None}  # None: a key the family's config does not have
    cfg = AutoConfig.for_model(model_type, **kw)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = (AutoModel if encoder else AutoModelForCausalLM).from_config(cfg, attn_implementation="eager")
    if not encoder:  # random norms and biases, so a parity test sees every parameter (HF initialises them to 1 / 0)
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() == 1:
                    p.add_(torch.randn_like(p) * 0.1)
    return model.eval(), tok


def tiny_model_dir(root: Path, model_type: str, **overrides) -> Path:
    """Save :func:`tiny_hf_model` (safetensors + tokenizer) under ``root/model_type``; return the folder."""
    out = Path(root) / model_type
    if (out / "config.json").exists():
        return out
    model, tok = tiny_hf_model(model_type, **overrides)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def check_tiny_report(out: Path, family: str, n_layers: int = 2, n_heads: int = 4) -> dict:
    """The checks of a default-backend report of a tiny model of ``family`` in ``out``: the backend
    auto chose (in-house where it covers the family, else hf), roles for every head, gradient
    importance reaching (nearly) every head, the three curves to 50%, the HTML with nothing
    missing. Returns its run.json (tests/reports/test_families_report.py, the sweep's sample)."""
    import json
    import math

    import pandas as pd

    from headscope.probes.models.config import INHOUSE_MODEL_TYPES

    run = json.loads((out / "run.json").read_text())
    expected = "inhouse" if family in INHOUSE_MODEL_TYPES else "hf"
    assert run["backend"] == expected, run["backend_choice"]
    assert run["backend_choice"].startswith(f"auto: {expected} (")
    roles = pd.read_csv(out / "tables" / "roles.csv")
    assert len(roles[["layer", "head"]].drop_duplicates()) == n_layers * n_heads
    imp = pd.read_csv(out / "tables" / "prune_importance.csv")
    assert len(imp) == n_layers * n_heads and imp["value"].map(math.isfinite).all()
    assert (imp["value"] > 0).sum() >= n_layers * n_heads - 1  # a gradient reached (nearly) every head
    curves = pd.read_csv(out / "tables" / "prune_curves.csv")
    assert {"curve:importance", "curve:ablation", "curve:reverse_importance"} <= set(curves["study"])
    assert curves["fraction_pruned"].max() >= 0.5
    html = (out / "report.html").read_text(encoding="utf-8")
    assert "pruning_curves" in html and "did not run" not in html
    return run
