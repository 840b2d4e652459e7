"""`make handout`: one PDF per lesson in build/handouts, printed from its static deck by
headless Chromium.

One slide per page (reveal.js's print mode, `?print-pdf`): fragments are shown all at
once rather than one page each, a slide is never continued on a second page, and speaker
notes are printed at the bottom of their slide's page. Needs the decks (`make slides`)
and Chromium; works offline.

The headless-Chromium driver here (`Chromium`, a minimal DevTools Protocol client) is
also what tests/test_slides.py drives the decks and JupyterLab with.
"""
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
import tempfile
import time
import urllib.request
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location(
    "build_slides", TOOLS / "build_slides.py"
)
build_slides = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build_slides)

HANDOUT_DIR = build_slides.REPO_ROOT / "build" / "handouts"
SCREEN = {"width": 1280, "height": 720}  # a 16:9 projector
# reveal.js reads its settings from the query string too (Reveal.initialize merges
# getQueryHash()): all fragments on one page, a slide never continued on a second page,
# the speaker notes printed, and pages 20 % larger than the slide, so that the notes sit
# in the margin below a full slide.
PRINT_QUERY = ("?print-pdf&showNotes=true&pdfSeparateFragments=false"
               "&pdfMaxPagesPerSlide=1&margin=0.2")
# Offline and quiet: no first-run dialogs, no background requests, no GPU, a throw-away
# profile.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--hide-scrollbars",
                  "--window-size=1280,720"]


def find_chromium():
    """The Chromium (or Chrome) executable, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


class Chromium:
    """Headless Chromium with one page, driven over the DevTools Protocol: `with
    Chromium() as page:`."""

    def __init__(self, executable=None):
        self.executable = executable or find_chromium()
        if self.executable is None:
            raise RuntimeError("Chromium is not installed (Debian: apt-get "
                               "install chromium)")

    def __enter__(self):
        self.profile = tempfile.TemporaryDirectory(prefix="chromium-")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.process = subprocess.Popen(
            [self.executable, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile.name}",
             f"--remote-debugging-port={port}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            # its own process group: Debian's chromium is a wrapper script
            start_new_session=True)
        deadline = time.time() + 30
        while True:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/json/list", timeout=2
                ) as answer:
                    page = next(p for p in json.load(answer) if p.get("type") == "page")
                break
            except Exception:
                if time.time() > deadline or self.process.poll() is not None:
                    self.close()
                    raise RuntimeError(
                        "headless Chromium did not start within 30 s"
                    ) from None
                time.sleep(0.3)
        import websocket  # websocket-client, installed with jupyter_server

        self.socket = websocket.create_connection(
            page["webSocketDebuggerUrl"], timeout=60, suppress_origin=True
        )
        self.next_id, self.events = 0, []
        for domain in ("Runtime", "Log", "Page"):
            self.call(f"{domain}.enable")
        self.call("Emulation.setDeviceMetricsOverride", deviceScaleFactor=1,
                  mobile=False, **SCREEN)
        # focus as in a visible window
        self.call("Emulation.setFocusEmulationEnabled", enabled=True)
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        if getattr(self, "socket", None) is not None:
            self.socket.close()
            self.socket = None
        if self.process.poll() is None:
            # the browser and every child it started
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self.profile.cleanup()

    def call(self, method, **params):
        """Send one DevTools command and return its result; events that arrive meanwhile
        are kept."""
        self.next_id += 1
        self.socket.send(
            json.dumps({"id": self.next_id, "method": method, "params": params})
        )
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def evaluate(self, expression, await_promise=False):
        """The value of a JavaScript expression in the page; a thrown exception raises
        here."""
        answer = self.call("Runtime.evaluate", expression=expression,
                           returnByValue=True, awaitPromise=await_promise)
        if "exceptionDetails" in answer:
            raise RuntimeError(answer["exceptionDetails"] .get("exception", {})
                               .get("description", answer))
        return answer["result"].get("value")

    def wait_for(self, expression, timeout=30, what=None):
        """Poll a JavaScript expression until it is truthy; return its value."""
        deadline = time.time() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.time() > deadline:
                raise TimeoutError(f"waited {timeout} s for {what or expression}")
            time.sleep(0.2)

    def open(self, url, ready="document.readyState === 'complete'", timeout=30):
        """Load a URL and wait until `ready` holds."""
        self.call("Page.navigate", url=url)
        # let the navigation start, so `ready` is not read from the old page
        time.sleep(0.1)
        return self.wait_for(ready, timeout, what=f"{url} to load")

    def errors(self):
        """Page errors seen so far: uncaught exceptions, console.error calls, error log
        entries."""
        found = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                found.append(
                    details.get("exception", {}).get("description", details.get("text"))
                )
            elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
                found.append(
                    " ".join(str(arg.get("value", arg.get("description")))
                             for arg in params["args"])
                )
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                found.append(params["entry"].get("text", ""))
        return found


def pdf_page_count(data):
    """The number of pages of a PDF (bytes), read from its page tree; no PDF library
    needed."""
    counts = [
        int(n) for n in re.findall(rb"/Type\s*/Pages\b[^>]*?/Count\s+(\d+)", data)
    ]
    counts += [
        int(n) for n in re.findall(rb"/Count\s+(\d+)[^>]*?/Type\s*/Pages\b", data)
    ]
    if not counts:
        raise ValueError("no page tree found: not a PDF, or one with "
                         "compressed object streams")
    return max(counts)  # the root of the page tree counts every page


def print_deck(page, deck, pdf):
    """Print one static deck to `pdf`, one slide per page; return (slides, slides with
    notes) printed."""
    page.open(
        deck.as_uri() + PRINT_QUERY, ready="!!document.querySelector('.reveal.ready')"
    )
    # reveal.js lays the pages out after it is ready; wait until every slide sits in a
    # page
    slides = page.wait_for("(() => { const Reveal = "
                           "require('reveal.js/dist/reveal.js');"  # loaded by RequireJS
                           f"  const total = Reveal.getTotalSlides();"
                           "  return document.querySelectorAll('.pdf-page').length "
                           "=== total && total; })()",
                           what=f"{deck.name}'s print layout")
    notes = page.evaluate("document.querySelectorAll('.pdf-page "
                          ".speaker-notes-pdf').length")
    printed = page.call("Page.printToPDF", printBackground=True, preferCSSPageSize=True)
    pdf.write_bytes(base64.b64decode(printed["data"]))
    return slides, notes


def main():
    """Print every lesson's deck (what `make handout` runs, after `make slides`)."""
    HANDOUT_DIR.mkdir(parents=True, exist_ok=True)
    decks = [build_slides.SLIDES_DIR / f"{lesson.stem}.slides.html"
             for lesson in build_slides.LESSONS]
    missing = [deck.name for deck in decks if not deck.exists()]
    if missing:
        raise SystemExit(f"no deck for {', '.join(missing)}: run `make slides` first")
    with Chromium() as page:
        for deck in decks:
            pdf = HANDOUT_DIR / deck.name.replace(".slides.html", ".pdf")
            slides, notes = print_deck(page, deck, pdf)
            pages = pdf_page_count(pdf.read_bytes())
            print(f"wrote {pdf.relative_to(build_slides.REPO_ROOT)}: {pages} pages "
                  f"for {slides} slides, "
                  f"speaker notes on {notes}")
            if pages != slides or page.errors():
                raise SystemExit(f"{deck.name}: {pages} pages for {slides} slides; "
                                 f"page errors: {page.errors()}")


if __name__ == "__main__":
    sys.exit(main())
