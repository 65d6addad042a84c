"""A real headless browser for the dashboard's tests (:mod:`server.lab.browser`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from server.lab.browser import console_errors, headless_chromium
from tests.mqtt.conftest import broker  # noqa: F401  (a real mosquitto, started from the repo's config)

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / ".cache" / "test-artifacts"  # screenshots the tests keep

__all__ = ["console_errors", "keep_screenshot"]


@pytest.fixture
def browser() -> Iterator[Any]:
    driver = headless_chromium()
    try:
        yield driver
    finally:
        driver.quit()


def keep_screenshot(driver: Any, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    driver.save_screenshot(str(path))
    return path
