"""What the calibration's cases (:data:`~.estimates.CASES`) read besides the shipped checkpoints and the
random-weight shapes: the GGUFs written under the cache (:data:`GGUFS`), the role corpora cut to their
longest items (:func:`longest_items`), and the cuts of the Qwen2-0.5B GGUF's cases.

Example::

    inputs = longest_items({"text": 48})  # {"text": [the 48 longest lines of the shipped text]}
"""

from __future__ import annotations

from headscope.reports.tools.bench.qwen_gguf import qwen05_gguf

__all__ = ["GGUFS", "QWEN05_CORPORA", "QWEN05_ITEMS", "case_model", "longest_items"]

#: GGUF calibration checkpoints: a case's ``model`` -> the function that writes it once and returns its path
GGUFS = {"qwen2-0.5b-gguf": qwen05_gguf}


def case_model(name: str) -> str:
    """The MODEL argument of a case's ``model``: a random-weight shape's folder
    (:func:`~.estimates.shape_dir`) or a :data:`GGUFS` file, each written once under the cache; else
    the name (a shipped checkpoint)."""
    from headscope.reports.tools.bench.estimates import SHAPES, shape_dir

    return str(shape_dir(name)) if name in SHAPES else str(GGUFS[name]()) if name in GGUFS else name


#: the Qwen2-0.5B GGUF's cuts, each where the peak is one batch's whatever the items' number: 32 generated
#: sequences (one batch: successor, induction and copy suppression read as many; function vectors keep their
#: 5 prompts a task, whose number sets the rows of their patched re-runs); the pruning study on 8 items (its
#: masked replicas, 64 rows a forward, are the working set); the weights' nulls and Gaussian heads on 64 and
#: 20 draws (drawn in blocks of 16 MiB and 8 MiB, 18 draws at this shape, whatever their number); the
#: long-context roles on 4 needle items (each its own forward at batch 1); the contextualisation on its first
#: 6 words. Patching runs as the report runs it (quick: 4 items a task, a KV group a unit).
QWEN05_ITEMS = {
    "roles": {"induction_n_sequences": 32},
    "pruning": {"n_items": 8},
    "weights": {"null": 64, "draws": 20},
    "kv": {"role_items": 4},
    "context": {"max_words": 6},
}
#: ... and the role corpora on their 48 longest items each (the largest batch, 32 of the longest, is the
#: one the plan sizes; the reducers' per-item values are a few KiB)
QWEN05_CORPORA = {"text": 48, "conllu": 48, "coref": 48}


def longest_items(keep: dict) -> dict:
    """The shipped role corpora (text lines, CoNLL-U sentences, coreference items) cut to the
    ``keep[corpus]`` longest items of each (UTF-8 bytes of their words), in their order in the
    files: as the roles stage's ``role_inputs``. ``{}`` for ``{}``."""
    from headscope.analyses.roles.pipeline import check_roles
    from headscope.reports.stages.plans import role_corpora

    if not keep:
        return {}
    full = role_corpora(check_roles(None), None)
    units = {
        "text": lambda c: list(c.lines),
        "conllu": lambda c: [s for doc in c for s in doc.sentences],
        "coref": lambda c: list(c.items),
    }
    size = {"text": lambda t: len(t.encode()), "conllu": lambda s: len(" ".join(s.words).encode())}
    size["coref"] = size["conllu"]
    out = {}
    for corpus, n in keep.items():
        items = units[corpus](full[corpus])
        longest = sorted(range(len(items)), key=lambda i: size[corpus](items[i]), reverse=True)[:n]
        out[corpus] = [items[i] for i in sorted(longest)]
    return out
