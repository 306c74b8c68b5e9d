"""Probe sets written by the headscope project (CoNLL-U, coreference JSONL, text).

>>> path("coref/coref.jsonl").name
'coref.jsonl'
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent


def path(relative: str) -> Path:
    """Absolute path of a shipped data file, e.g. ``path("syntax/generated.conllu")``."""
    return ROOT / relative
