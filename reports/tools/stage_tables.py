"""Write ``data/schemas/report_tables.json``: the columns and dtypes of every frame a registered
report stage may write (:func:`~headscope.reports.stages.registry.table_dtypes`).

:func:`~headscope.reports.runs.load_run` checks a report's tables against that file without
importing the stages (and torch with them). ``make schemas`` regenerates it; a test fails while
it differs from the registry, so a new stage's tables are checked from the day it lands.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

GENERATED_BY = "python -m headscope.reports.tools.stage_tables"


def tables_json() -> str:
    """The file's text: the registry's frames, dtypes as pandas names them."""
    from headscope.reports.stages.registry import table_dtypes

    return json.dumps({"generated_by": GENERATED_BY, "tables": table_dtypes()}, indent=1) + "\n"


def main(argv: list[str] | None = None) -> int:
    from headscope.data import path as data_path

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=data_path("schemas/report_tables.json"))
    args = ap.parse_args(argv)
    args.out.write_text(tables_json(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
