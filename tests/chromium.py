"""Headless Chromium driven over the DevTools Protocol: the browser client of
tests/test_slides.py (every lesson's deck measured, the live RISE deck, the handouts)
and of `make handout` (tools/handout.py), introduced with lesson 01's deck."""
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

SCREEN = {"width": 1280, "height": 720}  # a 16:9 projector
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
