"""The interactive head view: a clickable layer × head grid and a panel for the chosen head.

:func:`head_view_data` gathers, for every head of the model, its rows of the roles table,
the roles it holds (and their colours), its example attention maps and its single-head
pruning figures into one JSON-ready dict; :func:`head_view_block` wraps it as the document's
:class:`~headscope.reports.document.HeadView` block. :func:`render_head_view` writes the
block as HTML: the grid as buttons (it reads without the script), the data as one JSON blob
that cannot close its ``<script>``, and :data:`HEAD_VIEW_JS`, the page's only script, which
draws the panel; :data:`HEAD_VIEW_CSS` styles it. Markdown renders the block's sentence.

>>> data = head_view_data({}, 1, 2)
>>> sorted(data["cells"]), data["cells"]["L0H1"]["held"]
(['L0H0', 'L0H1'], [])
>>> render_head_view(head_view_block({}, 1, 2)).count('class="hv-cell"')
2
"""

from __future__ import annotations

import html as _html
import json
import math

import numpy as np
import pandas as pd

from headscope.reports import figures as F
from headscope.reports.document import HeadView, head_name

#: a role row as the report shows it (the top-heads tables and the head view)
ROLE_VIEW_COLUMNS = [
    "role",
    "relation",
    "direction",
    "score",
    "baseline",
    "margin",
    "ci_low",
    "ci_high",
    "p_value",
    "n",
    "verdict",
]


def _sig(v: object, digits: int = 4) -> float | int | bool | None:
    """A float rounded to ``digits`` significant digits for the embedded JSON (NaN → null)."""
    if v is None or v is pd.NA:
        return None
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(v):
        return None
    return float(f"{v:.{digits}g}")


def head_view_data(frames: dict[str, pd.DataFrame], n_layers: int, n_heads: int, max_rows: int = 20_000) -> dict:
    """The head view's JSON: for every head ``"L{layer}H{head}"`` its roles rows
    (:data:`ROLE_VIEW_COLUMNS`, verdicts first, then by margin; where the roles frame has
    more than ``max_rows`` rows, each head keeps its first ``max_rows // heads`` and
    ``n_rows`` says how many it has, so a large model's page stays small), the roles it holds and the
    colour of each, its example attention maps (words or tokens, weights to 3 decimals, gold
    pairs) and its single-head pruning figures (``prune_ablation`` deltas, ``prune_importance``).
    Keys: ``layers``, ``heads``, ``columns``, ``colours`` (role → ``#rrggbb``), ``cells``."""
    from matplotlib.colors import to_hex

    roles = frames.get("roles")
    roles = roles if roles is not None else pd.DataFrame(columns=ROLE_VIEW_COLUMNS + ["layer", "head"])
    held = F.held_roles(roles)
    names = sorted({r for v in held.values() for r, _ in v})
    heads = _empty_cells(held, names, n_layers, n_heads)
    _add_role_rows(heads, roles, max_rows, n_layers * n_heads)
    _add_examples(heads, frames.get("examples"))
    _add_pruning(heads, frames)
    return {
        "layers": n_layers,
        "heads": n_heads,
        "columns": ROLE_VIEW_COLUMNS,
        "colours": {n: to_hex(c) for n, c in F.role_colours(names).items()},
        "cells": heads,
    }


def _empty_cells(held: dict, names: list[str], n_layers: int, n_heads: int) -> dict[str, dict]:
    """One cell per head: the roles it holds, each with its strength (margin over the role's
    best head's) as the opacity of its stripe; rows, examples and pruning still empty."""
    top = {name: max((m for v in held.values() for r, m in v if r == name), default=1.0) for name in names}
    heads: dict[str, dict] = {}
    for layer in range(n_layers):
        for head in range(n_heads):
            cell = held.get((layer, head), [])
            heads[head_name(layer, head)] = {
                "layer": layer,
                "head": head,
                "held": [r for r, _ in cell],
                "alpha": [
                    _sig(0.35 + 0.65 * float(np.clip(m / top[r], 0, 1)) if top[r] > 0 else 1.0, 2) for r, m in cell
                ],
                "rows": [],
                "n_rows": 0,
                "examples": [],
                "prune": [],
            }
    return heads


def _add_role_rows(heads: dict[str, dict], roles: pd.DataFrame, max_rows: int, n_total: int) -> None:
    """Each head's roles rows (verdicts first, then by margin), capped when the frame is large."""
    if roles.empty:
        return
    d = roles.assign(_v=roles["verdict"].astype(bool)).sort_values(
        ["layer", "head", "_v", "margin"], ascending=[True, True, False, False], kind="stable"
    )
    cap = max(1, max_rows // max(1, n_total)) if len(d) > max_rows else len(d)
    for r in d.itertuples(index=False):
        h = heads.get(head_name(r.layer, r.head))
        if h is None:
            continue
        h["n_rows"] += 1
        if len(h["rows"]) >= cap:
            continue
        row = []
        for c in ROLE_VIEW_COLUMNS:
            v = getattr(r, c)
            if c in ("role", "relation", "direction"):
                row.append("" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v))
            else:
                row.append(bool(v) if c == "verdict" else _sig(v))
        h["rows"].append(row)


def _add_examples(heads: dict[str, dict], ex: pd.DataFrame | None) -> None:
    """Each example (EXAMPLE_COLUMNS rows) as a query × key weight matrix on its head."""
    if ex is None or ex.empty:
        return
    for key, e in ex.groupby("example", sort=False):
        h = heads.get(head_name(e["layer"].iloc[0], e["head"].iloc[0]))
        if h is None:
            continue
        q = e.drop_duplicates("query_index").sort_values("query_index")
        k = e.drop_duplicates("key_index").sort_values("key_index")
        mat = e.pivot_table(index="query_index", columns="key_index", values="weight", aggfunc="sum")
        mat = mat.reindex(index=q["query_index"], columns=k["key_index"]).fillna(0.0).to_numpy()
        qi = {int(v): i for i, v in enumerate(q["query_index"])}
        ki = {int(v): i for i, v in enumerate(k["key_index"])}
        gold = e[e["gold"].astype(bool)]
        r0 = e.iloc[0]
        h["examples"].append(
            {
                "name": str(key),
                "role": str(r0["role"]),
                "relation": str(r0["relation"]) if not pd.isna(r0["relation"]) else "",
                "level": str(r0["level"]),
                "sentence": str(r0["sentence"]),
                "queries": [str(w) for w in q["query_word"]],
                "keys": [str(w) for w in k["key_word"]],
                "w": [[round(float(x), 3) for x in row] for row in mat],
                "gold": [[qi[int(a)], ki[int(b)]] for a, b in zip(gold["query_index"], gold["key_index"])],
            }
        )


def _add_pruning(heads: dict[str, dict], frames: dict[str, pd.DataFrame]) -> None:
    """Each head's single-head figures: ``[label, value, rank by size, of how many heads]``."""
    measures = []
    ab = frames.get("prune_ablation")
    if ab is not None and not ab.empty:
        d = ab[ab["metric"].astype(str).str.startswith("delta_") & ab["layer"].notna()]
        for (study, metric), g in d.groupby(["study", "metric"], sort=True, observed=True):
            measures.append((f"single-head ablation ({study}): {metric}", g))
    imp = frames.get("prune_importance")
    if imp is not None and not imp.empty:
        d = imp[imp["layer"].notna()]
        for (study, metric), g in d.groupby(["study", "metric"], sort=True, observed=True):
            measures.append((f"{study}: {metric}", g))
    for label, g in measures:
        g = g.groupby(["layer", "head"], observed=True)["value"].mean().reset_index()
        rank = g["value"].abs().rank(ascending=False, method="min")
        for r, rk in zip(g.itertuples(index=False), rank):
            h = heads.get(head_name(r.layer, r.head))
            if h is not None:
                h["prune"].append([label, _sig(r.value), int(rk), len(g)])


def head_view_block(frames: dict[str, pd.DataFrame], n_layers: int, n_heads: int) -> HeadView:
    """The document block of the head view (:func:`head_view_data` of ``frames``)."""
    return HeadView(head_view_data(frames, n_layers, n_heads))


# ----------------------------------------------------------------- HTML: styles, script, markup
HEAD_VIEW_CSS = """
.hv{margin:1em 0}.hv-top{display:flex;flex-wrap:wrap;gap:1.5em;align-items:flex-start}
.hv-grid caption{max-width:24em}
.hv-grid td,.hv-grid th{padding:1px;border:0;text-align:center;font-size:11px;background:none}
.hv-cell{width:22px;height:22px;border:1px solid #fff;border-radius:2px;padding:0;cursor:pointer;display:block}
.hv-cell:hover{border-color:#555}.hv-cell:focus-visible{outline:2px solid #000;outline-offset:1px}
.hv-cell[aria-pressed=true]{border:2px solid #000}
.hv-legend{font:12px/1.6 'DejaVu Sans',Arial,sans-serif;max-width:260px}
.hv-legend span{display:inline-block;width:.9em;height:.9em;margin-right:.3em;vertical-align:middle}
.hv-panel{margin-top:1em;border-top:1px solid #ddd}
.hv-rows{max-height:22em;overflow:auto;border:1px solid #e2e2e2}.hv-rows table{margin:0}
.hv-rows th,.hv-rows td{white-space:nowrap;padding:.15em .45em}
#hv-examples{display:flex;flex-wrap:wrap;gap:1em}.hv-fig{margin:.8em 0;text-align:left;max-width:100%;overflow-x:auto}
.hv-fig figcaption{max-width:34em;margin:0 0 .3em}
tr.hv-held td{font-weight:bold}
.hv-map td{width:15px;height:15px;padding:0;border:1px solid #f4f4f4}
.hv-map td.gold{outline:2px solid #c44e52;outline-offset:-2px}
.hv-map th{font-weight:normal;background:none;padding:0 .3em;border:0;white-space:nowrap}
.hv-map thead th{writing-mode:vertical-rl;transform:rotate(180deg);text-align:left;padding:.3em 0}
"""

HEAD_VIEW_JS = r"""
(function(){
"use strict";
var root=document.getElementById("head-view"),src=document.getElementById("head-view-data");
if(!root||!src)return;
var D=JSON.parse(src.textContent),C=D.columns;
var cells=Array.prototype.slice.call(root.querySelectorAll("button.hv-cell"));
var byId={};cells.forEach(function(b){byId[b.getAttribute("data-head")]=b;});
var panel=document.getElementById("hv-panel"),status=document.getElementById("hv-status");
function el(tag,attrs,text){var e=document.createElement(tag);if(attrs)for(var k in attrs)e.setAttribute(k,attrs[k]);if(text!==undefined&&text!==null)e.textContent=text;return e;}
function num(v,isInt){if(v===null||v===undefined)return"\u2014";if(typeof v==="boolean")return v?"yes":"no";if(typeof v!=="number")return String(v);if(isInt)return String(Math.round(v));if(v!==0&&Math.abs(v)<1e-3)return v.toExponential(1);return v.toFixed(3);}
function col(name){return C.indexOf(name);}
function rolesTable(h){
  var rows=h.rows,wrap=el("div",{"class":"hv-rows",tabindex:"0",role:"region","aria-label":"roles of "+h.id});
  var t=el("table",{id:"hv-roles"});
  t.appendChild(el("caption",null,(h.n_rows>rows.length?"The first "+rows.length+" of the "+h.n_rows+" role rows of "+h.id+" (all in tables/roles.csv)":"Every role row of "+h.id)+" (verdicts first, then by margin): score, baseline, margin, CI of the score, adjusted p"));
  var rel=rows.some(function(r){return r[col("relation")];});
  var heads=["role"].concat(rel?["relation","direction"]:[],["score","baseline","margin","CI","p (adj.)","n","verdict"]);
  var tr=el("tr");heads.forEach(function(x){tr.appendChild(el("th",{scope:"col"},x));});
  var th=el("thead");th.appendChild(tr);t.appendChild(th);
  var tb=el("tbody");
  rows.forEach(function(r){
    var v=r[col("verdict")],tr=el("tr",v?{"class":"hv-held"}:null);
    var vals=[r[col("role")]].concat(rel?[r[col("relation")],r[col("direction")]]:[]);
    vals.forEach(function(x){tr.appendChild(el("td",null,x));});
    [num(r[col("score")]),num(r[col("baseline")]),num(r[col("margin")]),num(r[col("ci_low")])+"\u2013"+num(r[col("ci_high")]),num(r[col("p_value")]),num(r[col("n")],true)].forEach(function(x){tr.appendChild(el("td",{"class":"num"},x));});
    tr.appendChild(el("td",null,v?"yes":"no"));
    tb.appendChild(tr);
  });
  t.appendChild(tb);wrap.appendChild(t);return wrap;
}
function heat(ex){
  var top=0;ex.w.forEach(function(r){r.forEach(function(w){if(w>top)top=w;});});top=top>0?top:1;
  var f=el("figure",{"class":"hv-fig"}),t=el("table",{"class":"hv-map","aria-label":"attention of "+ex.name});
  f.appendChild(el("figcaption",null,ex.name+" ("+ex.level+" level): \u201c"+ex.sentence+"\u201d. Rows: query "+ex.level+"s; columns: the "+ex.level+"s they attend to; darker = more attention (full colour: this map's largest weight, "+top.toFixed(3)+")"+(ex.gold.length?"; red outline: the links the role expects.":".")));
  var gold={};ex.gold.forEach(function(g){gold[g[0]+","+g[1]]=1;});
  var th=el("thead"),tr=el("tr");tr.appendChild(el("td"));
  ex.keys.forEach(function(k){tr.appendChild(el("th",{scope:"col"},k));});th.appendChild(tr);t.appendChild(th);
  var tb=el("tbody");
  ex.w.forEach(function(row,i){
    var tr=el("tr");tr.appendChild(el("th",{scope:"row"},ex.queries[i]));
    row.forEach(function(w,j){
      var g=gold[i+","+j],lab=ex.queries[i]+" \u2192 "+ex.keys[j]+": "+w.toFixed(3)+(g?" (expected)":"");
      var td=el("td",{title:lab,"aria-label":lab,style:"background:rgba(8,69,148,"+Math.min(1,Math.max(0,w/top)).toFixed(3)+")"});
      if(g)td.className="gold";tr.appendChild(td);
    });
    tb.appendChild(tr);
  });
  t.appendChild(tb);f.appendChild(t);return f;
}
function show(id,focus){
  var h=D.cells[id];if(!h)return;h.id=id;
  cells.forEach(function(b){var on=b.getAttribute("data-head")===id;b.setAttribute("aria-pressed",on?"true":"false");b.tabIndex=on?0:-1;});
  if(focus)byId[id].focus();
  panel.textContent="";
  panel.appendChild(el("h3",{id:"hv-title"},id));
  panel.appendChild(el("p",{id:"hv-held"},"Layer "+h.layer+", head "+h.head+": "+(h.held.length?"holds "+h.held.join(", ")+".":"holds no role at the configured thresholds.")));
  if(h.prune.length){
    panel.appendChild(el("p",{id:"hv-prune"},"Pruning: "+h.prune.map(function(p){return p[0]+" = "+num(p[1])+" (rank "+p[2]+" of "+p[3]+" heads by size)";}).join("; ")+"."));
  }else{panel.appendChild(el("p",{id:"hv-prune"},"No single-head pruning figures for this head in this run."));}
  panel.appendChild(rolesTable(h));
  var exs=el("div",{id:"hv-examples"});
  if(h.examples.length){h.examples.forEach(function(ex){exs.appendChild(heat(ex));});}
  else exs.appendChild(el("p",null,"No example attention map for this head (the report draws one for each role's top head)."));
  panel.appendChild(exs);
  status.textContent="Showing "+id+": "+(h.held.length?h.held.join(", "):"no role");
}
root.addEventListener("click",function(e){var b=e.target.closest("button.hv-cell");if(b)show(b.getAttribute("data-head"),false);});
root.addEventListener("keydown",function(e){
  var b=e.target.closest&&e.target.closest("button.hv-cell");if(!b)return;
  var h=D.cells[b.getAttribute("data-head")],l=h.layer,k=h.head;
  if(e.key==="ArrowRight")k++;else if(e.key==="ArrowLeft")k--;else if(e.key==="ArrowDown")l++;else if(e.key==="ArrowUp")l--;
  else if(e.key==="Home")k=0;else if(e.key==="End")k=D.heads-1;else return;
  e.preventDefault();
  l=Math.max(0,Math.min(D.layers-1,l));k=Math.max(0,Math.min(D.heads-1,k));
  show("L"+l+"H"+k,true);
});
root.hidden=false;
var first=cells.filter(function(b){var h=D.cells[b.getAttribute("data-head")];return h.held.length&&h.examples.length;})[0]||cells.filter(function(b){return D.cells[b.getAttribute("data-head")].held.length;})[0]||cells[0];
if(first)show(first.getAttribute("data-head"),false);
})();
"""


def _cell_label(hid: str, cell: dict) -> str:
    return f"{hid}: {', '.join(cell['held']) if cell['held'] else 'no role'}"


def _cell_style(cell: dict, colours: dict) -> str:
    if not cell["held"]:
        return "background:#eeeeee"
    k = len(cell["held"])
    stops = ",".join(
        f"{colours[r]}{round(a * 255):02x} {100 * i / k:.4g}% {100 * (i + 1) / k:.4g}%"
        for i, (r, a) in enumerate(zip(cell["held"], cell["alpha"]))
    )
    return f"background:linear-gradient(to right,{stops}),#fff"


def _json_script(data: dict) -> str:
    """JSON safe inside ``<script>``: no ``</script>`` or ``<!--`` can appear."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_head_view(b: HeadView) -> str:
    """The head view as HTML: the grid (one button per head, stripes of the roles it holds),
    the legend, an empty panel, a ``<noscript>`` note, the data blob and the script."""
    d = b.data
    colours = d["colours"]
    head_row = "".join(f'<th scope="col">{h}</th>' for h in range(d["heads"]))
    body = []
    for layer in range(d["layers"]):
        tds = []
        for head in range(d["heads"]):
            hid = head_name(layer, head)
            cell = d["cells"][hid]
            label = _html.escape(_cell_label(hid, cell), quote=True)
            tds.append(
                f'<td><button type="button" class="hv-cell" data-head="{hid}" aria-label="{label}" title="{label}" '
                f'aria-pressed="false" tabindex="-1" style="{_cell_style(cell, colours)}"></button></td>'
            )
        body.append(f'<tr><th scope="row">{layer}</th>{"".join(tds)}</tr>')
    legend = "".join(f'<span style="background:{c}"></span>{_html.escape(n)}<br>' for n, c in colours.items())
    return (
        '<div class="hv" id="head-view" hidden>'
        '<div class="hv-top"><table class="hv-grid"><caption>Choose a head: click a cell, or Tab to the grid and move with the arrow '
        "keys (rows: layers, columns: heads; stripes: the roles a head holds)</caption>"
        f'<thead><tr><th scope="col">layer</th>{head_row}</tr></thead><tbody>{"".join(body)}</tbody></table>'
        f'<div class="hv-legend"><div aria-hidden="true">{legend or "no head holds a role"}</div>'
        '<p id="hv-status" aria-live="polite"></p></div></div>'
        '<div id="hv-panel" class="hv-panel"></div></div>'
        '<noscript><p class="note">The interactive head view needs JavaScript; the role map figure above and the '
        "tables below hold the same findings.</p></noscript>"
        f'<script type="application/json" id="head-view-data">{_json_script(d)}</script>'
        f"<script>{HEAD_VIEW_JS}</script>"
    )
