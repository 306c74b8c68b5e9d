"""What ``headscope report CKPT1 CKPT2 …`` reads: the checkpoints, every one resolved and checked
before any job runs, so a path that is not a checkpoint costs nothing (one line naming it, exit 2).

A checkpoint is what ``headscope report MODEL`` loads: an HF-format model folder (``config.json``,
as ``save_pretrained`` and the HF Trainer write it), a sentence-transformers folder, a ``.gguf``
file or a shipped model name. The list comes from the command line, from ``--checkpoints FILE``
(one per line; blank lines and ``#`` comments skipped; a relative path is read from the list
file's folder), or from a training run's output folder holding ``checkpoint-<step>`` folders
(the HF Trainer's layout), which is expanded into those folders ordered by step.

A checkpoint's step is the number in its ``checkpoint-<step>`` name, else the ``global_step`` of
its ``trainer_state.json``, else unknown (None; the comparison then orders by position).

>>> step_of(Path("runs/out/checkpoint-1500"))
1500
>>> unique_labels(["checkpoint-100", "model", "model"])
['checkpoint-100', 'model', 'model-2']
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["EXPECTED", "Checkpoint", "read_checkpoints", "step_folders", "step_of", "unique_labels"]

#: a step folder of an HF Trainer output folder
STEP_FOLDER = re.compile(r"^checkpoint-(\d+)$")
#: what a checkpoint must be, in the one-line refusal
EXPECTED = (
    "expected an HF model folder (config.json), a sentence-transformers folder, a .gguf file, a shipped model "
    "name, or a folder of checkpoint-<step> folders"
)


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint of the comparison: ``model`` (what the report loads: a path or a shipped
    name), ``label`` (its subfolder under ``--out`` and its name in the tables: unique) and
    ``step`` (the training step, None where unknown)."""

    model: str
    label: str
    step: int | None


def step_of(path: Path) -> int | None:
    """The training step of a checkpoint folder: ``checkpoint-<step>``, else ``trainer_state.json``'s
    ``global_step``, else None."""
    m = STEP_FOLDER.match(path.name)
    if m:
        return int(m.group(1))
    state = path / "trainer_state.json"
    if state.is_file():
        try:
            step = json.loads(state.read_text(encoding="utf-8")).get("global_step")
        except (ValueError, UnicodeDecodeError, AttributeError):
            return None
        if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
            return step
    return None


def _is_model_folder(p: Path) -> bool:
    return any((p / f).exists() for f in ("config.json", "modules.json")) or any(p.glob("*.gguf"))


def step_folders(folder: Path) -> list[Path] | None:
    """The ``checkpoint-<step>`` folders of a training run's output folder, by step; None when
    ``folder`` is itself a model folder or holds no step folder."""
    if not folder.is_dir() or _is_model_folder(folder):
        return None
    found = [p for p in folder.iterdir() if p.is_dir() and STEP_FOLDER.match(p.name)]
    return sorted(found, key=lambda p: int(STEP_FOLDER.match(p.name).group(1))) or None


def read_list(file) -> list[str]:
    """The checkpoints of a ``--checkpoints`` file: one a line, blank lines and ``#`` comments
    skipped, a relative path read from the file's folder. One-line errors."""
    path = Path(file)
    if not path.is_file():
        raise ValueError(f"--checkpoints {file}: no such file (expected a text file, one checkpoint path a line)")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise ValueError(f"--checkpoints {file}: not UTF-8 text (expected one checkpoint path a line)") from None
    out = []
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        p = Path(line).expanduser()
        out.append(str(p if p.is_absolute() or not (path.parent / p).exists() else path.parent / p))
    if not out:
        raise ValueError(f"--checkpoints {file}: lists no checkpoint (expected one checkpoint path a line)")
    return out


def unique_labels(names: list[str]) -> list[str]:
    """``names`` with a repeated one numbered from its second use (``model``, ``model-2``)."""
    seen: dict[str, int] = {}
    out = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n}-{seen[n]}")
    return out


def _checked(model: str) -> str:
    """``model`` unchanged when a report could load it; else one line naming it and what was expected."""
    from headscope.probes.errors import HeadscopeError
    from headscope.probes.models.checkpoints import resolve

    p = Path(model).expanduser()
    if p.suffix == ".json" and p.is_file():  # a config alone: random weights, not a checkpoint of a run
        raise ValueError(f"{model}: a config file, not a checkpoint; {EXPECTED}")
    try:
        resolve(model)
    except (HeadscopeError, ValueError, OSError) as e:
        why = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(f"{model}: not a checkpoint ({why}); {EXPECTED}") from None
    return model


def read_checkpoints(models: list[str], list_file=None) -> list[Checkpoint]:
    """The checkpoints named by ``models`` (command-line arguments, each a checkpoint or a folder
    of ``checkpoint-<step>`` folders) and ``list_file`` (``--checkpoints``), in that order, each
    checked; raises ``ValueError`` naming the first that is not a checkpoint."""
    given = list(models) + (read_list(list_file) if list_file is not None else [])
    if not given:
        raise ValueError(f"no checkpoint given; {EXPECTED}")
    expanded: list[str] = []
    for m in given:
        steps = step_folders(Path(m).expanduser())
        if steps:
            expanded.extend(str(p) for p in steps)
        else:
            expanded.append(m)
    for m in expanded:
        _checked(m)
    labels = unique_labels([_label(m) for m in expanded])
    return [
        Checkpoint(model=m, label=lab, step=step_of(Path(m).expanduser()) if Path(m).expanduser().exists() else None)
        for m, lab in zip(expanded, labels)
    ]


def _label(model: str) -> str:
    """A folder name for ``model``'s report: its folder or file name (a .gguf without its suffix)."""
    p = Path(model).expanduser()
    name = p.stem if p.suffix == ".gguf" else p.name
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip(".-") or "checkpoint"
