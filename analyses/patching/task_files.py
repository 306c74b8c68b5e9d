"""Users' patching tasks: JSONL files, one item per line, a JSON object with either texts::

    {"clean": "The key near the cabinet", "corrupted": "The keys near the cabinet", "answer": " is", "wrong": " are"}

or token ids (no tokenisation)::

    {"clean_ids": [1, 5, 6, 5], "corrupted_ids": [1, 7, 8, 5], "answer_id": 6}

``wrong``/``wrong_id`` is optional; every item of a file must agree on whether it has one
(with: ``logit_diff``, without: ``logprob``; on an encoder both are read but unused: the
metric is ``embedding_cosine``). ``answer`` and ``wrong`` must be single tokens
(tokenised without special tokens). Blank lines and lines starting with ``#`` are skipped.
A task file is UTF-8 text (as JSON Lines are), with or without a byte-order mark; any other
encoding (UTF-16, a binary file) is refused as ``file:line: not UTF-8 text (...)``.
A malformed line raises :class:`~headscope.probes.errors.InputFileError`
(``file:line:column: message``; :func:`read_task_jsonl`); an item whose clean and corrupted
inputs tokenise to different lengths, or whose answer is not one token, is *unusable*
(:func:`tokenize_rows`): it is counted and listed in
:attr:`~headscope.analyses.patching.items.Task.unusable` (with its line, its ``kind``
(:data:`~headscope.analyses.patching.items.UNUSABLE_KINDS`) and the reason), never dropped
silently. A task with no usable item is refused, with the count of each kind.
"""

from __future__ import annotations

import codecs
import io
import json
import warnings
from pathlib import Path

from headscope.analyses.patching.items import PairItem, Task, counts_text, unusable_counts
from headscope.probes.errors import InputFileError

_TEXT_KEYS = ("clean", "corrupted", "answer")
_ID_KEYS = ("clean_ids", "corrupted_ids", "answer_id")


def _utf8_text(path: Path) -> str:
    """The text of a task file: UTF-8, a leading byte-order mark dropped; ``InputFileError``
    ``file:line: not UTF-8 text (...)`` for anything else (UTF-16/32, a binary file)."""
    from headscope.probes.corpora.text import sniff_encoding

    raw = path.read_bytes()
    if raw.startswith(codecs.BOM_UTF8):
        raw = raw[len(codecs.BOM_UTF8) :]
    else:
        enc = sniff_encoding(raw[:4096])
        if enc.codec != "utf-8":
            raise InputFileError(
                path,
                1,
                None,
                f"not UTF-8 text (it reads as {enc.name}); JSON Lines are UTF-8: re-save the file as UTF-8",
            )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        before = io.StringIO(raw[: err.start].decode("utf-8"), newline=None).read()  # line ends as read below
        line, col = before.count("\n") + 1, len(before) - (before.rfind("\n") + 1) + 1
        raise InputFileError(
            path,
            line,
            None,
            f"not UTF-8 text (byte 0x{raw[err.start]:02x} at column {col}: {err.reason}); "
            "a task file is UTF-8 JSON Lines: re-save it as UTF-8",
        ) from None


def read_task_jsonl(path) -> list[tuple[int, dict]]:
    """``[(line number, item dict)]`` of a task file (format: module docstring), checked for
    structure; :class:`InputFileError` (``file:line:col``) on the first bad line, or
    ``file:line: not UTF-8 text (...)`` for a file that is not UTF-8 (a leading byte-order
    mark is fine)."""
    path = Path(path)
    rows: list[tuple[int, dict]] = []
    with_wrong: bool | None = None
    text = _utf8_text(path)
    with io.StringIO(text, newline=None) as f:  # LF, CRLF or CR line ends, as open() reads them
        for lineno, line in enumerate(f, start=1):
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                continue
            try:
                obj = json.loads(stripped)
            except json.JSONDecodeError as e:
                indent = len(line) - len(line.lstrip())
                raise InputFileError(path, lineno, indent + e.colno, f"not valid JSON ({e.msg})") from None
            if not isinstance(obj, dict):
                raise InputFileError(path, lineno, 1, f"an item must be a JSON object; got {type(obj).__name__}")
            ids = "clean_ids" in obj
            keys = _ID_KEYS if ids else _TEXT_KEYS
            missing = [k for k in keys if k not in obj]
            if missing:
                raise InputFileError(
                    path,
                    lineno,
                    1,
                    f"missing key {missing[0]!r}; an item needs {', '.join(keys)} (and optionally wrong)",
                )
            for k in keys:
                want_list = k.endswith("_ids")
                v = obj[k]
                ok = (
                    isinstance(v, list) and v and all(_is_id(x) for x in v)
                    if want_list
                    else (_is_id(v) if k.endswith("_id") else isinstance(v, str) and v != "")
                )
                if not ok:
                    what = (
                        "a non-empty list of token ids"
                        if want_list
                        else ("a token id" if k.endswith("_id") else "a non-empty string")
                    )
                    raise InputFileError(path, lineno, _column(line, k), f"{k!r} must be {what}; got {v!r}")
            wrong_key = "wrong_id" if ids else "wrong"
            has_wrong = wrong_key in obj
            if has_wrong:
                w = obj[wrong_key]
                if not _is_id(w) if ids else not (isinstance(w, str) and w):
                    raise InputFileError(
                        path, lineno, _column(line, wrong_key), f"{wrong_key!r} is malformed; got {w!r}"
                    )
            if with_wrong is None:
                with_wrong = has_wrong
            elif with_wrong != has_wrong:
                raise InputFileError(
                    path,
                    lineno,
                    1,
                    f"every item must {'have' if with_wrong else 'lack'} {wrong_key!r} like the first item "
                    "(with: logit_diff metric, without: logprob)",
                )
            rows.append((lineno, obj))
    if not rows:
        raise InputFileError(path, None, None, "no items (the file is empty or only comments)")
    return rows


def _is_id(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _column(line: str, key: str) -> int:
    """1-based column of ``"key"`` in ``line`` (1 when not found)."""
    at = line.find(f'"{key}"')
    return at + 1 if at >= 0 else 1


def _single_token(tokenizer, text: str) -> int | None:
    """The one id ``text`` is as plain text (a special token's string typed as an answer is not
    the special), or ``None`` when it is not a single token."""
    from headscope.probes.tokens import encode_plain

    ids = encode_plain(tokenizer, text, add_special_tokens=False)["input_ids"]
    return ids[0] if len(ids) == 1 else None


def tokenize_rows(model, rows: list[tuple[int, dict]], *, name: str, source: str = "") -> Task:
    """Tokenise :func:`read_task_jsonl` rows with ``model.encode`` (its tokenizer, context and
    vocabulary); items that cannot be used are counted in ``Task.unusable``, with a warning."""
    from headscope.probes.models.purpose import purpose_of

    tok = model.tokenizer
    lm = purpose_of(model).kind == "lm"  # what the model is for, decided at load
    items: list[PairItem] = []
    unusable: list[dict] = []
    texts = [r for _, r in rows if "clean_ids" not in r]
    encoded = {}
    if texts:
        batch = model.encode(texts=[t for r in texts for t in (r["clean"], r["corrupted"])])
        for j, r in enumerate(texts):
            encoded[id(r)] = (
                batch.input_ids[2 * j, : batch.lengths[2 * j]].tolist(),
                batch.input_ids[2 * j + 1, : batch.lengths[2 * j + 1]].tolist(),
            )
    vocab = model.vocab_size
    for k, (lineno, r) in enumerate(rows):
        if "clean_ids" in r:
            clean, corrupted = list(r["clean_ids"]), list(r["corrupted_ids"])
            answer, wrong = r["answer_id"], r.get("wrong_id")
            too_big = [
                x for x in [*clean, *corrupted, answer, *([wrong] if wrong is not None else [])] if vocab and x >= vocab
            ]
            if too_big:
                reason = f"token id {too_big[0]} >= vocab size {vocab}"
                unusable.append({"item": k, "line": lineno, "kind": "id_past_vocab", "reason": reason})
                continue
            if len(clean) > model.spec.max_positions or len(corrupted) > model.spec.max_positions:
                reason = f"{max(len(clean), len(corrupted))} tokens; the model's context is {model.spec.max_positions}"
                unusable.append({"item": k, "line": lineno, "kind": "longer_than_context", "reason": reason})
                continue
        elif not lm:  # an embedding model's metric reads no answer token
            clean, corrupted = encoded[id(r)]
            answer, wrong = 0, None
        else:
            clean, corrupted = encoded[id(r)]
            answer = _single_token(tok, r["answer"])
            wrong = _single_token(tok, r["wrong"]) if "wrong" in r else None
            if answer is None or ("wrong" in r and wrong is None):
                bad = r["answer"] if answer is None else r["wrong"]
                unusable.append(
                    {"item": k, "line": lineno, "kind": "not_single_token", "reason": f"{bad!r} is not a single token"}
                )
                continue
        if len(clean) != len(corrupted):
            reason = f"clean has {len(clean)} tokens, corrupted {len(corrupted)}"
            unusable.append({"item": k, "line": lineno, "kind": "length_mismatch", "reason": reason})
            continue
        items.append(PairItem(tuple(clean), tuple(corrupted), int(answer), None if wrong is None else int(wrong)))
    metric = "logit_diff" if ("wrong" in rows[0][1] or "wrong_id" in rows[0][1]) else "logprob"
    if not lm:
        metric = "embedding_cosine"
        items = [PairItem(it.clean, it.corrupted, 0) for it in items]
    if unusable:
        first = unusable[0]
        warnings.warn(
            f"task {name}: {len(unusable)} of {len(rows)} items unusable ({counts_text(unusable_counts(unusable))}; "
            f"first: line {first['line']}: {first['reason']}); they are listed in Task.unusable",
            stacklevel=2,
        )
    if not items:
        raise InputFileError(
            source or name,
            None,
            None,
            f"no usable items: read {len(rows)} item{'s' if len(rows) != 1 else ''}, all unusable "
            f"({counts_text(unusable_counts(unusable))}; "
            f"first at line {unusable[0]['line']}: {unusable[0]['reason']})",
        )
    return Task(name=name, items=items, metric=metric, unusable=unusable, source=source)
