"""Headless Chromium for the tests: Debian's /usr/bin/chromium driven by Playwright for Python.

Playwright's own browsers are never downloaded (`playwright install` needs network the tests do not have); the
system Chromium is launched through `executable_path`. `make browser` installs it when it is missing, and a test
that needs it fails (never skips) with that hint. VLLM_LOADTEST_CHROMIUM points at another Chromium.

    with chromium() as browser, open_page(browser, path.as_uri()) as (page, log):
        ...
        assert not log.errors and not log.foreign_requests
        screenshot(page, run_dir / "page.png")

A page served by a local server: open_page(browser, url, allow=("http://127.0.0.1:",)).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

CHROMIUM = Path(os.environ.get("VLLM_LOADTEST_CHROMIUM", "/usr/bin/chromium"))
# Headless, no sandbox (the tests may run as root), no GPU, nothing phoning home. `headless=True` adds --headless.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",  # containers often have a 64 MB /dev/shm; Debian's wrapper misdetects it
]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def require_chromium() -> Path:
    """The Chromium executable, or fail the test (not skip: CI must not silently lose browser tests)."""
    if not (CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK)):
        pytest.fail(f"{CHROMIUM} not found: run `make browser` to install Debian's chromium", pytrace=False)
    return CHROMIUM


@dataclass
class PageLog:
    """What a page did while it was open: console errors, uncaught exceptions, every request it made."""

    allowed: tuple[str, ...]
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)

    @property
    def errors(self) -> list[str]:
        return [f"console: {e}" for e in self.console_errors] + [f"pageerror: {e}" for e in self.page_errors]

    @property
    def foreign_requests(self) -> list[str]:
        """Requests to URLs outside the allowed prefixes (they were aborted, never sent)."""
        return [u for u in self.requests if not u.startswith(self.allowed)]


@contextmanager
def chromium(**launch_options) -> Iterator[Browser]:
    """A headless Chromium with a fresh temporary profile (Playwright's default), closed afterwards."""
    executable = require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(executable),
            headless=True,
            args=CHROMIUM_ARGS,
            **launch_options,
        )
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def open_page(
    browser: Browser,
    url: str,
    *,
    allow: tuple[str, ...] = ("file://",),
    viewport: tuple[int, int] = (1400, 900),
    wait_until: str = "load",
    timeout_s: float = 30,
) -> Iterator[tuple[Page, PageLog]]:
    """Open url in a fresh browser context; yield (page, PageLog).

    Every request is logged; requests outside `allow` (URL prefixes) are aborted so a test never reaches the
    network, and show up in `log.foreign_requests`.
    """
    log = PageLog(allowed=allow)
    context = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]})
    try:
        context.route(lambda u: not u.startswith(allow), lambda route: route.abort())
        page = context.new_page()
        page.set_default_timeout(timeout_s * 1000)
        page.on("console", lambda m: log.console_errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: log.page_errors.append(str(e)))
        page.on("request", lambda r: log.requests.append(r.url))
        page.goto(url, wait_until=wait_until)
        yield page, log
    finally:
        context.close()


def screenshot(page: Page, path: Path, *, full_page: bool = True) -> Path:
    """Save a PNG screenshot of the page (the whole scrollable page by default) and return its path."""
    path = Path(path)
    page.screenshot(path=str(path), full_page=full_page)
    assert path.read_bytes()[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    return path


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) of a PNG, from its IHDR chunk."""
    head = Path(path).read_bytes()[:24]
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
