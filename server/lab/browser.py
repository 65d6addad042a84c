"""A real headless browser for the dashboard's tests and benchmark: Debian's chromium
driven by its chromedriver through Selenium. ``./dev`` installs both; Selenium's own
driver manager is kept offline, so nothing is downloaded."""

from __future__ import annotations

import os
import shutil
from typing import Any


def chromium_paths() -> tuple[str, str]:
    """The chromium binary and its chromedriver; a clear error when either is missing."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if browser is None or driver is None:
        raise RuntimeError("the dashboard needs chromium and chromium-driver here: run ./dev test, or apt install them")
    return browser, driver


def headless_chromium(width: int = 1280, height: int = 1800) -> Any:
    """A headless chromium session that keeps the page's console messages."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must not fetch a browser or driver
    binary, driver_path = chromium_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    options.add_argument(f"--window-size={width},{height}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver_path), options=options)


def console_errors(driver: Any) -> list[str]:
    """The page's console messages at level SEVERE (errors, failed loads)."""
    return [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
