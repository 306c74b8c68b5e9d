"""Physical head pruning: a smaller in-house transformer whose layers really hold fewer heads.

Gating a head (``gate = 0`` with zero ablation) removes its contribution but keeps its
weights and its compute. :func:`prune_heads` builds a NEW model without them:

* the dropped query heads' rows of ``W_Q`` and columns of ``W_O`` are removed;
* a KV head's rows of ``W_K``/``W_V`` are removed only when no kept query head reads it
  (GQA: the whole group is gone); a partly pruned group keeps its KV head;
* biases follow their rows; ``o_proj``'s bias (BERT) stays whole. A dropped head whose
  ``ablation_value`` is not zero (mean ablation) has its constant output ``W_O,h · mean_h``
  folded into that bias, so the pruned model equals the gated model under either ablation.

``ModelConfig.heads_kept`` records, per layer, the ORIGINAL indices of the query heads kept;
``Block`` builds its attention from it. Indices passed to :func:`prune_heads` are always
original indices, so pruning a pruned model again composes.

:func:`save_pruned` / :func:`load_pruned` write and read ``model.safetensors`` +
``headscope_config.json`` (``ModelConfig.to_dict()``) + the tokenizer, atomically.

>>> small = prune_heads(Transformer(ModelConfig(n_layers=2, n_heads=4, n_kv_heads=2)), {0: [0, 1], 1: [3]})
>>> small.cfg.heads_kept, [b.attn.n_kv_heads for b in small.module.blocks]
(((2, 3), (0, 1, 2)), [1, 2])
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import statistics
import tempfile
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from headscope.probes.errors import CheckpointError
from headscope.probes.models.backends.inhouse import InHouseModel
from headscope.probes.models.backends.protocol import Backend
from headscope.probes.models.checkpoints import load_state_into
from headscope.probes.models.config import ModelConfig
from headscope.probes.models.inhouse.transformer import Transformer
from headscope.probes.outputs.modes import folder_mode
from headscope.probes.outputs.swap import swap_in

log = logging.getLogger(__name__)

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "headscope_config.json"


def _is_transformer(m) -> bool:
    # duck-typed: the package is importable both as ``headscope.probes`` and (doctests) ``probes``
    return isinstance(m, torch.nn.Module) and hasattr(m, "blocks") and hasattr(getattr(m, "cfg", None), "heads_kept")


def _build(cfg: ModelConfig) -> Transformer:
    """A fresh Transformer; a layer without heads has zero-element projections, whose
    initialisation warning is noise here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Initializing zero-element tensors")
        return Transformer(cfg)


def _as_inhouse(model) -> InHouseModel:
    if isinstance(model, Backend) and model.has_gates:  # structural: holds under either import name
        return model
    if _is_transformer(model):
        return InHouseModel(model)
    raise TypeError(
        f"model must be an InHouseModel or an in-house Transformer (load it with backend='inhouse'); "
        f"got {type(model).__name__}."
    )


def _check_heads(module: Transformer, heads_to_prune) -> dict[int, set[int]]:
    """Validate ``{layer: [original query head, ...]}`` against the heads each layer holds."""
    if not isinstance(heads_to_prune, dict):
        raise TypeError(f"heads_to_prune must be a dict {{layer: [head, ...]}}; got {type(heads_to_prune).__name__}.")
    n_layers = len(module.blocks)
    out: dict[int, set[int]] = {}
    for layer, heads in heads_to_prune.items():
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < n_layers:
            raise ValueError(f"heads_to_prune keys must be layers 0..{n_layers - 1}; got {layer!r}.")
        held = module.blocks[layer].heads
        hs = set()
        for h in heads:
            if isinstance(h, bool) or not isinstance(h, int):
                raise TypeError(f"head indices must be ints; got {h!r} in layer {layer}.")
            if h not in held:
                raise ValueError(
                    f"layer {layer} holds query heads {list(held)} (original indices); cannot prune head {h}."
                )
            hs.add(h)
        out[layer] = hs
    return out


def _rows(blocks: list[int], d_head: int) -> torch.Tensor:
    """Row indices of head blocks ``blocks`` in a ``[heads * d_head, ...]`` weight."""
    if not blocks:
        return torch.zeros(0, dtype=torch.long)
    return torch.cat([torch.arange(b * d_head, (b + 1) * d_head) for b in blocks])


def _kv_kept(cfg: ModelConfig, heads) -> list[int]:
    return sorted({cfg.kv_head_of(h) for h in heads})


def prune_heads(model, heads_to_prune: dict[int, list[int]]) -> InHouseModel:
    """A new in-house model without the query heads ``heads_to_prune = {layer: [head, ...]}``
    (ORIGINAL head indices). The input model is left untouched.

    Kept heads keep their gate and ablation value. A layer may lose all its heads (its
    attention then adds only ``o_proj``'s bias, as the fully gated layer does).

    Raises ``TypeError`` for a model that is not in-house, ``ValueError`` for a layer or
    head the model does not hold, and ``ValueError`` when a mean-ablated head would need
    folding into an ``o_proj`` that has no bias (Llama): zero its ablation value first.

    >>> m = Transformer(ModelConfig(family="bert", n_layers=1, n_heads=4))
    >>> p = prune_heads(m, {0: [0, 1, 2, 3]})
    >>> p.module.blocks[0].attn.q_proj.weight.shape, p.module.blocks[0].attn.o_proj.bias.shape
    (torch.Size([0, 64]), torch.Size([64]))
    """
    src = _as_inhouse(model)
    module, cfg = src.module, src.module.cfg
    drop = _check_heads(module, heads_to_prune)
    kept = tuple(
        tuple(sorted(h for h in block.heads if h not in drop.get(layer, set())))
        for layer, block in enumerate(module.blocks)
    )
    new_cfg = cfg.replace(heads_kept=kept)
    param = next(module.parameters())
    new = _build(new_cfg).to(dtype=param.dtype, device=param.device)

    old_state = module.state_dict()
    new_state = {}
    d_head = cfg.d_head
    for layer, (old_block, heads) in enumerate(zip(module.blocks, kept)):
        attn = old_block.attn
        old_heads = list(old_block.heads)
        q_pos = [old_heads.index(h) for h in heads]
        old_kv = _kv_kept(cfg, old_heads)
        kv_pos = [old_kv.index(g) for g in _kv_kept(cfg, heads)]
        dev = attn.q_proj.weight.device
        q_rows, kv_rows = _rows(q_pos, d_head).to(dev), _rows(kv_pos, d_head).to(dev)
        p = f"blocks.{layer}.attn."
        with torch.no_grad():
            for proj, rows in (("q_proj", q_rows), ("k_proj", kv_rows), ("v_proj", kv_rows)):
                lin = getattr(attn, proj)
                new_state[p + proj + ".weight"] = lin.weight.index_select(0, rows).clone()
                if lin.bias is not None:
                    new_state[p + proj + ".bias"] = lin.bias.index_select(0, rows).clone()
            new_state[p + "o_proj.weight"] = attn.o_proj.weight.index_select(1, q_rows).clone()
            bias = None if attn.o_proj.bias is None else attn.o_proj.bias.clone()
            dropped_pos = [i for i, h in enumerate(old_heads) if h not in heads]
            # A dropped head outputs its ablation value through W_O (gate 0): fold the constant.
            folded = [i for i in dropped_pos if bool(attn.ablation_value[i].any())]
            if folded:
                if bias is None:
                    raise ValueError(
                        f"layer {layer}: heads {[old_heads[i] for i in folded]} have a non-zero ablation value "
                        "(mean ablation) but o_proj has no bias to fold it into; set their ablation_value "
                        "to zero (zero ablation) before pruning."
                    )
                for i in folded:
                    cols = slice(i * d_head, (i + 1) * d_head)
                    bias = bias + attn.o_proj.weight[:, cols] @ attn.ablation_value[i].to(bias.dtype)
            if bias is not None:
                new_state[p + "o_proj.bias"] = bias
        new_block = new.blocks[layer].attn
        with torch.no_grad():
            idx = torch.tensor(q_pos, dtype=torch.long, device=attn.gate.device)
            new_block.gate.copy_(attn.gate.index_select(0, idx))
            new_block.ablation_value.copy_(attn.ablation_value.index_select(0, idx))
    for name, tensor in old_state.items():  # everything outside q/k/v/o is copied as is
        if name not in new_state and not name.endswith(".gate"):
            new_state[name] = tensor
    missing, unexpected = new.load_state_dict(new_state, strict=False)
    missing = [m for m in missing if not m.endswith(".gate")]
    if missing or unexpected:  # pragma: no cover - the two state dicts are built from one config
        raise RuntimeError(f"internal: pruned state mismatch missing={missing[:3]} unexpected={unexpected[:3]}")
    n_dropped = sum(len(v) for v in drop.values())
    log.info("pruned %d query heads; kept per layer: %s", n_dropped, [len(k) for k in kept])
    return InHouseModel(new.eval(), src.tokenizer, name=src.spec.name, trust_remote_code=src.trust_remote_code)


def heads_held(model) -> dict[int, tuple[int, ...]]:
    """``{layer: original indices of the query heads the layer holds}``."""
    module = _as_inhouse(model).module
    return {layer: tuple(b.heads) for layer, b in enumerate(module.blocks)}


def kv_heads_held(model) -> dict[int, int]:
    """``{layer: number of KV heads the layer holds}``."""
    module = _as_inhouse(model).module
    return {layer: b.attn.n_kv_heads for layer, b in enumerate(module.blocks)}


@contextmanager
def gates_off(model, heads: dict[int, list[int]]):
    """Gate the ORIGINAL query heads ``heads`` off with zero ablation for the ``with`` body;
    gates and ablation values are restored afterwards, even on an exception.

    This is the soft counterpart of :func:`prune_heads`: both give the same outputs.
    """
    module = _as_inhouse(model).module
    drop = _check_heads(module, heads)
    saved = []
    try:
        for layer, hs in drop.items():
            attn = module.blocks[layer].attn
            saved.append((attn, attn.gate.detach().clone(), attn.ablation_value.clone()))
            pos = [module.blocks[layer].heads.index(h) for h in hs]
            with torch.no_grad():
                attn.gate[pos] = 0.0
                attn.ablation_value[pos] = 0.0
        yield model
    finally:
        with torch.no_grad():
            for attn, gate, abl in saved:
                attn.gate.copy_(gate)
                attn.ablation_value.copy_(abl)


# --- save / load -------------------------------------------------------------------------


def _weights_to_save(module: Transformer) -> dict[str, torch.Tensor]:
    state = {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items() if not k.endswith(".gate")}
    if module.cfg.tie_embeddings and "unembed.weight" in state:
        del state["unembed.weight"]  # shared with embed.weight; load_state_into re-ties it
    return state


def save_pruned(model, directory, *, overwrite: bool = False) -> Path:
    """Write ``model.safetensors``, ``headscope_config.json`` (``ModelConfig.to_dict()``,
    with ``heads_kept``) and the tokenizer into ``directory``.

    Everything is written into a temporary sibling directory that is renamed into place, so
    a crash never leaves a half-written model. Gates are not saved: every gate must be 1
    (prune gated heads physically first). Returns the directory.

    Raises ``ValueError`` if ``directory`` exists and ``overwrite`` is False, or if a gate is
    not 1.
    """
    src = _as_inhouse(model)
    module = src.module
    for layer, block in enumerate(module.blocks):
        if not bool((block.attn.gate == 1).all()):
            off = [block.heads[i] for i in (block.attn.gate != 1).nonzero().flatten().tolist()]
            raise ValueError(
                f"layer {layer}: gates of heads {off} are not 1; gates are not saved. "
                f"Prune them with prune_heads(model, {{{layer}: {off}}}) or reset the gates to 1."
            )
    directory = Path(directory)
    if directory.exists() and not overwrite:
        raise ValueError(f"{directory} already exists; pass overwrite=True or choose a new directory.")
    directory.parent.mkdir(parents=True, exist_ok=True)
    from safetensors.torch import save_file

    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", suffix=".tmp", dir=directory.parent))
    os.chmod(tmp, folder_mode())  # mkdtemp's 0700 would hide the checkpoint from everyone else
    try:
        save_file(_weights_to_save(module), str(tmp / WEIGHTS_FILE), metadata={"format": "pt", "writer": "headscope"})
        cfg = module.cfg.to_dict()
        cfg["name"] = src.spec.name
        (tmp / CONFIG_FILE).write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        if src.tokenizer is not None:
            src.tokenizer.save_pretrained(str(tmp))
        swap_in(tmp, directory)  # one atomic exchange where the system has it
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


def load_pruned(directory) -> InHouseModel:
    """Load a model written by :func:`save_pruned` (weights-only safetensors, strict shapes).

    Raises :class:`~headscope.probes.errors.CheckpointError` for a missing or invalid
    config, a corrupt weights file, or a missing, extra or mis-shaped tensor (named).
    """
    directory = Path(directory)
    cfg_path = directory / CONFIG_FILE
    if not cfg_path.is_file():
        raise CheckpointError(f"{directory}: no {CONFIG_FILE}; not a directory written by save_pruned")
    try:
        cfg = ModelConfig.from_dict(json.loads(cfg_path.read_text(encoding="utf-8")))
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{cfg_path}:{e.lineno}:{e.colno}: invalid JSON ({e.msg})") from None
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{cfg_path}: invalid config ({e})") from None
    for layer, kept in enumerate(cfg.heads_kept or ()):
        # unsorted indices would silently mis-pair query and KV heads (see repeat_kv)
        if list(kept) != sorted(set(kept)) or any(not 0 <= h < cfg.n_heads for h in kept):
            raise CheckpointError(
                f"{cfg_path}: heads_kept[{layer}] must be sorted, distinct query heads in 0..{cfg.n_heads - 1}; "
                f"got {list(kept)}"
            )
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        raise CheckpointError(f"{directory}: no {WEIGHTS_FILE}")
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{weights}: corrupt or truncated safetensors ({e})") from None
    module = _build(cfg)
    load_state_into(module, state, str(weights))
    tokenizer = None
    if (directory / "tokenizer_config.json").is_file():
        from headscope.probes.models.checkpoints import load_tokenizer

        tokenizer = load_tokenizer(directory)
    return InHouseModel(module.eval(), tokenizer, name=cfg.name)


# --- what pruning buys ---------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class PruningGain:
    """Parameters and forward time of the gated model (heads gated off, weights kept) vs the
    physically pruned one. Parameter counts exclude gates; tied weights count once."""

    n_heads_pruned: int
    params_before: int
    params_after: int
    attn_params_before: int
    attn_params_after: int
    seconds_gated: float
    seconds_pruned: float

    @property
    def param_reduction(self) -> float:
        return 1 - self.params_after / self.params_before

    @property
    def attn_param_reduction(self) -> float:
        return 1 - self.attn_params_after / self.attn_params_before

    @property
    def speedup(self) -> float:
        return self.seconds_gated / self.seconds_pruned


def count_params(module: Transformer, attention_only: bool = False) -> int:
    """Parameters of ``module`` (gates excluded, shared tensors once)."""
    return sum(
        p.numel()
        for n, p in module.named_parameters()
        if not n.endswith(".gate") and (".attn." in n or not attention_only)
    )


def _seconds_per_forward(module: Transformer, input_ids, attention_mask, repeats: int) -> float:
    times = []
    with torch.inference_mode():
        module(input_ids, attention_mask)  # warm-up
        for _ in range(repeats):
            t0 = time.perf_counter()
            module(input_ids, attention_mask)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def pruning_gain(model, heads: dict[int, list[int]], batch, *, repeats: int = 5) -> PruningGain:
    """Prune ``heads`` physically and compare with gating them off in ``model``.

    ``batch``: a :class:`~headscope.probes.tokens.TokenBatch` or ``input_ids [batch, pos]``.
    Seconds are the median of ``repeats`` timed forwards after one warm-up.
    """
    src = _as_inhouse(model)
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive int; got {repeats!r}.")
    if isinstance(batch, torch.Tensor):
        input_ids, mask = batch, torch.ones_like(batch)
    else:
        input_ids, mask = batch.input_ids, batch.attention_mask
    pruned = prune_heads(src, heads)
    with gates_off(src, heads):
        t_gated = _seconds_per_forward(src.module, input_ids, mask, repeats)
    t_pruned = _seconds_per_forward(pruned.module, input_ids, mask, repeats)
    return PruningGain(
        n_heads_pruned=sum(len(set(v)) for v in heads.values()),
        params_before=count_params(src.module),
        params_after=count_params(pruned.module),
        attn_params_before=count_params(src.module, attention_only=True),
        attn_params_after=count_params(pruned.module, attention_only=True),
        seconds_gated=t_gated,
        seconds_pruned=t_pruned,
    )


def half_of_heads(model, seed: int = 0) -> dict[int, list[int]]:
    """A seeded random choice of half the query heads of every layer (rounded down), for
    :func:`pruning_gain` benchmarks."""
    module = _as_inhouse(model).module
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for layer, block in enumerate(module.blocks):
        held = list(block.heads)
        order = torch.randperm(len(held), generator=gen).tolist()
        out[layer] = sorted(held[i] for i in order[: len(held) // 2])
    return out
