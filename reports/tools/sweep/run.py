"""Every command of headscope checked on a tiny random checkpoint of each text family, on the default backend.

For one family (:func:`sweep_family`) the tiny model is saved to a folder
(:func:`~headscope.reports.tools.sweep.tiny_config.save_tiny`) and each check (:data:`CHECKS`) runs on it as a user runs
it, with the smallest settings that still go through every code path:

* ``card``: ``headscope card DIR --json``;
* ``capture``: ``headscope capture DIR --quantities pattern,z --json`` (what the analyses read), then the patterns of the backend ``--backend auto``
  chooses, on a padded batch, against ``output_attentions`` of the HF model loaded with eager
  attention (every query row that is not padding, all keys): equal within :data:`PATTERN_TOL`;
* ``roles``: ``headscope roles DIR`` on :data:`ROLE_GROUPS` with a few sentences of the shipped
  corpora;
* ``prune``: ``headscope prune DIR --quick`` on 8 items, one random-order seed;
* ``report``: :func:`report_check`, :func:`~headscope.reports.pipeline.build_report` (what
  ``headscope report`` runs) with the same small inputs and every registered stage on (the
  registry's ``STAGES``, those a report runs only when asked too, so a new stage is swept without
  an edit here); a stage that did not run says which and why, but for one left out by design on
  its backend (:func:`by_design`, which the stage itself answers: the weights stage, in-house only).

Each check's outcome is ``ok`` or why not in one line: the command's own error line
(``headscope: error: ...``, or ``internal error: ...``), or the exception's type and first line.
One check failing never stops the others, nor the sweep (:func:`sweep`); a check past
:data:`CHECK_TIMEOUT_S` is stopped and says so.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from headscope.reports.stages.config import RunConfig

__all__ = [
    "CHECKS",
    "COLUMNS",
    "SAMPLE_EXTRA",
    "PATTERN_TOL",
    "ROLE_GROUPS",
    "by_design",
    "report_check",
    "sweep_config",
    "read_sweep",
    "sample",
    "sweep",
    "sweep_family",
    "write_sweep",
]

#: the checks run on each family, in order: one column each (the report's stages are another thing)
CHECKS = ("card", "capture", "roles", "prune", "report")
#: one row per model type: how it was built, the backend auto chose (and the ones it rejected, why), each check
COLUMNS = ("family", "kind", "built", "backend", "rejected", *CHECKS, "transformers")
#: largest |pattern - HF eager's| the capture check accepts (fp32)
PATTERN_TOL = 1e-5
#: the role groups the roles and report checks run (one of each kind of input: text, generated sequences, CoNLL-U)
ROLE_GROUPS = ("positional", "special", "syntactic", "induction")
#: the fixed sample CI runs (``headscope sweep --sample``, ``tests/reports/tools/sweep/test_sweep.py``): every
#: in-house family, the two of ``tests/tiny_models.py`` that run through hf, and families with attention
#: variants of their own (partial rotary, ALiBi, parallel blocks, relative bias, disentangled attention,
#: MoE, encoder-decoder, a hybrid, a layer shared across layers, heads beside a convolution), two that fail
#: and one left out
SAMPLE_EXTRA = (
    "olmo2",
    "starcoder2",
    "gemma",
    "gpt_neox",
    "phi",
    "bloom",
    "falcon",
    "gptj",
    "opt",
    "mixtral",
    "mpnet",
    "deberta-v2",
    "electra",
    "t5",
    "olmo_hybrid",  # a hybrid: its attention layers alone, on hf
    "albert",  # one layer shared across its layers, a module per layer on hf
    "convbert",  # its heads' outputs concatenated with a convolution's, before one output projection
    "xlnet",  # two that fail, so that a check starting to pass shows here too
    "mra",
    "bamba",  # one left out (Mamba layers only at its defaults: no attention layer)
)
#: a check running longer is stopped (its outcome says so) and the sweep goes on
CHECK_TIMEOUT_S = 300
#: what the capture check captures: the patterns and the heads' outputs (``z``), what the analyses read
CAPTURED = "pattern,z"
#: the padded batch of the capture check's pattern comparison (two lengths, so one item is padded)
PADDED_TEXTS = ("The cat sat on the mat because it was warm.", "Heads attend.")


class _CheckTimeout(BaseException):
    """Raised by the alarm in a check past its time (a BaseException: the CLI boundary lets it through)."""


def sample() -> tuple[str, ...]:
    """:data:`SAMPLE_EXTRA` after every in-house family."""
    from headscope.probes.models.config import INHOUSE_MODEL_TYPES

    return (*sorted(INHOUSE_MODEL_TYPES), *SAMPLE_EXTRA)


@contextlib.contextmanager
def _time_limit(seconds: int):
    def _alarm(signum, frame):
        raise _CheckTimeout

    try:
        old = signal.signal(signal.SIGALRM, _alarm)
    except ValueError:  # not the main thread: no limit
        yield
        return
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _line(e: BaseException) -> str:
    """An exception in one line: a headscope error's own first line, else its type and first line."""
    from headscope.probes.errors import HeadscopeError

    text = str(e).strip()
    first = text.splitlines()[0][:300] if text else ""
    if isinstance(e, HeadscopeError) and first:
        return first
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def _check(fn: Callable[[], str]) -> str:
    """``fn()``'s outcome, or why it failed (one line); never raises but for an interrupt."""
    try:
        with _time_limit(CHECK_TIMEOUT_S):
            return fn()
    except _CheckTimeout:
        return f"timed out after {CHECK_TIMEOUT_S} s"
    except KeyboardInterrupt:
        raise
    except Exception as e:  # noqa: BLE001 - a check's failure is its outcome, recorded and the sweep goes on
        return _line(e)


def _cli(main: Callable[[list[str]], int], argv: list[str]) -> str:
    """``headscope ARGV`` run by ``main`` (the command line's entry point) in this process: ``ok`` on
    exit 0, else its error line without the prefix."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    if rc == 0:
        return "ok"
    lines = [line for line in err.getvalue().splitlines() if line.startswith("headscope")]
    last = lines[-1] if lines else f"exit {rc}"
    for prefix in ("headscope: error: ", "headscope: "):
        if last.startswith(prefix):
            return last.removeprefix(prefix)
    return last.split(": error: ", 1)[-1]


def _inputs(work: Path) -> dict[str, str]:
    """The small role inputs: 24 lines of the shipped text, the first CoNLL-U sentences."""
    from headscope.analyses.roles.pipeline import default_text
    from headscope.data import path

    text = work / "text.txt"
    text.write_text("".join(Path(default_text()).read_text(encoding="utf-8").splitlines(True)[:24]), encoding="utf-8")
    blocks = path("syntax/handwritten.conllu").read_text(encoding="utf-8").split("\n\n")
    conllu = work / "sample.conllu"
    conllu.write_text("\n\n".join(b for b in blocks[:6] if b.strip()) + "\n\n", encoding="utf-8")
    return {"text": str(text), "conllu": str(conllu)}


def _pattern_check(folder: Path, kind: str, row: dict) -> str:
    """The auto backend's patterns against HF eager's on :data:`PADDED_TEXTS` (fills ``row``'s backend)."""
    import torch
    import transformers

    from headscope.probes.models.hf_layout import attention_of_layers, softmax_returned_scores, unbanded
    from headscope.probes.models.loading import load_model
    from headscope.reports.tools.sweep.tiny_config import KINDS

    with contextlib.redirect_stderr(io.StringIO()):  # auto's "rejected ..." lines: kept in the row instead
        try:
            model = load_model(str(folder))
        except Exception as e:  # noqa: BLE001 - no backend loads it: the row says so, the check gives the reason
            row["backend"] = ""
            row["rejected"] = "; ".join(
                [_line(e), *(n.removeprefix("backend auto: ") for n in getattr(e, "__notes__", ()))]
            )
            raise
    row["backend"] = model.backend
    row["rejected"] = "; ".join(f"{r['backend']}: {r['reason']}" for r in getattr(model, "backend_rejected", []))
    batch = model.encode(list(PADDED_TEXTS))
    ours = model.run(batch, ("pattern",))
    saved = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    hf = getattr(transformers, KINDS[kind]).from_pretrained(str(folder), attn_implementation="eager").eval()
    if saved.get("is_encoder_decoder"):  # an encoder-decoder: its encoder's self-attention, as the hf backend reads it
        hf = hf.get_encoder()
    softmax_returned_scores(hf)  # where HF returns pre-softmax scores (SqueezeBERT), the softmax its forward takes
    with torch.no_grad():
        extra = {"use_cache": False} if kind == "decoder" else {}  # no cache: a plain forward, as the hf backend runs
        out = hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_attentions=True, **extra)
    record = getattr(model, "head_modules", None) or {}
    blocks = [*record.get("attention_blocks", ()), *record.get("blocks_without_attention", ())]
    theirs = attention_of_layers(out.attentions, record.get("attention_blocks"), len(blocks))  # a hybrid's
    theirs = unbanded(theirs, getattr(getattr(hf, "config", None), "attention_window", None))  # as [query, key]
    if theirs is None or len(theirs) != model.spec.n_layers:
        return f"HF eager gives {0 if theirs is None else len(theirs)} attention maps for {model.spec.n_layers} layers"
    rows = batch.attention_mask.bool()
    for layer in range(model.spec.n_layers):
        a, b = ours["pattern", layer].float(), theirs[layer].float()
        if a.shape != b.shape:
            return f"pattern of layer {layer} is {tuple(a.shape)}, HF eager's {tuple(b.shape)}"
        diff = float((a - b).abs().permute(0, 2, 1, 3)[rows].max())
        if not diff <= PATTERN_TOL:
            return (
                f"patterns differ from HF eager's in layer {layer} by {diff:.2e} (> {PATTERN_TOL:g}) on a padded batch"
            )
    return "ok"


def _capture(main: Callable[[list[str]], int], folder: Path, kind: str, row: dict) -> str:
    command = _cli(main, ["capture", str(folder), "--quantities", CAPTURED, "--json"])
    check = _pattern_check(folder, kind, row)  # also when the command failed: it names the backend auto chose
    return command if command != "ok" else check


def by_design(part: str, why: str, backend: str | None) -> bool:
    """Whether a report part left out is left out by design on ``backend``, not a failure: the
    registered stage named ``part`` says so (:meth:`~headscope.reports.stages.base.Stage.by_design`:
    the weights stage reads the in-house model's per-head matrices, the KV-cache stage has nothing to
    cache on an encoder, ...). A part that is no registered stage never is."""
    from headscope.reports.stages.registry import STAGES

    stage = STAGES.get(part)
    return stage is not None and stage.by_design(why, backend)


def sweep_config(inputs: dict[str, str]) -> RunConfig:
    """The report check's settings: :data:`ROLE_GROUPS` on ``inputs``, the quick pruning stage on 8
    items, and every registered stage on (those a report runs only when asked too)."""
    from headscope.analyses.pruning.study import PruneConfig
    from headscope.reports.stages.config import RunConfig
    from headscope.reports.stages.quick import QUICK_PRUNING
    from headscope.reports.stages.registry import STAGES

    return RunConfig(
        role_groups=ROLE_GROUPS,
        role_inputs=inputs,
        prune_config=PruneConfig(**{**QUICK_PRUNING, "n_items": 8}),
        on=tuple(STAGES),
    )


def report_check(folder: Path, out: Path, inputs: dict[str, str], config: RunConfig | None = None) -> str:
    """The report check: a report of ``folder`` into ``out`` (``config``, default
    :func:`sweep_config`) -> ``"ok"``, or ``"absent: <stage>: <why>"`` for the first stage, in run
    order, that did not run and is neither turned off by ``config`` nor left out by design (:func:`by_design`)."""
    from headscope.reports.pipeline import build_report

    with contextlib.redirect_stderr(io.StringIO()):
        build_report(str(folder), config or sweep_config(inputs), out_dir=out, quiet=True)
    run = json.loads((out / "run.json").read_text(encoding="utf-8"))
    for part, record in (run.get("stages") or {}).items():
        why = str(record.get("reason") or "")
        if record.get("status") not in ("ran", "off") and not by_design(part, why, run.get("backend")):
            return f"absent: {part}: {why.splitlines()[0][:240] if why else record.get('status')}"
    return "ok"


def sweep_family(
    model_type: str,
    work: Path,
    inputs: dict[str, str],
    timings: dict | None = None,
    *,
    cli: Callable[[list[str]], int],
) -> dict:
    """One row of the sweep (:data:`COLUMNS`) for ``model_type``, its files under ``work``; ``cli`` is
    the command line's entry point (``headscope.reports.cli.app.main``), which the checks run as a user
    does (passed in: the tools sit below the CLI and never import it)."""
    import transformers

    from headscope.reports.tools.sweep.tiny_config import TinyBuildError, save_tiny, text_families

    row = dict.fromkeys(COLUMNS, "")
    row.update(family=model_type, transformers=transformers.__version__)
    kind, why = text_families().get(model_type, (None, "not in this transformers' CONFIG_MAPPING"))
    row["kind"] = kind or ""
    if kind is None:
        row["built"] = f"skipped: {why}"
        return row
    folder = work / model_type
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            save_tiny(model_type, folder)
        row["built"] = "ok"
    except TinyBuildError as e:
        row["built"] = str(e)
        return row
    except Exception as e:  # noqa: BLE001 - the family is left out with the reason; the sweep goes on
        row["built"] = _line(e)
        return row
    d = str(folder)
    runs = {
        "card": lambda: _cli(cli, ["card", d, "--json"]),
        "capture": lambda: _capture(cli, folder, kind, row),
        "roles": lambda: _cli(
            cli,
            ["roles", d, "--roles", ",".join(ROLE_GROUPS), "--text", inputs["text"], "--conllu", inputs["conllu"]]
            + ["--out", str(work / f"{model_type}-roles"), "--quiet"],
        ),
        "prune": lambda: _cli(
            cli,
            ["prune", d, "--quick", "--n-items", "8", "--seeds", "1", "--studies", "ablation", "importance", "curves"]
            + ["--out", str(work / f"{model_type}-prune"), "--json"],
        ),
        "report": lambda: report_check(folder, work / f"{model_type}-report", inputs),
    }
    for check, fn in runs.items():
        start = time.perf_counter()
        row[check] = _check(fn)
        if timings is not None:
            timings[(model_type, check)] = time.perf_counter() - start
    for key in ("rejected", *CHECKS):  # a path in a reason names the family's folder, not the temporary root
        row[key] = row[key].replace(f"{work}/", "")
    return row


def sweep(
    families: Iterable[str],
    *,
    cli: Callable[[list[str]], int],
    work: Path | None = None,
    progress: Callable[[dict, float], None] | None = None,
    timings: dict | None = None,
) -> list[dict]:
    """The rows of :func:`sweep_family` for each of ``families`` in order; ``work`` keeps every
    family's folders (default: a temporary folder, removed after); ``progress(row, seconds)`` after
    each family; ``cli``: as :func:`sweep_family`. Never raises for a family's failure: it is that family's row."""
    import logging
    import warnings

    own = work is None
    root = Path(tempfile.mkdtemp(prefix="headscope-sweep-")) if own else Path(work)
    root.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        inputs = _inputs(root)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            logging.disable(logging.WARNING)
            try:
                for family in families:
                    start = time.perf_counter()
                    rows.append(sweep_family(family, root, inputs, timings, cli=cli))
                    if progress is not None:
                        progress(rows[-1], time.perf_counter() - start)
            finally:
                logging.disable(logging.NOTSET)
    finally:
        if own:
            shutil.rmtree(root, ignore_errors=True)
    return rows


def write_sweep(rows: list[dict], path: Path) -> Path:
    """``rows`` as CSV (:data:`COLUMNS`), written whole to a temporary file then moved into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    tmp.replace(path)
    return path


def read_sweep(path: Path) -> list[dict]:
    """The rows of a sweep CSV; ``ValueError`` naming the file when its columns are not :data:`COLUMNS`."""
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        if tuple(reader.fieldnames or ()) != COLUMNS:
            raise ValueError(f"{path}:1: sweep columns must be {','.join(COLUMNS)}; got {reader.fieldnames}")
        return list(reader)
