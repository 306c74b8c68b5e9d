"""Why a family's attention cannot be read head by head, in words a user understands.

The hf backend detects by structure what it cannot read (:func:`check_patterns`: transformers returns no
pattern, or none shaped ``[batch, head, query, key]``; :mod:`~headscope.probes.models.hf_layout`: no
output projection whose input is pattern × V; the bridge: no attention hooks) and raises
:class:`~headscope.probes.errors.ModelIncompatibleError` there; :func:`explained` puts first what the
family's attention does that the detected shape comes from, where transformers' registry sweep met it
(``data/sweep/sweep.md``); any other family gets what was detected alone.
"""

from __future__ import annotations

import torch

from headscope.probes.errors import ModelIncompatibleError

__all__ = ["ATTENTION_KINDS", "check_patterns", "explained"]

#: model type -> what its attention does that has no per-head [query, key] pattern times V to read
ATTENTION_KINDS = {
    "big_bird": "block-sparse attention (window, random and global key blocks): no [query, key] pattern",
    "canine": "downsampled characters: its deep layers attend over strided character blocks, not the tokens",
    "cpmant": "32 learned prompt tokens are put before every input and dropped from the patterns it returns",
    "deepseek_v4": "grouped low-rank output projection: no single linear map takes the concatenated heads",
    "diffllama": "differential attention: each head's output is the difference of two softmax maps times V",
    "dory": "looped layers: its recurrent section runs the same layer modules several times per forward",
    "hrm_text": "looped stacks: its two stacks of layers run several times per forward (H and L cycles)",
    "jetmoe": "mixture of attention heads: each token's queries and output projection are its top-k experts'",
    "led": "sliding-window attention with its own global query/key/value projections: several maps take heads × "
    "d_head to d_model and its V runs time-major over positions padded to the window, so none can be checked",
    "longt5": "local / transient-global attention: scores over key blocks, no [query, key] pattern",
    "mra": "multi-resolution approximate attention: no softmax pattern is computed",
    "nystromformer": "Nyström approximation of softmax attention: no exact pattern times V",
    "pegasus_x": "block-local attention with global tokens: local and global score blocks, no [query, key] pattern",
    "prophetnet": "n-gram prediction streams: its decoder attends over main and predicting streams at once",
    "xlnet": "two-stream relative attention whose output projection is a bare parameter (an einsum, no module)",
    "yoso": "LSH-sampled attention (YOSO): no softmax pattern is computed",
}


def explained(spec, what: str) -> ModelIncompatibleError:
    """The error for ``spec``'s model: what its attention does first (:data:`ATTENTION_KINDS`, where
    known), then ``what`` was detected (a message naming the model already has that name dropped)."""
    prefix = f"{spec.name!r} ({spec.family}): "
    what = what.strip().splitlines()[0].removeprefix(prefix) if what.strip() else what
    why = ATTENTION_KINDS.get(getattr(spec, "family", None) or "")
    return ModelIncompatibleError(f"{prefix}{why} ({what})" if why else f"{prefix}{what}")


def check_patterns(attentions, spec, batch: int, pos: int) -> tuple:
    """HF's ``attentions`` when they are one ``[batch, head, pos, pos]`` tensor per layer of ``spec``;
    :class:`ModelIncompatibleError` saying what transformers returned instead (none, too few, blocks
    or windows of keys, dicts) and, where known, why (:func:`explained`)."""
    what = None
    if attentions is None or len(attentions) == 0:
        what = "transformers returns no attention pattern for it (output_attentions gives none)"
    elif len(attentions) != spec.n_layers:
        what = f"output_attentions gives {len(attentions)} patterns for its {spec.n_layers} layers"
    else:
        bad = next((a for a in attentions if not torch.is_tensor(a) or a.layout != torch.strided), None)
        if bad is not None:
            what = f"output_attentions gives {type(bad).__name__} patterns, no dense [batch, head, query, key] tensor"
        else:
            want = (batch, spec.n_heads, pos, pos)
            shape = next((tuple(a.shape) for a in attentions if tuple(a.shape) != want), None)
            if shape is not None:
                what = f"output_attentions gives patterns shaped {shape}, not [batch, head, query, key] = {want}"
    if what is None:
        return tuple(attentions)
    raise explained(spec, what)
