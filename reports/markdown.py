"""The report as Markdown: the same :class:`~headscope.reports.html.Document` as the
HTML page, figures as PNG files under ``figures/``.

>>> text, files = render_markdown(Document(title="T", sections=[Section(id="s", title="S", blocks=[Paragraph("x")])]))
>>> text.splitlines()[:3], files
(['# T', '', '## S'], {})
"""

from __future__ import annotations

from headscope.reports.html import (  # noqa: F401 (Section: doctest)
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


def _cell(v) -> str:
    return fmt(v).replace("|", "\\|").replace("\n", " ")


def table_markdown(t: Table) -> str:
    """A pipe table with a caption line above it."""
    cols = [str(c) for c in t.frame.columns]
    lines = [f"*{t.caption}*", "", "| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for row in t.frame.itertuples(index=False):
        lines.append("| " + " | ".join(_cell(v) for v in row) + " |")
    return "\n".join(lines)


def render_markdown(doc: Document, figure_dir: str = "figures") -> tuple[str, dict[str, bytes]]:
    """``(markdown text, {relative path: PNG bytes})``; the caller writes the files."""
    files: dict[str, bytes] = {}
    out = [f"# {doc.title}", ""]
    if doc.subtitle:
        out += [doc.subtitle, ""]
    for s in doc.sections:
        out += ["#" * s.level + " " + s.title, ""]
        for b in s.blocks:
            if isinstance(b, Paragraph):
                out.append(b.text)
            elif isinstance(b, Note):
                out.append("> **Note.** " + b.text)
            elif isinstance(b, Pre):
                out += ["```", b.text, "```"]
            elif isinstance(b, Figure):
                path = f"{figure_dir}/{b.name}.png"
                files[path] = b.png
                alt = b.alt.replace("[", "(").replace("]", ")")
                out += [f"![{alt}]({path})", "", f"*{b.caption}*"]
            elif isinstance(b, Table):
                out.append(table_markdown(b))
            elif isinstance(b, HeadView):  # interactive, HTML only: one sentence here
                out.append(b.text)
            else:
                raise TypeError(f"unknown document block {type(b).__name__}")
            out.append("")
    return "\n".join(out).rstrip() + "\n", files
