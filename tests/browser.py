"""A real headless Chromium, driven over the DevTools protocol: load a page, record every
network request and console message, evaluate checks, take a screenshot."""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conftest import kill_group, spawn


def missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    import importlib.util

    if chromium() is None:
        return "needs chromium (Debian's chromium package)"
    if importlib.util.find_spec("websocket") is None:
        return "needs websocket-client (the test extra)"
    return None


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class PageLoad:
    requests: list[str] = field(default_factory=list)  # every URL the page asked for
    console: list[str] = field(default_factory=list)  # "level: text"
    errors: list[str] = field(default_factory=list)  # uncaught exceptions, error logs
    checks: dict[str, Any] = field(default_factory=dict)
    screenshot: bytes = b""


class _Session:
    def __init__(self, ws_url: str) -> None:
        import websocket

        self.ws = websocket.create_connection(ws_url, timeout=30, suppress_origin=True)
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def wait_for(self, method: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method for e in self.events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {method} within {timeout} s")
            self.events.append(json.loads(self.ws.recv()))


@contextlib.contextmanager
def _browser(profile: Path) -> Iterator[str]:
    """Start Chromium; yield the DevTools URL of its first page."""
    exe = chromium()
    assert exe is not None
    args = [
        exe,
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-extensions",
        "--remote-debugging-port=0",
        "--remote-allow-origins=*",
        f"--user-data-dir={profile}",
        "--window-size=1200,900",
        "about:blank",
    ]
    proc = spawn(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("chromium did not start its DevTools server")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            pages = [t for t in json.load(r) if t.get("type") == "page"]
        yield pages[0]["webSocketDebuggerUrl"]
    finally:
        kill_group(proc)


def load(path: Path, profile: Path, checks: dict[str, str]) -> PageLoad:
    """Open ``path`` (file://), wait for its load event and settle; evaluate each of
    ``checks`` (JavaScript expressions) in the page; screenshot it."""
    out = PageLoad()
    with _browser(profile) as ws_url:
        s = _Session(ws_url)
        for domain in ("Page", "Network", "Runtime", "Log"):
            s.call(f"{domain}.enable")
        s.call("Page.navigate", url=path.resolve().as_uri())
        s.wait_for("Page.loadEventFired")
        time.sleep(0.5)  # anything the page would fetch after load
        for name, expr in checks.items():
            result = s.call("Runtime.evaluate", expression=expr, returnByValue=True)
            out.checks[name] = result.get("result", {}).get("value")
        shot = s.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        out.screenshot = base64.b64decode(shot["data"])
        s.ws.close()
    for e in s.events:
        method, p = e.get("method"), e.get("params", {})
        if method == "Network.requestWillBeSent":
            out.requests.append(p["request"]["url"])
        elif method == "Runtime.consoleAPICalled":
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in p["args"])
            out.console.append(f"{p['type']}: {text}")
            if p["type"] in ("error", "assert"):
                out.errors.append(text)
        elif method == "Runtime.exceptionThrown":
            out.errors.append(str(p["exceptionDetails"].get("text")))
        elif method == "Log.entryAdded":
            out.console.append(f"{p['entry']['level']}: {p['entry']['text']}")
            if p["entry"]["level"] == "error":
                out.errors.append(p["entry"]["text"])
    return out
