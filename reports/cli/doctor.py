"""``headscope doctor``: what this installation has — versions, threads, bf16, models, Chromium,
caches and free disk. It only looks; it always exits 0.

>>> d = diagnose(check_bf16=False)
>>> sorted(d)[:4], d["exit"]
(['cache', 'chromium', 'env', 'exit'], 0)
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

PACKAGES = ("torch", "transformers", "transformer-lens", "tokenizers", "safetensors", "gguf", "pandas", "ray", "rich")
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def register(sub) -> None:
    p = sub.add_parser("doctor", help="check the installation: versions, threads, bf16, models, Chromium, caches")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _free_bytes(path: Path) -> int | None:
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def find_chromium() -> dict:
    """Chromium's path (``/usr/bin/chromium`` or a known name on PATH) and ``--version``."""
    path = "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None
    for name in CHROMIUM_NAMES:
        if path:
            break
        path = shutil.which(name)
    if not path:
        return {"found": False, "path": None, "version": None}
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20)
        version = (out.stdout.strip() or out.stderr.strip()).splitlines()[0] if (out.stdout or out.stderr) else None
    except (OSError, subprocess.TimeoutExpired) as e:
        version = f"could not run --version ({type(e).__name__})"
    return {"found": True, "path": path, "version": version}


def shipped_models() -> list[dict]:
    """For each shipped model: its package, whether installed, the weights' path and size,
    and for GGUF files whether the dequantised cache exists."""
    from headscope.probes.models.checkpoints import SHIPPED, cache_dir, file_sha256

    out = []
    for name, (pkg, inner, hint) in SHIPPED.items():
        row = {
            "name": name,
            "package": pkg,
            "installed": False,
            "path": None,
            "bytes": None,
            "gguf_cache": None,
            "hint": hint,
        }
        spec = importlib.util.find_spec(pkg)
        if spec is not None and spec.submodule_search_locations:
            row["installed"] = True
            path = Path(list(spec.submodule_search_locations)[0]) / inner
            row["path"] = str(path)
            if path.is_dir():
                files = [f for f in path.rglob("*") if f.is_file()]
                row["bytes"] = sum(f.stat().st_size for f in files)
            elif path.is_file():
                row["bytes"] = path.stat().st_size
                if path.suffix == ".gguf":
                    cached = cache_dir() / "gguf" / file_sha256(path)[:16]
                    row["gguf_cache"] = str(cached) if (cached / "model.safetensors").exists() else None
            else:
                row["path"] = f"{path} (missing)"
        out.append(row)
    return out


def diagnose(*, check_bf16: bool = True) -> dict:
    """Everything ``headscope doctor`` reports, as a dict (``exit`` is always 0)."""
    import torch

    from headscope.probes.models.checkpoints import cache_dir

    d: dict = {
        "python": {"version": platform.python_version(), "executable": sys.executable, "platform": platform.platform()},
        "torch": {
            "version": torch.__version__,
            "threads": torch.get_num_threads(),
            "interop_threads": torch.get_num_interop_threads(),
            "cpus": os.cpu_count(),
            "cuda": torch.cuda.is_available(),
            "mkldnn": torch.backends.mkldnn.is_available(),
        },
        "packages": {p: _version(p) for p in PACKAGES},
    }
    if check_bf16:
        from headscope.reports.tools.bench.harness import bf16_support

        ok, why = bf16_support("cpu")
        d["torch"]["bf16"] = {"native": ok, "note": why}
    d["models"] = shipped_models()
    d["chromium"] = find_chromium()
    d["env"] = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME", "HEADSCOPE_CACHE")}
    hc = cache_dir()
    try:
        from huggingface_hub.constants import HF_HUB_CACHE

        hf_cache = Path(HF_HUB_CACHE)
    except ImportError:
        hf_cache = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub"
    d["cache"] = {
        "headscope": str(hc),
        "headscope_exists": hc.exists(),
        "huggingface": str(hf_cache),
        "free_bytes": _free_bytes(hc),
    }
    d["exit"] = 0
    return d


def _gib(n) -> str:
    return "?" if n is None else f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def render(d: dict) -> str:
    """Plain-text report of :func:`diagnose`'s dict."""
    t = d["torch"]
    lines = [
        f"python           {d['python']['version']} ({d['python']['executable']})",
        f"torch            {t['version']}, {t['threads']} threads ({t['cpus']} CPUs), CUDA {'yes' if t['cuda'] else 'no'}, "
        f"oneDNN {'yes' if t['mkldnn'] else 'no'}",
    ]
    if "bf16" in t:
        lines.append(
            f"bf16             {'native' if t['bf16']['native'] else 'not native (emulated or missing)'}: {t['bf16']['note']}"
        )
    lines.append("packages         " + ", ".join(f"{k} {v or 'not installed'}" for k, v in d["packages"].items()))
    for m in d["models"]:
        if not m["installed"]:
            lines.append(f"model {m['name']:<11} package {m['package']} not installed: {m['hint']}")
            continue
        extra = ""
        if m["path"] and m["path"].endswith(".gguf"):
            extra = f"; float32 cache {m['gguf_cache'] or 'not built yet (first load takes ~40 s)'}"
        lines.append(f"model {m['name']:<11} {m['path']} ({_gib(m['bytes'])}){extra}")
    c = d["chromium"]
    lines.append(
        f"chromium         {c['path'] + ' — ' + (c['version'] or '?') if c['found'] else 'not found (HTML reports still work; PDF/screenshot checks need it)'}"
    )
    env = ", ".join(f"{k}={v}" for k, v in d["env"].items() if v is not None)
    lines.append(f"environment      {env or '(HF_HUB_OFFLINE etc. not set)'}")
    cache = d["cache"]
    lines.append(
        f"cache            {cache['headscope']} ({'exists' if cache['headscope_exists'] else 'not created yet'}); "
        f"HF cache {cache['huggingface']}; free disk {_gib(cache['free_bytes'])}"
    )
    return "\n".join(lines)


def run(args) -> int:
    d = diagnose()
    print(json.dumps(d, indent=2, default=str) if args.json else render(d))
    return 0
