"""Instructor mode: slide metadata, the rendered decks, and the decks in a real browser."""
import base64
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter

import pytest

from helpers.paths import REPO_ROOT


# tools/ is a folder of scripts, not a package on the import path: load the script by its path.
_spec = importlib.util.spec_from_file_location("build_slides", REPO_ROOT / "tools" / "build_slides.py")
build_slides = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build_slides)
LESSONS, SLIDES_DIR = build_slides.LESSONS, build_slides.SLIDES_DIR
SLIDE_TYPES = {"slide", "subslide", "fragment", "skip", "notes", "-"}


def slide_type(cell):
    return cell.get("metadata", {}).get("slideshow", {}).get("slide_type")


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_every_cell_has_slide_metadata(lesson, read_notebook):
    types = [slide_type(cell) for cell in read_notebook(lesson)["cells"]]
    assert set(types) <= SLIDE_TYPES, f"unknown or missing slide types: {set(types) - SLIDE_TYPES}"
    assert types[0] == "slide", "the title cell opens the deck"
    counts = Counter(types)
    assert counts["fragment"] >= 1 and counts["notes"] >= 1 and counts["skip"] >= 1


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_set_up_code_is_skipped(lesson, read_notebook):
    first_code = next(cell for cell in read_notebook(lesson)["cells"] if cell["cell_type"] == "code")
    assert slide_type(first_code) == "skip"


def test_the_a_plus_b_bullets_are_fragments(read_notebook):
    lesson = next(p for p in LESSONS if p.stem.startswith("01_"))
    bullets = ["**Compute A + B = C", "**A and B are not needed", "**Should we keep A and B",
               "**Without checkpointing", "**With checkpointing", "**If recomputing B is expensive"]
    sources = {"".join(cell["source"]): slide_type(cell) for cell in read_notebook(lesson)["cells"]}
    for bullet in bullets:
        matching = [kind for source, kind in sources.items() if source.startswith(bullet)]
        assert matching == ["fragment"], bullet


@pytest.fixture(scope="module")
def decks():
    SLIDES_DIR.mkdir(parents=True, exist_ok=True)
    if shutil.which("npm") is None and not (SLIDES_DIR / "reveal.js").exists():
        pytest.skip("npm is needed once to fetch reveal.js for the offline decks")
    build_slides.install_assets()
    return dict(zip(LESSONS, build_slides.render(*LESSONS)))  # every deck rendered once, by one nbconvert


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_each_lesson_renders_with_the_expected_number_of_slides(decks, lesson, read_notebook):
    html = decks[lesson].read_text()
    counts = Counter(slide_type(cell) for cell in read_notebook(lesson)["cells"])
    # nbconvert nests a section per subslide inside a section per slide
    assert html.count("<section") == 2 * counts["slide"] + counts["subslide"]
    assert "data:image/png;base64" in html  # figures embedded: no kernel, no files needed
    assert not re.search(r"""(src|href)=["']https?://|from ["']https?://""", html)  # nothing fetched


def test_rise_extension_is_installed_and_enabled():
    listing = subprocess.run([sys.executable, "-m", "jupyter", "labextension", "list"],
                             capture_output=True, text=True)
    text = re.sub(r"\x1b\[[0-9;]*m", "", listing.stdout + listing.stderr)
    assert re.search(r"jupyterlab-rise v[\d.]+ enabled\s+OK", text), text


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
TITLE_CHECK = """(() => {
  const title = document.querySelector('.reveal .slides section.present h1');
  if (!title) return null;
  const box = title.getBoundingClientRect(), style = getComputedStyle(title);
  return {text: title.innerText, visible: box.width > 0 && box.height > 0 && box.top < innerHeight
          && box.bottom > 0 && style.visibility !== 'hidden' && style.display !== 'none'};
})()"""


class DevTools:
    """A minimal Chrome DevTools Protocol client over one page's websocket."""

    def __init__(self, url):
        import websocket

        self.socket = websocket.create_connection(url, timeout=20, suppress_origin=True)
        self.next_id, self.events = 0, []

    def call(self, method, **params):
        self.next_id += 1
        self.socket.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == self.next_id:
                return message.get("result", {})
            self.events.append(message)

    def errors(self):
        found = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                found.append(params["exceptionDetails"].get("exception", {}).get("description", "exception"))
            elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
                found.append(str(params.get("args")))
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                found.append(params["entry"].get("text", ""))
        return found


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install chromium); the deck test needs a browser")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path_factory.mktemp('chromium')}", f"--remote-debugging-port={port}",
         "--window-size=1280,800", "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)  # its own process group: Debian's chromium is a wrapper script
    deadline = time.time() + 30
    while True:
        try:
            pages = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=2))
            page = next(p for p in pages if p.get("type") == "page")
            break
        except Exception:
            if time.time() > deadline:
                os.killpg(process.pid, signal.SIGKILL)
                raise
            time.sleep(0.3)
    yield DevTools(page["webSocketDebuggerUrl"])
    os.killpg(process.pid, signal.SIGKILL)  # the browser and every child it started
    process.wait()


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_deck_opens_in_a_browser_with_a_visible_title_and_no_script_errors(decks, browser, lesson, read_notebook):
    browser.events.clear()
    for domain in ("Runtime", "Log", "Page"):
        browser.call(f"{domain}.enable")
    browser.call("Page.navigate", url=decks[lesson].as_uri())
    deadline, title = time.time() + 20, None
    while time.time() < deadline:
        ready = browser.call("Runtime.evaluate", expression="!!document.querySelector('.reveal.ready')",
                             returnByValue=True)["result"].get("value")
        if ready:
            title = browser.call("Runtime.evaluate", expression=TITLE_CHECK, returnByValue=True)["result"].get("value")
            break
        time.sleep(0.2)
    screenshot = browser.call("Page.captureScreenshot", format="png")["data"]
    (SLIDES_DIR / f"{lesson.stem}.title.png").write_bytes(base64.b64decode(screenshot))
    assert title is not None, "reveal.js did not start, or the first slide has no title"
    heading = "".join(read_notebook(lesson)["cells"][0]["source"]).splitlines()[0].lstrip("# ")
    assert title["visible"] and title["text"].lower() == heading.lower(), title  # the theme upper-cases it
    assert browser.errors() == []
