"""MHA -> GQA conversion by mean-pooling K/V heads."""

from __future__ import annotations

import pytest
import torch

from headscope.analyses.pruning.gqa_conversion import (
    GQA_COLUMNS,
    gqa_study,
    kv_cache_bytes_per_token,
    sentence_embeddings,
)
from headscope.probes.models.backends.inhouse import InHouseModel
from headscope.probes.models.config import ModelConfig
from headscope.probes.models.inhouse.kv_pooling import convert_to_gqa
from headscope.probes.models.inhouse.transformer import Transformer

# six items in the shape of data/paraphrase/pairs.jsonl
PAIRS = [
    {
        "anchor": "The doctor thanked the nurse after the long shift.",
        "positive": "The nurse was thanked by the doctor after the long shift.",
        "negatives": [
            "The nurse thanked the doctor after the long shift.",
            "The doctor blamed the nurse after the long shift.",
        ],
    },
    {
        "anchor": "The children built a snowman in the garden.",
        "positive": "A snowman was built in the garden by the children.",
        "negatives": [
            "The children destroyed a snowman in the garden.",
            "The children built a sandcastle on the beach.",
        ],
    },
    {
        "anchor": "She bought a new bicycle last week.",
        "positive": "Last week she purchased a new bike.",
        "negatives": ["She sold her old bicycle last week.", "She will buy a new bicycle next week."],
    },
    {
        "anchor": "The train was delayed because of the storm.",
        "positive": "The storm caused the train to be late.",
        "negatives": ["The train was on time despite the storm.", "The storm was delayed because of the train."],
    },
    {
        "anchor": "He rarely drinks coffee in the evening.",
        "positive": "In the evening he seldom has coffee.",
        "negatives": ["He always drinks coffee in the evening.", "He rarely drinks tea in the morning."],
    },
    {
        "anchor": "The museum opens at nine every morning.",
        "positive": "Every morning the museum opens its doors at nine.",
        "negatives": ["The museum closes at nine every evening.", "The library opens at ten every morning."],
    },
]


def _tiny_bert(seed=0):
    module = Transformer(ModelConfig(family="bert", n_layers=2, d_model=48, n_heads=6, vocab_size=40))
    module.init_weights(std=0.3, seed=seed)
    return InHouseModel(module)


def test_planted_shared_kv_heads_convert_exactly():
    """Heads whose K/V are already equal within each group lose nothing: the grouping of
    the conversion (consecutive heads) is the grouping the attention reads."""
    model = _tiny_bert()
    ids = torch.randint(0, 40, (3, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    with torch.inference_mode():
        before = model.module(ids, mask)
    with torch.no_grad():  # make heads (0,1,2) share K/V, and (3,4,5)
        for block in model.module.blocks:
            for proj in (block.attn.k_proj, block.attn.v_proj):
                w = proj.weight.view(2, 3, 8, 48)
                w[:] = w[:, :1].clone()
                b = proj.bias.view(2, 3, 8)
                b[:] = b[:, :1].clone()
    with torch.inference_mode():
        shared = model.module(ids, mask)
        converted = convert_to_gqa(model, 2)
        after = converted.module(ids, mask)
        other = convert_to_gqa(model, 3).module(ids, mask)  # groups (0,1) (2,3) (4,5) cut across
    assert converted.cfg.n_kv_heads == 2 and converted.cfg.family == "bert"
    assert converted.module.blocks[0].attn.kv_index.tolist() == [0, 0, 0, 1, 1, 1]
    real = mask.bool()
    assert (shared - after)[real].abs().max().item() <= 1e-5
    assert (shared - other)[real].abs().max().item() > 1e-3
    assert (before - shared)[real].abs().max().item() > 1e-3  # the planting did change the model


def test_bad_group_counts(minilm):
    with pytest.raises(ValueError, match=r"divide the model's 12 KV heads.*got 5.*\[1, 2, 3, 4, 6, 12\]"):
        convert_to_gqa(minilm, 5)
    with pytest.raises(TypeError, match="n_groups must be an int"):
        convert_to_gqa(minilm, 2.0)
    with pytest.raises(TypeError, match="in-house"):
        convert_to_gqa(object(), 2)


def test_g12_reproduces_minilm_exactly(minilm, sentences):
    same = convert_to_gqa(minilm, 12)
    batch = minilm.encode(texts=sentences)
    with torch.inference_mode():
        assert torch.equal(
            same.module(batch.input_ids, batch.attention_mask), minilm.module(batch.input_ids, batch.attention_mask)
        )
    assert same.module.blocks[0].attn.k_proj.weight.data_ptr() != minilm.module.blocks[0].attn.k_proj.weight.data_ptr()


def test_gqa_study_minilm(minilm, sentences):
    df = gqa_study(minilm, groups=(12, 6, 1), sentences=sentences, pairs=PAIRS)
    assert df.columns.tolist() == GQA_COLUMNS
    v = {(r.n_kv_heads, r.metric): r.value for r in df.itertuples()}
    assert v[12, "cosine_to_mha"] == pytest.approx(1.0, abs=1e-6)
    # measured on the five conftest sentences: 0.6448 (g=6), 0.5130 (g=1)
    assert v[6, "cosine_to_mha"] == pytest.approx(0.6448, abs=0.01)
    assert v[1, "cosine_to_mha"] == pytest.approx(0.5130, abs=0.01)
    # measured on the six PAIRS items: 4/6 unconverted, 3/6 at g=6 and g=1
    assert v[12, "paraphrase_accuracy"] == pytest.approx(4 / 6)
    assert v[6, "paraphrase_accuracy"] == pytest.approx(3 / 6)
    assert v[1, "paraphrase_accuracy"] == pytest.approx(3 / 6)
    cache = df.drop_duplicates("n_kv_heads").set_index("n_kv_heads")["kv_cache_bytes_per_token"]
    assert cache.to_dict() == {12: 18432, 6: 9216, 1: 1536}  # 2 * 6 layers * g * 32 * 4 bytes
    assert df.drop_duplicates("n_kv_heads")["group_size"].tolist() == [1, 2, 12]


def test_embeddings_match_hf_minilm(minilm, minilm_hf, sentences):
    """The private embedding helper is sentence-transformers' recipe on the HF model."""
    emb = sentence_embeddings(minilm, sentences)
    batch = minilm_hf.encode(texts=sentences)
    hidden = minilm_hf.run(batch, quantities=("pattern",), layers=[0])[("output", None)]
    m = batch.attention_mask[..., None].float()
    ref = torch.nn.functional.normalize((hidden * m).sum(1) / m.sum(1), dim=-1)
    assert (emb - ref).abs().max().item() <= 1e-5
    assert kv_cache_bytes_per_token(minilm.cfg) == 18432
