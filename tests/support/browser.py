"""A real headless browser for tests: Debian's ``chromium``, driven over the DevTools protocol.

``make test`` installs chromium when it is missing (see the Makefile's ``browser`` step); without
it the tests that need a browser are skipped with the reason. The browser listens for DevTools on
127.0.0.1 only, on a port it picks itself (written to ``DevToolsActivePort`` in its profile), and
is stopped when the ``with`` block ends (SIGTERM, then SIGKILL). Every wait is bounded.

The protocol client is aiohttp's websocket client running in its own thread and event loop, so
tests stay synchronous: ``page.evaluate("document.title")``.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest

# Seconds for chromium to start and write its DevTools port; for one protocol call to answer.
START_S = 60.0
CALL_S = 30.0


CHROMIUM_MISSING = "chromium is not installed (make test installs it: apt-get install chromium)"


def chromium_or_skip() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.skip(CHROMIUM_MISSING)
    return path


def has_chromium() -> bool:
    """For a test whose browser part is one of several: it runs the rest and skips at the end."""
    return shutil.which("chromium") is not None


class Page:
    """One browser tab; protocol calls are synchronous, each bounded by CALL_S."""

    def __init__(self, ws_url: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.events: list[dict[str, Any]] = []  # every protocol event, e.g. dialogs opened
        self._session: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._reader: asyncio.Task[None] | None = None
        self._run(self._connect(ws_url))

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(CALL_S + 5)

    async def _connect(self, ws_url: str) -> None:
        self._session = aiohttp.ClientSession()
        self._ws = await self._session.ws_connect(ws_url, max_msg_size=64 * 1024 * 1024)
        self._reader = asyncio.create_task(self._read())  # owned: cancelled in close()

    async def _read(self) -> None:
        assert self._ws is not None
        async for msg in self._ws:
            data = json.loads(msg.data)
            future = self._pending.pop(data.get("id", -1), None)
            if future is not None and not future.done():
                future.set_result(data)
            elif "method" in data:
                self.events.append(data)

    async def _call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        assert self._ws is not None
        n = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = self._loop.create_future()
        self._pending[n] = future
        await self._ws.send_json({"id": n, "method": method, "params": params})
        answer = await asyncio.wait_for(future, CALL_S)
        if "error" in answer:
            raise AssertionError(f"{method}: {answer['error']}")
        return dict(answer.get("result", {}))

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        result: dict[str, Any] = self._run(self._call(method, params))
        return result

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-serializable values)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float, what: str) -> Any:
        """Poll until ``expression`` is truthy; AssertionError naming ``what`` after timeout."""
        deadline = time.monotonic() + timeout
        value = None
        while time.monotonic() < deadline:
            try:
                value = self.evaluate(expression)
            except AssertionError as exc:  # e.g. the document is still loading: poll on
                value = str(exc)[:300]
                time.sleep(0.5)
                continue
            if value:
                return value
            time.sleep(0.5)
        raise AssertionError(f"page never showed {what} within {timeout} s (last: {value!r})")

    def navigate(self, url: str) -> None:
        self.call("Page.enable")
        self.call("Runtime.enable")
        self.call("Page.navigate", url=url)

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(data["data"]))
        return path

    def close(self) -> None:
        async def shut() -> None:
            if self._reader is not None:
                self._reader.cancel()
            if self._ws is not None:
                await self._ws.close()
            if self._session is not None:
                await self._session.close()

        try:
            self._run(shut())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)


@contextmanager
def open_page(profile: Path, *, width: int = 1200, height: int = 1600) -> Iterator[Page]:
    """Start headless chromium with a fresh profile; yield its first tab; stop it after."""
    binary = chromium_or_skip()
    profile.mkdir(parents=True, exist_ok=True)
    cmd = [
        binary,
        "--headless",
        "--no-sandbox",  # tests run as root in a container; the page is our own
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-extensions",
        "--disable-background-networking",
        "--disable-sync",
        "--remote-debugging-address=127.0.0.1",
        "--remote-debugging-port=0",
        f"--user-data-dir={profile}",
        f"--window-size={width},{height}",
        "about:blank",
    ]
    log = (profile.parent / "chromium.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    page: Page | None = None
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + START_S
        while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"chromium did not start (exit {proc.poll()})")
            time.sleep(0.1)
        port = int(port_file.read_text().split("\n")[0])
        targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=CALL_S).json()
        (tab,) = [t for t in targets if t["type"] == "page"][:1]
        page = Page(tab["webSocketDebuggerUrl"])
        yield page
    finally:
        if page is not None:
            page.close()
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
