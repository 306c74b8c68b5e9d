"""``python -m headscope.reports.cli.device_map_check [--dry-run] [--out DIR]``: print the
``--device-map auto`` plan of a random Llama-shaped checkpoint, load it with ``device_map="auto"``
and compare (:mod:`headscope.reports.tools.device_map_check`); exit 1 when the loaded
``hf_device_map`` differs from the plan. Run by ``.ci/gpu-check``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv=None) -> int:
    from headscope.reports.tools.device_map_check import check

    p = argparse.ArgumentParser(prog="device_map_check", description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true", help="the plan over two simulated GPUs, no load (the CPU)")
    p.add_argument("--out", type=Path, default=None, help="folder for device_map_check.json")
    args = p.parse_args(argv)
    result = check(args.dry_run)
    for line in result["lines"]:
        print(line)
    if args.out is not None:
        (args.out / "device_map_check.json").write_text(json.dumps(result, indent=2), encoding="utf-8")
    if result["equal"] is False:
        print(
            f"device_map_check: hf_device_map {result['loaded']} differs from the plan {result['plan']['device_map']}",
            file=sys.stderr,
        )
        return 1
    print("device_map_check: " + ("planned (dry run, no load)" if args.dry_run else "hf_device_map equals the plan"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
