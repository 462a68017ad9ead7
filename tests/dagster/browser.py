"""Headless Chromium driven over the DevTools protocol (no browser download, no extra package: the
``websockets`` client that dagster-webserver already depends on).

``HeadlessChromium(out_dir)`` starts ``/usr/bin/chromium --headless`` with a fresh profile in its own
process group; ``page.goto(url)``, ``page.text()``, ``page.wait_for(predicate)`` and
``page.screenshot(path)``; ``close()`` stops the browser by its process group.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from mooncake_assets.engine.pg.embedded import reset_signals as _reset_signals

CHROMIUM_FLAGS = [
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
    "--mute-audio",
]


def find_chromium() -> str | None:
    for c in ("/usr/bin/chromium", shutil.which("chromium") or "", shutil.which("chromium-browser") or ""):
        if c and os.access(c, os.X_OK):
            return c
    return None


class HeadlessChromium:
    def __init__(self, log_path: Path, width: int = 1920, height: int = 1200, timeout: float = 30.0):
        exe = find_chromium()
        if exe is None:
            raise FileNotFoundError("chromium is not installed (make system-deps installs Debian's chromium)")
        self.profile = Path(tempfile.mkdtemp(prefix="mooncake-chromium-"))
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(
            [
                exe,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={self.profile}",
                "--remote-debugging-port=0",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_reset_signals,
        )
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.time() + timeout
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None or time.time() > deadline:
                self.close()
                raise RuntimeError(f"chromium did not start (see {log_path})")
            time.sleep(0.1)
        port = int(port_file.read_text().splitlines()[0])
        for _ in range(100):
            try:
                targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5))
                pages = [t for t in targets if t.get("type") == "page"]
                if pages:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        else:
            self.close()
            raise RuntimeError("chromium shows no page target")
        from websockets.sync.client import connect

        self._conn = connect(pages[0]["webSocketDebuggerUrl"], max_size=None, open_timeout=timeout)
        self.ws = self._conn.__enter__()
        self._ids = itertools.count(1)
        self.call("Page.enable")
        self.call("Runtime.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def call(self, method: str, timeout: float = 60.0, **params) -> dict:
        """One DevTools command; returns its result (RuntimeError on a protocol error)."""
        mid = next(self._ids)
        self.ws.send(json.dumps({"id": mid, "method": method, "params": params}))
        deadline = time.time() + timeout
        while True:
            msg = json.loads(self.ws.recv(timeout=max(deadline - time.time(), 0.1)))
            if msg.get("id") == mid:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def goto(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def evaluate(self, expression: str):
        res = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return res.get("result", {}).get("value")

    def text(self) -> str:
        return self.evaluate("document.body ? document.body.innerText : ''") or ""

    def wait_for(self, predicate, timeout: float = 60.0, interval: float = 0.5):
        """Poll ``predicate(page)`` until it returns something true; returns it (TimeoutError otherwise)."""
        deadline = time.time() + timeout
        while True:
            value = predicate(self)
            if value:
                return value
            if time.time() > deadline:
                raise TimeoutError(f"page did not get ready in {timeout:.0f}s; it shows: {self.text()[:500]!r}")
            time.sleep(interval)

    def click_button(self, label: str) -> bool:
        """Click the first button whose text is ``label`` (e.g. a modal's "Skip"); False when there is none."""
        js = (
            "(() => { const b = [...document.querySelectorAll('button')].find(b => b.innerText.trim() === "
            + json.dumps(label)
            + "); if (b) { b.click(); return true } return false })()"
        )
        return bool(self.evaluate(js))

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=False)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self._conn.__exit__(None, None, None)
        except Exception:
            pass
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(5)
        self._log.close()
        shutil.rmtree(self.profile, ignore_errors=True)
