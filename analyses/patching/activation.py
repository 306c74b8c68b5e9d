"""Activation patching of each head's output ``z`` between the clean and the corrupted run.

For every unit (one query head, or with ``unit="kv_group"`` all query heads reading one
KV head) and every item:

* **denoising**: run the corrupted input with the unit's ``z [batch, head, pos, d_head]``
  replaced by the clean run's (all positions); ``delta = m_patched - m_corrupted``;
* **noising**: run the clean input with the unit's ``z`` from the corrupted run;
  ``delta = m_clean - m_patched``.

Batched like :func:`~headscope.analyses.pruning.gates.replica_masks`: ``R`` units are
patched in one forward of ``R`` stacked replicas of a batch (rows ``r*B .. (r+1)*B``),
through :meth:`Backend.head_hooks` on any backend::

    z'[r] = z[r] + mask[r] · (z_source - z[r])          # mask[r, head] = 1 on unit r's heads

A model that can resume a forward from a layer (the in-house backend, ``model.resumable``)
computes the unpatched prefix below the lowest patched layer once per batch. Frames:
:func:`~headscope.analyses.patching.frames.effect_frame`.

**Per position** (``per_position=True``): a unit is (heads, position) and only that
position of ``z`` is patched (``mask[r, head, pos]``). Items of a batch share their length
``T``; positions are counted from the end, ``position = p - T`` (``-1`` is the last token,
the one the metric reads), so items of different lengths line up at their ends, and the
effect at a position is aggregated over the items that have it (its ``n``), normalised by
the task's gap over all items. The frame gets a ``position`` column (int).

The metric reads :func:`readout`: a language model's last-position logits, an embedding model's
sentence embedding through its own pipeline (the metrics that read an embedding,
:data:`~headscope.analyses.patching.tasks.REFERENCE_METRICS`, compare it with the clean run's, per item).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass

import pandas as pd
import torch

from headscope.analyses.patching.frames import effect_frame
from headscope.analyses.patching.items import Task
from headscope.analyses.patching.tasks import REFERENCE_METRICS, check_decoder, metric_fn
from headscope.analyses.stats.resampling import adjust_p
from headscope.probes.capture import in_part
from headscope.probes.embedding import pipeline_of, sentence_embedding
from headscope.probes.models.backends.protocol import rows_unembedded, unembed_at
from headscope.probes.models.purpose import purpose_of

log = logging.getLogger(__name__)

DIRECTIONS = ("denoising", "noising")
UNITS = ("head", "kv_group")
ABLATIONS = ("zero", "mean", "mean_position", "resample")
#: how attribution patching takes ∂m/∂z (:mod:`~headscope.analyses.patching.attribution`)
GRADIENTS = ("total", "bypass_heads")
#: AtP*'s corrections to attribution patching (:mod:`~headscope.analyses.patching.atp_star`)
ATP_FIXES = ("none", "qk", "graddrop", "both")


@dataclass(frozen=True, kw_only=True)
class PatchConfig:
    """Options of a patching run (written into run.json).

    ``directions``: which of :data:`DIRECTIONS`; ``unit``: ``"head"`` or ``"kv_group"``
    (GQA: patch all query heads of a KV group together); ``batch_size``: items per
    batch; ``max_rows``: sequences per forward (replicas × batch); ``alpha``, ``n_boot``,
    ``n_perm``, ``seed``: statistics (:mod:`~headscope.analyses.patching.frames`) and the
    resample ablation's derangement; ``per_position``: activation and attribution
    patching per (unit, position) (module docstring); ``ablations``: the kinds of
    :func:`~headscope.analyses.patching.ablation.ablation_patching` (:data:`ABLATIONS`);
    ``gradient``: attribution patching's ``"total"`` derivative (every later path) or
    ``"bypass_heads"`` (later heads cut; :mod:`~headscope.analyses.patching.attribution`);
    ``atp_fix``: AtP*'s corrections to the total-gradient estimate, ``"qk"``, ``"graddrop"``
    or ``"both"`` (:data:`ATP_FIXES`, :mod:`~headscope.analyses.patching.atp_star`);
    ``heads``: the ``(layer, head)`` query heads activation and ablation patching patch,
    a forward per unit each (``None``: every head; a KV-group unit is kept when it holds one
    of them); attribution patching, one backward for all heads, always scores every one."""

    directions: tuple[str, ...] = ("denoising", "noising")
    unit: str = "head"
    batch_size: int = 16
    max_rows: int = 144
    alpha: float = 0.05
    n_boot: int = 1000
    n_perm: int = 10000
    seed: int = 0
    per_position: bool = False
    ablations: tuple[str, ...] = ("zero", "mean", "resample")
    gradient: str = "total"
    atp_fix: str = "none"
    heads: tuple[tuple[int, int], ...] | None = None

    def __post_init__(self):
        bad = [d for d in self.directions if d not in DIRECTIONS]
        if bad or not self.directions:
            raise ValueError(f"directions must be a non-empty subset of {DIRECTIONS}; got {self.directions}")
        if self.unit not in UNITS:
            raise ValueError(f"unit must be one of {UNITS}; got {self.unit!r}")
        if self.batch_size < 1 or self.max_rows < 1:
            raise ValueError(f"batch_size and max_rows must be >= 1; got {self.batch_size}, {self.max_rows}")
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must be in (0, 1); got {self.alpha}")
        bad = [a for a in self.ablations if a not in ABLATIONS]
        if bad or not self.ablations:
            raise ValueError(f"ablations must be a non-empty subset of {ABLATIONS}; got {self.ablations}")
        if self.gradient not in GRADIENTS:
            raise ValueError(f"gradient must be one of {GRADIENTS}; got {self.gradient!r}")
        if self.atp_fix not in ATP_FIXES:
            raise ValueError(f"atp_fix must be one of {ATP_FIXES}; got {self.atp_fix!r}")
        if self.atp_fix != "none" and (self.gradient != "total" or self.per_position):
            raise ValueError(
                f"atp_fix {self.atp_fix!r} corrects the total-gradient estimate of whole-sequence units; "
                f"got gradient {self.gradient!r}, per_position {self.per_position}"
            )
        if self.heads is not None:
            if not self.heads or any(len(h) != 2 or min(h) < 0 for h in self.heads):
                raise ValueError(f"heads must be a non-empty tuple of (layer, head) pairs >= 0; got {self.heads}")
            object.__setattr__(self, "heads", tuple((int(l), int(h)) for l, h in self.heads))


def chosen_units(spec, cfg: PatchConfig) -> list[list[tuple[int, int]]]:
    """:func:`patch_units` of ``cfg.unit``, kept to those holding one of ``cfg.heads`` (all
    when ``None``); a head outside the model is refused with the model's shape."""
    units = patch_units(spec, cfg.unit)
    if cfg.heads is None:
        return units
    outside = [h for h in cfg.heads if h[0] >= spec.n_layers or h[1] >= spec.n_heads]
    if outside:
        raise ValueError(
            f"heads {outside} are outside the model ({spec.n_layers} layers of {spec.n_heads} query heads)"
        )
    wanted = set(cfg.heads)
    return [u for u in units if wanted.intersection(u)]


def patch_units(spec, unit: str = "head") -> list[list[tuple[int, int]]]:
    """The units patched together: ``[[(layer, head)], ...]`` per query head, or per layer and
    KV head the query heads reading it (``unit="kv_group"``), ordered by layer.

    >>> from headscope.probes.models.backends.protocol import ModelSpec
    >>> s = ModelSpec(name="m", family="llama", n_layers=1, n_heads=4, n_kv_heads=2, d_head=8, d_model=32,
    ...     causal=True, max_positions=64, backend="inhouse")
    >>> patch_units(s, "kv_group")
    [[(0, 0), (0, 1)], [(0, 2), (0, 3)]]
    """
    if unit == "head":
        return [[(l, h)] for l in range(spec.n_layers) for h in range(spec.n_heads)]
    if unit == "kv_group":
        return [[(l, h) for h in hs] for l in range(spec.n_layers) for hs in spec.kv_groups().values()]
    raise ValueError(f"unit must be one of {UNITS}; got {unit!r}")


# ----------------------------------------------------------------------------- runs
def readout(model, ids: torch.Tensor, **resume) -> torch.Tensor:
    """What the metric reads (all inputs of a batch have equal length, no padding): a language
    model's logits at the last position ``[batch, vocab]``; an embedding model's sentence
    embedding ``[batch, d]`` (float32; :func:`embedding_readout`). Which one follows what the
    model is for (:func:`~headscope.probes.models.purpose.purpose_of`). A decoder whose
    unembedding reads chosen rows (in-house; HF where checked) unembeds the last position only (:func:`~headscope.probes.models.backends.protocol.unembed_at`:
    the same arithmetic per row; the other positions' logits, 22% of a SmolLM2 forward of
    17 tokens, are never computed)."""
    mask = torch.ones_like(ids)
    if purpose_of(model).kind != "lm":
        if not model.spec.causal:
            return embedding_readout(model, model.forward(ids, mask, **resume))
        with model.final_states() as kept:  # a causal embedding model: its final hidden states, no logits
            model.forward(ids, mask, **resume)
        return embedding_readout(model, kept[-1])
    if rows_unembedded(model):
        keep = torch.zeros(ids.shape, dtype=torch.bool, device=ids.device)
        keep[:, -1] = True
        with unembed_at(model, keep):
            return model.forward(ids, mask, **resume)  # [batch, vocab]
    return model.forward(ids, mask, **resume)[:, -1]


def embedding_readout(model, hidden: torch.Tensor) -> torch.Tensor:
    """``hidden [batch, pos, d_model]`` (no padding) -> the model's sentence embedding ``[batch, d]``
    float32: its own pipeline's pooling and Dense layers (:func:`~headscope.probes.embedding.pipeline_of`),
    Normalize left out (the cosine ignores scale). Prompts are not prepended: the items are token
    sequences."""
    pipe = pipeline_of(model)
    h = hidden.float()
    if pipe.pooling == ("mean",) and not pipe.dense:
        return h.mean(1)  # every position a real token: the pipeline's mean
    return sentence_embedding(h, None, pipe, normalize=False)


def measures(model, metric: str) -> str:
    """What ``metric`` measures on ``model``, in words (the summary's ``measures``): its
    registry definition; for an embedding metric, with the model's pipeline and where it comes from."""
    from headscope.analyses.metrics import get_metric

    text = get_metric(metric).definition
    if metric not in REFERENCE_METRICS:
        return text
    pipe = pipeline_of(model)
    origin = "" if pipe.assumed else " (the model's sentence-transformers modules)"
    return f"{text}; embedding: {pipe.describe()}{origin}; special tokens such as [CLS] and [SEP] count as positions"


last_logits = readout  # the name the first version used


def tile(t: torch.Tensor | None, r: int) -> torch.Tensor | None:
    """``t [batch, ...]`` stacked ``r`` times along the batch (``None`` stays ``None``)."""
    return None if t is None else t.repeat(r, *([1] * (t.dim() - 1)))


def capture_z(model, ids: torch.Tensor) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """One forward: ``(last-position logits [batch, vocab], {layer: z [batch, head, pos, d_head]})``."""
    kept: dict[int, torch.Tensor] = {}

    def keep(l):
        def fn(z):
            kept[l] = z.detach().clone()
            return z

        return fn

    with torch.inference_mode(), model.head_hooks({l: keep(l) for l in range(model.spec.n_layers)}):
        logits = last_logits(model, ids)
    return logits, kept


@contextmanager
def replica_patches(model, masks: torch.Tensor, source: dict[int, torch.Tensor]):
    """Head hooks patching ``R`` stacked replicas: replica ``r`` takes ``source[l]`` (``z [batch,
    head, pos, d_head]``) on the heads where ``masks [R, layer, head]`` is 1 (or, per
    position, where ``masks [R, layer, head, pos]`` is 1). Removed on exit."""
    fns = {}
    for l in range(masks.shape[1]):
        m = masks[:, l]
        if not bool(m.any()):
            continue

        def fn(z, m=m, src=source[l]):
            r = m.shape[0]
            zr = z.reshape(r, z.shape[0] // r, *z.shape[1:])  # [R, batch, head, pos, d_head]
            m = m.to(z.device, z.dtype)  # host-side masks; z may sit on a GPU
            mm = m[:, None, :, :, None] if m.dim() == 3 else m[:, None, :, None, None]
            return (zr + mm * (src.to(z.device, z.dtype)[None] - zr)).reshape(z.shape)

        fns[l] = fn
    with model.head_hooks(fns):
        yield


def patched_metrics(
    model,
    target: torch.Tensor,
    source_z: dict[int, torch.Tensor],
    units,
    metric,
    answer,
    wrong,
    max_rows: int,
    positions: list[int] | None = None,
    part: tuple[int, int] | None = None,
) -> torch.Tensor:
    """The metric ``[batch, n_units]`` of the ``target`` ids ``[batch, pos]`` with each unit's
    heads patched from ``source_z``; ``ceil(n_units B / max_rows)`` forwards. ``positions``:
    per unit, the one position (``0 .. pos-1``) patched (default: all positions). ``part``
    ``(k, n)`` (a sharded run): only every ``n``-th forward's units from the ``k``-th, the others NaN."""
    n_layers, n_heads = model.spec.n_layers, model.spec.n_heads
    b, t = target.shape
    per = max(1, max_rows // b)
    out = torch.full((b, len(units)), float("nan"))
    prefix: dict[int, torch.Tensor] = {}
    resumable = bool(getattr(model, "resumable", False))
    for c, s in enumerate(range(0, len(units), per)):
        if part is not None and c % part[1] != part[0]:
            continue
        chunk = units[s : s + per]
        r = len(chunk)
        masks = torch.zeros(r, n_layers, n_heads) if positions is None else torch.zeros(r, n_layers, n_heads, t)
        for i, heads in enumerate(chunk):
            for l, h in heads:
                if positions is None:
                    masks[i, l, h] = 1.0
                else:
                    masks[i, l, h, positions[s + i]] = 1.0
        l0 = min(l for heads in chunk for l, _ in heads)
        ids = target.repeat(r, 1)
        with torch.inference_mode(), replica_patches(model, masks, source_z):
            if resumable and l0 > 0:
                if l0 not in prefix:
                    prefix[l0] = model.forward(target, torch.ones_like(target), stop_at_layer=l0)
                logits = readout(model, ids, start_at_layer=l0, resid=prefix[l0].repeat(r, 1, 1))
            else:
                logits = readout(model, ids)
        log.info("patched units %d-%d of %d (from layer %d)", s + 1, s + r, len(units), l0)
        out[:, s : s + r] = metric(logits, tile(answer, r), tile(wrong, r)).view(r, b).T.cpu()
    return out


@dataclass
class RunMetrics:
    """Per-item metric of the clean and the corrupted run (item order)."""

    clean: torch.Tensor
    corrupted: torch.Tensor

    @property
    def gap(self) -> torch.Tensor:
        return self.clean - self.corrupted


@dataclass
class PairedBatch:
    """One batch of a task's pairs, both runs done: inputs ``[batch, pos]``, answer and
    wrong tokens ``[batch]`` (for a reference metric ``answer`` is the clean run's readout
    ``[batch, d_model]``), item indices, each layer's ``z`` of the clean and the corrupted
    run, and their metrics ``[batch]``."""

    clean: torch.Tensor
    corrupted: torch.Tensor
    answer: torch.Tensor
    wrong: torch.Tensor | None
    rows: list[int]
    z_clean: dict
    z_corrupted: dict
    m_clean: torch.Tensor
    m_corrupted: torch.Tensor


def paired_runs(model, task: Task, cfg: PatchConfig, metric, run: RunMetrics, part: tuple[int, int] | None = None):
    """Run the clean and the corrupted input of every batch of ``task``, capturing ``z``;
    write each item's two metrics into ``run`` and yield the :class:`PairedBatch`.
    ``part`` ``(k, n)``: only batches ``k, k+n, ...`` (:func:`~headscope.probes.capture.in_part`).
    ``ModelIncompatibleError`` for a logit metric on an encoder."""
    if task.metric not in REFERENCE_METRICS:
        check_decoder(model)
    for i, (clean, corrupted, answer, wrong, rows) in enumerate(task.batches(cfg.batch_size)):
        if not in_part(part, i):
            continue
        logits_c, z_c = capture_z(model, clean)
        logits_x, z_x = capture_z(model, corrupted)
        if task.metric in REFERENCE_METRICS:
            answer = logits_c.float()
        m_c, m_x = metric(logits_c, answer, wrong).cpu(), metric(logits_x, answer, wrong).cpu()  # per-item: host
        run.clean[rows], run.corrupted[rows] = m_c, m_x
        yield PairedBatch(clean, corrupted, answer, wrong, rows, z_c, z_x, m_c, m_x)


def activation_patching(model, task: Task, cfg: PatchConfig = PatchConfig()) -> tuple[pd.DataFrame, RunMetrics]:
    """Activation patching of every unit in ``cfg.directions``: the :data:`PATCH_COLUMNS`
    frame (rows in unit order, one block per direction; per position: by position from
    the first to the last, then unit) and the clean/corrupted metrics."""
    units = chosen_units(model.spec, cfg)
    if cfg.per_position:
        metric, n = metric_fn(task.metric), len(task.items)
        run = RunMetrics(torch.empty(n), torch.empty(n))
        return per_position_patching(model, task, cfg, units, metric, run), run
    delta, run = activation_deltas(model, task, cfg)
    return direction_frames(delta, run, units, cfg, "activation"), run


def activation_deltas(
    model, task: Task, cfg: PatchConfig, part: tuple[int, int] | None = None
) -> tuple[dict[str, torch.Tensor], RunMetrics]:
    """``({direction: [n_items, n_units]} effects, the runs' metrics)`` of activation patching
    every unit of :func:`chosen_units` (not per position). ``part`` ``(k, n)``: only the units of
    every ``n``-th patched forward (:func:`patched_metrics`), the others NaN: :func:`merge_deltas`
    of the ``n`` parts is the whole run's, each value from the same forward."""
    units = chosen_units(model.spec, cfg)
    metric = metric_fn(task.metric)
    n = len(task.items)
    run = RunMetrics(torch.empty(n), torch.empty(n))
    delta = {d: torch.empty(n, len(units)) for d in cfg.directions}
    for b in paired_runs(model, task, cfg, metric, run):
        if "denoising" in delta:
            args = (b.answer, b.wrong, cfg.max_rows, None, part)
            patched = patched_metrics(model, b.corrupted, b.z_clean, units, metric, *args)
            delta["denoising"][b.rows] = patched - b.m_corrupted[:, None]
        if "noising" in delta:
            args = (b.answer, b.wrong, cfg.max_rows, None, part)
            patched = patched_metrics(model, b.clean, b.z_corrupted, units, metric, *args)
            delta["noising"][b.rows] = b.m_clean[:, None] - patched
        log.info("activation patching: %d/%d items", max(b.rows) + 1, n)
    return delta, run


def merge_deltas(parts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The parts' :func:`activation_deltas` in one: each cell from the part that computed it
    (the one not NaN there). Raises ``ValueError`` for no parts.

    >>> nan = float("nan")
    >>> merge_deltas([{"d": torch.tensor([[1.0, nan]])}, {"d": torch.tensor([[nan, 2.0]])}])["d"].tolist()
    [[1.0, 2.0]]
    """
    if not parts:
        raise ValueError("merge_deltas needs at least one part; got none")
    out = {d: v.clone() for d, v in parts[0].items()}
    for p in parts[1:]:
        for d, v in p.items():
            out[d] = torch.where(torch.isnan(out[d]), v, out[d])
    return out


def per_position_patching(model, task: Task, cfg: PatchConfig, units, metric, run: RunMetrics) -> pd.DataFrame:
    """Activation patching per (unit, position) (module docstring) -> the frame with ``position``."""
    n = len(task.items)
    delta: dict[str, dict[int, torch.Tensor]] = {d: {} for d in cfg.directions}
    for b in paired_runs(model, task, cfg, metric, run):
        t = b.clean.shape[1]
        flat = [heads for heads in units for _ in range(t)]
        pos = [p for _ in units for p in range(t)]
        for d in cfg.directions:
            target, source, base = (
                (b.corrupted, b.z_clean, b.m_corrupted) if d == "denoising" else (b.clean, b.z_corrupted, b.m_clean)
            )
            patched = patched_metrics(model, target, source, flat, metric, b.answer, b.wrong, cfg.max_rows, pos)
            got = (patched - base[:, None]) if d == "denoising" else (base[:, None] - patched)
            store_positions(delta[d], got.view(len(b.rows), len(units), t), b.rows, n)
        log.info("per-position patching: %d/%d items", max(b.rows) + 1, n)
    return position_frames(delta, float(run.gap.mean()), units, cfg, "activation")


def store_positions(delta: dict[int, torch.Tensor], got: torch.Tensor, rows: list[int], n_items: int) -> None:
    """Write ``got [batch, unit, pos]`` (one batch of equal-length items, ``rows`` their item
    indices) into ``delta`` ``{position from the end: [n_items, unit]}`` (NaN where an item
    has no such position)."""
    t = got.shape[2]
    for p in range(t):
        store = delta.setdefault(p - t, torch.full((n_items, got.shape[1]), float("nan")))
        store[rows] = got[:, :, p]


def position_frames(delta: dict, gap: float, units, cfg: PatchConfig, method: str) -> pd.DataFrame:
    """The per-position frame of ``delta`` ``{direction: {position: [n_items, unit]}}``:
    ``method`` ``"{method}_{direction}"``, a ``position`` column, positions from the first
    to the last, BH over every (unit, position) of a direction (:func:`readjust`)."""
    frames = []
    for d in cfg.directions:
        blocks = [
            subset_frame(delta[d][p], gap, units, cfg, f"{method}_{d}", extra={"position": p}) for p in sorted(delta[d])
        ]
        frames.append(readjust(pd.concat(blocks, ignore_index=True), [len(h) for h in units] * len(blocks), cfg.alpha))
    return pd.concat(frames, ignore_index=True)


def readjust(frame: pd.DataFrame, rows_per_unit: list[int], alpha: float) -> pd.DataFrame:
    """BH over every (unit, position) of one method: ``p_value``/``significant`` recomputed
    from ``p_raw``, one test per unit (``rows_per_unit``: rows each unit holds, in order)."""
    starts = torch.tensor([0, *rows_per_unit[:-1]]).cumsum(0)
    p = adjust_p(torch.tensor(frame["p_raw"].to_numpy())[starts], "bh")
    per_row = torch.repeat_interleave(p, torch.tensor(rows_per_unit)).numpy()
    frame["p_value"] = per_row
    frame["significant"] = per_row < alpha
    return frame


def subset_frame(
    delta: torch.Tensor, gap: float, units, cfg: PatchConfig, method: str, extra: dict | None = None
) -> pd.DataFrame:
    """:func:`effect_frame` over the items (rows of ``delta [n_items, n_units]``) that are not
    NaN, normalised by ``gap`` (the task's mean clean - corrupted gap over all items)."""
    keep = ~torch.isnan(delta).any(1)
    d = delta[keep]
    return effect_frame(
        d,
        torch.full((d.shape[0],), gap),
        units,
        method=method,
        alpha=cfg.alpha,
        n_boot=cfg.n_boot,
        n_perm=cfg.n_perm,
        seed=cfg.seed,
        unit=cfg.unit,
        extra=extra,
    )


def direction_frames(delta: dict, run: RunMetrics, units, cfg: PatchConfig, method: str) -> pd.DataFrame:
    """One :func:`effect_frame` per direction of ``delta`` (``{direction: [item, unit]}``),
    ``method`` ``"{method}_{direction}"``, concatenated."""
    frames = [
        effect_frame(
            delta[d],
            run.gap,
            units,
            method=f"{method}_{d}",
            alpha=cfg.alpha,
            n_boot=cfg.n_boot,
            n_perm=cfg.n_perm,
            seed=cfg.seed,
            unit=cfg.unit,
        )
        for d in cfg.directions
    ]
    return pd.concat(frames, ignore_index=True)
