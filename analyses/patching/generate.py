"""Rebuild the shipped task files: ``python -m headscope.analyses.patching.generate``
writes ``data/tasks/agreement.jsonl`` from :func:`~headscope.analyses.patching.sentence_tasks.agreement_rows`
(deterministic: the same bytes every run)."""

from __future__ import annotations

import logging

from headscope.analyses.patching.sentence_tasks import write_agreement
from headscope.data import path


def main() -> None:
    target = path("tasks/agreement.jsonl")
    n = write_agreement(target)
    logging.getLogger(__name__).warning("wrote %d rows to %s", n, target)


if __name__ == "__main__":
    main()
