r"""The report as Markdown: the same :class:`~headscope.reports.document.Document` as the
HTML page, figures as PNG files under ``figures/``.

The document holds plain text (the HTML page escapes all of it), and much of that text
comes from the user: role names carry a coreference file's ``kind``, examples its words,
the title and the run table the model's name or path, the skipped table file names. So
every string is escaped here (:func:`escape`) and reads in report.md exactly as it does in
report.html: no raw HTML, link, image, heading, list, code span or table cell can be made
by a value.

>>> text, files = render_markdown(Document(title="T", sections=[Section(id="s", title="S", blocks=[Paragraph("x")])]))
>>> text.splitlines()[:3], files
(['# T', '', '## S'], {})
>>> print(escape("coreference:<b>hi</b> [x](javascript:alert(1)) a|b p_value"))
coreference:\<b\>hi\</b\> \[x\](javascript:alert(1)) a\|b p_value
"""

from __future__ import annotations

import re

from headscope.reports.document import (  # noqa: F401 (Section: doctest)
    Document,
    Figure,
    HeadView,
    Note,
    Paragraph,
    Pre,
    Section,
    Table,
    fmt,
)

# ASCII punctuation that opens or closes something inline (CommonMark backslash-escapes
# any ASCII punctuation): raw HTML and autolinks (< >), code spans (`), emphasis (*),
# links and images ([ ]), GFM table cells (|) and strikethrough (~), headings (#), and
# the backslash itself (escaped first, so a value's own backslash cannot undo an escape)
_ALWAYS = re.compile(r"([\\`*\[\]<>|~#])")
# `&` only where it would start an entity (&lt; &#60; &#x3c;): "Jain & Wallace" stays as it is
_ENTITY = re.compile(r"&(?=#?[A-Za-z0-9]+;)")
# `_` opens or closes emphasis unless it sits between two letters or digits (p_value stays)
_UNDERSCORE = re.compile(r"(?<![^\W_])_|_(?![^\W_])")
# at the start of a line: a list item (- + or "1. " "1) "), a thematic break or setext underline (- =)
_LINE_START = re.compile(r"^(?:([-+=])|(\d{1,9})([.)])(?=\s|$))")
_NEWLINES = re.compile(r"\s*(?:\r\n|\r|\n)\s*")


def escape(text: object, *, line_start: bool = False) -> str:
    """``text`` (any value, through ``str``) as Markdown that renders as exactly that text,
    on one line: line breaks become spaces (as in the HTML page's ``<p>``), and every
    character that could start Markdown or HTML syntax is backslash-escaped; with
    ``line_start`` (text that begins a line) also a leading list marker or rule."""
    s = _NEWLINES.sub(" ", str(text)).strip()
    s = _ALWAYS.sub(r"\\\1", s)
    s = _ENTITY.sub(r"\\&", s)
    s = _UNDERSCORE.sub(r"\\_", s)
    if not line_start:
        return s
    return _LINE_START.sub(lambda m: "\\" + m.group(1) if m.group(1) else m.group(2) + "\\" + m.group(3), s)


def _cell(v: object) -> str:
    return escape(fmt(v))


def _fenced(text: str) -> list[str]:
    """A code block whose fence is longer than any run of backticks in ``text``."""
    longest = max((len(r) for r in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence, text, fence]


def table_markdown(t: Table) -> str:
    """A pipe table with a caption line above it."""
    cols = [escape(c) for c in t.frame.columns]
    lines = [f"*{escape(t.caption)}*", "", "| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for row in t.frame.itertuples(index=False):
        lines.append("| " + " | ".join(_cell(v) for v in row) + " |")
    return "\n".join(lines)


def render_markdown(doc: Document, figure_dir: str = "figures") -> tuple[str, dict[str, bytes]]:
    """``(markdown text, {relative path: PNG or SVG bytes})``; the caller writes the files.
    Every string of ``doc`` goes through :func:`escape` (a :class:`Pre` block is fenced)."""
    files: dict[str, bytes] = {}
    out = [f"# {escape(doc.title)}", ""]
    if doc.subtitle:
        out += [escape(doc.subtitle, line_start=True), ""]
    for s in doc.sections:
        out += ["#" * s.level + " " + escape(s.title), ""]
        for b in s.blocks:
            if isinstance(b, Paragraph):
                out.append(escape(b.text, line_start=True))
            elif isinstance(b, Note):
                out.append("> **Note.** " + escape(b.text))
            elif isinstance(b, Pre):
                out += _fenced(b.text)
            elif isinstance(b, Figure):
                if not re.fullmatch(r"[A-Za-z0-9_-]+", b.name):
                    raise ValueError(f"figure name must be a slug ([A-Za-z0-9_-]+: a file stem); got {b.name!r}")
                path = f"{figure_dir}/{b.name}.{'svg' if b.svg else 'png'}"
                files[path] = b.svg.encode() if b.svg else b.png
                alt = escape(b.alt.replace("[", "(").replace("]", ")"))
                out += [f"![{alt}]({path})", "", f"*{escape(b.caption)}*"]
            elif isinstance(b, Table):
                out.append(table_markdown(b))
            elif isinstance(b, HeadView):  # interactive, HTML only: one sentence here
                out.append(escape(b.text, line_start=True))
            else:
                raise TypeError(f"unknown document block {type(b).__name__}")
            out.append("")
    return "\n".join(out).rstrip() + "\n", files
