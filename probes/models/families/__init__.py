"""Model families: one module per family (an HF ``model_type``), each holding its
:class:`Family`, and one registry, :data:`FAMILIES`, that the config reader
(:mod:`~headscope.probes.models.arch`), the in-house configuration
(:func:`~headscope.probes.models.config.config_from_arch`), the checkpoint names
(:func:`~headscope.probes.models.checkpoints.hf_to_inhouse_names`) and the HF backend's
layout (:mod:`~headscope.probes.models.hf_layout`) iterate.

A new family is one module here (its ``FAMILY``; with GGUF support, its ``gguf`` record) plus its line
below; an in-house one also
needs its parity config in ``tests/tiny_models.py`` (the contract test,
``tests/probes/test_family_contract.py``, fails until it has one).

>>> FAMILIES["qwen2"].options()["o_bias"], family_of("gemma3").model_type
(False, 'gemma3_text')
>>> INHOUSE_MODEL_TYPES[:3], ENCODER_FAMILIES
(('bert', 'roberta', 'distilbert'), ('bert', 'roberta', 'distilbert'))
"""

from __future__ import annotations

from headscope.probes.models.families import (
    bert,
    distilbert,
    gemma2,
    gemma3_text,
    gpt2,
    llama,
    mistral,
    olmo2,
    phi3,
    qwen2,
    qwen3,
    roberta,
    starcoder2,
)
from headscope.probes.models.families.base import OPTIONS, Family, Fused
from headscope.probes.models.families.gguf_only import GGUF_ONLY
from headscope.probes.models.families.gguf_record import GGUF

__all__ = [
    "ENCODER_FAMILIES",
    "FAMILIES",
    "GGUF",
    "GGUF_RECORDS",
    "INHOUSE_MODEL_TYPES",
    "OPTIONS",
    "Family",
    "Fused",
    "family_of",
]

#: every family, by ``model_type``, in-house ones first (the order of messages that list them)
FAMILIES: dict[str, Family] = {
    f.model_type: f
    for f in (
        bert.FAMILY,
        roberta.FAMILY,
        distilbert.FAMILY,
        llama.FAMILY,
        mistral.FAMILY,
        qwen2.FAMILY,
        qwen3.FAMILY,
        phi3.FAMILY,
        gemma2.FAMILY,
        gemma3_text.FAMILY,
        gpt2.FAMILY,
        olmo2.FAMILY,
        starcoder2.FAMILY,
    )
}
_ALIASES = {alias: f for f in FAMILIES.values() for alias in f.aliases}
#: the model types the in-house stack builds (other code picks a backend with it); anything
#: else needs ``--backend hf`` or ``--backend bridge``
INHOUSE_MODEL_TYPES = tuple(t for t, f in FAMILIES.items() if f.inhouse)
#: in-house families whose model returns final hidden states (HF ``AutoModel``); the others return logits
ENCODER_FAMILIES = tuple(t for t, f in FAMILIES.items() if f.inhouse and f.encoder)
#: how each GGUF architecture transformers reads is read (:mod:`~headscope.probes.models.gguf`
#: iterates them): the families' own records (``Family.gguf``), then those of no family here
GGUF_RECORDS: tuple[GGUF, ...] = tuple(f.gguf for f in FAMILIES.values() if f.gguf is not None) + GGUF_ONLY


def family_of(model_type: str | None) -> Family | None:
    """The family of ``model_type`` or of which it is an alias (``gemma3`` → ``gemma3_text``); None: none."""
    return FAMILIES.get(model_type) or _ALIASES.get(model_type)
