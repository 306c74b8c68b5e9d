"""The README's picture: a report's title and its layer × head map of roles, from headless Chromium.

``make readme-picture`` runs it on ``runs/report-minilm-l6/report.html`` (``make report``
writes it) into ``docs/_static/report.png``, which the README and the docs show. Needs
Debian's ``chromium`` (``apt-get install chromium``) or ``HEADSCOPE_CHROMIUM``.

    python docs/readme_picture.py REPORT_HTML OUT_PNG [--width 1200]
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
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


class _Page:
    """One headless Chromium page over the DevTools protocol (``websocket-client``)."""

    def __init__(self, exe: str, profile: str):
        import websocket

        self.proc = subprocess.Popen(
            [
                exe,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                "--no-first-run",
                "--disable-background-networking",
                f"--user-data-dir={profile}",
                "--remote-debugging-port=0",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port_file, deadline = Path(profile) / "DevToolsActivePort", time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"chromium did not start (exit code {self.proc.returncode})")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        pages: list = []
        while not pages:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
                pages = [t for t in json.load(r) if t["type"] == "page"]
        self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=60, suppress_origin=True)
        self._id = 0

    def send(self, method: str, **params) -> dict:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def close(self) -> None:
        self.ws.close()
        self.proc.terminate()
        self.proc.wait(10)


#: what the picture shows, top to bottom, each a span from one element to another: the report's
#: title and subtitle, then the first figure of the "Head roles" section (the layer × head map)
PARTS = (("main > h1", "main > p.subtitle"), ("#roles img", "#roles img"))
_BOX = "(() => {{ const r = document.querySelector({sel!r}).getBoundingClientRect(); return [r.x, r.y + window.scrollY, r.width, r.height]; }})()"


def screenshot(html: Path, out: Path, width: int = 1200, parts: tuple[tuple[str, str], ...] = PARTS) -> Path:
    """Render ``html`` at ``width`` CSS pixels, cut out each span of ``parts`` (from the top of one
    CSS selector's element to the bottom of another's, full width, 8 px of margin) and save
    them stacked as a palette PNG at ``out``."""
    if not html.is_file():
        raise FileNotFoundError(f"{html}: no such report (run make report first)")
    with tempfile.TemporaryDirectory(prefix="headscope-shot-") as tmp:
        page = _Page(chromium(), tmp)
        try:
            page.send("Page.enable")
            page.send("Emulation.setDeviceMetricsOverride", width=width, height=900, deviceScaleFactor=1, mobile=False)
            page.send("Page.navigate", url=html.resolve().as_uri())
            while (
                page.send("Runtime.evaluate", expression="document.readyState", returnByValue=True)["result"]["value"]
                != "complete"
            ):
                time.sleep(0.1)
            pieces = []
            for first, last in parts:
                boxes = []
                for sel in (first, last):
                    r = page.send("Runtime.evaluate", expression=_BOX.format(sel=sel), returnByValue=True)["result"]
                    if "value" not in r:
                        raise ValueError(f"{html}: no element {sel!r} in the report")
                    boxes.append(r["value"])
                top, bottom = boxes[0][1], boxes[1][1] + boxes[1][3]
                clip = {"x": 0, "y": max(0, top - 8), "width": width, "height": bottom - top + 16, "scale": 1}
                shot = page.send("Page.captureScreenshot", format="png", captureBeyondViewport=True, clip=clip)
                pieces.append(Image.open(io.BytesIO(base64.b64decode(shot["data"]))).convert("RGB"))
        finally:
            page.close()
    image = Image.new("RGB", (width, sum(p.height for p in pieces)), "white")
    y = 0
    for p in pieces:
        image.paste(p, (0, y))
        y += p.height
    out.parent.mkdir(parents=True, exist_ok=True)
    image.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(out, optimize=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("html", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--width", type=int, default=1200)
    args = parser.parse_args(argv)
    try:
        screenshot(args.html, args.out, args.width)
    except (FileNotFoundError, ValueError, RuntimeError) as e:
        print(f"readme-picture: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
