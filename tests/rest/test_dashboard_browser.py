"""The budget dashboard in headless Chromium (Debian's chromium + chromium-driver, selenium).

The page must load without console errors, draw one bar per block, and redraw by itself after a
query is charged.  A screenshot is saved under the test run's temporary directory
(``.../dashboard/dashboard.png``; its path is printed).

Without Chromium the test is skipped, unless ``CHORUS_REQUIRE_CHROMIUM=1`` (set by ``.ci/run``,
which installs it), where that is a failure.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.rest.harness import ALICE_TOKEN, OWNER_TOKEN, ServerThread

CHROMIUM = os.environ.get("CHORUS_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CHORUS_CHROMEDRIVER", "/usr/bin/chromedriver")


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        message = f"Chromium or chromedriver missing ({CHROMIUM}, {CHROMEDRIVER})"
        if os.environ.get("CHORUS_REQUIRE_CHROMIUM") == "1":
            pytest.fail(message)
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="chorus-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--window-size=1400,1500",
                 f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _wait(condition, timeout: float = 15.0, what: str = "condition") -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _attributes(driver, selector: str, key: str, value: str) -> dict[str, float]:
    """``{key attribute: float(value attribute)}`` of the matching elements, read at once
    (the page redraws every few seconds, so element handles go stale)."""
    pairs = driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]), "
        "e => [e.getAttribute(arguments[1]), e.getAttribute(arguments[2])]);",
        selector, key, value)
    return {k: float(v) for k, v in pairs}


def _bars(driver) -> dict[str, float]:
    return _attributes(driver, "#blocks-chart g.block-bar", "data-block", "data-consumed")


def test_dashboard_in_chromium(browser, live_duckdb: ServerThread,
                               tmp_path_factory: pytest.TempPathFactory) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    with live_duckdb.client(OWNER_TOKEN) as owner:
        expected_blocks = len(owner.get("/v1/dashboard").json()["blocks"])
    assert expected_blocks >= 90

    driver.get(f"{live_duckdb.url}/dashboard#token={OWNER_TOKEN}")
    _wait(lambda: len(_bars(driver)) == expected_blocks, what="one bar per block")
    assert "#token" not in driver.current_url  # the token left the address bar
    first_drawn = driver.find_element(By.TAG_NAME, "body").get_attribute("data-generated-at")
    before = _bars(driver)

    # An analyst's query charges its blocks; the page redraws by itself (no reload).
    with live_duckdb.client(ALICE_TOKEN) as alice:
        response = alice.post("/v1/query", json={
            "sql": "SELECT COUNT(*) FROM trips WHERE pickup_time >= '2026-02-10' "
                   "AND pickup_time < '2026-02-12'", "epsilon": 250.0})
    assert response.status_code == 200, response.text
    charged = response.json()["report"]["blocks"]
    assert charged

    def redrawn() -> bool:
        after = _bars(driver)
        return all(after.get(b, 0.0) >= before.get(b, 0.0) + 250.0 for b in charged)

    _wait(redrawn, what="the charged blocks to grow")
    assert driver.find_element(By.TAG_NAME, "body").get_attribute(
        "data-generated-at") != first_drawn
    assert len(_bars(driver)) == expected_blocks
    # the other charts are drawn too
    assert driver.find_elements(By.CSS_SELECTOR, "#history-chart path.line-consumed")
    claims = _attributes(driver, "#claims-chart g.hbar", "data-name", "data-value")
    assert claims["granted"] >= 1
    analysts = _attributes(driver, "#analysts-chart g.hbar", "data-name", "data-value")
    assert analysts["alice"] >= 250.0
    assert driver.find_element(By.ID, "status").get_attribute("class") != "error"

    errors = [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == [], errors

    shots = tmp_path_factory.mktemp("dashboard")
    path = Path(shots) / "dashboard.png"
    assert driver.save_screenshot(str(path))
    assert path.stat().st_size > 10_000
    print(f"dashboard screenshot: {path}")


def test_dashboard_asks_for_a_token(browser, live_duckdb: ServerThread) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    driver.get(f"{live_duckdb.url}/dashboard")
    driver.execute_script("sessionStorage.clear()")
    driver.get(f"{live_duckdb.url}/dashboard")
    form = _wait(lambda: driver.find_element(By.ID, "login").is_displayed() and
                 driver.find_element(By.ID, "login"), what="the token form")
    driver.find_element(By.ID, "token").send_keys(OWNER_TOKEN)
    form.submit()
    _wait(lambda: len(_bars(driver)) >= 90, what="bars after logging in")
    errors = [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == [], errors
