"""Hand-built models and texts the pruning tests share with the output-folder and report
tests: a helper module (test modules import from here, never from each other)."""

from __future__ import annotations

import torch

from headscope.probes.models.backends.inhouse import InHouseModel
from headscope.probes.models.config import ModelConfig
from headscope.probes.models.inhouse.transformer import Transformer

WORDS = [f"w{i}" for i in range(8)]


def word_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[BOS]", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="[BOS] $A", special_tokens=[("[BOS]", 2)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", bos_token="[BOS]")


def planted_copy_model(seed: int = 0) -> InHouseModel:
    V, P, nh, dh = 11, 16, 3, 16
    d = V + P + V  # [current word | position | copied word]
    cfg = ModelConfig(
        family="llama",
        n_layers=1,
        d_model=d,
        n_heads=nh,
        d_head=dh,
        vocab_size=V,
        max_positions=P,
        positional="learned",
        tie_embeddings=False,
        name="planted-copy",
    )
    net = Transformer(cfg)
    net.init_weights(seed=seed)
    a = net.blocks[0].attn
    c = (d / 2) ** 0.5  # size of an entry after RMSNorm of a vector with two unit entries
    with torch.no_grad():
        net.embed.weight.zero_()
        net.embed.weight[:, :V] = torch.eye(V)
        net.pos_embed.weight.zero_()
        net.pos_embed.weight[:, V : V + P] = torch.eye(P)
        q, k, v, o = a.q_proj.weight, a.k_proj.weight, a.v_proj.weight, a.o_proj.weight
        q[:dh].zero_(), k[:dh].zero_(), v[:dh].zero_(), o[:, :dh].zero_()
        for j in range(P):
            q[j, V + j] = 40.0 / c  # query: my position; score 40/sqrt(d_head) = 10 on the match
            if j + 1 < dh:
                k[j + 1, V + j] = 1.0 / c  # key: my position + 1
        for t in range(3, V):
            v[t, t] = 1.0 / c  # value: my word (not PAD/UNK/BOS)
            o[V + P + t, t] = 1.0  # into the copy block
        net.blocks[0].mlp.down.weight.zero_()
        net.unembed.weight.zero_()
        for t in range(V):
            net.unembed.weight[t, V + P + t] = 1.0  # unsaturated (p(copy) ~ 0.76): the gate gradient is not ~0
    return InHouseModel(net, word_tokenizer(), name="planted-copy")


def alternating(n: int, length: int = 12, seed: int = 0) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        a, b = torch.randperm(8, generator=g)[:2].tolist()
        out.append(" ".join(WORDS[a] if i % 2 == 0 else WORDS[b] for i in range(length)))
    return out


def random_gqa_model(dtype=torch.float32) -> InHouseModel:
    cfg = ModelConfig(
        family="llama",
        n_layers=2,
        d_model=32,
        n_heads=4,
        n_kv_heads=2,
        vocab_size=11,
        max_positions=16,
        name="random-gqa",
    )
    net = Transformer(cfg)
    net.init_weights(std=0.3, seed=1)
    return InHouseModel(net.to(dtype), word_tokenizer(), name="random-gqa")
