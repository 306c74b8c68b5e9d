"""The kinds of output folder headscope writes, and how a folder says which kind it holds.

Each command's folder (``report``, ``roles``, ``prune``, ``patch``, ``diff``, ``weights``, ``kv``, ``circuit``) is an
:class:`OutputKind` in :data:`KINDS`: the manifests that identify it and the names it
writes. A manifest starts with :func:`manifest_header`; :func:`output_kind_of` reads it back.

>>> manifest_header("roles")
{'output': {'kind': 'roles', 'format': 2}}
>>> sorted(KINDS)
['circuit', 'diff', 'kv', 'patch', 'prune', 'qk', 'report', 'roles', 'weights']
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass
from pathlib import Path

#: written into every manifest: ``{"output": {"kind": ..., "format": OUTPUT_FORMAT}}``
#: 2: role tables gained p_raw, test, interval, family, meets_threshold; roles folders coref_pairs
OUTPUT_FORMAT = 2


@dataclass(frozen=True)
class OutputKind:
    """What one kind of output folder holds.

    ``manifests``: files that identify the kind (the first one found is read);
    ``legacy_keys``: keys a manifest written before ``output`` was recorded must hold;
    ``entries``: glob patterns of the top-level names the kind writes; ``subfolders``:
    folder name -> glob patterns of the names inside it."""

    name: str
    manifests: tuple[str, ...]
    legacy_keys: tuple[frozenset, ...]
    entries: tuple[str, ...]
    subfolders: tuple[tuple[str, tuple[str, ...]], ...] = ()


_FRAME = ("*.csv", "*.parquet")
KINDS: dict[str, OutputKind] = {
    "report": OutputKind(
        "report",
        ("run.json",),
        (frozenset({"tables", "card", "model"}),),
        ("run.json", "report.html", "report.md", "tables", "figures"),
        (("tables", _FRAME), ("figures", ("*.png",))),
    ),
    "roles": OutputKind(
        "roles",
        ("run.json",),
        (frozenset({"roles", "config", "n_items", "model"}),),
        (
            "run.json",
            "skipped.json",
            "examples.json",
            *(
                f"{stem}.{ext}"
                for stem in ("roles", "head_stats", "clusters", "roles_by_head", "coref_pairs")
                for ext in ("csv", "parquet")
            ),
        ),
    ),
    "prune": OutputKind(
        "prune",
        ("state.json", "run.json"),
        (frozenset({"version", "config", "curves", "done"}), frozenset({"config", "model", "summary"})),
        (
            "state.json",
            "run.json",
            *(
                f"{stem}.{ext}"
                for stem in (
                    "baseline",
                    "ablation",
                    "all_but_one",
                    "importance",
                    "roles",
                    "curves",
                    "curve_summary",
                    "prunable",
                )
                for ext in ("csv", "parquet")
            ),
        ),
    ),
    "patch": OutputKind(
        "patch",
        ("run.json",),
        (),
        ("run.json", "patch.csv", "patch.parquet", "figures"),
        (("figures", ("*.png",)),),
    ),
    "qk": OutputKind(
        "qk", ("run.json",), (), ("run.json", "qk.csv", "qk.parquet", "figures"), (("figures", ("*.png",)),)
    ),
    "diff": OutputKind(
        "diff",
        ("diff.json",),
        (frozenset({"run_a", "run_b", "tables"}),),
        ("diff.json", "tables", "figures"),
        (("tables", _FRAME), ("figures", ("*.png",))),
    ),
    "weights": OutputKind(
        "weights",
        ("run.json",),
        (),
        (
            "run.json",
            "weights.md",
            *(f"{stem}.{ext}" for stem in ("heads", "composition") for ext in ("csv", "parquet")),
        ),
    ),
    "circuit": OutputKind(
        "circuit",
        ("run.json",),
        (),
        ("run.json", *(f"{stem}.{ext}" for stem in ("edges", "faithfulness") for ext in ("csv", "parquet"))),
    ),
    "kv": OutputKind(
        "kv",
        ("run.json",),
        (),
        (
            "run.json",
            "kv.md",
            *(
                f"{stem}.{ext}"
                for stem in ("kv_study", "kv_curve", "kv_roles", "long_context_roles", "long_context_causal")
                for ext in ("csv", "parquet")
            ),
        ),
    ),
}

# a temporary file left by a killed atomic write: ".<name>.<8 random chars>.tmp[<suffix>]"
_ATOMIC_TMP = re.compile(r"^\.(?P<name>.+)\.[A-Za-z0-9_]{8}\.tmp(\.[A-Za-z0-9]+)?$")


def is_atomic_leftover(name: str, kind: OutputKind, patterns: tuple[str, ...]) -> bool:
    m = _ATOMIC_TMP.match(name)
    return bool(m) and any(fnmatch.fnmatchcase(m.group("name"), p) for p in patterns)


def output_kind_of(out: Path) -> str | None:
    """The kind of headscope output ``out`` holds according to its manifest, or None."""
    for kind in KINDS.values():
        for manifest in kind.manifests:
            path = out / manifest
            if not path.is_file():
                continue
            try:
                meta = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if not isinstance(meta, dict):
                continue
            declared = meta.get("output")
            if isinstance(declared, dict) and declared.get("kind") in KINDS:
                return declared["kind"]
            if any(keys <= meta.keys() for keys in kind.legacy_keys):
                return kind.name
    return None


def few(names: list[str], k: int = 5) -> str:
    return ", ".join(names[:k]) + (f" and {len(names) - k} more" if len(names) > k else "")


def manifest_header(kind: str) -> dict:
    """The ``output`` entry of a manifest: ``{"output": {"kind": kind, "format": OUTPUT_FORMAT}}``."""
    return {"output": {"kind": kind, "format": OUTPUT_FORMAT}}
