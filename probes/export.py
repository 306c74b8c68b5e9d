"""Captured attention patterns in the forms external viewers take.

Neither viewer is a dependency: these functions only shape the data.

- bertviz: ``head_view(attention, tokens)`` / ``model_view(attention, tokens)`` take a
  tuple with one ``[1, head, query_pos, key_pos]`` tensor per layer and the tokens of
  one sentence: :func:`to_bertviz`.
- CircuitsVis: ``circuitsvis.attention.attention_heads(attention, tokens)`` takes one
  layer's ``[head, dest, src]`` weights and the tokens: :func:`to_circuitsvis`.
- :func:`write_patterns_json` writes every captured layer of one item to a JSON file,
  for a viewer on another machine (or in a notebook without torch).

Padding is cut off: an item's output covers only its ``n`` real tokens, so every row
sums to 1.

The file's first key, ``headscope`` (:data:`EXPORT_MARK`), says that headscope wrote it:
an existing file is replaced only when it is such an export; any other file, a folder, a
FIFO, a device or a socket is refused with one line (:func:`export_target`), and a
symbolic link is followed (its target is written, the link kept).

>>> import torch
>>> from headscope.probes.capture import Capture
>>> from headscope.probes.models.backends.protocol import ModelSpec
>>> from headscope.probes.tokens import collate
>>> def item(toks):
...     n = len(toks)
...     return {"ids": list(range(n)), "text": " ".join(toks), "words": toks, "tokens": toks,
...             "offsets": [(0, 0)] * n, "word_ids": [None] * n, "special": [False] * n}
>>> spec = ModelSpec(name="toy", family="toy", n_layers=1, n_heads=2, n_kv_heads=1, d_head=4,
...                  d_model=8, causal=False, max_positions=8, backend="inhouse")
>>> pattern = torch.full((2, 2, 3, 3), 1 / 3)  # [batch, head, query_pos, key_pos]
>>> pattern[1, :, :, :2], pattern[1, :, :, 2], pattern[1, :, 2] = 0.5, 0.0, 0.0  # item 1: 2 tokens
>>> cap = Capture(tokens=collate([item(["[CLS]", "hi", "[SEP]"]), item(["[CLS]", "[SEP]"])], 0),
...               data={("pattern", 0): pattern}, layers=(0,), spec=spec)
>>> attention, tokens = to_bertviz(cap, item=1)
>>> [tuple(a.shape) for a in attention], tokens
([(1, 2, 2, 2)], ['[CLS]', '[SEP]'])
>>> to_circuitsvis(cap, layer=0, item=1)["attention"][0]
[[0.5, 0.5], [0.5, 0.5]]
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import torch

from headscope.probes.outputs.atomic import atomic_write
from headscope.probes.tokens import display_token

__all__ = ["EXPORT_MARK", "export_target", "to_bertviz", "to_circuitsvis", "write_patterns_json"]

#: the value of the first key (``headscope``) of every file :func:`write_patterns_json` writes
EXPORT_MARK = {"export": "patterns", "format": 1}
_MARK_PREFIX = b'{"headscope":{"export":"patterns"'  # how such a file begins (compact JSON, the mark first)

_NOT_REGULAR = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _is_export(path: Path) -> bool:
    """Whether the regular file ``path`` begins as a file :func:`write_patterns_json` wrote."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.read(fd, len(_MARK_PREFIX)) == _MARK_PREFIX
    except OSError:
        return False
    finally:
        os.close(fd)


def export_target(path, *, what: str = "export path") -> Path:
    """The file :func:`write_patterns_json` writes for ``path``: ``path`` itself, or the
    target of a symbolic link ``path``. ``what`` names ``path`` in messages (the CLI passes
    ``"--export"``).

    Raises ``ValueError`` (one line, nothing touched) when ``path`` is empty, is a folder,
    a FIFO, a device or a socket, lies in a folder that does not exist, or is an existing
    file that is not a headscope export (its first key is not ``headscope``).

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> export_target(d / "p.json") == d / "p.json"
    True
    >>> _ = (d / "notes.json").write_text("{}")
    >>> try:
    ...     export_target(d / "notes.json")
    ... except ValueError as err:
    ...     print(str(err).replace(str(d), "D").split(";")[0])
    export path D/notes.json exists and is not a headscope patterns export
    """
    if isinstance(path, str) and path == "":
        raise ValueError(f"{what} is empty; name a file (e.g. patterns.json)")
    given = Path(path)
    target, label = given, str(given)
    if given.is_symlink():
        try:
            target = given.resolve()
        except (RuntimeError, OSError):
            raise ValueError(f"{what} {given} is a symbolic link that loops and never reaches a file") from None
        label = f"{given} (a symbolic link to {target})"
    try:
        st = os.stat(target)
    except FileNotFoundError:
        st = None
    except NotADirectoryError:
        parent = next(p for p in target.parents if p.exists())
        raise ValueError(f"{what} {label}: {parent} is a file, not a folder; pass another file") from None
    if st is None:
        if not target.parent.is_dir():
            raise ValueError(f"{what} {label}: folder {str(target.parent)!r} does not exist; create it first")
        return target
    if stat.S_ISDIR(st.st_mode):
        raise ValueError(f"{what} must name a file; {label} is a folder")
    for test, kind in _NOT_REGULAR:
        if test(st.st_mode):
            raise ValueError(
                f"{what} {label} is {kind}, not a regular file; headscope writes the export whole and renames it "
                "into place, so name a regular file (nothing was written)"
            )
    if not _is_export(target):
        raise ValueError(
            f"{what} {label} exists and is not a headscope patterns export; name a new file, or move that one "
            "away first (it was left as it was)"
        )
    return target


def _check_item(cap, item: int) -> int:
    """The number of real tokens of ``item``; ValueError when the item or patterns are missing."""
    if not any(q == "pattern" for q, _ in cap.data):
        raise ValueError(
            "the capture holds no attention patterns; capture with quantities including 'pattern' to export them"
        )
    batch = cap.tokens.shape[0]
    if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item < batch:
        raise ValueError(f"item must be an integer in 0..{batch - 1} (the capture has {batch} texts); got {item!r}")
    if cap.tokens.lengths:
        return int(cap.tokens.lengths[item])
    return int(cap.tokens.attention_mask[item].sum())


def _tokens(cap, item: int, n: int, tokenizer) -> list[str]:
    toks = list(cap.tokens.tokens[item][:n])
    return toks if tokenizer is None else [display_token(tokenizer, t) for t in toks]


def _pattern(cap, layer: int, item: int, n: int) -> torch.Tensor:
    """``[head, query_pos, key_pos]`` float32 on CPU, the item's real tokens only (a copy)."""
    return cap["pattern", layer][item, :, :n, :n].detach().to("cpu", torch.float32).clone()


def to_bertviz(cap, item: int = 0, *, tokenizer=None) -> tuple[tuple[torch.Tensor, ...], list[str]]:
    """``(attention, tokens)`` for bertviz's ``head_view`` / ``model_view``.

    ``attention``: one ``[1, head, query_pos, key_pos]`` float32 tensor per captured
    layer (in ``cap.layers`` order), cut to the item's ``n`` real tokens; ``tokens``: its
    ``n`` token strings (readable text when ``tokenizer`` is given, via
    :func:`~headscope.probes.tokens.display_token`).

    Raises ``ValueError`` when ``item`` is not an index of the batch or the capture has
    no patterns. See the module docstring for an example.
    """
    n = _check_item(cap, item)
    attention = tuple(_pattern(cap, layer, item, n)[None] for layer in cap.layers)  # each [1, head, n, n]
    return attention, _tokens(cap, item, n, tokenizer)


def to_circuitsvis(cap, layer: int, item: int = 0, *, tokenizer=None) -> dict:
    """``{"attention": [head][dest][src] floats, "tokens": [str]}`` for CircuitsVis's
    ``attention_heads(**result)``; JSON-serialisable, cut to the item's real tokens.

    Raises ``ValueError`` when ``layer`` was not captured, ``item`` is not an index of
    the batch or the capture has no patterns.
    """
    n = _check_item(cap, item)
    if layer not in cap.layers or ("pattern", layer) not in cap.data:
        have = [l for l in cap.layers if ("pattern", l) in cap.data]
        raise ValueError(f"layer {layer!r} has no captured pattern; captured layers are {have}")
    return {"attention": _pattern(cap, layer, item, n).tolist(), "tokens": _tokens(cap, item, n, tokenizer)}


def write_patterns_json(cap, path, item: int = 0, *, tokenizer=None) -> Path:
    """Write one item's patterns to ``path`` (atomically) and return the path.

    Keys: ``headscope`` (:data:`EXPORT_MARK`, first: it lets a later export replace this
    file), ``model`` (name), ``text``, ``tokens`` (``n`` strings), ``layers`` (captured
    layer indices), ``attention`` (``[layer][head][dest][src]``, rows over the ``n`` real
    tokens, float32 values written exactly), ``kv_groups`` (``{kv_head: [query heads]}``,
    keys as strings). ``json.load`` it and pass ``attention[i]`` and ``tokens`` to
    CircuitsVis, or ``tuple(torch.tensor(a)[None] for a in attention)`` to bertviz.

    Raises ``ValueError`` as :func:`to_bertviz` and :func:`export_target` do (an existing
    file is replaced only when it is a headscope export; a symbolic link's target is written).
    """
    export_target(path)  # before the work: a refused path costs nothing
    attention, tokens = to_bertviz(cap, item, tokenizer=tokenizer)
    doc = {
        "headscope": EXPORT_MARK,
        "model": getattr(cap.spec, "name", None),
        "text": cap.tokens.texts[item],
        "tokens": tokens,
        "layers": list(cap.layers),
        "attention": [a[0].tolist() for a in attention],
        "kv_groups": {str(k): v for k, v in cap.kv_groups.items()},
    }
    target = export_target(path)  # again, just before the rename: nothing but a headscope export is replaced
    with atomic_write(target) as f:  # compact: one float a line would be ~1M lines for 128 tokens x 72 heads
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    return Path(path)
