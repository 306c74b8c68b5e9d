"""Probe corpora: dependency trees (CoNLL-U), coreference items (JSONL), plain text.

One import point for the three readers; each lives in its own module:

- :mod:`.conllu_reader` — :func:`read_conllu`, :class:`DependencyCorpus`,
  :class:`DependencySentence`, :func:`arcs_frame`, :func:`write_conllu`
- :mod:`.coref_items` — :func:`read_coref`, :class:`CorefSet`, :class:`CorefItem`
- :mod:`.text_reader` — :func:`read_text`, :class:`TextSet`, :class:`SkipRecord`

Every reader raises :class:`~headscope.probes.errors.InputFileError`
(``file:line:column: message``, a ``ValueError``) for a missing path, a directory,
an empty file or a format error, and records in ``skipped`` the units it leaves out.

>>> from headscope.data import path
>>> corpus = read_conllu(path("syntax/handwritten.conllu"))
>>> corpus.skipped.counts
{}
>>> read_coref(path("coref/coref.jsonl")).items[0].kind
'winograd'
"""

from __future__ import annotations

from headscope.probes.corpora.conllu import (
    DependencyCorpus,
    DependencySentence,
    arcs_frame,
    format_conllu,
    read_conllu,
    tree_problem,
    write_conllu,
)
from headscope.probes.corpora.coref import CorefItem, CorefSet, baseline_choice, item_problem, read_coref
from headscope.probes.corpora.text import SkipRecord, TextSet, read_text
from headscope.probes.errors import InputFileError

__all__ = [
    "DependencyCorpus",
    "DependencySentence",
    "arcs_frame",
    "format_conllu",
    "read_conllu",
    "tree_problem",
    "write_conllu",
    "CorefItem",
    "CorefSet",
    "baseline_choice",
    "item_problem",
    "read_coref",
    "SkipRecord",
    "TextSet",
    "read_text",
    "InputFileError",
]
