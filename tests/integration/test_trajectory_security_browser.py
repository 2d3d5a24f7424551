"""The issue's browser attack, made by a real browser (Debian's Chromium, headless, through
Selenium): a page of another site, opened while a trainer's trajectory API runs on
loopback without a token, tries to wipe the queue (``<img>`` and a no-cors ``fetch`` of
``GET /reset_data``), to push a group (a no-cors ``text/plain`` POST, which needs no
preflight) and to read ``/status``. The server must do none of it. A page of the allowed
origin, in the same browser, then resets the queue with an ordinary ``fetch``: the control
that shows the browser's requests do reach the server.

Set-up as for the dashboard's browser test (``scripts/setup-browser.sh`` and selenium);
without them the test skips locally and fails under ``CI=true``.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import threading
import time
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.test_trajectory_security import REGISTRATION, Server, free_port, group

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"

PAGE = """<!doctype html><html><body><script>
const api = %(api)s;
window.done = [];
const mark = (what) => window.done.push(what);
%(script)s
</script></body></html>"""

ATTACK = """
const img = new Image();
img.onload = img.onerror = () => mark("img");
img.src = api + "/reset_data";
fetch(api + "/reset_data", {mode: "no-cors"}).then(() => mark("reset"), () => mark("reset"));
fetch(api + "/scored_data", {method: "POST", mode: "no-cors",
    headers: {"Content-Type": "text/plain"}, body: %(group)s})
  .then(() => mark("push"), () => mark("push"));
fetch(api + "/status").then((r) => r.text()).then((t) => mark("read " + t),
    () => mark("read blocked"));
"""

ALLOWED = """
fetch(api + "/status").then((r) => r.text()).then((t) => {
  mark("read " + t);
  return fetch(api + "/reset_data").then((r) => r.text()).then((t) => mark("reset " + t));
}, (e) => mark("read blocked " + e));
"""


def need_browser() -> Any:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    reason = f"{', '.join(missing)} missing: run scripts/setup-browser.sh" if missing else ""
    try:
        from selenium import webdriver
    except ImportError:
        webdriver, reason = None, reason or "selenium is not installed (pip install selenium)"
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"browser test cannot run in CI: {reason}")
        pytest.skip(reason)
    return webdriver


@pytest.fixture
def browser() -> Iterator[Any]:
    webdriver = need_browser()
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--no-first-run", "--disable-background-networking", "--disable-component-update",
        "--disable-sync",
    ):  # fmt: skip
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(15)
    try:
        yield driver
    finally:
        driver.quit()


class Site:
    """A static web site on its own loopback port (so its own origin)."""

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True)
        self.root = root
        self.port = free_port()
        handler = functools.partial(SimpleHTTPRequestHandler, directory=str(root))
        handler.log_message = lambda *a: None  # type: ignore[method-assign]
        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.origin = f"http://localhost:{self.port}"

    def page(self, name: str, api: str, script: str) -> str:
        (self.root / name).write_text(PAGE % {"api": json.dumps(api), "script": script})
        return f"{self.origin}/{name}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def visit(driver: Any, url: str, marks: int, timeout_s: float = 15) -> list[str]:
    """Open ``url`` and wait until its script has marked ``marks`` outcomes."""
    driver.get(url)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done = driver.execute_script("return window.done || []")
        if len(done) >= marks:
            return sorted(done)
        time.sleep(0.1)
    raise AssertionError(f"the page did not finish: {done}")


def test_a_foreign_page_cannot_reset_push_or_read(browser: Any, tmp_path: Path) -> None:
    evil, friend = Site(tmp_path / "evil"), Site(tmp_path / "friend")
    server = Server(tmp_path / "api", "--cors-origin", friend.origin)
    (tmp_path / "api").mkdir()
    server.start()
    try:
        with httpx.Client(base_url=server.url) as c:  # a trainer at work, one group queued
            assert c.post("/register", json=REGISTRATION).status_code == 200
            c.get("/batch")
            assert c.post("/scored_data", json=group(1.0)).status_code == 200
        before = server.logged()

        attack = ATTACK % {"group": json.dumps(json.dumps(group(6.0)))}
        done = visit(browser, evil.page("evil.html", server.url, attack), marks=4)
        assert done == ["img", "push", "read blocked", "reset"]
        assert server.logged() == before  # no reset, no group, nothing at all
        assert httpx.get(server.url + "/status").json()["queue_size"] == 1

        # the control: the allowed origin's page reads, and resets with a plain fetch
        done = visit(browser, friend.page("ok.html", server.url, ALLOWED), marks=2)
        assert done[0].startswith("read {") and '"queue_size":1' in done[0]
        assert done[1] == "reset Reset successful"
        assert server.logged()[len(before) :] == ["TrajectoryDataReset"]
    finally:
        server.stop()
        evil.close()
        friend.close()
