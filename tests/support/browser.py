"""A real headless Chromium for the management page's tests (Debian's ``chromium`` and
``chromium-driver``, selenium from the dev extra): the ``browser`` fixture (in tests/conftest.py),
``needs_browser`` to skip with the reason when either is missing, and waiting for the page."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
CHROMEDRIVER = shutil.which("chromedriver")


def _browser_missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    if CHROMIUM is None or CHROMEDRIVER is None:
        return "headless Chromium is not installed (apt-get install chromium chromium-driver)"
    return None


needs_browser = pytest.mark.skipif(_browser_missing() is not None, reason=_browser_missing() or "")


def open_browser() -> Iterator[Any]:
    """A headless Chromium driven by selenium, quit at the end."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,900",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def snap(browser: Any, name: str) -> None:
    """With TRIMARAN_SCREENSHOTS=DIR, save the page as DIR/<name>.png (the README's pictures)."""
    folder = os.environ.get("TRIMARAN_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(Path(folder) / f"{name}.png"))


def wait(predicate: Callable[[], Any], timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except Exception:  # the page is re-rendering the element just looked up
            value = None
        if value:
            return value
        assert time.monotonic() < deadline, "the page did not show it in time"
        time.sleep(0.1)
