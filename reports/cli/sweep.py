"""``headscope sweep``: every command checked on a tiny random model of each text family of transformers' registry.

For each family (default: every model type of the installed transformers; ``--families a,b`` or
``--sample``, the fixed sample CI runs) a tiny random checkpoint is built from the family's config
class and card, capture (patterns against HF eager's), roles, quick prune and report run on it on
the default backend (:mod:`headscope.reports.tools.sweep.run`). ``--out DIR`` (default ``runs/sweep``)
gets ``sweep.csv`` (family, backend chosen, each check ``ok`` or why not, transformers' version)
and ``sweep.md``, the table the docs' supported-models table is rendered from (``--page
docs/guide/models.md`` writes it there too); ``--update`` replaces only the swept families' rows of an earlier ``sweep.csv`` (a sweep
run in parts). One line per family on stderr as it finishes (``--quiet``: none).
"""

from __future__ import annotations

import sys
from pathlib import Path


def register(sub) -> None:
    from headscope.probes.outputs.folder import out_argument

    p = sub.add_parser(
        "sweep", help="every command checked on a tiny model of each text family of transformers' registry"
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--families", metavar="LIST", default=None, help="comma-separated model types (default: the whole registry)"
    )
    which.add_argument(
        "--sample", action="store_true", help="the fixed sample CI runs (every in-house family and more)"
    )
    p.add_argument(
        "--out", type=out_argument, default="runs/sweep", metavar="DIR", help="folder for sweep.csv and sweep.md"
    )
    p.add_argument(
        "--update",
        action="store_true",
        help="keep the other families' rows of DIR/sweep.csv and replace only the swept ones (a sweep run in parts)",
    )
    p.add_argument(
        "--page",
        metavar="FILE",
        default=None,
        help="also write the table between the sweep-table markers of FILE (make sweep: docs/guide/models.md)",
    )
    p.add_argument(
        "--render",
        action="store_true",
        help="run nothing: render DIR/sweep.md (and --page) again from DIR/sweep.csv and the committed "
        "per-head weights study (after make weights-families)",
    )
    p.add_argument("--quiet", action="store_true", help="no line per family")
    p.set_defaults(func=run)


def families_of(args) -> list[str]:
    """The model types ``args`` names, checked against the registry before anything runs."""
    from headscope.reports.tools.sweep.run import sample
    from headscope.reports.tools.sweep.tiny_config import text_families

    known = text_families()
    if args.sample:
        return list(sample())
    if args.families is None:
        return list(known)
    names = list(dict.fromkeys(x.strip() for x in args.families.split(",") if x.strip()))
    if not names:
        raise ValueError(f"--families: give comma-separated model types (e.g. llama,bert); got {args.families!r}")
    unknown = [x for x in names if x not in known]
    if unknown:
        raise ValueError(
            f"--families: {unknown[0]!r} is not a model type of this transformers' registry "
            f"({len(known)} types; e.g. {', '.join(list(known)[:3])})"
        )
    return names


def _target(out: Path, name: str) -> Path:
    """``out/name``, refused (one line) where it is there and not a sweep's file."""
    from headscope.reports.tools.sweep.run import COLUMNS
    from headscope.reports.tools.sweep.table import summary

    path = out / name
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise ValueError(f"--out {out}: {name} is there and is not a plain file; give another folder")
    if path.exists():
        head = path.read_text(encoding="utf-8", errors="replace")
        ours = head.startswith(",".join(COLUMNS)) if name.endswith(".csv") else head.startswith(summary([])[:12])
        if not ours:
            raise ValueError(f"--out {out}: {name} is there and is not a headscope sweep's; give another folder")
    return path


def _render_only(out: Path, page: str | None) -> int:
    """``--render``: sweep.md and the page rendered again from the committed sweep.csv, nothing run."""
    from headscope.reports.tools.sweep.run import read_sweep
    from headscope.reports.tools.sweep.table import render, update_readme

    csv_path = out / "sweep.csv"
    if not csv_path.is_file():
        raise ValueError(f"--render: {csv_path} not found (expected the sweep.csv of an earlier sweep)")
    rows = read_sweep(csv_path)
    if page is not None:
        update_readme(Path(page), rows)
    (out / "sweep.md").write_text(render(rows), encoding="utf-8")
    print(f"rendered {out / 'sweep.md'}" + (f" and {page}" if page else "") + f" from {csv_path}")
    return 0


def run(args) -> int:
    from headscope.reports.cli.app import main
    from headscope.reports.tools.sweep.run import CHECKS, read_sweep, sweep, write_sweep
    from headscope.reports.tools.sweep.table import counts, readme_block, render, update_readme

    out = Path(args.out)
    if args.render:
        return _render_only(out, args.page)
    families = families_of(args)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: is a file; give a folder")
    csv_path, md_path = _target(out, "sweep.csv"), _target(out, "sweep.md")
    if not args.quiet:
        print(f"sweep: {len(families)} model types", file=sys.stderr)

    kept = (
        [r for r in read_sweep(csv_path) if r["family"] not in set(families)]
        if args.update and csv_path.exists()
        else []
    )

    done: list[dict] = []

    def progress(row, seconds):  # the CSV so far after each family: a sweep stopped midway keeps what it did
        done.append(row)
        write_sweep(sorted(kept + done, key=lambda r: r["family"]), csv_path)
        if args.quiet:
            return
        checks = " ".join(f"{s}={'ok' if row[s] == 'ok' else 'x'}" for s in CHECKS)
        what = checks if row["built"] == "ok" else row["built"][:100]
        print(f"{row['family']:<28} {row['backend'] or '-':<8} {what} ({seconds:.1f} s)", file=sys.stderr, flush=True)

    if args.page is not None:
        readme_block(Path(args.page).read_text(encoding="utf-8"))  # its markers, checked before the sweep runs
    rows = sorted(kept + sweep(families, cli=main, progress=progress), key=lambda r: r["family"])
    write_sweep(rows, csv_path)
    if args.page is not None:
        update_readme(Path(args.page), rows)
    tmp = md_path.with_name(md_path.name + ".tmp")
    tmp.write_text(render(rows), encoding="utf-8")
    tmp.replace(md_path)
    n, m, k = counts(rows)
    print(f"{k} of {m} text families built pass every check ({n} model types); wrote {csv_path} and {md_path}")
    return 0
