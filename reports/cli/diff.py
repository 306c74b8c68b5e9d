"""``headscope diff RUN_A RUN_B``: how head roles and importance changed between two runs
of the same architecture (e.g. before/after fine-tuning, two seeds, two backends)."""

from __future__ import annotations


def register(sub) -> None:
    from headscope.probes.outputs.folder import out_argument
    from headscope.reports.cli.argtypes import MAX_LISTED, int_in, listed

    p = sub.add_parser("diff", help="changes in head roles and importance between two runs of the same architecture")
    p.add_argument("run_a", help="report, roles or prune output folder")
    p.add_argument("run_b", help="report, roles or prune output folder")
    p.add_argument(
        "--out", type=out_argument, default="runs/diff", metavar="DIR", help="output folder (default: runs/diff)"
    )
    p.add_argument(
        "--top",
        type=int_in(1, MAX_LISTED, "changes printed"),
        default=10,
        help="how many of the largest changes to print",
    )
    p.add_argument(
        "--top-heads", type=listed, default=3, metavar="K", help="heads per role compared as a set (default 3)"
    )
    p.add_argument("--json", action="store_true", help="print the changes as JSON on stdout")
    p.set_defaults(func=run)


def run(args) -> int:
    import json
    import sys

    from headscope.reports.diff import agreement_summary, diff_runs, largest_changes

    frames, paths = diff_runs(args.run_a, args.run_b, out_dir=args.out, top=args.top_heads)
    lines = largest_changes(frames, top=args.top)
    if args.json:
        notes = next((f.attrs["notes"] for f in frames.values() if f.attrs.get("notes")), [])
        json.dump(
            {
                "out_dir": str(paths["out_dir"]),
                "largest_changes": lines,
                "notes": notes,
                "top_heads": agreement_summary(frames["top_heads"], args.top_heads) if "top_heads" in frames else None,
                "verdict_changes": frames["role_changes"]["change"].value_counts().to_dict()
                if "role_changes" in frames
                else {},
            },
            sys.stdout,
            indent=2,
            default=str,
        )
        sys.stdout.write("\n")
    else:
        for line in lines:
            print(line)
        print(f"diff written to {paths['out_dir']}")
    return 0
