"""BERT and MiniLM (``bert``): a bidirectional encoder returning its final hidden states:
learned absolute positions plus token-type embeddings, post-LayerNorm blocks, a GELU MLP, biases
everywhere. Its config must give every size (and heads that divide the hidden size)."""

from __future__ import annotations

from headscope.probes.errors import CheckpointError
from headscope.probes.models.families._common import BERT_LIKE, encoder_prefixes, family


def _check_sizes(hf: dict, where: str) -> None:
    d_model, n_heads = hf["hidden_size"], hf["num_attention_heads"]
    if d_model % n_heads:
        raise CheckpointError(
            f"{where}: hidden_size={d_model} is not divisible by num_attention_heads={n_heads}; fix one of them"
        )


FAMILY = family(
    BERT_LIKE,
    model_type="bert",
    label="BERT",
    hf_prefixes=encoder_prefixes("bert"),
    required_sizes=(
        "num_hidden_layers",
        "hidden_size",
        "num_attention_heads",
        "intermediate_size",
        "vocab_size",
        "max_position_embeddings",
    ),
    optional_sizes=("type_vocab_size",),
    check_sizes=_check_sizes,
)
