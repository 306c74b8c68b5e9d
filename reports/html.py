"""The report as one self-contained HTML page.

:func:`render_html` writes a :class:`~headscope.reports.document.Document` (built from frames
by :func:`headscope.reports.sections.build_document`) as one HTML file with CSS inline and
every image a ``data:`` URI, so it opens from disk, offline; its one script, embedded, draws
the interactive head view (:mod:`headscope.reports.head_view`) and nothing else needs it.
Every string of the document is escaped here. :mod:`headscope.reports.markdown` renders the
same document as Markdown.

>>> doc = Document(title="t", sections=[Section(id="s", title="S", blocks=[Paragraph("a < b")])])
>>> "a &lt; b" in render_html(doc)
True
"""

from __future__ import annotations

import html as _html

import numpy as np

from headscope.reports import figures as F
from headscope.reports.document import (  # noqa: F401 (Section: doctest)
    Block,
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
from headscope.reports.head_view import HEAD_VIEW_CSS, render_head_view

__all__ = ["CSS", "render_html"]

CSS = """
body{font:15px/1.5 Georgia,'DejaVu Serif',serif;color:#222;max-width:980px;margin:2em auto;padding:0 1.2em;background:#fff}
h1{font-size:1.7em;margin-bottom:.1em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
h3{margin-top:1.6em}.subtitle{color:#666;margin-top:0}
nav ul{columns:2;font-size:.9em}
pre{background:#f6f6f4;padding:.8em;overflow-x:auto;font:13px/1.4 'DejaVu Sans Mono',monospace}
figure{margin:1.2em 0;text-align:center}figure img{max-width:100%;height:auto}
figcaption{font-size:.88em;color:#444;text-align:left;margin-top:.4em}
table{border-collapse:collapse;margin:.8em 0;font:13px/1.35 'DejaVu Sans',Arial,sans-serif}
caption{caption-side:top;text-align:left;font-style:italic;color:#555;padding-bottom:.3em}
th,td{border-bottom:1px solid #e2e2e2;padding:.25em .6em;text-align:left}
th{background:#f2f2f2}td.num{text-align:right;font-variant-numeric:tabular-nums}
.note{border-left:4px solid #c44e52;background:#fbf3f3;padding:.5em .8em;font-size:.92em}
"""


def _num(v: object) -> str:
    return (
        ' class="num"'
        if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))
        else ""
    )


def _table_html(t: Table) -> str:
    head = "".join(f'<th scope="col">{_html.escape(str(c))}</th>' for c in t.frame.columns)
    body = "".join(
        "<tr>" + "".join(f"<td{_num(v)}>{_html.escape(fmt(v))}</td>" for v in row) + "</tr>"
        for row in t.frame.itertuples(index=False)
    )
    return f"<table><caption>{_html.escape(t.caption)}</caption><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _block_html(b: Block) -> str:
    if isinstance(b, Paragraph):
        return f"<p>{_html.escape(b.text)}</p>"
    if isinstance(b, Note):
        return f'<p class="note" role="note">{_html.escape(b.text)}</p>'
    if isinstance(b, Pre):
        return f"<pre>{_html.escape(b.text)}</pre>"
    if isinstance(b, Figure):
        if b.svg:  # drawn in Python: inline, its <title> holds the alt text
            return (
                f'<figure id="fig-{_html.escape(b.name)}">{b.svg}'
                f"<figcaption>{_html.escape(b.caption)}</figcaption></figure>"
            )
        return (
            f'<figure id="fig-{_html.escape(b.name)}"><img src="{F.data_uri(b.png)}" alt="{_html.escape(b.alt, quote=True)}">'
            f"<figcaption>{_html.escape(b.caption)}</figcaption></figure>"
        )
    if isinstance(b, Table):
        return _table_html(b)
    if isinstance(b, HeadView):
        return render_head_view(b)
    raise TypeError(
        f"unknown document block {type(b).__name__}; expected Paragraph, Note, Pre, Figure, Table or HeadView"
    )


def render_html(doc: Document) -> str:
    """One self-contained HTML page: inline CSS, images as data URIs, no external
    resource; the only script is the head view's (embedded, with its data as one JSON
    blob), and the page reads the same without it."""
    toc = "".join(f'<li><a href="#{_html.escape(s.id)}">{_html.escape(s.title)}</a></li>' for s in doc.sections)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_html.escape(doc.title)}</title><style>{CSS}{HEAD_VIEW_CSS}</style></head><body><main>",
        f"<h1>{_html.escape(doc.title)}</h1>",
        f'<p class="subtitle">{_html.escape(doc.subtitle)}</p>' if doc.subtitle else "",
        f'<nav aria-label="contents"><ul>{toc}</ul></nav>',
    ]
    for s in doc.sections:
        h = f"h{s.level}"
        parts.append(f'<section id="{_html.escape(s.id)}"><{h}>{_html.escape(s.title)}</{h}>')
        parts.extend(_block_html(b) for b in s.blocks)
        parts.append("</section>")
    parts.append("</main></body></html>\n")
    return "\n".join(p for p in parts if p)


def write_document(doc: Document, folder, stem: str) -> list[str]:
    """Write ``doc`` into ``folder`` as ``<stem>.md`` (its figures under ``figures/``) and
    ``<stem>.html``, each file atomically; the one writer of the report and the checkpoints'
    comparison. Returns the figures' paths relative to ``folder``."""
    from headscope.probes.outputs.atomic import atomic_write
    from headscope.reports.markdown import render_markdown

    md, files = render_markdown(doc)
    for rel, data in files.items():
        with atomic_write(folder / rel, "wb") as f:
            f.write(data)
    with atomic_write(folder / f"{stem}.md") as f:
        f.write(md)
    with atomic_write(folder / f"{stem}.html") as f:
        f.write(render_html(doc))
    return sorted(files)
