"""A compiled tracr model (its export, :func:`~headscope.probes.models.compiled.tracr.compile_export`)
as a headscope model on the in-house backend, with its truth table.

The in-house :class:`~headscope.probes.models.inhouse.transformer.Transformer` runs tracr's
arithmetic when configured as: no layer norm (``norm="none"``), learned positions (tracr's
position embedding, BOS at position 0), ReLU MLPs without biases, no attention biases, the scale
``key_size ** -0.5`` (tracr's; ``query_scale``, since ``d_head`` may be wider than ``key_size``
for the distractors), causal or bidirectional as compiled, and an unembedding that reads the
output space: row ``i`` is the ``i``-th output value's residual dimension (categorical; tracr
decodes the argmax of these rows), or row 0 the output dimension (numerical). Rows past the
output space and embedding rows past the input vocabulary are zero.

Distractors (``distractors=True``, :mod:`.distractors`) widen the residual by
:data:`~headscope.probes.models.compiled.distractors.N_EXTRA` dimensions and each layer by two
heads; the program's dimensions and output are unchanged.

The tokenizer is a word-level one over the input vocabulary (tokens as their text, split on
whitespace), with tracr's ``BOS`` put in front and ``PAD`` for padding.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

from headscope.probes.errors import ModelIncompatibleError
from headscope.probes.models.backends.inhouse import InHouseModel
from headscope.probes.models.compiled.distractors import add_distractors
from headscope.probes.models.compiled.programs import ProgramSetting
from headscope.probes.models.compiled.relations import role_of
from headscope.probes.models.compiled.tracr import BOS, PAD
from headscope.probes.models.config import ModelConfig
from headscope.probes.models.inhouse.transformer import Transformer
from headscope.probes.models.purpose import Purpose

#: the truth table's columns: one row per head of the loaded model
TRUTH_COLUMNS = ("layer", "head", "kind", "node", "keys", "queries", "predicate", "relation", "role", "used")
UNK = "[UNK]"


@dataclass
class CompiledModel:
    """A loaded compiled model: ``model`` (an :class:`InHouseModel`), its ``setting``, ``truth``
    (:data:`TRUTH_COLUMNS`, one row per head), ``export`` (what the compiler gave) and
    ``output_values`` (the unembedding rows' values; None for a numerical output)."""

    model: InHouseModel
    setting: ProgramSetting
    truth: pd.DataFrame
    export: dict
    output_values: list | None

    def encode(self, tokens: list) -> list[int]:
        """Input ids of ``tokens`` with BOS in front (``ValueError`` for a token outside the vocabulary)."""
        imap = self.export["input_map"]
        bad = [t for t in tokens if t not in imap or t in (BOS, PAD)]
        if bad:
            raise ValueError(f"{self.setting.label}: tokens {bad} are not in the vocabulary {list(self.setting.vocab)}")
        return [imap[BOS], *(imap[t] for t in tokens)]

    def output_id(self, value) -> int:
        """The unembedding row of a categorical output ``value`` (row 0 for a numerical output)."""
        if self.output_values is None:
            return 0
        return self.output_values.index(value)


def _tokenizer(input_map: dict):
    """Word-level tokenizer over ``input_map`` (tokens as text), BOS added in front, ``[UNK]`` past the vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {str(v): i for v, i in input_map.items()}
    vocab[UNK] = len(input_map)
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, vocab[BOS])])
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token=BOS, pad_token=PAD, unk_token=UNK)


def _sizes(export: dict) -> dict:
    w = export["weights"]
    d_model = w["token_embed"].shape[1]
    n_out = len(export["output_dims"])
    vocab = max(len(export["input_map"]) + 1, n_out + 1)  # + [UNK]; + a row that stays zero
    return {"d_model": d_model, "vocab": vocab, "n_out": n_out, "d_mlp": w["transformer/layer_0/mlp/linear_1"].shape[1]}


def network(export: dict, *, distractors: bool = True, seed: int = 0) -> Transformer:
    """The in-house :class:`Transformer` of ``export`` (module docstring)."""
    s, c = _sizes(export), export["config"]
    setting = export["setting"]
    key = c["key_size"]
    d_head = key
    if distractors:
        d_head = max(key, setting["max_seq_len"] + 1, len(setting["vocab"]) + 1)
    cfg = ModelConfig(
        family="llama",
        n_layers=c["n_layers"],
        d_model=s["d_model"],
        n_heads=c["n_heads"],
        d_head=d_head,
        d_mlp=s["d_mlp"],
        vocab_size=s["vocab"],
        max_positions=setting["max_seq_len"] + 1,
        causal=setting["causal"],
        positional="learned",
        norm="none",
        mlp="plain",
        activation="relu",
        mlp_bias=False,
        attention_bias=False,
        tie_embeddings=False,
        query_scale=key**-0.5,
        pad_token_id=export["input_map"][PAD],
        name=f"tracr-{setting['program']}",
    )
    module = Transformer(cfg)
    with torch.no_grad():
        for p in module.parameters():
            p.zero_()
        for name, p in module.named_parameters():
            if name.endswith(("ln1.weight", "ln2.weight", "ln_final.weight")) or name.endswith("gate"):
                p.fill_(1.0)
        _fill(module, export, key)
    if distractors:
        module = add_distractors(module, export, seed=seed)
    return module.eval()


def _fill(module: Transformer, export: dict, key: int) -> None:
    """Copy tracr's weights into ``module`` (zeroed; module docstring)."""
    w = export["weights"]
    n_in = len(export["input_map"])
    module.embed.weight[:n_in] = w["token_embed"]
    module.pos_embed.weight[: w["pos_embed"].shape[0]] = w["pos_embed"]
    for row, dim in enumerate(export["output_dims"]):
        module.unembed.weight[row, dim] = 1.0
    d_model, n_heads, d_head = module.cfg.d_model, module.cfg.n_heads, module.cfg.d_head
    for layer, block in enumerate(module.blocks):
        p = f"transformer/layer_{layer}"
        for name, proj in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
            m = w[f"{p}/attn/{name}"]
            if tuple(m.shape) != (d_model, n_heads * key):
                raise ModelIncompatibleError(
                    f"layer {layer}: attention {name} has shape {tuple(m.shape)}; expected {(d_model, n_heads * key)}"
                )
            per_head = m.reshape(d_model, n_heads, key)  # [d_model, head, key_size]
            target = getattr(block.attn, proj).weight.view(n_heads, d_head, d_model)
            target[:, :key] = per_head.permute(1, 2, 0)
        o = w[f"{p}/attn/linear"].reshape(n_heads, key, d_model)  # [head, key_size, d_model]
        block.attn.o_proj.weight.view(d_model, n_heads, d_head)[:, :, :key] = o.permute(2, 0, 1)
        up, down = w[f"{p}/mlp/linear_1"], w[f"{p}/mlp/linear_2"]
        if tuple(up.shape) != (d_model, module.cfg.d_mlp) or tuple(down.shape) != (module.cfg.d_mlp, d_model):
            raise ModelIncompatibleError(
                f"layer {layer}: MLP shapes {tuple(up.shape)}, {tuple(down.shape)} are not read"
            )
        block.mlp.up.weight.copy_(up.T)
        block.mlp.down.weight.copy_(down.T)


def truth_frame(export: dict, n_heads: int, extra: list[dict] | None = None) -> pd.DataFrame:
    """:data:`TRUTH_COLUMNS` for every head slot: the compiled heads (``kind`` ``"compiled"``),
    the slots tracr left as zeros (``"empty"``: no Select, role none, not used) and ``extra``
    rows (the distractors)."""
    causal = export["setting"]["causal"]
    rows = {}
    for h in export["heads"]:
        rows[(h["layer"], h["slot"])] = {
            "layer": h["layer"],
            "head": h["slot"],
            "kind": "compiled",
            "node": h["node"],
            "keys": h["keys"],
            "queries": h["queries"],
            "predicate": h["predicate"],
            "relation": h["relation"],
            "role": role_of(h["keys"], h["queries"], h["relation"], causal=causal),
            "used": bool(h["used"]),
        }
    for r in extra or []:
        rows[(r["layer"], r["head"])] = {c: r.get(c, "") for c in TRUTH_COLUMNS}
    empty = {
        "kind": "empty",
        "node": "",
        "keys": "",
        "queries": "",
        "predicate": "",
        "relation": "",
        "role": "none",
        "used": False,
    }
    for layer in range(export["config"]["n_layers"]):
        for head in range(n_heads):
            rows.setdefault((layer, head), {"layer": layer, "head": head, **empty})
    frame = pd.DataFrame([rows[k] for k in sorted(rows)], columns=list(TRUTH_COLUMNS))
    return frame.astype({"layer": int, "head": int, "used": bool})


def load_export(export: dict, *, distractors: bool = True, seed: int = 0) -> CompiledModel:
    """``export`` as a :class:`CompiledModel` (module docstring)."""
    st = export["setting"]
    setting = ProgramSetting(
        program=st["program"],
        vocab=tuple(st["vocab"]),
        max_seq_len=st["max_seq_len"],
        causal=st["causal"],
        unique=st["unique"],
    )
    module = network(export, distractors=distractors, seed=seed)
    model = InHouseModel(module, _tokenizer(export["input_map"]), name=f"tracr-{setting.label}")
    # what the validation reads: the output space at the last position, whichever the attention
    model.purpose = Purpose(
        kind="lm",
        reason="a compiled tracr program: its unembedding reads the program's output space",
        has_lm_head=True,
        bidirectional=not setting.causal,
    )
    extra = getattr(module, "distractor_truth", None)
    truth = truth_frame(export, module.cfg.n_heads, extra)
    return CompiledModel(
        model=model, setting=setting, truth=truth, export=export, output_values=export["output_values"]
    )
