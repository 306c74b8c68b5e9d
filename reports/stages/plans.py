"""The stages of each command's memory plan: what one forward of a ``roles``, ``prune`` or
``patch`` run holds, read from the model's config and the run's settings and inputs.

Each builder returns :class:`~headscope.probes.budget.WorkingSet` rows for
:func:`headscope.reports.budget.plan` (:func:`roles_stages`, :func:`prune_stages`,
:func:`patch_stages`); :func:`apply_prune` / :func:`apply_patch` put the fitted batch sizes
back into a config. Lengths are counted with the model's tokenizer where one is at hand
(:func:`model_shape` reads it without the weights), else bounded by the items' UTF-8 bytes
(:func:`longest_tokens`).
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import replace

from headscope.probes.budget import Shape, WorkingSet

log = logging.getLogger(__name__)


def _stream_caps() -> tuple[int | None, int | None]:
    """``(max_tokens, max_cells)``: :func:`~headscope.probes.capture.stream`'s defaults."""
    from headscope.probes.capture import stream

    p = inspect.signature(stream).parameters
    return p["max_tokens"].default, p["max_cells"].default


def longest_tokens(items, tokenizer=None, *, words: bool = False) -> int:
    """Tokens of the longest of ``items`` (texts, or word lists with ``words``): counted with
    ``tokenizer``, else bounded by UTF-8 bytes + 2 (special tokens). 1 for no items."""
    from headscope.probes.tokens import tokenize_one

    best = 1
    for it in items:
        if tokenizer is not None:
            try:
                n = len(
                    tokenize_one(tokenizer, words=list(it), add_bos=False)["ids"]
                    if words
                    else tokenize_one(tokenizer, text=it)["ids"]
                )
            except (ValueError, TypeError):  # skipped by the run, counted there
                continue
        else:
            n = (sum(len(str(w).encode()) + 1 for w in it) if words else len(str(it).encode())) + 2
        best = max(best, n)
    return best


def model_shape(model, dtype: str = "fp32") -> tuple[Shape, bool, object] | None:
    """``(shape, convert, tokenizer)`` of a MODEL argument from its config alone (``convert``:
    a GGUF not yet dequantised; ``tokenizer``: loaded where its files are at hand without
    the weights, else None); None for a hub id (nothing to read before the download) and for
    a model whose config cannot be read here: the load then reports what is wrong, as before."""
    from headscope.probes.errors import HeadscopeError

    try:
        return _model_shape(model, dtype)
    except (HeadscopeError, ValueError, TypeError, KeyError, OSError) as e:
        log.info("no memory estimate for %s before it loads: %s", model, e)
        return None


def _model_shape(model, dtype: str):
    from headscope.probes.models.card import source_hf_config
    from headscope.probes.models.checkpoints import cache_dir, file_sha256, resolve

    source = resolve(model)
    if source.kind == "hub":
        return None
    hf = source_hf_config(source)
    folder = None
    if source.kind == "hf-dir":
        folder = source.path
    elif source.kind == "gguf":
        cached = cache_dir() / "gguf" / file_sha256(source.path)[:16]
        folder = cached if (cached / "model.safetensors").exists() else None
    convert = source.kind == "gguf" and folder is None
    tokenizer = None
    if folder is not None and any((folder / f).exists() for f in ("tokenizer.json", "vocab.txt", "tokenizer.model")):
        try:
            from headscope.probes.models.checkpoints import load_tokenizer

            tokenizer = load_tokenizer(folder)
        except Exception as e:  # noqa: BLE001 - lengths are then bounded by bytes; the load reports the error
            log.info("tokenizer of %s not read for the memory estimate (%s); lengths bounded by bytes", model, e)
    if tokenizer is None and convert:  # a GGUF not converted yet: its metadata's tokenizer counts the lengths
        from headscope.probes.models.tokenizer import gguf_tokenizer

        tokenizer = gguf_tokenizer(source.path)
    return Shape.from_hf_config(hf, dtype=dtype, where=str(source.path)), convert, tokenizer


def auto_probes(model) -> bool:
    """Whether ``--backend auto`` will load MODEL ``model`` in-house and probe it against an HF
    eager copy (:func:`~headscope.probes.models.loading.choose_backend`: the in-house stack
    covers its family); False where that cannot be told from its config."""
    from headscope.probes.errors import HeadscopeError
    from headscope.probes.models.checkpoints import resolve
    from headscope.probes.models.loading import choose_backend

    try:
        return choose_backend(resolve(model))[0] == "inhouse"
    except (HeadscopeError, ValueError, TypeError, KeyError, OSError):
        return False


def shape_of_model(model, dtype: str) -> Shape | None:
    """The :class:`Shape` of a loaded model (its HF config), for a run on a model a notebook
    holds; None when its config is unknown or unreadable."""
    from headscope.probes.errors import HeadscopeError
    from headscope.probes.models.loading import hf_config_of

    try:
        hf = hf_config_of(model)
        return None if hf is None else Shape.from_hf_config(hf, dtype=dtype)
    except (HeadscopeError, ValueError, TypeError, KeyError, OSError) as e:
        log.info("no memory estimate for the model object: %s", e)
        return None


# ----------------------------------------------------------------------------- stages per command


def roles_stages(shape: Shape, cfg, groups, inputs: dict, tokenizer=None) -> list[WorkingSet]:
    """One stage per corpus the role ``groups`` stream (text, syntactic, coreference) and one per
    generated role, at ``cfg.batch_size`` with every layer's patterns kept; no logits
    (:func:`~headscope.probes.capture.run_batch` does not unembed what no role reads). A generated
    role read through the logits (:attr:`~headscope.analyses.roles.base.Role.needs_logits`) has no
    items on an encoder, and no working set there."""
    from headscope.analyses.roles.base import REGISTRY

    max_tokens, max_cells = _stream_caps()
    common = dict(
        logits="none",
        batch_size=cfg.batch_size,
        max_tokens=max_tokens,
        max_cells=max_cells,
        kept_layers=shape.n_layers,
        reducers=True,
        statistics=True,
    )
    out = []
    corpora = {}
    for g in groups:
        corpora.setdefault(REGISTRY[g].corpus, []).append(g)
    for corpus, gs in corpora.items():
        if corpus == "generated":  # each generated role says how long its sequences are
            for g in gs:
                role = REGISTRY[g]
                if not shape.causal and role.needs_logits:
                    continue
                if role.plan is not None:
                    out += role.plan(shape, cfg)
                elif role.generated is not None:
                    out.append(WorkingSet(name=g, longest=role.generated(cfg)[0], **common))
            continue
        items = inputs.get(corpus)
        if corpus == "text":
            lines = list(items.lines) if hasattr(items, "lines") else list(items or [])
            n = longest_tokens(lines, tokenizer)
        elif corpus == "conllu":
            sents = [s for c in items or [] for s in (c.sentences if hasattr(c, "sentences") else [c])]
            n = longest_tokens([s.words for s in sents], tokenizer, words=True)
        else:
            its = list(items.items) if hasattr(items, "items") else list(items or [])
            n = longest_tokens([i.words for i in its], tokenizer, words=True)
        out.append(WorkingSet(name="text" if corpus == "text" else "+".join(gs), longest=n, **common))
    return out


def roles_items(groups, inputs: dict, cfg, spec=None) -> int:
    """Items the role ``groups`` will run (for the time estimate); a group whose items cost more
    than a forward each (:attr:`~headscope.analyses.roles.base.Role.work`) counts its forwards,
    from the model's shape ``spec`` where it is known."""
    from headscope.analyses.roles.base import REGISTRY

    corpora = {REGISTRY[g].corpus for g in groups}
    n = 0
    if "text" in corpora and inputs.get("text") is not None:
        n += len(getattr(inputs["text"], "lines", inputs["text"]))
    if "conllu" in corpora:
        n += sum(len(getattr(c, "sentences", [c])) for c in inputs.get("conllu") or [])
    if "coref" in corpora and inputs.get("coref") is not None:
        n += len(getattr(inputs["coref"], "items", inputs["coref"]))
    for g in groups:
        role = REGISTRY[g]
        if role.work is not None:
            n += role.work(cfg, spec)
        elif role.generated is not None:
            n += role.generated(cfg)[1]
    return n


def _prune_data(metric: str, n_items: int | None):
    """``(items, words)`` the pruning metric reads (its shipped data, first ``n_items``)."""
    from headscope.data import path

    if metric == "coref_accuracy":
        from headscope.probes.corpora import read_coref

        items = [i.words for i in read_coref(path("coref/coref.jsonl")).items]
        return items[:n_items] if n_items else items, True
    if metric == "paraphrase_accuracy":
        from headscope.analyses.pruning.metrics import read_paraphrases

        pairs = read_paraphrases(path("paraphrase/pairs.jsonl"))
        pairs = pairs[:n_items] if n_items else pairs
        texts = []
        for p in pairs:  # anchor, positive, negatives
            for v in p.values():
                texts.extend(t for t in (v if isinstance(v, list) else [v]) if isinstance(t, str))
        return texts, False
    from headscope.analyses.pruning.metrics import read_lines

    lines = read_lines(path("heldout/lm_text.txt"))
    return (lines[:n_items] if n_items else lines), False


def prune_stages(shape: Shape, pcfg, tokenizer=None) -> list[WorkingSet]:
    """The masked replicas of a batch (``max(batch_size, max_rows)`` rows per forward, the
    unablated stream of the batch kept per layer) and, with importance, one batch's backward."""
    from headscope.analyses.pruning.metrics import default_metric

    metric = pcfg.metric or default_metric(shape)
    items, words = _prune_data(metric, pcfg.items)
    n = longest_tokens(items, tokenizer, words=words)
    b = shape.bytes_per
    decoder = shape.causal
    rows = max(pcfg.batch_size, pcfg.max_rows)
    out = [
        WorkingSet(
            name="pruning",
            batch_size=rows,
            longest=n,
            logits="all" if decoder else "none",
            loss=decoder,
            chunked=True,  # analyses.metrics.token_nll(_at): the log-softmax over row chunks
            statistics=True,
            cache_per_row=shape.n_layers * n * shape.d_model * b,  # the unablated stream of the batch
            cache_rows=pcfg.batch_size,
        )
    ]
    if "importance" in pcfg.studies or "curves" in pcfg.studies:
        out.append(
            WorkingSet(
                name="importance", batch_size=pcfg.batch_size, longest=n, logits="all" if decoder else "none", grad=True
            )
        )
    return out


def apply_prune(pcfg, batch_sizes):
    """``pcfg`` with the batch sizes :func:`~headscope.probes.budget.fit` chose (working set -> batch)."""
    rows = batch_sizes.get("pruning", pcfg.max_rows)
    batch = min(pcfg.batch_size, batch_sizes.get("importance", pcfg.batch_size), rows)
    if rows >= max(pcfg.batch_size, pcfg.max_rows) and batch == pcfg.batch_size:
        return pcfg
    return replace(pcfg, batch_size=batch, max_rows=min(pcfg.max_rows, rows))


def patch_stages(shape: Shape, pc, *, longest: int, methods=("activation", "attribution")) -> list[WorkingSet]:
    """Activation patching (``max(batch_size, max_rows)`` sequences per forward, the clean and
    corrupted ``z`` of a batch kept per layer, the last position's logits read) and, for
    attribution, one batch's backward."""
    b = shape.bytes_per
    z = 2 * shape.n_layers * longest * shape.n_heads * shape.d_head * b  # clean and corrupted z, per item
    out = []
    if set(methods) - {"attribution"}:  # activation, ablation and path patching: replicated forwards
        out.append(
            WorkingSet(
                name="patching",
                batch_size=max(pc.batch_size, pc.max_rows),
                longest=longest,
                logits="last" if shape.causal else "none",
                statistics=True,
                cache_per_row=z,
                cache_rows=pc.batch_size,
            )
        )
    if "attribution" in methods:
        out.append(
            WorkingSet(
                name="attribution",
                batch_size=pc.batch_size,
                longest=longest,
                logits="last" if shape.causal else "none",
                grad=True,
                cache_per_row=z,
            )
        )
    return out


def apply_patch(pc, batch_sizes):
    """``pc`` with the batch sizes :func:`~headscope.probes.budget.fit` chose (working set -> batch)."""
    rows = batch_sizes.get("patching", pc.max_rows)
    batch = min(pc.batch_size, batch_sizes.get("attribution", pc.batch_size), rows)
    if rows >= max(pc.batch_size, pc.max_rows) and batch == pc.batch_size:
        return pc
    return replace(pc, batch_size=batch, max_rows=min(pc.max_rows, rows))


def task_longest(task: str, seq_len: int, tokenizer=None) -> int:
    """Tokens of a patching task's longest sequence: generated tasks from ``seq_len``; a file
    task (``agreement``, ``coreference``, a JSONL path) from its rows' texts (``clean``,
    ``corrupted``, or ``words``), counted with ``tokenizer`` or bounded by their bytes, plus
    the answer's token."""
    import json
    from pathlib import Path

    from headscope.analyses.patching.tasks import GENERATED_LONGEST, TASK_FILES
    from headscope.data import path

    if task in GENERATED_LONGEST:
        return GENERATED_LONGEST[task](seq_len)
    f = path(TASK_FILES[task]) if task in TASK_FILES else Path(task)
    texts = []
    try:
        with open(f, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(row, dict):
                    continue
                if isinstance(row.get("words"), list):
                    texts.append(" ".join(map(str, row["words"])))
                texts.extend(v for k, v in row.items() if k in ("clean", "corrupted", "text") and isinstance(v, str))
    except OSError:
        return 64
    return longest_tokens(texts, tokenizer) + 2


def role_corpora(groups, role_inputs: dict | None) -> dict:
    """The corpora the role ``groups`` read, as :func:`roles_stages` takes them: the given
    ``role_inputs`` (paths are read), the shipped files for the others."""
    from pathlib import Path

    from headscope.analyses.roles.pipeline import corpora_for, default_conllu, default_coref, default_text
    from headscope.probes.corpora import read_conllu, read_coref, read_text

    given = dict(role_inputs or {})
    out = {}
    for corpus in corpora_for(groups):
        if corpus == "text":
            t = given.get("text")
            out["text"] = (
                read_text(default_text() if t is None else t) if t is None or isinstance(t, (str, Path)) else t
            )
        elif corpus == "conllu":
            c = given.get("conllu")
            c = default_conllu() if c is None else ([c] if isinstance(c, (str, Path)) else list(c))
            out["conllu"] = [read_conllu(x) if isinstance(x, (str, Path)) else x for x in c]
        elif corpus == "coref":
            c = given.get("coref")
            out["coref"] = (
                read_coref(default_coref() if c is None else c) if c is None or isinstance(c, (str, Path)) else c
            )
    return out


def report_tasks() -> tuple[str, ...]:
    """The report's patching tasks: each shipped role's own
    (:func:`~headscope.analyses.roles.base.role_tasks`), once each."""
    from headscope.analyses.roles import shipped  # noqa: F401  (registers the shipped roles)
    from headscope.analyses.roles.base import role_tasks

    return tuple(dict.fromkeys(role_tasks().values()))


#: float32 bytes of the KV study's logits unembedded at once (its final hidden states a block of rows at a
#: time beyond it): a whole input's where they fit (SmolLM2-135M at 2,048 tokens, 0.38 GiB, keeps them whole),
#: a block elsewhere (Qwen2-0.5B's 151,936 entries at 1,024 tokens would be 0.58 GiB, thrice with the loss)
KV_LOGIT_BYTES = 400 << 20


def kv_logit_rows(shape: Shape, tokens: int) -> int | None:
    """The KV study's rows unembedded at once for inputs of ``tokens`` tokens: None (whole) where
    their logits fit in :data:`KV_LOGIT_BYTES`, else as many rows as do."""
    per_row = max(1, shape.vocab_size) * 4
    rows = max(1, KV_LOGIT_BYTES // per_row)
    return None if rows >= tokens else int(rows)


def kv_stages(shape: Shape, kc, *, tokens: int) -> list[WorkingSet]:
    """The report's KV-cache stage (``kc`` a :class:`~headscope.analyses.kvcache.stage.KVStageConfig`,
    its study at ``tokens``): the study's forward of one input (batch 1, the residual entering every
    layer kept for the restricted runs), the unembedding of its final hidden states ``logit_rows``
    rows at a time (the batch :func:`~headscope.probes.budget.fit` turns; the loss's gather and
    log-softmax on each block), and the long-context roles' chunked forward of one needle item
    (each layer's Q and K kept for its pattern pieces; the logits at its answer rows only)."""
    resid = shape.n_layers * tokens * shape.d_model * shape.bytes_per
    rows = kc.logit_rows or tokens
    qk = shape.n_layers * kc.role_tokens * (shape.n_heads + shape.n_kv_heads) * shape.d_head * 4
    # in blocks (logit_rows), the rows read are those unembedded: the logits and their log-softmax; whole,
    # the forward's logits, the rows the loss reads gathered from them and their log-softmax
    copies = 1 if kc.logit_rows else 2
    return [
        WorkingSet(name="kv", batch_size=1, longest=tokens, logits="none", cache_per_row=resid),
        WorkingSet(
            name="kv logits",
            batch_size=rows,
            longest=1,
            logits="all",
            loss=True,
            loss_copies=copies,
            cache_per_row=resid,
            cache_rows=1,
        ),
        WorkingSet(name="long-context roles", batch_size=1, longest=kc.role_tokens, logits="last", cache_per_row=qk),
    ]


def weights_stage(shape: Shape, wc) -> WorkingSet:
    """The report's weights stage (``wc`` a :class:`~headscope.analyses.run_weights.WeightsConfig`):
    no forward; what it holds at once (:func:`weights_bytes`) as the stage's cache."""
    return WorkingSet(name="weights", batch_size=1, longest=1, logits="none", cache_per_row=weights_bytes(shape, wc))


#: float64 blocks of Gaussian draws a composition null holds at once
#: (:func:`~headscope.analyses.circuits.weights.composition.null_scores`: ``P``, the receiver's first
#: factor, its last factor and the copy LAPACK's QR makes of it, their R factors and the batched
#: products): the five families' nulls at 16 MiB blocks, the heap handed back after each block, reach
#: 115-160 MiB over the resident set alone on (d_model, d_head) = (576, 64), (384, 32), (256, 64), (512, 256);
#: within the stage (its other terms are bounds too) eight blocks keep every calibration row in the band
NULL_BLOCKS = 8


def weights_bytes(shape: Shape, wc) -> int:
    """Bytes the weights stage holds at once: every layer's sender factors (float32 ``[head, d_head,
    d_model]``) and a group of them as float64, one receiver layer's float64 side, the blocks of
    (un)embedding rows and Gaussian draws, the composition frame (five families of head pairs, ~100
    bytes a row with its columns' lists) and a null's comparison with every pair of a family."""
    from headscope.analyses.circuits.weights.composition import SENDER_GROUP_BYTES
    from headscope.analyses.circuits.weights.ov_qk import DRAW_BLOCK_BYTES, VOCAB_CHUNK_BYTES

    L, h, kv, k, d = shape.n_layers, shape.n_heads, shape.n_kv_heads, shape.d_head, shape.d_model
    senders = L * h * k * d * 4
    receiver = 8 * (3 * h + 2 * kv) * k * d * 2
    pairs = L * (L - 1) // 2 * h * h
    frame = (3 * pairs + 2 * L * (L - 1) // 2 * h * kv) * 100
    compare = pairs * wc.null  # bool [null, pairs]
    blocks = (
        2 * min(VOCAB_CHUNK_BYTES, max(1, shape.vocab_size) * d * 4)
        + min(DRAW_BLOCK_BYTES, wc.draws * d * k * 8)
        + NULL_BLOCKS * min(wc.null_block_bytes, wc.null * d * k * 8)
        + 2 * d * d * 8
    )
    return senders + min(SENDER_GROUP_BYTES, 2 * senders) + receiver + frame + compare + blocks


#: values per item, token and ``d_model`` an EAP-IG batch holds per sender (its clean and corrupted outputs,
#: the difference taken in place) and per receiver input (the steps' running sum of gradients and one step's
#: gradients: :func:`~headscope.analyses.circuits.edges.attribution._ig_gradients`). Measured: SmolLM2-135M
#: (301 senders, 481 receivers), 8 induction items of 19 tokens, one thread: a 1766 MiB peak, 1871 planned
#: at the plan's 22-token bound (+5.9%); the peak does not grow with torch's threads (docs/guide/estimates.md)
EDGE_PER_SENDER, EDGE_PER_RECEIVER = 2, 2


def circuit_stages(shape: Shape, *, batch_size: int, longest: int, n_items: int) -> list[WorkingSet]:
    """An edge circuit's working sets (:mod:`headscope.analyses.circuits.edges`): the scores' batch
    (one gradient per receiver input, the outputs of every sender: :data:`EDGE_PER_SENDER` /
    :data:`EDGE_PER_RECEIVER` float32 values per token and ``d_model``, a backward's activations) and
    the exact evaluation's batch (the corrupted outputs of every sender for all ``n_items``, kept
    across the circuits evaluated, and this run's difference; one layer's receiver inputs)."""
    L, h, kv = shape.n_layers, shape.n_heads, shape.n_kv_heads
    senders, receivers = 1 + L * (h + 1), L * (h + 2 * kv + 1) + 1
    per_token = longest * shape.d_model * 4
    batch_size = max(1, min(batch_size, n_items))  # a batch holds at most the items there are
    scores = WorkingSet(
        name="circuit scores",
        batch_size=batch_size,
        longest=longest,
        logits="last",
        grad=True,
        cache_per_row=(EDGE_PER_SENDER * senders + EDGE_PER_RECEIVER * receivers) * per_token,
    )
    held = -(-n_items // max(1, batch_size))  # the batches whose corrupted outputs are kept
    evaluation = WorkingSet(
        name="circuit evaluation",
        batch_size=batch_size,
        longest=longest,
        logits="last",
        cache_per_row=((held + 1) * senders + (h + 2 * kv + 1)) * per_token,
    )
    return [scores, evaluation]
