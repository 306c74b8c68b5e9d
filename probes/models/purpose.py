"""What a checkpoint is for, decided once when it loads: :class:`Purpose` (``"lm"`` or
``"embedding"``), by :func:`decide_purpose`; every consumer that picks a metric (pruning's
default, patching's tasks, the KV stage, the refusal of an LM metric) reads
:func:`purpose_of` ``(model)`` and none re-derives it. run.json and the model card record it.

The rule, first match wins:

* bidirectional attention (an encoder family, or a decoder family run with
  ``use_bidirectional_attention``) -> ``"embedding"``;
* a sentence-transformers folder (``modules.json``) -> ``"embedding"``: what its users get is
  its sentence embedding;
* causal attention but no trained LM head (neither tied to the input embedding nor among the
  checkpoint's tensors) -> ``"embedding"``;
* causal attention and an LM head (its own or tied) -> ``"lm"``.

``has_mlm_head`` records whether an encoder's checkpoint carries a masked-LM head.

>>> p = decide_purpose(causal=True, tied=True, lm_head_in_weights=None, sentence_transformers=False)
>>> p.kind, p.reason
('lm', 'causal attention and an LM head (tied to the input embedding)')
>>> decide_purpose(causal=False, encoder=True, sentence_transformers=True).kind
'embedding'
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path

#: what a checkpoint can be for
PURPOSES = ("lm", "embedding")
#: the metric kind (:data:`headscope.analyses.metrics.MODELS`) each purpose is scored by
METRIC_KIND = {"lm": "decoder", "embedding": "encoder"}

#: tensor-name endings of a causal LM's own output head, and of an encoder's masked-LM head
_LM_HEADS = ("lm_head.weight", "embed_out.weight", "output.weight")
_MLM_HEADS = ("cls.predictions.", "lm_head.dense.", "lm_head.decoder.", "vocab_projector.", "generator_lm_head.")


@dataclass(frozen=True, kw_only=True)
class Purpose:
    """What a checkpoint is for: ``kind`` (:data:`PURPOSES`), ``reason`` (one phrase, for the
    card and run.json), ``has_lm_head`` (a trained next-token head, own or tied),
    ``has_mlm_head`` (a masked-LM head among its tensors) and ``bidirectional``."""

    kind: str = "lm"
    reason: str = ""
    has_lm_head: bool = False
    has_mlm_head: bool = False
    bidirectional: bool = False

    def __post_init__(self):
        if self.kind not in PURPOSES:
            raise ValueError(f"The 'kind' parameter of Purpose must be one of {PURPOSES}; got {self.kind!r} instead.")

    @property
    def metric_kind(self) -> str:
        """``"decoder"`` (LM metrics: logits) or ``"encoder"`` (embedding metrics)."""
        return METRIC_KIND[self.kind]

    @property
    def words(self) -> str:
        """``"a language model"`` or ``"an embedding model"``."""
        return "a language model" if self.kind == "lm" else "an embedding model"

    def record(self) -> dict:
        """run.json's ``purpose``."""
        return asdict(self)


def decide_purpose(
    *,
    causal: bool,
    encoder: bool = False,
    tied: bool = False,
    lm_head_in_weights: bool | None = None,
    sentence_transformers: bool = False,
    mlm_head: bool = False,
) -> Purpose:
    """The :class:`Purpose` of a checkpoint from its facts (module docstring): ``causal``
    attention, an ``encoder`` family, an LM head ``tied`` to the input embedding, its own head
    among the tensors (``lm_head_in_weights``; None: not known, the load kept one), a
    ``sentence_transformers`` folder, a masked-LM head among the tensors (``mlm_head``)."""
    head = tied or lm_head_in_weights is not False
    if not causal:
        why = "an encoder family" if encoder else "use_bidirectional_attention"
        return Purpose(
            kind="embedding",
            reason=f"bidirectional attention ({why})",
            has_lm_head=False,
            has_mlm_head=mlm_head,
            bidirectional=True,
        )
    if sentence_transformers:
        return Purpose(
            kind="embedding",
            reason="a sentence-transformers folder (modules.json): its sentence embedding is what it is for",
            has_lm_head=head,
        )
    if not head:
        return Purpose(kind="embedding", reason="causal attention but no trained LM head among its tensors")
    how = "tied to the input embedding" if tied else "its own"
    return Purpose(kind="lm", reason=f"causal attention and an LM head ({how})", has_lm_head=True)


def tensor_names(directory: Path | None) -> set[str] | None:
    """The tensor names of the safetensors files in ``directory`` (headers only; None where
    there are none to read, e.g. a ``.bin`` checkpoint)."""
    if directory is None:
        return None
    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        return None
    from safetensors import safe_open

    names: set[str] = set()
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            names.update(st.keys())
    return names


def lm_head_absent(directory: Path | None, arch) -> bool:
    """Whether a decoder's checkpoint in ``directory`` has no LM head: not tied to the input
    embedding, and no head tensor among its safetensors (False where the tensors cannot be listed)."""
    if arch.tie_embeddings or arch.encoder:
        return False
    names = tensor_names(directory)
    return names is not None and not _has_lm_head(names, arch.model_type)


def _is_lm_head(name: str) -> bool:
    return name in _LM_HEADS or name.endswith(tuple("." + h for h in _LM_HEADS[:2]))


def _has_lm_head(names: set[str], model_type: str | None) -> bool:
    """Whether one of ``names`` is an LM head, as named or as transformers loads it: a checkpoint saved under
    the family's original names has its head renamed by the family's checkpoint conversion (DeepSeek-V4's
    ``head.weight``, Inkling 2's ``model.llm.unembed.weight``: ``lm_head.weight``)."""
    if any(_is_lm_head(n) for n in names):
        return True
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping

        renamings = get_checkpoint_conversion_mapping(model_type) or () if model_type else ()
    except ImportError:  # a transformers without checkpoint conversions: the names as they are
        return False
    to_head = [
        (re.compile(source), t.target_patterns[0])
        for t in renamings
        if type(t).__name__ == "WeightRenaming" and str(t.target_patterns[0]).startswith("lm_head")
        for source in t.source_patterns
    ]
    return any(_is_lm_head(p.sub(lambda m, t=target: t, n, count=1)) for n in names for p, target in to_head)


def purpose_from_source(arch, source, *, causal: bool | None = None, loaded_head: bool | None = None) -> Purpose:
    """:func:`decide_purpose` of a checkpoint from its :class:`~headscope.probes.models.spec.ArchSpec`
    and :class:`~headscope.probes.models.checkpoints.ModelSource` (its tensor names read from the
    safetensors headers where the source is a folder); ``loaded_head``: whether the loaded network
    holds an output head (None: not known); ``causal``: the loaded model's attention where it
    differs from the config's (an encoder-decoder's encoder runs alone)."""
    folder = getattr(source, "path", None) if getattr(source, "kind", None) == "hf-dir" else None
    names = tensor_names(folder)
    own = None if names is None else _has_lm_head(names, getattr(arch, "model_type", None))
    if own is None and loaded_head is not None:
        own = loaded_head
    mlm = bool(names) and any(n.startswith(_MLM_HEADS) for n in names)
    return decide_purpose(
        causal=arch.causal if causal is None else causal,
        encoder=arch.encoder or (causal is False and not arch.bidirectional_attention),
        tied=bool(arch.tie_embeddings) and not arch.encoder,
        lm_head_in_weights=own,
        sentence_transformers=getattr(source, "st_folder", None) is not None,
        mlm_head=mlm,
    )


def purpose_of(model) -> Purpose:
    """The :class:`Purpose` decided when ``model`` loaded (``model.purpose``, set by
    :func:`~headscope.probes.models.loading.load_model`); a model built another way (an in-house
    network from a config, a test's planted model) is decided once here from its spec and
    source, and the decision kept on it."""
    p = getattr(model, "purpose", None)
    if isinstance(p, Purpose):
        return p
    source = getattr(model, "source", None)
    spec = model.spec
    p = decide_purpose(
        causal=spec.causal,
        encoder=not spec.causal,
        tied=True,
        lm_head_in_weights=None,
        sentence_transformers=getattr(source, "st_folder", None) is not None,
    )
    try:
        model.purpose = p
    except AttributeError:  # an object that takes no attributes: decided again next time, alike
        pass
    return p
