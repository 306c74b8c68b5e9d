"""The documentation site ``make docs`` built, opened in a real headless Chromium (the report's
browser test helper, :class:`test_browser.Browser`): the landing page, one API page and one
executed tutorial render with their images, no script error, no request off the machine, and
every internal link points at a file of the site (and its anchor at an element of that page).

The test builds nothing: it reads ``docs/_build/html`` (``HEADSCOPE_DOCS_HTML`` to point
elsewhere). Without a build it skips with the reason, except where ``HEADSCOPE_DOCS_BUILT=1``
says a build must be there (``.ci/run`` runs ``make docs`` first and sets it), where it fails.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
from test_browser import Browser, _chromium

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
SITE = Path(os.environ.get("HEADSCOPE_DOCS_HTML", ROOT / "docs" / "_build" / "html"))

#: page -> (images it must show at least, text it must hold)
PAGES = {
    "index.html": (1, "headscope tells you what each attention head"),
    "api/roles.html": (0, "head_roles"),
    "tutorials/01-roles-report.html": (1, "positional:previous"),
}


@pytest.fixture(scope="module")
def site() -> Path:
    if not (SITE / "index.html").is_file():
        why = f"no documentation build at {SITE} (run make docs first)"
        if os.environ.get("HEADSCOPE_DOCS_BUILT") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return SITE


@pytest.fixture(scope="module")
def browser():
    exe = _chromium()
    if exe is None:
        pytest.skip("no Chromium found (apt-get install chromium, or set HEADSCOPE_CHROMIUM)")
    pytest.importorskip("websocket", reason="needs websocket-client (pip install websocket-client)")
    b = Browser(exe)
    yield b
    b.close()


def open_page(b: Browser, html: Path) -> dict:
    """Load ``html``; what it shows: its images, links, text, script errors and requests."""
    b.events.clear()
    for domain in ("Page", "Runtime", "Log", "Network"):
        b.send(f"{domain}.enable")
    b.send("Emulation.setDeviceMetricsOverride", width=1200, height=900, deviceScaleFactor=1, mobile=False)
    b.send("Page.navigate", url=html.resolve().as_uri())
    b.wait_for("Page.loadEventFired")
    imgs = b.eval(
        "Promise.all(Array.from(document.images).map(i => i.decode().then(() => [i.src, i.naturalWidth],"
        " () => [i.src, 0])))"
    )
    links = b.eval("Array.from(document.querySelectorAll('a[href]')).map(a => a.href)")
    text = b.eval("document.body.innerText")
    errors = [
        e
        for e in b.events
        if e.get("method") == "Runtime.exceptionThrown"
        or (e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")
    ]
    requests = [e["params"]["request"]["url"] for e in b.events if e.get("method") == "Network.requestWillBeSent"]
    return {"imgs": imgs, "links": links, "text": text, "errors": errors, "requests": requests}


def _ids(page: Path) -> set[str]:
    return set(re.findall(r'\bid="([^"]+)"', page.read_text(encoding="utf-8")))


def page_problems(seen: dict, site: Path, min_images: int) -> list[str]:
    """What is wrong with a page :func:`open_page` saw (empty: nothing)."""
    problems = [f"error: {e['params']}" for e in seen["errors"]]
    if len(seen["imgs"]) < min_images:
        problems.append(f"{len(seen['imgs'])} images, expected at least {min_images}")
    problems += [f"image not shown: {src[:80]}" for src, width in seen["imgs"] if not width]
    problems += [f"request {u}" for u in seen["requests"] if not u.startswith(("file:", "data:"))]
    for href in seen["links"]:
        url = urlparse(href)
        if url.scheme != "file":
            continue  # links out of the site (the source, intersphinx) are not followed offline
        target = Path(unquote(url.path))
        if target.is_dir():
            target = target / "index.html"
        if not target.is_file() or site.resolve() not in target.resolve().parents:
            problems.append(f"broken link {href}")
        elif url.fragment and url.fragment not in _ids(target):
            problems.append(f"broken anchor {href}")
    return problems


@pytest.mark.parametrize("page", sorted(PAGES))
def test_page_renders_with_its_images_and_links(browser, site, page):
    min_images, text = PAGES[page]
    seen = open_page(browser, site / page)
    assert page_problems(seen, site, min_images) == []
    assert text in seen["text"]
    assert len(seen["links"]) > 20  # the navigation is there


def test_the_tutorial_shows_its_executed_outputs(browser, site):
    """A table a cell returned (pandas' HTML) and a figure it drew are in the built page."""
    seen = open_page(browser, site / "tutorials" / "01-roles-report.html")
    assert browser.eval("document.querySelectorAll('.cell_output table.dataframe').length") >= 3
    assert any(src.startswith(("data:image/png", "file:")) and w > 200 for src, w in seen["imgs"])


def test_a_broken_link_and_image_are_caught(browser, tmp_path):
    """The checks can fail: a missing page, a missing anchor and an image that does not load."""
    (tmp_path / "other.html").write_text('<p id="here">x</p>', encoding="utf-8")
    page = tmp_path / "index.html"
    page.write_text(
        '<a href="missing.html">a</a> <a href="other.html#nowhere">b</a> <a href="other.html#here">c</a>'
        ' <img src="nothing.png">',
        encoding="utf-8",
    )
    problems = page_problems(open_page(browser, page), tmp_path, 1)
    # the missing image is caught as not shown, or (when the page is read before the browser gives up on it,
    # as under load) as the browser's own failed load of a file
    assert any(p.startswith("image not shown") and "nothing.png" in p for p in problems) or any(
        p.startswith("error:") and "ERR_FILE_NOT_FOUND" in p for p in problems
    ), problems
    assert [p for p in problems if p.startswith("broken")] == [
        f"broken link {(tmp_path / 'missing.html').as_uri()}",
        f"broken anchor {(tmp_path / 'other.html').as_uri()}#nowhere",
    ]
