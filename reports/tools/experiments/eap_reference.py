"""EAP and EAP-IG edge scores from the reference implementation, for the agreement test (``make eap-reference``).

``python -m headscope.reports.tools.experiments.eap_reference`` builds a small random GPT-2
(:func:`reference_model`: an HF ``GPT2LMHeadModel`` from a ``GPT2Config``, seeded), boots it in
transformer-lens, scores every edge with the reference's own ``get_scores_eap`` and
``get_scores_eap_ig`` (vendored below) on :func:`reference_items`, and writes
``data/figures/eap_reference.json``: the scores keyed by headscope's edge names
(:func:`headscope_edge_name`), the model config, the inputs, the metric, the steps and the
reference's commit. ``tests/analyses/circuits/edges/test_eap_reference.py`` rebuilds the same
model and items in headscope alone (no transformer-lens) and checks its scores against the file.

Vendored code (below the line marked ``--- vendored``): from github.com/hannamw/EAP-IG at commit
795f5607b25638935aec89aee3c1cb4bd9ed72f1, MIT License, Copyright (c) 2025 Michael Hanna:

* ``get_scores_eap``, ``get_scores_eap_ig``: ``src/eap/attribute.py``;
* ``make_hooks_and_matrices``: ``src/eap/utils.py``;
* the graph's index arithmetic (``Graph.from_model``, ``_forward_index``, ``_backward_index``,
  ``prev_index``, node names, hook names): ``src/eap/graph.py``, reduced to the index functions
  the two scorers call (:class:`_RefGraph`).

Changes to the vendored code, none to its arithmetic: ``device='cuda'`` -> the model's device;
``tokenize_plus`` takes already tokenised, unpadded ids (a ``[batch, pos]`` tensor: the attention
mask is all ones); the mean-ablation branch of ``get_scores_eap``, ``tqdm`` and the NaN prints are
dropped; type hints removed. transformer-lens 4 has no ``HookedTransformer`` (removed in 4.0):
the model is a ``TransformerBridge`` in compatibility mode without weight processing
(``no_processing=True``: no LayerNorm folding or centring, so the network computes exactly the
HF model's function) with ``use_attn_result``, ``use_split_qkv_input`` and ``use_hook_mlp_in``
on: the flags and hook names (``hook_embed``, ``blocks.{l}.hook_{q,k,v}_input``,
``blocks.{l}.attn.hook_result``, ``blocks.{l}.hook_mlp_in/out``, ``blocks.{l}.hook_resid_post``)
the reference reads. The reference's license text is kept in ``LICENSE_EAP_IG`` below.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
from functools import partial
from pathlib import Path

import torch
from einops import einsum

FIGURES = Path(__file__).resolve().parents[3] / "data" / "figures"
OUT = FIGURES / "eap_reference.json"
EAP_IG_REPO = "github.com/hannamw/EAP-IG"
EAP_IG_COMMIT = "795f5607b25638935aec89aee3c1cb4bd9ed72f1"
#: the random GPT-2: GPT2Config's fields
MODEL_CONFIG = dict(n_layer=2, n_head=4, n_embd=64, n_inner=128, n_positions=32, vocab_size=600)
SEED = 0
N_ITEMS, SEQ_LEN, STEPS = 6, 8, 5
METRIC = "logit_diff"

#: the reference's node names -> headscope's (senders; receivers with their ``<qkv>`` or input)
NAME_MAPPING = {
    "input": "input",
    "a{l}.h{h}": "L{l}H{h}",
    "m{l}": "MLP{l}",
    "->a{l}.h{h}<q>": "->L{l}H{h} q",
    "->a{l}.h{h}<k>": "->L{l}KV{h} k (GPT-2: one KV head per query head)",
    "->a{l}.h{h}<v>": "->L{l}KV{h} v",
    "->m{l}": "->MLP{l} mlp",
    "->logits": "->logits logits",
}

LICENSE_EAP_IG = """MIT License

Copyright (c) 2025 Michael Hanna

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction, including without limitation the rights
to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
SOFTWARE."""

log = logging.getLogger(__name__)


def reference_tokenizer():
    """A byte-level BPE of at most ``vocab_size`` tokens trained on the shipped corpora
    (deterministic), saved and read back (transformer-lens reads a loaded tokenizer's
    ``name_or_path``). Only the loaders need it: the items are ids."""
    import tempfile

    from transformers import AutoTokenizer

    from headscope.reports.tools.sweep.tokenizer import train_tokenizer

    where = tempfile.mkdtemp(prefix="headscope-eap-reference-")
    train_tokenizer(False, MODEL_CONFIG["vocab_size"]).save_pretrained(where)
    return AutoTokenizer.from_pretrained(where)


def reference_model():
    """The random GPT-2 both sides score: ``GPT2LMHeadModel(GPT2Config(**MODEL_CONFIG))`` seeded
    with :data:`SEED`, its matrices redrawn with std 0.1 and its norms and biases moved off 1 / 0
    by N(0, 0.1) (HF's 0.02 init makes a near-linear metric; eager attention, eval, fp32)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(SEED)
    hf = GPT2LMHeadModel(GPT2Config(**MODEL_CONFIG, bos_token_id=0, eos_token_id=0, attn_implementation="eager"))
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for p in hf.parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(0.1 * noise if p.dim() > 1 else p + 0.1 * noise)
    return hf.eval().float()


def weights_checksum(hf) -> float:
    """``Σ |w|`` over the model's parameters: the test's proof it rebuilt the same weights."""
    return float(sum(p.detach().double().abs().sum() for p in hf.parameters()))


def reference_items() -> list[dict]:
    """:data:`N_ITEMS` pairs of :data:`SEQ_LEN` random ids (seeded) differing in one position,
    with an answer and a wrong id: ``{"clean", "corrupted", "answer", "wrong"}``."""
    g = torch.Generator().manual_seed(SEED + 1)
    vocab = MODEL_CONFIG["vocab_size"]
    items = []
    for _ in range(N_ITEMS):
        clean = torch.randint(0, vocab, (SEQ_LEN,), generator=g)
        corrupted = clean.clone()
        at = int(torch.randint(0, SEQ_LEN, (1,), generator=g))
        corrupted[at] = (clean[at] + 1 + torch.randint(0, vocab - 1, (1,), generator=g)) % vocab
        answer, wrong = torch.randperm(vocab, generator=g)[:2].tolist()
        items.append(dict(clean=clean.tolist(), corrupted=corrupted.tolist(), answer=answer, wrong=wrong))
    return items


def headscope_edge_name(parent: str, child: str, qkv: str | None) -> str:
    """The reference's edge ``parent -> child<qkv>`` in headscope's names ``"sender->receiver
    via"``: ``input`` -> ``input``, ``a{l}.h{h}`` -> ``L{l}H{h}``, ``m{l}`` -> ``MLP{l}``,
    ``logits`` -> ``logits``; receivers ``a{l}.h{h}<q>`` -> ``L{l}H{h} q``, ``<k>``/``<v>`` ->
    ``L{l}KV{h} k``/``v`` (GPT-2 has as many KV heads as query heads), ``m{l}`` -> ``MLP{l} mlp``,
    ``logits`` -> ``logits logits``.

    >>> headscope_edge_name("a0.h1", "a1.h2", "k"), headscope_edge_name("input", "m0", None)
    ('L0H1->L1KV2 k', 'input->MLP0 mlp')
    """

    def node(n: str) -> str:
        if n in ("input", "logits"):
            return n
        if n[0] == "m":
            return f"MLP{n[1:]}"
        layer, head = n[1:].split(".h")
        return f"L{layer}H{head}"

    if qkv is None:
        return f"{node(parent)}->{node(child)} {'logits' if child == 'logits' else 'mlp'}"
    layer, head = child[1:].split(".h")
    return f"{node(parent)}->L{layer}{'H' if qkv == 'q' else 'KV'}{head} {qkv}"


def _bridge(hf, tokenizer):
    """A transformer-lens bridge on a copy of ``hf`` (the bridge rewires the modules it gets),
    computing the HF model's function, with the hooks the reference reads."""
    from transformer_lens.model_bridge import TransformerBridge

    bridge = TransformerBridge.boot_transformers("gpt2", hf_model=copy.deepcopy(hf), tokenizer=tokenizer)
    bridge.enable_compatibility_mode(disable_warnings=True, no_processing=True)
    bridge.set_use_attn_result(True)
    bridge.set_use_split_qkv_input(True)
    bridge.set_use_hook_mlp_in(True)
    return bridge.eval()


def _metric(logits, clean_logits, input_lengths, labels):
    """logit(answer) - logit(wrong) at the last position, summed over the batch (the reference
    divides its summed scores by the number of items: a mean per item, as headscope's)."""
    last = logits[torch.arange(logits.shape[0]), input_lengths - 1]
    return (last.gather(-1, labels[:, :1]) - last.gather(-1, labels[:, 1:])).sum()


def reference_scores(items: list[dict], steps: int = STEPS) -> dict:
    """``{"eap": {edge: score}, "eap-ig": {edge: score}, "n_edges": n}`` from the vendored reference."""
    model = _bridge(reference_model(), reference_tokenizer())
    graph = _RefGraph(model.cfg.n_layers, model.cfg.n_heads, model.cfg.parallel_attn_mlp)
    clean = torch.tensor([it["clean"] for it in items])
    corrupted = torch.tensor([it["corrupted"] for it in items])
    labels = torch.tensor([[it["answer"], it["wrong"]] for it in items])
    data = [(clean, corrupted, labels)]
    out = {}
    for name, fn in (("eap", get_scores_eap), ("eap-ig", partial(get_scores_eap_ig, steps=steps))):
        scores = fn(model, graph, data, _metric).cpu()
        out[name] = {headscope_edge_name(*e): float(scores[m]) for e, m in graph.edges()}
    out["n_edges"] = len(out["eap"])
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from importlib.metadata import version

    items = reference_items()
    scores = reference_scores(items)
    doc = {
        "what": "edge scores of the EAP-IG reference implementation (vendored, transformer-lens bridge)",
        "script": "reports/tools/experiments/eap_reference.py",
        "reference": {
            "repository": EAP_IG_REPO,
            "commit": EAP_IG_COMMIT,
            "functions": ["get_scores_eap", "get_scores_eap_ig"],
        },
        "transformer_lens": version("transformer-lens"),
        "model": {
            "class": "GPT2LMHeadModel",
            "config": MODEL_CONFIG,
            "seed": SEED,
            "weights_checksum": weights_checksum(reference_model()),
        },
        "metric": METRIC,
        "metric_definition": "logit(answer) - logit(wrong) at the last position; scores are means over items",
        "steps": STEPS,
        "alphas": [k / STEPS for k in range(STEPS)],
        "items": items,
        "edge_names": "'sender->receiver via' in headscope's names (headscope_edge_name)",
        "name_mapping": NAME_MAPPING,
        "transformer_lens_model": "TransformerBridge, compatibility mode, no_processing=True, use_attn_result, "
        "use_split_qkv_input, use_hook_mlp_in",
        **scores,
    }
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    log.info("wrote %s (%d edges)", args.out, scores["n_edges"])


# ----------------------------------------------------------------------------- vendored
# From github.com/hannamw/EAP-IG @ 795f5607b25638935aec89aee3c1cb4bd9ed72f1 (MIT, (c) 2025 Michael
# Hanna; LICENSE_EAP_IG above). Changes: listed in the module docstring.


class _RefGraph:
    """The index arithmetic of ``src/eap/graph.py``'s ``Graph`` that the scorers use: forward
    (sender) indices ``input, a{l}.h{h}…, m{l}``, backward (receiver) indices ``a{l}.h{h}<q>…
    <k>… <v>…, m{l}``, then ``logits`` (-1), and ``prev_index``."""

    def __init__(self, n_layers: int, n_heads: int, parallel_attn_mlp: bool):
        self.cfg = {"n_layers": n_layers, "n_heads": n_heads, "parallel_attn_mlp": parallel_attn_mlp}
        self.n_forward = 1 + n_layers * (n_heads + 1)
        self.n_backward = n_layers * (3 * n_heads + 1) + 1

    def forward_index(self, name: str, attn_slice=True):  # Graph.forward_index
        n_heads = self.cfg["n_heads"]
        if name == "input":
            return 0
        if name[0] == "m":
            return 1 + int(name[1:]) * (n_heads + 1) + n_heads
        layer, head = name.split(".")
        i = 1 + int(layer[1:]) * (n_heads + 1)
        return slice(i, i + n_heads) if attn_slice else i + int(head[1:])

    def backward_index(self, name: str, qkv=None, attn_slice=True):  # Graph._backward_index
        n_heads = self.cfg["n_heads"]
        if name == "logits":
            return -1
        if name[0] == "m":
            return int(name[1:]) * (3 * n_heads + 1) + 3 * n_heads
        layer, head = name.split(".")
        i = int(layer[1:]) * (3 * n_heads + 1) + "qkv".index(qkv) * n_heads
        return slice(i, i + n_heads) if attn_slice else i + int(head[1:])

    def prev_index(self, name: str) -> int:  # Graph.prev_index
        n_heads = self.cfg["n_heads"]
        if name == "logits":
            return self.n_forward
        layer = int(name[1:].split(".")[0])
        if name[0] == "m" and not self.cfg["parallel_attn_mlp"]:
            return 1 + layer * (n_heads + 1) + n_heads
        return 1 + layer * (n_heads + 1)

    def edges(self):
        """``((parent, child, qkv), (forward, backward))`` of every edge, as ``Graph.from_model`` adds them."""
        n_layers, n_heads = self.cfg["n_layers"], self.cfg["n_heads"]
        stream = ["input"]
        for layer in range(n_layers):
            heads = [f"a{layer}.h{h}" for h in range(n_heads)]
            for p in stream:
                for h in heads:
                    for q in "qkv":
                        yield (p, h, q), (self.forward_index(p, False), self.backward_index(h, q, attn_slice=False))
            stream += heads
            for p in stream:
                yield (p, f"m{layer}", None), (self.forward_index(p, False), self.backward_index(f"m{layer}"))
            stream.append(f"m{layer}")
        for p in stream:
            yield (p, "logits", None), (self.forward_index(p, False), self.n_backward - 1)


def tokenize_plus(model, tokens):
    """``utils.tokenize_plus`` for already tokenised, unpadded ids ``[batch, pos]``."""
    tokens = tokens.to(model.cfg.device)
    attention_mask = torch.ones_like(tokens)
    return tokens, attention_mask, attention_mask.sum(1), attention_mask.size(1)


def make_hooks_and_matrices(model, graph, batch_size, n_pos, scores):
    """``utils.make_hooks_and_matrices`` (the ``separate_activations`` branch dropped: GPT-2 has
    no post-norms)."""
    activation_difference = torch.zeros(
        (batch_size, n_pos, graph.n_forward, model.cfg.d_model), device=model.cfg.device, dtype=model.cfg.dtype
    )
    fwd_hooks_clean, fwd_hooks_corrupted, bwd_hooks = [], [], []

    def activation_hook(index, activations, hook, add=True):
        acts = activations.detach()
        if add:
            activation_difference[:, :, index] += acts
        else:
            activation_difference[:, :, index] -= acts

    def gradient_hook(prev_index, bwd_index, gradients, hook):
        grads = gradients.detach()
        if grads.ndim == 3:
            grads = grads.unsqueeze(2)
        s = einsum(
            activation_difference[:, :, :prev_index],
            grads,
            "batch pos forward hidden, batch pos backward hidden -> forward backward",
        )
        s = s.squeeze(1)
        scores[:prev_index, bwd_index] += s

    def both(hook_name, fwd_index):
        fwd_hooks_corrupted.append((hook_name, partial(activation_hook, fwd_index)))
        fwd_hooks_clean.append((hook_name, partial(activation_hook, fwd_index, add=False)))

    both("hook_embed", graph.forward_index("input"))
    for layer in range(graph.cfg["n_layers"]):
        node = f"a{layer}.h0"
        both(f"blocks.{layer}.attn.hook_result", graph.forward_index(node))
        prev_index = graph.prev_index(node)
        for letter in "qkv":
            bwd_index = graph.backward_index(node, qkv=letter)
            bwd_hooks.append((f"blocks.{layer}.hook_{letter}_input", partial(gradient_hook, prev_index, bwd_index)))
        node = f"m{layer}"
        both(f"blocks.{layer}.hook_mlp_out", graph.forward_index(node))
        prev_index, bwd_index = graph.prev_index(node), graph.backward_index(node)
        bwd_hooks.append((f"blocks.{layer}.hook_mlp_in", partial(gradient_hook, prev_index, bwd_index)))
    last = graph.cfg["n_layers"] - 1
    bwd_hooks.append((f"blocks.{last}.hook_resid_post", partial(gradient_hook, graph.prev_index("logits"), -1)))
    return (fwd_hooks_corrupted, fwd_hooks_clean, bwd_hooks), activation_difference


def get_scores_eap(model, graph, dataloader, metric):
    """``attribute.get_scores_eap`` with ``intervention='patching'``."""
    scores = torch.zeros((graph.n_forward, graph.n_backward), device=model.cfg.device, dtype=model.cfg.dtype)
    total_items = 0
    for clean, corrupted, label in dataloader:
        batch_size = len(clean)
        total_items += batch_size
        clean_tokens, attention_mask, input_lengths, n_pos = tokenize_plus(model, clean)
        corrupted_tokens, _, _, _ = tokenize_plus(model, corrupted)
        (fwd_hooks_corrupted, fwd_hooks_clean, bwd_hooks), activation_difference = make_hooks_and_matrices(
            model, graph, batch_size, n_pos, scores
        )
        with torch.inference_mode():
            with model.hooks(fwd_hooks_corrupted):
                _ = model(corrupted_tokens, attention_mask=attention_mask)
            clean_logits = model(clean_tokens, attention_mask=attention_mask)
        with model.hooks(fwd_hooks=fwd_hooks_clean, bwd_hooks=bwd_hooks):
            logits = model(clean_tokens, attention_mask=attention_mask)
            metric_value = metric(logits, clean_logits, input_lengths, label)
            metric_value.backward()
    scores /= total_items
    return scores


def get_scores_eap_ig(model, graph, dataloader, metric, steps=30):
    """``attribute.get_scores_eap_ig``: the input embeddings at ``corrupted + k/steps · (clean -
    corrupted)``, ``k = 0 … steps - 1``."""
    scores = torch.zeros((graph.n_forward, graph.n_backward), device=model.cfg.device, dtype=model.cfg.dtype)
    total_items = 0
    for clean, corrupted, label in dataloader:
        batch_size = len(clean)
        total_items += batch_size
        clean_tokens, attention_mask, input_lengths, n_pos = tokenize_plus(model, clean)
        corrupted_tokens, _, _, n_pos_corrupted = tokenize_plus(model, corrupted)
        if n_pos != n_pos_corrupted:
            raise ValueError("Number of positions must match")
        (fwd_hooks_corrupted, fwd_hooks_clean, bwd_hooks), activation_difference = make_hooks_and_matrices(
            model, graph, batch_size, n_pos, scores
        )
        with torch.inference_mode():
            with model.hooks(fwd_hooks=fwd_hooks_corrupted):
                _ = model(corrupted_tokens, attention_mask=attention_mask)
            input_activations_corrupted = activation_difference[:, :, graph.forward_index("input")].clone()
            with model.hooks(fwd_hooks=fwd_hooks_clean):
                clean_logits = model(clean_tokens, attention_mask=attention_mask)
            input_activations_clean = (
                input_activations_corrupted - activation_difference[:, :, graph.forward_index("input")]
            )

        def input_interpolation_hook(k):
            def hook_fn(activations, hook):
                # the hook runs within its own loop iteration: the late binding is safe
                new_input = input_activations_corrupted + (k / steps) * (  # noqa: B023
                    input_activations_clean - input_activations_corrupted  # noqa: B023
                )
                new_input.requires_grad = True
                return new_input

            return hook_fn

        total_steps = 0
        for step in range(0, steps):
            total_steps += 1
            with model.hooks(fwd_hooks=[("hook_embed", input_interpolation_hook(step))], bwd_hooks=bwd_hooks):
                logits = model(clean_tokens, attention_mask=attention_mask)
                metric_value = metric(logits, clean_logits, input_lengths, label)
                if torch.isnan(metric_value).any().item():
                    raise ValueError("Metric value is NaN")
                metric_value.backward()
    scores /= total_items
    scores /= total_steps
    return scores


if __name__ == "__main__":
    main()
