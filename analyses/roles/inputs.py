"""The roles pipeline's inputs: the shipped corpora, and the readers of the corpora it reads.

:func:`read_inputs` reads each corpus a run needs (plain text, CoNLL-U, coreference JSONL)
from a path, a parsed set or items given as they are, and records what each reader left
out of each file in ``file_skips`` (``{"file:<name>": {reason: count}}``, see
:attr:`~headscope.analyses.roles.pipeline.RolesResult.skipped`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from headscope.analyses.roles.config import RolesConfig

#: corpora read from a file (or given): :func:`~headscope.analyses.roles.pipeline.head_roles` takes one keyword each
READ_CORPORA = ("text", "conllu", "coref")


def default_conllu() -> list[Path]:
    """The shipped CoNLL-U files (``data/syntax/*.conllu``), sorted."""
    from headscope.data import path

    return sorted(path("syntax").glob("*.conllu"))


def default_coref() -> Path:
    from headscope.data import path

    return path("coref/coref.jsonl")


def default_text() -> Path:
    from headscope.data import path

    return path("text/sentences.txt")


# ---------------------------------------------------------------------------------- inputs


def _add_file_skips(file_skips: dict, path, counts: dict, *, full_path: bool = False) -> None:
    """Record ``counts`` under ``file:<name>``, or ``file:<path as given>`` when ``full_path``
    (several inputs share the name) or the name is taken; never overwrite another file's
    counts (the same path given twice gets `` (2)``, `` (3)``, ...)."""
    key = f"file:{path}" if full_path else f"file:{Path(path).name}"
    if key in file_skips:
        key = f"file:{path}"
    base, n = key, 2
    while key in file_skips:
        key, n = f"{base} ({n})", n + 1
    file_skips[key] = counts


def _read_conllu(conllu, cfg: RolesConfig, file_skips: dict) -> list:
    from headscope.probes.corpora import DependencyCorpus, DependencySentence, read_conllu

    sources = default_conllu() if conllu is None else conllu
    if isinstance(sources, (str, Path, DependencyCorpus)):
        sources = [sources]
    sources = list(sources)
    if sources and all(isinstance(s, DependencySentence) for s in sources):
        return sources  # sentences given as they are
    names = [Path(str(s.path or "corpus") if isinstance(s, DependencyCorpus) else str(s)).name for s in sources]
    sentences = []
    for src, name in zip(sources, names):
        if isinstance(src, DependencyCorpus):
            corpus = src
        elif isinstance(src, (str, Path)):
            corpus = read_conllu(src, full_labels=cfg.full_labels)
        else:
            raise TypeError(
                "conllu must be a path, a DependencyCorpus, a list of them or a list of DependencySentence; "
                f"got {type(src).__name__}"
            )
        if corpus.skipped.total:
            _add_file_skips(
                file_skips, corpus.path or "corpus", dict(corpus.skipped.counts), full_path=names.count(name) > 1
            )
        sentences.extend(corpus.sentences)
    return sentences


def _read_coref(coref, file_skips: dict) -> list:
    from headscope.probes.corpora import CorefItem, CorefSet, read_coref

    if isinstance(coref, Sequence) and not isinstance(coref, str) and all(isinstance(i, CorefItem) for i in coref):
        return list(coref)  # items given as they are
    cs = read_coref(default_coref() if coref is None else coref) if not isinstance(coref, CorefSet) else coref
    if cs.skipped.total:
        _add_file_skips(file_skips, cs.path or "coref", dict(cs.skipped.counts))
    return list(cs.items)


def _read_text(text, file_skips: dict) -> list[str]:
    from headscope.probes.corpora import TextSet, read_text

    if isinstance(text, TextSet):
        if text.skipped.total:
            _add_file_skips(file_skips, "text", dict(text.skipped.counts))
        return list(text.lines)
    if text is None or isinstance(text, (str, Path)):
        ts = read_text(default_text() if text is None else text)
        if ts.skipped.total:
            _add_file_skips(file_skips, str(text or default_text()), dict(ts.skipped.counts))
        return list(ts.lines)
    if isinstance(text, Sequence) and all(isinstance(t, str) for t in text):
        return list(text)
    raise TypeError(f"text must be a path or a list of strings; got {type(text).__name__}")


def read_inputs(corpora, given: dict, cfg: RolesConfig, file_skips: dict) -> dict[str, list]:
    """The items of each corpus in ``corpora`` that is read (text, conllu, coref), in that
    order (so ``file_skips`` keeps it)."""
    readers = {
        "text": lambda: _read_text(given["text"], file_skips),
        "conllu": lambda: _read_conllu(given["conllu"], cfg, file_skips),
        "coref": lambda: _read_coref(given["coref"], file_skips),
    }
    return {c: readers[c]() for c in READ_CORPORA if c in corpora}
