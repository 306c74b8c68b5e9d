"""What a KV-cache restriction costs: long-context LM loss and needle copy accuracy.

:func:`study_inputs` builds the inputs once: ``n_items`` needle items of ``n_tokens`` tokens
(:func:`~headscope.analyses.longctx.needle.needle_items`; their haystacks are the long-input
corpus of :mod:`~headscope.analyses.roles.long_inputs`) and ``n_texts`` long texts
(:func:`~headscope.analyses.roles.long_inputs.long_text`). The LM loss is the mean next-token
cross-entropy over every target at position ``>= sink + window`` (the only ones a restriction can
change) that is haystack or long text (not a needle, cue or answer token); the copy accuracy is
:func:`~headscope.analyses.longctx.needle.copy_accuracy` over the items' answers.

:class:`Evaluator` runs one configuration (``{(layer, kv_group): (sink, window)}``) through
the in-house model's :meth:`~headscope.probes.models.inhouse.transformer.Transformer.kv_windows_set`.
The unrestricted run keeps the residual entering every layer, so a configuration whose first
restricted layer is ``l`` runs layers ``l..`` only (the layers before it compute exactly
what they did). With ``logit_rows`` (the report's memory plan sets it where an input's logits
``[pos, vocab]`` would be large: Qwen2-0.5B's 151,936 entries at 1,024 tokens are 0.58 GiB, and
the loss's gather and log-softmax hold two more copies), the forward stops before the
unembedding and the final hidden states are unembedded ``logit_rows`` rows at a time, the loss
summed over the blocks; unset, or at least an input's length, the logits come whole, as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class StudyInput:
    """One forward of the study: ``input_ids [1, pos]``, the target positions of its LM loss,
    and the needle item (None for a long text)."""

    input_ids: torch.Tensor
    loss_targets: torch.Tensor
    item: object | None = None
    resid: list = field(default_factory=list)  # residual entering each layer, unrestricted


def _targets(n: int, start: int, skip=()) -> torch.Tensor:
    skip = set(skip)
    return torch.tensor([t for t in range(max(1, start), n) if t not in skip], dtype=torch.long)


def study_inputs(tokenizer, n_tokens: int, *, n_items: int, n_texts: int, sink: int, window: int, seed: int = 0):
    """The study's inputs (:class:`StudyInput`): ``n_items`` needle items then ``n_texts`` long
    texts, each ``n_tokens`` tokens (a text at most). Raises ``LongInputError`` where the length
    leaves no haystack."""
    from headscope.analyses.longctx.needle import needle_items
    from headscope.analyses.roles.long_inputs import long_text
    from headscope.probes.tokens import encode_plain

    start = sink + window
    out = []
    if n_items:
        for it in needle_items(tokenizer, n_tokens, n_items, seed=seed):
            ids = torch.tensor([it.input_ids], dtype=torch.long)
            skip = [*it.needle, *it.answer, *(it.cue or ())]
            out.append(StudyInput(ids, _targets(ids.shape[1], start, skip), it))
    for i in range(n_texts):
        text = long_text(tokenizer, n_tokens, seed=seed + 1 + i)
        ids = torch.tensor([encode_plain(tokenizer, text, add_special_tokens=True)["input_ids"][:n_tokens]])
        out.append(StudyInput(ids, _targets(ids.shape[1], start)))
    return out


class Evaluator:
    """``evaluator(windows) -> {"lm_loss": float, "copy_accuracy": float | None}`` on ``inputs``;
    ``evaluator.runs`` counts forwards and ``evaluator.layers_run`` the layers they ran."""

    def __init__(self, model, inputs: list[StudyInput], *, logit_rows: int | None = None):
        if logit_rows is not None and logit_rows < 1:
            raise ValueError(f"logit_rows must be None or >= 1; got {logit_rows}")
        self.model, self.inputs, self.logit_rows = model, inputs, logit_rows
        self.n_layers = model.spec.n_layers
        self.runs, self.layers_run = 0, 0
        self._full = None

    def _forward(self, x: StudyInput, start: int, keep_resid: bool) -> torch.Tensor:
        from headscope.probes.models.inhouse.hooks import hooks

        mask = torch.ones_like(x.input_ids)
        self.runs += 1
        self.layers_run += self.n_layers - start
        if start:
            return self.model.forward(x.input_ids, mask, start_at_layer=start, resid=x.resid[start])
        if not keep_resid:
            return self.model.forward(x.input_ids, mask)
        x.resid = [None] * self.n_layers
        points = self.model.hook_points
        pairs = [
            (points[f"blocks.{l}.hook_resid_pre"], lambda t, name, l=l: x.resid.__setitem__(l, t.clone()))
            for l in range(self.n_layers)
        ]
        with hooks(pairs):
            return self.model.forward(x.input_ids, mask)

    def _blocks(self, x: StudyInput, start: int, keep_resid: bool) -> tuple[float, torch.Tensor | None]:
        """One forward of ``x`` whose final hidden states are unembedded :attr:`logit_rows` rows at
        a time -> ``(the summed cross-entropy of its loss targets, its copy hits or None)``."""
        from headscope.analyses.longctx.needle import copy_hits

        with self.model.final_states() as kept:  # the unembedding itself reads no row
            self._forward(x, start, keep_resid)
        h = kept[0][0]  # [pos, d_model]
        t = x.loss_targets
        total = 0.0
        for a in range(0, len(t), self.logit_rows):
            rows = t[a : a + self.logit_rows]
            logits = self.model.unembed_rows(h[(rows - 1).to(h.device)])
            total += float(F.cross_entropy(logits, x.input_ids[0, rows].to(logits.device), reduction="sum"))
            del logits
        hit = None
        if x.item is not None:
            answer = torch.tensor([a - 1 for a in x.item.answer], dtype=torch.long, device=h.device)
            hit = copy_hits(self.model.unembed_rows(h[answer]), x.item).cpu()
        return total, hit

    def __call__(self, windows: dict) -> dict:
        from headscope.analyses.longctx.needle import copy_hits

        if not windows and self._full is not None:
            return dict(self._full)
        start = min(l for l, _ in windows) if windows and self._full is not None else 0
        total, count, hits = 0.0, 0, []
        with torch.inference_mode(), self.model.network.kv_windows_set(windows):
            for x in self.inputs:
                t = x.loss_targets
                if self.logit_rows is not None and self.logit_rows < x.input_ids.shape[1]:
                    ce, hit = self._blocks(x, start, keep_resid=not windows)
                    total, count = total + ce, count + len(t)
                    if hit is not None:
                        hits.append(hit)
                    continue
                logits = self._forward(x, start, keep_resid=not windows)[0].float()  # [pos, vocab]
                if len(t):
                    ce = F.cross_entropy(logits[t - 1], x.input_ids[0, t].to(logits.device), reduction="sum")
                    total, count = total + float(ce), count + len(t)
                if x.item is not None:
                    hits.append(copy_hits(logits, x.item).cpu())
        out = {
            "lm_loss": total / count if count else None,
            "copy_accuracy": float(torch.cat(hits).float().mean()) if hits else None,
        }
        if not windows:
            self._full = dict(out)
        return out
