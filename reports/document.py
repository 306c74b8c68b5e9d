"""The report as a document: sections of blocks, built once from frames and rendered twice.

A :class:`Document` holds :class:`Section` objects, each a list of blocks: :class:`Paragraph`,
:class:`Note`, :class:`Pre` (plain text), :class:`Figure` (PNG bytes with alt text and a
caption), :class:`Table` (a frame with a caption) and :class:`HeadView` (the interactive
layer × head view's data). Blocks hold plain text only; :mod:`headscope.reports.html` and
:mod:`headscope.reports.markdown` escape it. :mod:`headscope.reports.sections` builds the
document; the formatting helpers here are the ones both renderings and every section share.

>>> doc = Document(title="t", sections=[Section(id="s", title="S", blocks=[Paragraph("a"), Pre("b")])])
>>> doc.figures(), [s.id for s in doc.sections]
([], ['s'])
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd


@dataclass
class Paragraph:
    text: str


@dataclass
class Note:
    """A highlighted remark (the attention caveat, warnings)."""

    text: str


@dataclass
class Pre:
    text: str


@dataclass
class Figure:
    """A picture: ``png`` bytes, or ``svg`` markup drawn in Python (inline in the HTML, a
    ``figures/<name>.svg`` file beside the Markdown; ``png`` then empty)."""

    name: str  # file stem under figures/ (Markdown) — unique in a document
    png: bytes
    alt: str
    caption: str
    svg: str = ""


@dataclass
class Table:
    name: str
    frame: pd.DataFrame
    caption: str


@dataclass
class HeadView:
    """The clickable layer × head grid and the per-head panel (HTML only: data as one JSON
    blob, drawn by a small embedded script; Markdown renders ``text``). ``data`` is
    :func:`headscope.reports.head_view.head_view_data`'s dict."""

    data: dict
    text: str = (
        "The HTML report (report.html) has an interactive head view here: choose a head on a layer × head "
        "grid to see all its rows of the roles table, its attention on the example items and its pruning figures."
    )


#: what a section may hold, in the order the renderers check
Block = Paragraph | Note | Pre | Figure | Table | HeadView


@dataclass
class Section:
    id: str
    title: str
    blocks: list[Block] = field(default_factory=list)
    level: int = 2


@dataclass
class Document:
    title: str
    sections: list[Section]
    subtitle: str = ""

    def figures(self) -> list[Figure]:
        return [b for s in self.sections for b in s.blocks if isinstance(b, Figure)]

    def tables(self) -> list[Table]:
        return [b for s in self.sections for b in s.blocks if isinstance(b, Table)]


# ----------------------------------------------------------------- formatting helpers
def fmt(v: object) -> str:
    """Display a cell: floats to 3 decimals (p-values in scientific notation when small),
    NaN as an em dash, booleans as yes/no.

    >>> [fmt(v) for v in (0.12345, 2e-5, 0.0, float("nan"), True, 7, "x")]
    ['0.123', '2.0e-05', '0.000', '—', 'yes', '7', 'x']
    """
    if v is None or v is pd.NA or v is pd.NaT or (isinstance(v, float) and math.isnan(v)):
        return "—"
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (float, np.floating)):
        v = float(v)
        if v != 0 and abs(v) < 1e-3:
            return f"{v:.1e}"
        return f"{v:.3f}"
    return str(v)


def slug(text: object) -> str:
    """A lower-case id of letters, digits and ``-`` (``"x"`` when nothing is left).

    >>> slug("coreference:Pronoun (it)"), slug("***")
    ('coreference-pronoun-it', 'x')
    """
    return re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-") or "x"


def counted(k: int, one: str, many: str) -> str:
    """``k`` and the noun in the number it takes.

    >>> counted(1, "head", "heads"), counted(3, "head", "heads")
    ('1 head', '3 heads')
    """
    return f"{k} {one if k == 1 else many}"


def head_name(layer: int, head: int) -> str:
    """A head as the report names it (0-based).

    >>> head_name(3, 11)
    'L3H11'
    """
    return f"L{int(layer)}H{int(head)}"
