"""Plain-text probe sets, and the streaming line reader every corpus reader shares.

A text probe set holds one sentence or passage per line. :func:`read_text` decodes
UTF-8 (with or without a byte-order mark) and UTF-16 with a byte-order mark, never
loads an over-long line into memory whole, and records every line it leaves out:

>>> import pathlib, tempfile
>>> p = pathlib.Path(tempfile.mkdtemp()) / "s.txt"
>>> _ = p.write_bytes("\\ufeffThe cat sat .\\r\\n\\nIt purred .\\n".encode("utf-8"))
>>> ts = read_text(p)
>>> ts.lines, ts.line_numbers, ts.blank, ts.encoding
(('The cat sat .', 'It purred .'), (1, 3), 1, 'utf-8-sig')

Errors (:class:`~headscope.probes.errors.InputFileError`) read ``file:line:column: message``.
"""
from __future__ import annotations

import codecs
import unicodedata
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .errors import InputFileError

__all__ = ["SkipRecord", "TextSet", "check_input_path", "iter_lines", "read_text"]

# (byte-order mark, codec for the rest of the file, reported name, code-unit width, newline bytes)
_ENCODINGS = (
    (codecs.BOM_UTF8, "utf-8", "utf-8-sig", 1, b"\n"),
    (codecs.BOM_UTF16_LE, "utf-16-le", "utf-16-le", 2, b"\n\x00"),
    (codecs.BOM_UTF16_BE, "utf-16-be", "utf-16-be", 2, b"\x00\n"),
)
_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True, kw_only=True)
class SkipRecord:
    """What a reader left out: one ``(line, reason)`` entry per skipped unit.

    ``reason`` is a short stable key (``"too_long"``, ``"empty_node"``, …);
    :attr:`counts` tallies them.

    >>> r = SkipRecord(entries=((3, "nul_byte"), (9, "too_long"), (12, "nul_byte")))
    >>> r.counts, r.total
    ({'nul_byte': 2, 'too_long': 1}, 3)
    """

    entries: tuple[tuple[int, str], ...] = ()

    @property
    def counts(self) -> dict[str, int]:
        """Number of skipped units by reason, reasons sorted."""
        return dict(sorted(Counter(reason for _, reason in self.entries).items()))

    @property
    def total(self) -> int:
        """Number of skipped units."""
        return len(self.entries)


@dataclass(frozen=True, kw_only=True)
class TextSet:
    """Lines of a text probe set.

    ``lines[i]`` was read from line ``line_numbers[i]`` (1-based) of the file;
    ``blank`` counts blank (whitespace-only) lines, which are not errors;
    ``skipped`` records lines left out (``"nul_byte"``, ``"too_long"``).
    """

    lines: tuple[str, ...] = ()
    line_numbers: tuple[int, ...] = ()
    skipped: SkipRecord = SkipRecord()
    blank: int = 0
    encoding: str = "utf-8"

    def __post_init__(self) -> None:
        if len(self.lines) != len(self.line_numbers):
            raise ValueError(
                f"TextSet needs one line number per line; got {len(self.lines)} lines and "
                f"{len(self.line_numbers)} line numbers")

    def __len__(self) -> int:
        return len(self.lines)


def check_input_path(path: str | Path, *, expected: str) -> Path:
    """Return ``path`` as a :class:`~pathlib.Path` if it names a non-empty regular file.

    Raises :class:`InputFileError` (one line) for a missing path, a directory, or an
    empty file; ``expected`` says what the file should hold.

    >>> try:
    ...     check_input_path("/nonexistent/x.txt", expected="one sentence per line")
    ... except InputFileError as err:
    ...     print(err)
    /nonexistent/x.txt: no such file; check the path (expected a file with one sentence per line)
    """
    p = Path(path)
    if not p.exists():
        raise InputFileError(p, None, None, f"no such file; check the path (expected a file with {expected})")
    if p.is_dir():
        raise InputFileError(p, None, None, f"is a directory; pass a file inside it with {expected}")
    if not p.is_file():
        raise InputFileError(p, None, None, f"is not a regular file; pass a file with {expected}")
    if p.stat().st_size == 0:
        raise InputFileError(p, None, None, f"file is empty; expected {expected}")
    return p


def iter_lines(path: Path, *, max_line_chars: int | None) -> Iterator[tuple[int, str | None]]:
    """Yield ``(line_number, text)`` for each line of ``path``, line ends removed.

    Line ends are LF or CRLF, mixed freely; the last line needs no line end. The
    encoding is UTF-8 unless a UTF-16 byte-order mark says otherwise. The file is read
    in 1 MiB chunks; a line longer than ``max_line_chars`` characters is yielded as
    ``None`` and never held in memory whole. Raises :class:`InputFileError` naming the
    line and column of the first byte that cannot be decoded, or "file is empty" for a
    file holding only a byte-order mark.
    """
    try:
        f = path.open("rb")
    except OSError as err:
        raise InputFileError(path, None, None, f"cannot be read ({err.strerror}); check its permissions") from None
    with f:
        head = f.read(4)
        codec, width, newline, bom = "utf-8", 1, b"\n", b""
        for mark, name, _, w, nl in _ENCODINGS:
            if head.startswith(mark):
                codec, width, newline, bom = name, w, nl, mark
                break
        f.seek(len(bom))
        # A character takes at most 4 bytes in UTF-8 and in UTF-16; a line with more
        # bytes than this is too long whatever it holds (+2 code units for a CR).
        limit = None if max_line_chars is None else 4 * max_line_chars + 2 * width
        buf = bytearray()
        line_no, overflow, seen_any = 1, False, False
        while chunk := f.read(_CHUNK_BYTES):
            seen_any = True
            buf += chunk
            start = 0
            while (end := _find_newline(buf, newline, start, width)) >= 0:
                if overflow:
                    yield line_no, None
                    overflow = False
                else:
                    yield line_no, _decode(path, line_no, bytes(buf[start:end]), codec, width, max_line_chars)
                line_no += 1
                start = end + width
            del buf[:start]
            if limit is not None and len(buf) > limit:
                overflow = True
                del buf[: len(buf) - len(buf) % width]
        if not seen_any:
            raise InputFileError(path, None, None, "file is empty (it holds only a byte-order mark)")
        if overflow:
            yield line_no, None
        elif buf:
            yield line_no, _decode(path, line_no, bytes(buf), codec, width, max_line_chars)


def _find_newline(buf: bytearray, newline: bytes, start: int, width: int) -> int:
    """Index of the next newline code unit at or after ``start`` (aligned to ``width``)."""
    i = buf.find(newline, start)
    while i >= 0 and (i - start) % width:
        i = buf.find(newline, i + 1)
    return i


def _decode(path: Path, line_no: int, raw: bytes, codec: str, width: int,
            max_line_chars: int | None) -> str | None:
    cr = "\r".encode(codec)
    if raw.endswith(cr) and (len(raw) - width) % width == 0:
        raw = raw[:-width]
    try:
        text = raw.decode(codec)
    except UnicodeDecodeError as err:
        column = len(raw[: err.start].decode(codec, errors="replace")) + 1
        bad = raw[err.start: err.start + 1].hex() or "end of line"
        raise InputFileError(
            path, line_no, column,
            f"byte 0x{bad} cannot be decoded as {codec} ({err.reason}); "
            "re-save the file as UTF-8, or as UTF-16 with a byte-order mark") from None
    if max_line_chars is not None and len(text) > max_line_chars:
        return None
    return text


def read_text(path: str | Path, *, max_line_chars: int = 100_000, nfc: bool = False) -> TextSet:
    """Read a text probe set: one sentence or passage per line.

    Blank lines are counted in ``blank``; lines holding a NUL character
    (``"nul_byte"``) or more than ``max_line_chars`` characters (``"too_long"``) are
    recorded in ``skipped``. Characters are kept as they are (combining marks,
    right-to-left text, emoji and ZWJ sequences) unless ``nfc=True`` asks for NFC
    normalisation.

    Raises :class:`InputFileError` for a missing path, a directory, an empty file, or
    bytes that cannot be decoded (naming line and column of the first bad byte).

    >>> import pathlib, tempfile
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "t.txt"
    >>> _ = p.write_text("cafe\\u0301\\nx\\x00y\\n" + "z" * 50 + "\\n", encoding="utf-16")
    >>> ts = read_text(p, max_line_chars=20, nfc=True)
    >>> ts.lines, ts.skipped.entries, ts.encoding
    (('café',), ((2, 'nul_byte'), (3, 'too_long')), 'utf-16-le')
    """
    if not isinstance(max_line_chars, int) or max_line_chars < 1:
        raise ValueError(f"max_line_chars must be a positive int; got {max_line_chars!r}")
    p = check_input_path(path, expected="one sentence or passage per line")
    lines: list[str] = []
    numbers: list[int] = []
    skips: list[tuple[int, str]] = []
    blank = 0
    for line_no, text in iter_lines(p, max_line_chars=max_line_chars):
        if text is None:
            skips.append((line_no, "too_long"))
        elif "\x00" in text:
            skips.append((line_no, "nul_byte"))
        elif not text.strip():
            blank += 1
        else:
            lines.append(unicodedata.normalize("NFC", text) if nfc else text)
            numbers.append(line_no)
    with p.open("rb") as f:
        head = f.read(4)
    encoding = next((name for mark, _, name, _, _ in _ENCODINGS if head.startswith(mark)), "utf-8")
    return TextSet(lines=tuple(lines), line_numbers=tuple(numbers), skipped=SkipRecord(entries=tuple(skips)),
                   blank=blank, encoding=encoding)
