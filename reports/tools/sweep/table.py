"""The family table of a sweep (:mod:`~headscope.reports.tools.sweep.run`) in Markdown: the README's
family table is :func:`render` of the committed ``data/sweep/sweep.csv`` (``tests/test_sweep_readme.py``
fails while they differ; ``make sweep`` writes both).

The table groups the families that pass every check (:data:`~.run.CHECKS`; the rendered table
still calls them stages) by the backend ``--backend auto`` chose, then the families that pass only
some checks by what they pass, with how many of each group have checked per-head weights on the hf
backend (the committed ``data/figures/hf_weights_families.json``, ``make weights-families``; the
families without, and why, in a collapsed list); below it, in collapsed lists, each failing family with its first
failing check and reason, and the text families that could not be
built from a tiny config, with why.

>>> rows = [dict(family="llama", kind="decoder", built="ok", backend="inhouse", rejected="", card="ok",
...     capture="ok", roles="ok", prune="ok", report="ok", transformers="5.0")]
>>> print(summary(rows))
transformers 5.0: 1 model types of the registry swept, 1 text families built from a tiny config, 1 running every stage on the default backend (100%).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from headscope.reports.tools.sweep.run import CHECKS

#: the committed study of per-head weights per family (``make weights-families``), read into the table
WEIGHTS_STUDY = Path(__file__).resolve().parents[3] / "data" / "figures" / "hf_weights_families.json"


def weights_study(path: Path = WEIGHTS_STUDY) -> dict[str, dict]:
    """``{family: row}`` of the committed per-head weights study, ``{}`` where there is none."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))["families"]
    except (OSError, ValueError, KeyError):
        return {}


def study_version(path: Path = WEIGHTS_STUDY) -> str | None:
    """The transformers version the committed weights study ran on, None where there is none."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8")).get("transformers")
    except (OSError, ValueError, AttributeError):
        return None


__all__ = [
    "BEGIN",
    "END",
    "counts",
    "readme_block",
    "render",
    "study_version",
    "summary",
    "update_readme",
    "weights_count",
    "weights_line",
    "weights_study",
]

#: the markers around the generated table in README.md
BEGIN = "<!-- sweep-table: generated from data/sweep/sweep.csv by `make sweep`; do not edit by hand -->"
END = "<!-- /sweep-table -->"
BACKEND_NAMES = {"inhouse": "in-house", "hf": "hf", "bridge": "bridge", "": "none loaded"}


def _ok(row: dict) -> bool:
    return row["built"] == "ok" and all(row[s] == "ok" for s in CHECKS)


def counts(rows: list[dict]) -> tuple[int, int, int]:
    """``(N, M, K)``: model types swept, text families built from a tiny config, those passing every check."""
    built = [r for r in rows if r["built"] == "ok"]
    return len(rows), len(built), sum(_ok(r) for r in built)


def weights_count(rows: list[dict], weights: dict[str, dict]) -> tuple[int, int]:
    """``(P, M)``: text families built from a tiny config whose per-head weights pass the study's check
    (``weights``, :func:`weights_study`), and all built (the table's weights column summed)."""
    built = [r["family"] for r in rows if r["built"] == "ok"]
    return sum(weights.get(f, {}).get("status") == "pass" for f in built), len(built)


def summary(rows: list[dict]) -> str:
    n, m, k = counts(rows)
    versions: dict[str, int] = defaultdict(int)
    for r in rows:
        versions[r["transformers"]] += 1
    version = next(iter(versions), "?")
    if len(versions) > 1:  # a sweep rerun in parts on another transformers: which rows are whose
        version = " and ".join(f"{v} ({c} rows)" for v, c in sorted(versions.items(), key=lambda vc: -vc[1]))
    share = f"{100 * k / m:.0f}%" if m else "-"
    return (
        f"transformers {version}: {n} model types of the registry swept, {m} text families built from a tiny config, "
        f"{k} running every stage on the default backend ({share})."
    )


def weights_line(rows: list[dict], weights: dict[str, dict], version: str | None) -> str:
    """How many built families have checked per-head weights, from which study (``version``: its transformers)."""
    p, m = weights_count(rows, weights)
    theirs = {r["transformers"] for r in rows}
    study = f" (transformers {version})" if version and theirs != {version} else ""
    return (
        f"{p} of these {m} text families have per-head weights (hf backend) that pass the check against their "
        f"forward to 1e-5: data/figures/hf_weights_families.json{study}, `make weights-families`."
    )


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _names(families) -> str:
    return ", ".join(f"`{f}`" for f in sorted(families))


def _first_failure(row: dict) -> tuple[str, str]:
    check = next(s for s in CHECKS if row[s] != "ok")
    return check, row[check]


def _weights_cell(families: list[str], weights: dict[str, dict]) -> str:
    """How many of ``families`` have checked per-head weights (the study's ``pass``), of those it checked."""
    seen = [f for f in families if f in weights]
    if not seen:
        return "-"
    return f"{sum(weights[f]['status'] == 'pass' for f in seen)} of {len(seen)}"


def render(rows: list[dict], weights: dict[str, dict] | None = None) -> str:
    """The Markdown of ``rows`` (see the module): one summary line, the table, the collapsed lists;
    ``weights``: the per-head weights study per family (default: the committed one,
    :func:`weights_study`), its column and its list of the families without weights."""
    version = study_version() if weights is None else None
    weights = weights_study() if weights is None else weights
    built = [r for r in rows if r["built"] == "ok"]
    by_backend: dict[str, list[str]] = defaultdict(list)
    partial: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for r in built:
        if _ok(r):
            by_backend[r["backend"]].append(r["family"])
        else:
            passed = tuple(s for s in CHECKS if r[s] == "ok")
            partial[passed].append(f"{r['family']} ({BACKEND_NAMES.get(r['backend'], r['backend'])})")
    head = "| backend `auto` chose | stages that run | per-head weights (hf, checked) | families |"
    lines = [
        summary(rows),
        "",
        *([weights_line(rows, weights, version), ""] if weights else []),
        head,
        "|---|---|---|---|",
    ]
    for backend in ("inhouse", "hf", "bridge"):
        if by_backend.get(backend):
            name = BACKEND_NAMES[backend]
            cell = _weights_cell(by_backend[backend], weights)
            lines.append(f"| {name} | all: {', '.join(CHECKS)} | {cell} | {_names(by_backend[backend])} |")
    for passed in sorted(partial, key=lambda p: (-len(p), p)):
        checks = f"only {', '.join(passed)}" if passed else "none"
        backends = ", ".join(sorted({f.split(" ", 1)[1][1:-1] for f in partial[passed]}))
        names = ", ".join(f"`{f.split(' ')[0]}` {f.split(' ', 1)[1]}" for f in sorted(partial[passed]))
        cell = _weights_cell([f.split(" ")[0] for f in partial[passed]], weights)
        lines.append(f"| {backends} | {checks} | {cell} | {names} |")
    without = sorted(r["family"] for r in built if r["family"] in weights and weights[r["family"]]["status"] != "pass")
    if without:
        lines += [
            "",
            f"<details><summary>{len(without)} of these families without per-head weights, and why "
            "(data/figures/hf_weights_families.json, `make weights-families`)</summary>",
            "",
            "| family | weights | reason |",
            "|---|---|---|",
        ]
        lines += [f"| {f} | {weights[f]['status']} | {_cell(weights[f]['reason'])} |" for f in without]
        lines += ["", "</details>"]
    failing = [r for r in built if not _ok(r)]
    if failing:
        lines += ["", f"<details><summary>{len(failing)} families that fail a stage, and why</summary>", ""]
        lines += ["| family | backend | first failing stage | reason |", "|---|---|---|---|"]
        for r in sorted(failing, key=lambda r: r["family"]):
            check, why = _first_failure(r)
            backend = BACKEND_NAMES.get(r["backend"], r["backend"])
            lines.append(f"| `{r['family']}` | {backend} | {check} | {_cell(why)} |")
        lines += ["", "</details>"]
    unbuilt = [r for r in rows if r["kind"] and r["built"] != "ok"]
    if unbuilt:
        lines += ["", f"<details><summary>{len(unbuilt)} text families not built from a tiny config</summary>", ""]
        lines += ["| family | why |", "|---|---|"]
        lines += [f"| `{r['family']}` | {_cell(r['built'])} |" for r in sorted(unbuilt, key=lambda r: r["family"])]
        lines += ["", "</details>"]
    skipped = [r for r in rows if not r["kind"]]
    if skipped:
        why: dict[str, int] = defaultdict(int)
        for r in skipped:
            why[r["built"].removeprefix("skipped: ")] += 1
        lines += [
            "",
            f"{len(skipped)} model types are not text families: "
            + "; ".join(f"{n} {reason}" for reason, n in sorted(why.items(), key=lambda kv: (-kv[1], kv[0])))
            + ".",
        ]
    return "\n".join(lines + _other_versions(rows)) + "\n"


def _other_versions(rows: list[dict]) -> list[str]:
    """Where the rows ran on several transformers versions (a sweep rerun in parts), the families of each
    version but the most common one's, in collapsed lists: which rows are whose."""
    versions: dict[str, int] = defaultdict(int)
    for r in rows:
        versions[r["transformers"]] += 1
    if len(versions) < 2:
        return []
    main = max(versions, key=versions.get)
    out = []
    for v in sorted(versions):
        if v != main:
            families = [r["family"] for r in rows if r["transformers"] == v]
            out += ["", f"<details><summary>{len(families)} rows swept on transformers {v}, not rerun on {main}"]
            out += ["</summary>", "", _names(families), "", "</details>"]
    return out


def readme_block(text: str) -> str:
    """What stands between :data:`BEGIN` and :data:`END` in ``text``; ``ValueError`` where the markers are missing."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"README.md: the generated family table's markers ({BEGIN!r} ... {END!r}) are missing")
    return text[start + len(BEGIN) : end].strip("\n") + "\n"


def update_readme(readme: Path, rows: list[dict]) -> bool:
    """Write :func:`render` of ``rows`` between the markers of ``readme``; True where it changed."""
    text = Path(readme).read_text(encoding="utf-8")
    readme_block(text)  # the markers are there
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    new = text[:start] + "\n" + render(rows) + text[end:]
    if new != text:
        Path(readme).write_text(new, encoding="utf-8")
    return new != text
