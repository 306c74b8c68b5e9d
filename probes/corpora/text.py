"""Plain-text probe sets, and the streaming line reader every corpus reader shares.

A text probe set holds one sentence or passage per line. :func:`read_text` decodes
UTF-8 (with or without a byte-order mark), UTF-16 and UTF-32 (with a byte-order
mark, or recognised without one by :func:`sniff_encoding`), splits lines at LF, CRLF
or a lone CR, never loads an over-long line into memory whole, and records every
line it leaves out (a line that shows nothing, :func:`is_blank`, is one of them):

>>> import pathlib, tempfile
>>> p = pathlib.Path(tempfile.mkdtemp()) / "s.txt"
>>> _ = p.write_bytes("\\ufeffThe cat sat .\\r\\n\\u200b\\u2060\\nIt purred .\\n".encode("utf-8"))
>>> ts = read_text(p)
>>> ts.lines, ts.line_numbers, ts.blank, ts.encoding
(('The cat sat .', 'It purred .'), (1, 3), 1, 'utf-8-sig')
>>> ts.skipped.entries, ts.note()
(((2, 'blank or invisible-only'),), '1 line skipped: 1 blank or invisible-only')

Errors (:class:`~headscope.probes.errors.InputFileError`) read ``file:line:column: message``.
"""

from __future__ import annotations

import codecs
import unicodedata
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from headscope.probes.errors import InputFileError

__all__ = [
    "BLANK",
    "Encoding",
    "SkipRecord",
    "TextSet",
    "check_input_path",
    "is_blank",
    "iter_lines",
    "read_text",
    "sniff_encoding",
]

# (byte-order mark, codec for the rest of the file, reported name, code-unit width).
# UTF-32 first: its little-endian mark begins with UTF-16's.
_ENCODINGS = (
    (codecs.BOM_UTF8, "utf-8", "utf-8-sig", 1),
    (codecs.BOM_UTF32_LE, "utf-32-le", "utf-32-le", 4),
    (codecs.BOM_UTF32_BE, "utf-32-be", "utf-32-be", 4),
    (codecs.BOM_UTF16_LE, "utf-16-le", "utf-16-le", 2),
    (codecs.BOM_UTF16_BE, "utf-16-be", "utf-16-be", 2),
)
_SNIFF_BYTES = 4096


@dataclass(frozen=True)
class Encoding:
    """How a file is encoded: the codec, the name reported to the user, the code-unit
    width in bytes, and the length of the byte-order mark to skip."""

    codec: str
    name: str
    width: int
    bom: int


def sniff_encoding(head: bytes) -> Encoding:
    """Encoding of a file from its first bytes.

    A byte-order mark decides (UTF-8, UTF-16 or UTF-32, either byte order). Without
    one, UTF-16 and UTF-32 are recognised by where their NUL bytes fall (text that is
    mostly Latin script has a NUL in every other, or three of every four, bytes);
    such a file is reported as e.g. ``"utf-16-le (no BOM)"``. Anything else is UTF-8.

    >>> sniff_encoding("hello\\n".encode("utf-16-le")).name
    'utf-16-le (no BOM)'
    >>> sniff_encoding("\\ufeffhi".encode("utf-32")).name
    'utf-32-le'
    >>> sniff_encoding(b"plain ascii, with one \\x00 NUL").name
    'utf-8'
    """
    for mark, codec, name, width in _ENCODINGS:
        if head.startswith(mark):
            return Encoding(codec, name, width, len(mark))
    sample = head[: len(head) - len(head) % 4]
    if len(sample) >= 4 and sample.count(0) >= len(sample) // 3:

        def nul_share(offset: int, step: int) -> float:
            units = sample[offset::step]
            return units.count(0) / len(units)

        # (codec, width, positions that are NUL for BMP text, positions that never are)
        candidates = (
            ("utf-32-le", 4, (1, 2, 3), (0,)),
            ("utf-32-be", 4, (0, 1, 2), (3,)),
            ("utf-16-le", 2, (1,), (0,)),
            ("utf-16-be", 2, (0,), (1,)),
        )
        for codec, width, nul_at, text_at in candidates:
            if all(nul_share(i, width) >= 0.5 for i in nul_at) and all(nul_share(i, width) < 0.1 for i in text_at):
                try:
                    sample.decode(codec)
                except UnicodeDecodeError as err:
                    if err.start < len(sample) - 4:  # a cut at the sample's end is fine
                        continue
                return Encoding(codec, f"{codec} (no BOM)", width, 0)
    return Encoding("utf-8", "utf-8", 1, 0)


_CHUNK_BYTES = 1 << 20

#: the skip reason of a line that shows nothing (:func:`is_blank`)
BLANK = "blank or invisible-only"

# Code points that show nothing besides whitespace, controls (Cc) and format characters (Cf):
# the rest of Unicode's Default_Ignorable_Code_Point set (combining grapheme joiner, Hangul
# fillers, Khmer inherent vowels, Mongolian and other variation selectors, tags and their
# reserved neighbours) and the blank braille pattern U+2800, a common "invisible" filler.
_INVISIBLE_RANGES = (
    (0x034F, 0x034F),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x180B, 0x180F),
    (0x2065, 0x2065),
    (0x2800, 0x2800),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFFA0, 0xFFA0),
    (0xFFF0, 0xFFF8),
    (0xE0000, 0xE0FFF),
)
# Format characters that do show: Unicode's Prepended_Concatenation_Mark (Arabic number signs,
# end of ayah, Syriac abbreviation mark, Kaithi number signs).
_VISIBLE_FORMAT = frozenset((*range(0x0600, 0x0606), 0x06DD, 0x070F, 0x0890, 0x0891, 0x08E2, 0x110BD, 0x110CD))


def _shows_nothing(c: str) -> bool:
    if c.isspace():
        return True
    category = unicodedata.category(c)
    if category in ("Cc", "Zs", "Zl", "Zp"):
        return True
    cp = ord(c)
    if category == "Cf":
        return cp not in _VISIBLE_FORMAT
    return any(lo <= cp <= hi for lo, hi in _INVISIBLE_RANGES)


def is_blank(text: str) -> bool:
    """True when ``text`` shows nothing: every character is whitespace, a control
    character, a format character (zero-width space U+200B, non-joiner U+200C, joiner
    U+200D, word joiner U+2060, byte-order mark U+FEFF, bidi marks, soft hyphen, ...) or
    another default-ignorable code point (variation selectors, Hangul fillers, tags), or
    the blank braille pattern. Such a line is no sentence: the readers skip it, and
    :func:`~headscope.probes.tokens.tokenize_one` refuses it as empty.

    >>> is_blank(" \\t\\u200b\\u200c\\u200d\\ufeff\\u2060\\u00a0\\ufe0f"), is_blank("")
    (True, True)
    >>> is_blank("\\u200bcat"), is_blank("\\U0001f468\\u200d\\U0001f469"), is_blank("\\u0600")
    (False, False, False)
    """
    return all(_shows_nothing(c) for c in text)


@dataclass(frozen=True, kw_only=True)
class SkipRecord:
    """What a reader left out: one ``(line, reason)`` entry per skipped unit.

    ``reason`` is a short stable key (``"too_long"``, ``"empty_node"``, …);
    :attr:`counts` tallies them.

    >>> r = SkipRecord(entries=((3, "nul_byte"), (9, "too_long"), (12, "nul_byte")))
    >>> r.counts, r.total, r.summary()
    ({'nul_byte': 2, 'too_long': 1}, 3, 'nul_byte 2, too_long 1')
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

    def summary(self) -> str:
        """The counts on one line: ``"reason count, reason count"`` (``"nothing"`` when empty)."""
        return ", ".join(f"{reason} {n}" for reason, n in self.counts.items()) or "nothing"


@dataclass(frozen=True, kw_only=True)
class TextSet:
    """Lines of a text probe set.

    ``lines[i]`` was read from line ``line_numbers[i]`` (1-based) of the file;
    ``skipped`` records every line left out: :data:`BLANK` (``"blank or invisible-only"``:
    whitespace, zero-width and other invisible characters only, :func:`is_blank`; not an
    error), ``"nul_byte"``, ``"too_long"``; ``blank`` counts the :data:`BLANK` ones.
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
                f"{len(self.line_numbers)} line numbers"
            )

    def __len__(self) -> int:
        return len(self.lines)

    def note(self) -> str | None:
        """The skipped lines on one line for the user (None when none was skipped).

        >>> TextSet(skipped=SkipRecord(entries=((2, BLANK), (5, "nul_byte"), (7, BLANK)))).note()
        '3 lines skipped: 2 blank or invisible-only, 1 nul_byte'
        """
        if not self.skipped.total:
            return None
        n = self.skipped.total
        counts = ", ".join(f"{k} {reason}" for reason, k in self.skipped.counts.items())
        return f"{n} line{'s' if n != 1 else ''} skipped: {counts}"


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

    Line ends are LF, CRLF or a lone CR (old Mac files), mixed freely; the last line
    needs no line end. The encoding comes from :func:`sniff_encoding`. The file is read
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
        enc = sniff_encoding(f.read(_SNIFF_BYTES))
        f.seek(enc.bom)
        width = enc.width
        lf, cr = "\n".encode(enc.codec), "\r".encode(enc.codec)
        # A character takes at most 4 bytes in every supported encoding; a line with
        # more bytes than this is too long whatever it holds (+2 code units for CRLF).
        limit = None if max_line_chars is None else 4 * max_line_chars + 2 * width
        buf = bytearray()
        line_no, overflow, seen_any, eof = 1, False, False, False
        while not eof:
            chunk = f.read(_CHUNK_BYTES)
            eof = not chunk
            seen_any = seen_any or bool(chunk)
            buf += chunk
            start = 0
            for line_start, end, after in _line_ends(buf, lf, cr, width, eof):
                if overflow:
                    yield line_no, None
                    overflow = False
                else:
                    yield line_no, _decode(path, line_no, bytes(buf[line_start:end]), enc, max_line_chars)
                line_no += 1
                start = after
            del buf[:start]
            if limit is not None and len(buf) > limit:
                overflow = True
                del buf[: len(buf) - len(buf) % width]
        if not seen_any:
            raise InputFileError(path, None, None, "file is empty (it holds only a byte-order mark)")
        if overflow:
            yield line_no, None
        elif buf:
            yield line_no, _decode(path, line_no, bytes(buf), enc, max_line_chars)


def _line_ends(buf: bytearray, lf: bytes, cr: bytes, width: int, eof: bool) -> Iterator[tuple[int, int, int]]:
    """``(line start, line end, next line start)`` for every complete line in ``buf``.

    Line ends are LF, CRLF or a lone CR, aligned to ``width``. A CR at the very end of
    ``buf`` waits for the next chunk (it may be half a CRLF) unless ``eof``. Each
    terminator is searched for once per pass, so a pass is linear in ``len(buf)``.
    """
    start, i_lf, i_cr = 0, -2, -2  # -2: not searched yet; -1: none left in buf
    while True:
        if i_lf == -2 or 0 <= i_lf < start:
            i_lf = _find_unit(buf, lf, start, width)
        if i_cr == -2 or 0 <= i_cr < start:
            i_cr = _find_unit(buf, cr, start, width)
        if i_cr < 0 or (0 <= i_lf < i_cr):
            if i_lf < 0:
                return
            yield start, i_lf, i_lf + width
            start = i_lf + width
            continue
        nxt = i_cr + width
        if nxt + width > len(buf) and not eof:
            return
        after = nxt + width if buf[nxt : nxt + width] == lf else nxt
        yield start, i_cr, after
        start = after


def _find_unit(buf: bytearray, unit: bytes, start: int, width: int) -> int:
    """Index of the next ``unit`` at or after ``start`` that is aligned to ``width``."""
    i = buf.find(unit, start)
    while i >= 0 and (i - start) % width:
        i = buf.find(unit, i + 1)
    return i


def _decode(path: Path, line_no: int, raw: bytes, enc: Encoding, max_line_chars: int | None) -> str | None:
    try:
        text = raw.decode(enc.codec)
    except UnicodeDecodeError as err:
        column = len(raw[: err.start].decode(enc.codec, errors="replace")) + 1
        bad = raw[err.start : err.start + 1].hex() or "end of line"
        raise InputFileError(
            path,
            line_no,
            column,
            f"byte 0x{bad} cannot be decoded as {enc.codec} ({err.reason}); "
            "re-save the file as UTF-8 (or UTF-16/UTF-32 with a byte-order mark)",
        ) from None
    if max_line_chars is not None and len(text) > max_line_chars:
        return None
    return text


def read_text(path: str | Path, *, max_line_chars: int = 100_000, nfc: bool = False) -> TextSet:
    """Read a text probe set: one sentence or passage per line.

    Lines left out are recorded in ``skipped`` (and summed up by :meth:`TextSet.note`):
    lines that show nothing (:data:`BLANK`: whitespace, zero-width and other invisible
    characters only, :func:`is_blank`; also counted in ``blank``), lines holding a NUL
    character (``"nul_byte"``) or more than ``max_line_chars`` characters
    (``"too_long"``). Characters are kept as they are (combining marks, right-to-left
    text, emoji and ZWJ sequences) unless ``nfc=True`` asks for NFC normalisation.

    Raises :class:`InputFileError` for a missing path, a directory, an empty file, a
    file with no usable line (all blank or skipped; the message gives the counts), or
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
        elif is_blank(text):
            skips.append((line_no, BLANK))
            blank += 1
        else:
            lines.append(unicodedata.normalize("NFC", text) if nfc else text)
            numbers.append(line_no)
    if not lines:
        others = [(n, r) for n, r in skips if r != BLANK]
        parts = ([f"{blank} blank"] if blank else []) + (
            [f"{len(others)} skipped ({SkipRecord(entries=tuple(others)).summary()}; first at line {others[0][0]})"]
            if others
            else []
        )
        raise InputFileError(
            p,
            None,
            None,
            f"no sentences: every line is blank or skipped ({', '.join(parts)}); "
            "expected one sentence or passage per line",
        )
    with p.open("rb") as f:
        encoding = sniff_encoding(f.read(_SNIFF_BYTES)).name
    return TextSet(
        lines=tuple(lines),
        line_numbers=tuple(numbers),
        skipped=SkipRecord(entries=tuple(skips)),
        blank=blank,
        encoding=encoding,
    )
