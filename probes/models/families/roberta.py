"""RoBERTa (``roberta``): BERT whose positions count from ``pad_token_id + 1`` and skip padding."""

from __future__ import annotations

from headscope.probes.models.families._common import BERT_LIKE, ENCODER, encoder_prefixes, family

FAMILY = family(
    BERT_LIKE,
    model_type="roberta",
    pad_aware_positions=True,
    hf_prefixes=encoder_prefixes("roberta"),
    hf_drop=(*ENCODER["hf_drop"], "embeddings.token_type_ids"),
)
