"""Driving the admin (and the demo's pages) in a real browser: Debian's headless Chromium through
Selenium, in a laptop's window (1,280 x 800).

CI installs chromium and chromium-driver (.ci/install-system-deps); without them (or without
selenium) a browser test skips, and under CI=true fails. Screenshots go to the folder a test
names (its ``tmp_path``), or to ``$DELAYQUEUE_SCREENSHOTS`` when set, to look at them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ci_support import skip_or_fail

CHROMIUM = os.environ.get("DELAYQUEUE_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("DELAYQUEUE_CHROMEDRIVER", "/usr/bin/chromedriver")
WAIT_SECONDS = 15  # upper bound for a page to load on a busy CI machine, not a timing check
WIDTH, HEIGHT = 1280, 800  # a laptop's screen: what the overview must fit
FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    f"--window-size={WIDTH},{HEIGHT}",
)


def missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    try:
        import selenium.webdriver  # noqa: F401
    except ImportError:
        return "selenium is not installed: pip install -e '.[test]'"
    for path in (CHROMIUM, CHROMEDRIVER):
        if not (os.path.exists(path) or shutil.which(path)):
            return f"{path} not found: apt-get install chromium chromium-driver"
    return None


def require_browser() -> None:
    reason = missing()
    if reason:
        skip_or_fail(reason)


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium in a 1,280 x 800 window (its viewport: what a laptop shows)."""
    require_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="dq-chromium-")
    options = Options()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        # The window's outer size includes no frame in headless mode; make the page's
        # viewport exactly the laptop's whatever the version does.
        viewport = driver.execute_script("return [window.innerWidth, window.innerHeight]")
        if viewport != [WIDTH, HEIGHT]:
            driver.execute_cdp_cmd(
                "Emulation.setDeviceMetricsOverride",
                {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False},
            )
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait_for(driver: Any, css: str) -> Any:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_SECONDS).until(
        ec.presence_of_element_located((By.CSS_SELECTOR, css))
    )


def open_page(driver: Any, url: str, css: str) -> None:
    driver.get(url)
    wait_for(driver, css)


def log_in(driver: Any, base_url: str, username: str, password: str) -> None:
    """Log in through the admin's login page."""
    from selenium.webdriver.common.by import By

    driver.get(f"{base_url}/admin/login/?next=/admin/")
    wait_for(driver, "#login-form")
    driver.find_element(By.NAME, "username").send_keys(username)
    driver.find_element(By.NAME, "password").send_keys(password)
    driver.find_element(By.CSS_SELECTOR, "#login-form [type=submit]").click()
    # The login page has #content-main too: wait for what only a logged-in page shows, or the
    # next get() can be overtaken by the login redirect.
    wait_for(driver, "#logout-form")


# What scrolls sideways: the page itself, or a box of it that scrolls (the admin's changelist
# results scroll inside their box rather than widen the page).
SIDEWAYS = """
const out = [];
const root = document.documentElement;
if (root.scrollWidth > root.clientWidth) {
  out.push(`the page: ${root.scrollWidth} px wide in a ${root.clientWidth} px window`);
}
for (const el of document.querySelectorAll("body *")) {
  const style = getComputedStyle(el);
  if (!["auto", "scroll"].includes(style.overflowX)) continue;
  if (el.scrollWidth > el.clientWidth + 1) {
    const name = `${el.tagName.toLowerCase()}#${el.id}.${el.className}`;
    out.push(`${name}: ${el.scrollWidth} px in ${el.clientWidth}`);
  }
}
return out;
"""


def sideways(driver: Any) -> list[str]:
    """What scrolls sideways on the page shown (empty: nothing)."""
    return list(driver.execute_script(SIDEWAYS))


def screenshot(driver: Any, folder: Path, name: str, *, full: bool = True) -> Path:
    """Save the page as ``<folder>/<name>.png`` (the whole page when ``full``: the window is
    made as tall as the page for the shot, then put back); returns the file."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    if full:
        height = int(driver.execute_script("return document.documentElement.scrollHeight"))
        driver.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {
                "width": WIDTH,
                "height": max(HEIGHT, height),
                "deviceScaleFactor": 1,
                "mobile": False,
            },
        )
    try:
        driver.save_screenshot(str(path))
    finally:
        if full:
            driver.execute_cdp_cmd(
                "Emulation.setDeviceMetricsOverride",
                {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False},
            )
    return path


def screenshot_folder(tmp_path: Path) -> Path:
    """Where a test saves its screenshots: ``$DELAYQUEUE_SCREENSHOTS`` or its own tmp_path."""
    named = os.environ.get("DELAYQUEUE_SCREENSHOTS")
    return Path(named) if named else tmp_path / "screenshots"


def set_theme(driver: Any, theme: str) -> None:
    """The admin's theme ("light", "dark" or "auto"), as its toggle keeps it; then reload."""
    driver.execute_script("localStorage.setItem('theme', arguments[0])", theme)
    driver.refresh()
