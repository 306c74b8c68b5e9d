"""The report in a real headless Chromium (Debian's ``chromium``), over the DevTools
protocol (``websocket-client``): every image decodes, nothing is logged as an error,
no network request leaves the page, and a screenshot is saved (set
``HEADSCOPE_SCREENSHOT_DIR`` to keep it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def _chromium() -> str | None:
    env = os.environ.get("HEADSCOPE_CHROMIUM")
    if env and Path(env).exists():
        return env
    for name in CHROMIUM_NAMES:
        if p := shutil.which(name):
            return p
    return None


class Browser:
    """Headless Chromium with one page, driven over CDP."""

    def __init__(self, exe: str):
        import websocket  # websocket-client

        self.profile = tempfile.mkdtemp(prefix="headscope-chromium-")
        self.proc = subprocess.Popen(
            [
                exe,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-dev-shm-usage",
                "--hide-scrollbars",
                f"--user-data-dir={self.profile}",
                "--remote-debugging-port=0",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"chromium did not start (exit code {self.proc.returncode})")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        pages = []
        while not pages and time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
                pages = [t for t in json.load(r) if t["type"] == "page"]
            time.sleep(0.05)
        self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=60, suppress_origin=True)
        self.events: list[dict] = []
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
            self.events.append(msg)

    def wait_for(self, method: str, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        for i, e in enumerate(self.events):
            if e.get("method") == method:
                return self.events.pop(i)
        while time.monotonic() < deadline:
            msg = json.loads(self.ws.recv())
            if msg.get("method") == method:
                return msg
            self.events.append(msg)
        raise TimeoutError(method)

    def eval(self, expr: str):
        r = self.send("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        return r["result"].get("value")

    def close(self):
        try:
            self.ws.close()
        except Exception:  # noqa: BLE001 - best effort
            pass
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.profile, ignore_errors=True)


@pytest.fixture(scope="module")
def browser():
    exe = _chromium()
    if exe is None:
        pytest.skip("no Chromium found (apt-get install chromium, or set HEADSCOPE_CHROMIUM)")
    pytest.importorskip("websocket", reason="needs websocket-client (pip install websocket-client)")
    b = Browser(exe)
    yield b
    b.close()


def open_report(b: Browser, html: Path, shot: Path) -> dict:
    b.events.clear()
    for domain in ("Page", "Runtime", "Log", "Network"):
        b.send(f"{domain}.enable")
    b.send("Emulation.setDeviceMetricsOverride", width=1100, height=900, deviceScaleFactor=1, mobile=False)
    b.send("Page.navigate", url=html.resolve().as_uri())
    b.wait_for("Page.loadEventFired")
    imgs = b.eval("Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.naturalHeight, i.alt.length])")
    height = b.eval("document.documentElement.scrollHeight")
    shot_png = b.send(
        "Page.captureScreenshot",
        format="png",
        captureBeyondViewport=True,
        clip={"x": 0, "y": 0, "width": 1100, "height": min(height, 16000), "scale": 1},
    )
    import base64

    shot.write_bytes(base64.b64decode(shot_png["data"]))
    errors = [
        e
        for e in b.events
        if e.get("method") == "Runtime.exceptionThrown"
        or (e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "assert"))
        or (e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")
    ]
    requests = [e["params"]["request"]["url"] for e in b.events if e.get("method") == "Network.requestWillBeSent"]
    return {"imgs": imgs, "errors": errors, "requests": requests, "height": height}


def _shot_dir(tmp_path) -> Path:
    d = os.environ.get("HEADSCOPE_SCREENSHOT_DIR")
    if d:
        Path(d).mkdir(parents=True, exist_ok=True)
        return Path(d)
    return tmp_path


def _page_problems(seen: dict, n_images: int) -> list[str]:
    """What is wrong with a page :func:`open_report` saw (empty: nothing): console or script
    errors, a count of images other than ``n_images``, an image not loaded (or smaller than
    100 × 50, or with an alt text under 41 characters), a request that left the page (images are
    data URIs: the page itself is the only request)."""
    problems = [f"error: {e}" for e in seen["errors"]]
    if len(seen["imgs"]) != n_images:
        problems.append(f"{len(seen['imgs'])} images, expected {n_images}")
    for i, (complete, w, h, alt) in enumerate(seen["imgs"]):
        if not (complete and w > 100 and h > 50 and alt > 40):
            problems.append(f"image {i}: complete={complete} {w}x{h} alt {alt} chars")
    problems += [f"request {u}" for u in seen["requests"] if not u.startswith(("file:", "data:"))]
    if sum(u.startswith("file:") for u in seen["requests"]) != 1:
        problems.append(f"file requests: {[u for u in seen['requests'] if u.startswith('file:')]}")
    return problems


def test_synthetic_report_in_chromium(browser, tmp_path):
    from test_report import _meta, synthetic_frames

    from headscope.probes.models.card import model_card, render_card
    from headscope.reports import pipeline

    card = model_card("minilm-l6")
    paths = pipeline.write_report(
        synthetic_frames(), card=card, card_text=render_card(card), meta=_meta(), out_dir=tmp_path / "r"
    )
    seen = open_report(browser, paths["html"], _shot_dir(tmp_path) / "report-synthetic.png")
    assert _page_problems(seen, 8) == []
    assert seen["height"] > 3000


def test_broken_image_is_caught(browser, tmp_path):
    """The check can fail: a page with a corrupt data URI and a console error."""
    page = tmp_path / "bad.html"
    page.write_text(
        '<!DOCTYPE html><html><body><img alt="x" src="data:image/png;base64,AAAA">'
        '<script>console.error("boom")</script></body></html>'
    )
    seen = open_report(browser, page, tmp_path / "bad.png")
    assert seen["imgs"] == [[True, 0, 0, 1]]
    assert len(seen["errors"]) == 1


def test_real_report_in_chromium(browser, tmp_path, tmp_path_factory):
    from test_report import real_report_dir

    out = real_report_dir(tmp_path_factory)
    html = out / "report.html"
    n = html.read_text().count("<img ")
    seen = open_report(browser, html, _shot_dir(tmp_path) / "report-minilm-l6.png")
    assert _page_problems(seen, n) == []


def _click(b: Browser, selector: str):
    """A real mouse click (press and release) at the centre of ``selector``."""
    box = b.eval(
        f"(() => {{const e = document.querySelector({json.dumps(selector)}); e.scrollIntoView({{block: 'center'}});"
        " const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2];})()"
    )
    assert box, selector
    for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
        b.send("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1)


def _key(b: Browser, key: str, code: int):
    for kind in ("rawKeyDown", "keyUp"):
        b.send("Input.dispatchKeyEvent", type=kind, key=key, code=key, windowsVirtualKeyCode=code)


def _shown(b: Browser) -> dict:
    return b.eval(
        "(() => ({title: document.getElementById('hv-title').textContent,"
        " rows: Array.from(document.querySelectorAll('#hv-roles tbody tr')).map(r => r.cells[0].textContent),"
        " held: document.querySelectorAll('#hv-roles tbody tr.hv-held').length,"
        " maps: document.querySelectorAll('#hv-examples table.hv-map').length,"
        " gold: document.querySelectorAll('#hv-examples td.gold').length,"
        " prune: (document.getElementById('hv-prune') || {}).textContent,"
        " pressed: Array.from(document.querySelectorAll('button.hv-cell[aria-pressed=true]')).map(e => e.dataset.head),"
        " focused: document.activeElement && document.activeElement.dataset ? document.activeElement.dataset.head : null"
        "}))()"
    )


def _errors_and_requests(b: Browser):
    errors = [
        e
        for e in b.events
        if e.get("method") == "Runtime.exceptionThrown"
        or (e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "assert", "warning"))
        or (e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] in ("error", "warning"))
    ]
    requests = [e["params"]["request"]["url"] for e in b.events if e.get("method") == "Network.requestWillBeSent"]
    return errors, requests


def test_head_view_in_chromium(browser, tmp_path, tmp_path_factory):
    """The head view on the real report: three heads chosen by mouse and one by keyboard
    each show their own title, roles rows, example maps and pruning figures; nothing is
    logged as an error and nothing is fetched."""
    import pandas as pd
    from test_report import real_report_dir

    out = real_report_dir(tmp_path_factory)
    html = out / "report.html"
    roles = pd.read_parquet(out / "tables" / "roles.parquet")
    examples = pd.read_parquet(out / "tables" / "examples.parquet")
    seen = open_report(browser, html, _shot_dir(tmp_path) / "head-view-initial.png")
    assert _page_problems(seen, html.read_text().count("<img ")) == []
    b = browser
    n_layers, n_heads = int(roles["layer"].max()) + 1, int(roles["head"].max()) + 1
    assert b.eval("document.getElementById('head-view').hidden") is False
    labels = b.eval("Array.from(document.querySelectorAll('button.hv-cell')).map(e => e.getAttribute('aria-label'))")
    assert len(labels) == n_layers * n_heads
    held = roles[roles["verdict"].astype(bool)].groupby(["layer", "head"])["role"].agg(lambda r: sorted(set(r)))
    for (layer, head), names in held.items():
        assert f"L{layer}H{head}: {', '.join(names)}" in labels
    # three different heads: one with an example map, the head holding most roles, one holding none
    ex_head = tuple(examples[["layer", "head"]].iloc[0])
    multi = held.map(len).idxmax()
    none = next((l, h) for l in range(n_layers) for h in range(n_heads) if (l, h) not in held.index)
    chosen = list(dict.fromkeys([ex_head, multi, none, (0, 0), (n_layers - 1, n_heads - 1)]))[:3]
    assert len(chosen) == 3
    b.events.clear()
    for layer, head in chosen:
        hid = f"L{layer}H{head}"
        _click(b, f'button.hv-cell[data-head="{hid}"]')
        v = _shown(b)
        mine = roles[(roles["layer"] == layer) & (roles["head"] == head)]
        assert v["title"] == hid and v["pressed"] == [hid]
        assert len(v["rows"]) == len(mine) and sorted(v["rows"]) == sorted(mine["role"].astype(str))
        assert v["held"] == int(mine["verdict"].astype(bool).sum())
        n_ex = examples[(examples["layer"] == layer) & (examples["head"] == head)]["example"].nunique()
        assert v["maps"] == n_ex
        assert v["gold"] == int(
            examples[(examples["layer"] == layer) & (examples["head"] == head)]["gold"].astype(bool).sum()
        )
        assert "delta_" in v["prune"] and "importance" in v["prune"]
    # keyboard: arrows move the selection (and the focus) along the grid
    layer, head = chosen[-1]
    b.eval(f"document.querySelector('button.hv-cell[data-head=\"L{layer}H{head}\"]').focus()")
    right = (layer, head + 1) if head + 1 < n_heads else (layer, head)
    _key(b, "ArrowRight", 39)
    v = _shown(b)
    assert v["title"] == f"L{right[0]}H{right[1]}" and v["focused"] == v["title"]
    down = (min(right[0] + 1, n_layers - 1), right[1])
    _key(b, "ArrowDown", 40)
    assert _shown(b)["title"] == f"L{down[0]}H{down[1]}"
    errors, requests = _errors_and_requests(b)
    assert errors == [] and requests == []
    height = b.eval("document.documentElement.scrollHeight")
    shot = b.send(
        "Page.captureScreenshot",
        format="png",
        captureBeyondViewport=True,
        clip={"x": 0, "y": 0, "width": 1100, "height": min(height, 16000), "scale": 1},
    )
    import base64

    (_shot_dir(tmp_path) / "head-view-clicked.png").write_bytes(base64.b64decode(shot["data"]))


def test_report_without_javascript(browser, tmp_path, tmp_path_factory):
    """With scripts off the page still shows every static figure and table, and the
    (script-drawn) head view stays hidden instead of showing dead buttons."""
    from test_report import real_report_dir

    out = real_report_dir(tmp_path_factory)
    html = out / "report.html"
    browser.send("Emulation.setScriptExecutionDisabled", value=True)
    try:
        seen = open_report(browser, html, _shot_dir(tmp_path) / "report-no-js.png")
        assert _page_problems(seen, html.read_text().count("<img ")) == []
        assert browser.eval("document.getElementById('head-view').hidden") is True
        assert browser.eval("!!document.querySelector('#fig-role_map img').naturalWidth") is True
        assert browser.eval("document.getElementById('hv-title')") is None
        assert browser.eval("document.querySelectorAll('table').length") > 6
    finally:
        browser.send("Emulation.setScriptExecutionDisabled", value=False)
