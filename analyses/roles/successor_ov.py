"""The successor role's weights score (Gould et al. 2023, §3): a head's **effective OV circuit** on
the tokens of the ordinal sets, ``W_U^T W_OV MLP0(W_E)``, with no attention pattern and no text.

Per ordinal token ``t`` (a member with a successor in its set, :func:`chains`):

* its **extended embedding** ``e(t)``: the residual stream after block 0 when ``t`` stands alone (a
  one-token sequence, no BOS): the embedding (with the first position's, where the model adds one),
  layer 0's attention, which can only read ``t`` itself, and MLP0: Gould et al.'s ``MLP0(W_E)``;
* at head ``h`` of layer ``L``: the value ``v = norm_L(e(t)) W_V + b_V`` the head would read from a
  position holding ``e(t)`` (``norm_L``: the layer's own input norm, the module itself; the hf backend
  finds it as the norm whose output the value projection reads on a forward), written ``v W_O[h]``
  and read by the unembedding over the set's members (``W_U`` as
  :func:`~headscope.analyses.roles.successor.readout` reads it: the final norm's scale folded on the
  in-house stack, not on the hf backend; the final norm's per-token division does not move an argmax);
* a **hit** is the successor of ``t`` getting the largest logit among the set's members.

Rows ``successor:ov`` (score kind ``hit``, one item per token): the share of hits, against a uniform
pick among the set's members (``1 / members``), verdict at a share of :data:`THRESHOLD` with the
adjusted p below ``cfg.alpha``. Only pre-norm decoders (a post-norm model reads ``e`` through other
norms first): others, and a backend without per-head weights, get a note instead.

>>> chains_of_items([])
[]
"""

from __future__ import annotations

import torch

ROLE = "successor:ov"
#: the share of ordinal tokens whose successor a successor head's effective OV circuit puts first
THRESHOLD = 0.5


def chains(tokenizer, sets) -> list[tuple[tuple[int, ...], dict[int, int]]]:
    """``[(member ids in order, {id: successor id})]`` of the sets (``{name: [words in order]}``) with
    at least two consecutive single-token pairs and three single-token members."""
    from headscope.analyses.roles.successor import single_token_ids, successor_map

    out = []
    for words in sets.values():
        ids = single_token_ids(tokenizer, words)
        succ = successor_map(ids)
        members = tuple(dict.fromkeys(i for i in ids if i is not None))
        if len(succ) >= 2 and len(members) >= 3:
            out.append((members, succ))
    return out


def chains_of_items(items) -> list[tuple[tuple[int, ...], dict[int, int]]]:
    """The chains given :class:`~headscope.analyses.roles.successor.OrdinalItem` s show: per distinct
    member tuple, the successor of each token scored somewhere."""
    out: dict[tuple, dict] = {}
    for it in items:
        out.setdefault(tuple(it.members), {}).update({it.ids[p]: t for p, t in zip(it.positions, it.targets)})
    return list(out.items())


def ov_hits(model, chain_list, layers) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """``(hits [token, layer, head]`` (0/1), ``baseline [token]`` (``1 / members``), the scored token
    ids)``: per token with a successor, whether each head's effective OV circuit puts the successor
    first among the set's members (module docstring)."""
    from headscope.analyses.roles.successor import readout
    from headscope.probes.ov_inputs import extended_embeddings, ov_values

    tokens, targets, member_sets = [], [], []
    for members, succ in chain_list:
        for t in members:
            if t in succ:
                tokens.append(t)
                targets.append(members.index(succ[t]))
                member_sets.append(members)
    if not tokens:
        raise ValueError("successor: no ordinal token with a successor to score")
    columns = sorted({m for ms in member_sets for m in ms})
    read = readout(model, layers, columns)  # {layer: [head, d_head, column]}
    values = ov_values(model, extended_embeddings(model, tokens), layers)
    hits = torch.zeros(len(tokens), len(layers), model.spec.n_heads)
    for li, l in enumerate(layers):
        r = read[l].cpu()
        for i, (ms, target) in enumerate(zip(member_sets, targets)):
            cols = [columns.index(m) for m in ms]
            logits = torch.einsum("he,hem->hm", values[l][:, i], r[:, :, cols])  # [head, member]
            hits[i, li] = (logits.argmax(-1) == target).float()
    baseline = torch.tensor([1.0 / len(ms) for ms in member_sets])
    return hits, baseline, tokens
