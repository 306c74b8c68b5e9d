"""Distractor heads: real negatives for the validation.

tracr leaves unused head slots as zeros, which every method finds trivially. :func:`add_distractors`
widens the residual stream by :data:`N_EXTRA` dimensions the program never reads (the embeddings
write seeded random values there) and adds three heads to every layer, none of which the output
depends on:

* ``random``: seeded random ``W_Q``/``W_K``/``W_V`` reading only the extra dimensions, ``W_O``
  writing only there; ``W_Q``/``W_K`` scaled so that the logits have a standard deviation of about
  :data:`RANDOM_LOGIT_STD` (as the planted models' random heads): a non-uniform pattern that a
  role threshold should not pass;
* ``previous-token``: ``W_Q``/``W_K`` read the program's ``indices`` dimensions (and BOS) so that
  each query attends the key one position back (the first token: BOS), with tracr's softmax
  coldness (a logit gap of 100); ``W_V``/``W_O`` random, on the extra dimensions only;
* ``duplicate-token``: ``W_Q``/``W_K`` read the ``tokens`` dimensions (and ``one``/BOS, as tracr's
  own heads do) so that each query attends every key holding its token; ``W_V``/``W_O`` as above.

The last two attend in a role's pattern but write nowhere that matters: their role is true and
they are not used. The program's dimensions, and so its output, are exactly what they were.
"""

from __future__ import annotations

import torch

from headscope.probes.models.inhouse.transformer import Transformer

#: residual dimensions added for the distractors
N_EXTRA = 8
#: the distractor heads of every layer, in slot order after the compiled ones: (name, role, keys, relation)
DISTRACTORS = (
    ("random", "none", "", ""),
    ("previous-token", "previous-token", "indices", "k == q - 1"),
    ("duplicate-token", "duplicate-token", "tokens", "k == q"),
)
COLDNESS = 100.0  # tracr's softmax_coldness: the logit of a match
RANDOM_LOGIT_STD = 0.5


def _copy_into(new: Transformer, old: Transformer) -> None:
    """``old``'s weights into the leading dimensions and head slots of ``new`` (zeroed first)."""
    d, h, dh = old.cfg.d_model, old.cfg.n_heads, old.cfg.d_head
    D, H = new.cfg.d_model, new.cfg.n_heads
    for p in new.parameters():
        p.zero_()
    new.embed.weight[:, :d] = old.embed.weight
    new.pos_embed.weight[:, :d] = old.pos_embed.weight
    new.unembed.weight[:, :d] = old.unembed.weight
    for nb, ob in zip(new.blocks, old.blocks):
        for proj in ("q_proj", "k_proj", "v_proj"):
            getattr(nb.attn, proj).weight.view(H, dh, D)[:h, :, :d] = getattr(ob.attn, proj).weight.view(h, dh, d)
        nb.attn.o_proj.weight.view(D, H, dh)[:d, :h] = ob.attn.o_proj.weight.view(d, h, dh)
        nb.mlp.up.weight[:, :d] = ob.mlp.up.weight
        nb.mlp.down.weight[:d] = ob.mlp.down.weight
        nb.attn.gate.fill_(1.0)
    for name, p in new.named_parameters():
        if name.endswith(("ln1.weight", "ln2.weight", "ln_final.weight")):
            p.fill_(1.0)


def _dims(labels: list[str], prefix: str) -> dict[str, int]:
    """``{value text: residual index}`` of the dimensions labelled ``prefix:value``."""
    return {lab.split(":", 1)[1]: i for i, lab in enumerate(labels) if lab.startswith(prefix + ":")}


def _pattern(new: Transformer, layer: int, head: int, kind: str, export: dict) -> None:
    """Write the role-like ``W_Q``/``W_K`` of distractor ``kind`` into ``(layer, head)``."""
    cfg = new.cfg
    attn = new.blocks[layer].attn
    dh, D = cfg.d_head, cfg.d_model
    wq = attn.q_proj.weight.view(cfg.n_heads, dh, D)[head]
    wk = attn.k_proj.weight.view(cfg.n_heads, dh, D)[head]
    beta = COLDNESS / cfg.query_scale  # q·k × scale = COLDNESS on a match
    labels = export["residual_labels"]
    bos = labels.index("tokens:BOS")
    if kind == "previous-token":
        idx = _dims(labels, "indices")
        for i in range(export["setting"]["max_seq_len"]):
            wq[i, idx[str(i)]] = beta
            if i + 1 < dh and str(i) in idx:
                wk[i + 1, idx[str(i)]] = 1.0
        wk[0, bos] = 1.0
    else:  # duplicate-token: match on the token, BOS at half strength when nothing matches
        tok = _dims(labels, "tokens")
        values = [str(v) for v in export["setting"]["vocab"]]
        for j, v in enumerate(values):
            wq[j, tok[v]] = beta
            wk[j, tok[v]] = 1.0
        wq[len(values), labels.index("one")] = beta / 2
        wk[len(values), bos] = 1.0


def add_distractors(old: Transformer, export: dict, *, seed: int = 0) -> Transformer:
    """A copy of ``old`` with :data:`N_EXTRA` more residual dimensions and the
    :data:`DISTRACTORS` heads in every layer (module docstring); its ``distractor_truth`` lists
    their truth rows (:data:`~headscope.probes.models.compiled.loader.TRUTH_COLUMNS`)."""
    d, h = old.cfg.d_model, old.cfg.n_heads
    cfg = old.cfg.replace(d_model=d + N_EXTRA, n_heads=h + len(DISTRACTORS), n_kv_heads=h + len(DISTRACTORS))
    new = Transformer(cfg)
    gen = torch.Generator().manual_seed(seed)
    dh, D, H = cfg.d_head, cfg.d_model, cfg.n_heads
    truth = []
    with torch.no_grad():
        _copy_into(new, old)
        new.embed.weight[:, d:] = torch.randn(cfg.vocab_size, N_EXTRA, generator=gen)
        new.pos_embed.weight[:, d:] = 0.5 * torch.randn(cfg.max_positions, N_EXTRA, generator=gen)
        for layer, block in enumerate(new.blocks):
            for k, (name, role, keys, relation) in enumerate(DISTRACTORS):
                head = h + k
                a = block.attn
                a.v_proj.weight.view(H, dh, D)[head, :, d:] = torch.randn(dh, N_EXTRA, generator=gen)
                if name == "random":  # logits q·k × scale of std ~RANDOM_LOGIT_STD on unit-variance inputs
                    std = (RANDOM_LOGIT_STD / (cfg.query_scale * N_EXTRA * dh**0.5)) ** 0.5
                    for proj in (a.q_proj, a.k_proj):
                        proj.weight.view(H, dh, D)[head, :, d:] = std * torch.randn(dh, N_EXTRA, generator=gen)
                a.o_proj.weight.view(D, H, dh)[d:, head] = torch.randn(N_EXTRA, dh, generator=gen) / dh**0.5
                if name != "random":
                    _pattern(new, layer, head, name, export)
                truth.append(
                    {
                        "layer": layer,
                        "head": head,
                        "kind": f"distractor:{name}",
                        "node": "",
                        "keys": keys,
                        "queries": keys,
                        "predicate": "",
                        "relation": relation,
                        "role": role,
                        "used": False,
                    }
                )
    new.distractor_truth = truth
    return new
