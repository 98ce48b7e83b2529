"""A headless Chromium page driven over the Chrome DevTools Protocol (CDP).

No Playwright: Debian's `chromium` is started with `--remote-debugging-port=0`
and driven over its websocket with the `websockets` package. `Browser` collects
console errors, uncaught exceptions and failed loads in `errors`. Screenshots
go to `$TEMPER_ARTIFACTS/screenshots/` (default `test-artifacts/screenshots/`
in the repository; gitignored). Callers check that chromium and websockets
exist first (the dashboard's browser tests skip without them).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from websockets.sync import client as websockets_sync

ROOT = Path(__file__).resolve().parents[2]
SHOTS = Path(os.environ.get("TEMPER_ARTIFACTS", ROOT / "test-artifacts")) / "screenshots"


class Browser:
    """One headless Chromium page, driven over CDP (just the few commands the tests need)."""

    def __init__(self, executable: str, width: int = 1400, height: int = 1000) -> None:
        self.profile = tempfile.mkdtemp(prefix="temper-chromium-")
        self.log = open(Path(self.profile) / "stderr.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                executable,
                "--headless=new",
                "--no-sandbox",  # root in containers; the page is our own localhost server
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--disable-extensions",
                "--remote-debugging-port=0",
                f"--user-data-dir={self.profile}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=self.log,
        )
        port = self._devtools_port()
        pages = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list").read())
        ws_url = next(p["webSocketDebuggerUrl"] for p in pages if p["type"] == "page")
        self._stack = contextlib.ExitStack()
        self.ws = self._stack.enter_context(
            websockets_sync.connect(ws_url, max_size=None, open_timeout=20)
        )
        self._id = 0
        self.errors: list[str] = []
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable")
        self.send(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )

    def _devtools_port(self, timeout: float = 30.0) -> int:
        # With port 0 Chromium writes the port it chose to DevToolsActivePort.
        marker = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if marker.is_file() and marker.read_text().strip():
                return int(marker.read_text().split()[0])
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.close()
        raise RuntimeError(f"chromium did not start: {Path(self.profile, 'stderr.log')}")

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        """Call one CDP method; events that arrive meanwhile are checked for errors."""
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self._event(msg)

    def _event(self, msg: dict[str, Any]) -> None:
        method, params = msg.get("method"), msg.get("params", {})
        if method == "Runtime.exceptionThrown":
            d = params["exceptionDetails"]
            self.errors.append(
                f"exception: {d.get('exception', {}).get('description') or d.get('text')}"
            )
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            args = [a.get("value", a.get("description", "")) for a in params.get("args", [])]
            self.errors.append(f"console.{params['type']}: {' '.join(map(str, args))}")
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            entry = params["entry"]
            self.errors.append(
                f"log ({entry.get('source')}): {entry.get('text')} {entry.get('url', '')}"
            )

    def eval(self, expression: str) -> Any:
        """The value of a JS expression (promises awaited)."""
        result = self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r} threw {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 20.0) -> Any:
        deadline = time.monotonic() + timeout
        # A DOM node would come back as {} (falsy here): count it as found.
        probe = f"(v => v instanceof Node ? true : v)({expression})"
        while True:
            value = self.eval(probe)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {expression!r}; errors: {self.errors}")
            time.sleep(0.1)

    def goto(self, url: str) -> None:
        # Through about:blank: a URL differing only in its #tab would not reload the
        # page, and the old page's ready flag must not be mistaken for the new one's.
        self.send("Page.navigate", url="about:blank")
        self.wait_for("location.href === 'about:blank' && document.readyState === 'complete'")
        self.send("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete' && document.body.dataset.ready === '1'")

    def screenshot(self, name: str) -> Path:
        SHOTS.mkdir(parents=True, exist_ok=True)
        data = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path = SHOTS / f"{name}.png"
        path.write_bytes(base64.b64decode(data["data"]))
        return path

    def close(self) -> None:
        try:
            if hasattr(self, "_stack"):
                self._stack.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.log.close()
            shutil.rmtree(self.profile, ignore_errors=True)
