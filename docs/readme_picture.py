"""The README's picture: the top of a report rendered in headless Chromium, cropped and saved.

``make readme-picture`` runs it on ``runs/report-minilm-l6/report.html`` (``make report``
writes it) into ``docs/_static/report.png``, which the README and the docs show. Needs
Debian's ``chromium`` (``apt-get install chromium``) or ``HEADSCOPE_CHROMIUM``.

    python docs/readme_picture.py REPORT_HTML OUT_PNG [--width 1200 --height 900]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def chromium() -> str:
    """The Chromium executable: ``HEADSCOPE_CHROMIUM`` or the first of :data:`NAMES` on PATH."""
    env = os.environ.get("HEADSCOPE_CHROMIUM")
    if env and Path(env).exists():
        return env
    for name in NAMES:
        if found := shutil.which(name):
            return found
    raise FileNotFoundError("no Chromium found: apt-get install chromium, or set HEADSCOPE_CHROMIUM")


def screenshot(html: Path, out: Path, width: int = 1200, height: int = 900) -> Path:
    """Render ``html`` at ``width`` × ``height`` CSS pixels and save it as a palette PNG at ``out``."""
    if not html.is_file():
        raise FileNotFoundError(f"{html}: no such report (run make report first)")
    with tempfile.TemporaryDirectory(prefix="headscope-shot-") as tmp:
        raw = Path(tmp) / "shot.png"
        cmd = [
            chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            "--disable-background-networking",
            f"--user-data-dir={tmp}/profile",
            f"--window-size={width},{height}",
            "--virtual-time-budget=5000",
            f"--screenshot={raw}",
            html.resolve().as_uri(),
        ]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)
        image = Image.open(raw).convert("RGB").crop((0, 0, width, height))
    out.parent.mkdir(parents=True, exist_ok=True)
    image.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(out, optimize=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("html", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--width", type=int, default=1200)
    parser.add_argument("--height", type=int, default=900)
    args = parser.parse_args(argv)
    try:
        screenshot(args.html, args.out, args.width, args.height)
    except (FileNotFoundError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        print(f"readme-picture: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
