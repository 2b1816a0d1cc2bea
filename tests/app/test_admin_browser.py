"""The "Delay queues" admin in a real browser: Debian's headless Chromium driven by Selenium.

Logs in, watches the counts move when messages are scheduled, and requeues a dead letter.
CI installs chromium and chromium-driver (.ci/install-system-deps); without them (or without
selenium) this skips, and under CI=true fails.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from ci_support import skip_or_fail

from django_delayqueue.core import Queue

CHROMIUM = os.environ.get("DELAYQUEUE_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("DELAYQUEUE_CHROMEDRIVER", "/usr/bin/chromedriver")
WAIT_SECONDS = 15  # upper bound for a page to load on a busy CI machine, not a timing check
FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1400,1000",
)


def _missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    try:
        import selenium.webdriver  # noqa: F401
    except ImportError:
        return "selenium is not installed: pip install -e '.[test]'"
    for path in (CHROMIUM, CHROMEDRIVER):
        if not (os.path.exists(path) or shutil.which(path)):
            return f"{path} not found: apt-get install chromium chromium-driver"
    return None


def _require_browser() -> None:
    reason = _missing()
    if reason:
        skip_or_fail(reason)


@pytest.fixture
def browser() -> Iterator[Any]:
    _require_browser()
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
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.mark.parametrize("ci", ["true", ""])
def test_a_missing_browser_skips_locally_and_fails_in_ci(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, ci: str
) -> None:
    monkeypatch.setattr(sys.modules[__name__], "CHROMEDRIVER", str(tmp_path / "no-chromedriver"))
    monkeypatch.setenv("CI", ci)
    reason = _missing()
    assert reason and "no-chromedriver not found" in reason
    expected = pytest.fail.Exception if ci else pytest.skip.Exception
    with pytest.raises(expected, match="no-chromedriver not found"):
        _require_browser()


def _wait_for(driver: Any, css: str) -> Any:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_SECONDS).until(
        ec.presence_of_element_located((By.CSS_SELECTOR, css))
    )


def _count(driver: Any, queue: str, state: str) -> str:
    cell = _wait_for(driver, f'tr[data-queue="{queue}"] td[data-state="{state}"]')
    return cell.text.strip()


def _open(driver: Any, url: str, css: str) -> None:
    driver.get(url)
    _wait_for(driver, css)


def _log_in(driver: Any, base_url: str) -> None:
    """Log in as the superuser "boss" through the admin's login page."""
    from selenium.webdriver.common.by import By

    driver.get(f"{base_url}/admin/login/?next=/admin/")
    _wait_for(driver, "#login-form")
    driver.find_element(By.NAME, "username").send_keys("boss")
    driver.find_element(By.NAME, "password").send_keys("s3cret-pass")
    driver.find_element(By.CSS_SELECTOR, "#login-form [type=submit]").click()
    # The login page has #content-main too: wait for what only a logged-in page shows, or the
    # next get() can be overtaken by the login redirect.
    _wait_for(driver, "#logout-form")


def _screenshot(driver: Any, name: str) -> None:
    """Save a screenshot when DELAYQUEUE_SCREENSHOTS names a directory (for looking at)."""
    folder = os.environ.get("DELAYQUEUE_SCREENSHOTS")
    if folder:
        os.makedirs(folder, exist_ok=True)
        driver.save_screenshot(os.path.join(folder, f"{name}.png"))


@pytest.mark.django_db(transaction=True)
def test_login_watch_counts_and_requeue_a_dead_letter(
    browser, live_server, redis_client, django_user_model
):
    from selenium.webdriver.common.by import By

    django_user_model.objects.create_superuser("boss", "boss@example.com", "s3cret-pass")
    q = Queue(redis_client, "order-close", prefix="dq")
    overview = f"{live_server.url}/admin/django_delayqueue/queuemessage/"

    # Anonymous: the admin's login page, then back to the overview.
    browser.get(overview)
    _wait_for(browser, "#login-form")
    browser.find_element(By.NAME, "username").send_keys("boss")
    browser.find_element(By.NAME, "password").send_keys("s3cret-pass")
    browser.find_element(By.CSS_SELECTOR, "#login-form [type=submit]").click()
    _wait_for(browser, 'tr[data-queue="order-close"]')
    assert _count(browser, "order-close", "pending") == "0"
    assert _count(browser, "order-close", "garbage") == "0"

    # Schedule: the counts move on the next load.
    for i in range(3):
        q.schedule({"order_id": i}, delay=3600, id=f"order-{i}")
    q.schedule({"order_id": 99}, id="order-99")
    (dead,) = q.claim(1)
    assert q.bury(dead, "card declined: do not retry")
    _open(browser, overview, 'tr[data-queue="order-close"]')
    assert _count(browser, "order-close", "pending") == "3"
    assert _count(browser, "order-close", "garbage") == "1"
    assert _count(browser, "order-close", "ready") == "0"
    _screenshot(browser, "overview")

    # The queue's garbage page shows the dead letter and its reason; requeue it.
    browser.find_element(
        By.CSS_SELECTOR, 'tr[data-queue="order-close"] td[data-state="garbage"] a'
    ).click()
    row = _wait_for(browser, 'tr[data-id="order-99"]')
    assert "card declined: do not retry" in row.text
    assert '"order_id": 99' in row.text
    _screenshot(browser, "queue-garbage")
    row.find_element(By.CSS_SELECTOR, 'button[data-action="requeue"]').click()
    message = _wait_for(browser, "ul.messagelist li")
    assert "Requeued 1 message" in message.text
    assert browser.find_elements(By.CSS_SELECTOR, 'tr[data-id="order-99"]') == []
    garbage_tab = browser.find_element(By.CSS_SELECTOR, '.dq-tabs a[data-state="garbage"]')
    assert "(0)" in garbage_tab.text

    # It left the garbage count and is ready again, in Redis and on the overview.
    assert q.counts()["garbage"] == 0 and q.counts()["ready"] == 1
    _open(browser, overview, 'tr[data-queue="order-close"]')
    assert _count(browser, "order-close", "garbage") == "0"
    assert _count(browser, "order-close", "ready") == "1"


@pytest.mark.django_db(transaction=True)
def test_pending_page_selects_and_cancels_with_the_toggle(
    browser, live_server, redis_client, django_user_model
):
    from selenium.webdriver.common.by import By

    django_user_model.objects.create_superuser("boss", "boss@example.com", "s3cret-pass")
    q = Queue(redis_client, "activation-sms", prefix="dq")
    for i in range(3):
        q.schedule({"store_id": i}, delay=3600, id=f"store-{i}")
    _log_in(browser, live_server.url)

    page = f"{live_server.url}/admin/django_delayqueue/queuemessage/activation-sms/?state=pending"
    _open(browser, page, 'tr[data-id="store-2"]')
    _screenshot(browser, "queue-pending")
    browser.find_element(By.ID, "dq-toggle").click()  # the select-all script
    boxes = browser.find_elements(By.CSS_SELECTOR, "input.action-select")
    assert len(boxes) == 3 and all(b.is_selected() for b in boxes)
    browser.find_element(By.CSS_SELECTOR, 'button[data-action="cancel-selected"]').click()
    message = _wait_for(browser, "ul.messagelist li")
    assert "Cancelled 3 message" in message.text
    assert q.counts()["pending"] == 0


@pytest.mark.django_db(transaction=True)
def test_recurring_schedules_list_and_run_now(
    browser, live_server, redis_client, django_user_model
):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from django_delayqueue.core.recurring import parse_tick_id
    from django_delayqueue.models import RecurringSchedule

    django_user_model.objects.create_superuser("boss", "boss@example.com", "s3cret-pass")
    row = RecurringSchedule.objects.create(
        name="nightly-report",
        queue="order-close",
        cron="0 3 * * *",
        timezone="Europe/Berlin",
        payload={"kind": "unpaid"},
    )
    _log_in(browser, live_server.url)

    _open(browser, f"{live_server.url}/admin/django_delayqueue/recurringschedule/", "#result_list")
    table = browser.find_element(By.ID, "result_list").text
    assert "nightly-report" in table and "cron 0 3 * * * (Europe/Berlin)" in table
    assert "no runqueue has scheduled it yet" in table and "never" in table
    _screenshot(browser, "recurring-schedules")
    browser.find_element(By.CSS_SELECTOR, f'input.action-select[value="{row.pk}"]').click()
    Select(browser.find_element(By.NAME, "action")).select_by_value("run_now")
    browser.find_element(By.CSS_SELECTOR, 'button[name="index"]').click()
    message = _wait_for(browser, "ul.messagelist li")
    assert "Sent a tick of nightly-report now." in message.text
    q = Queue(redis_client, "order-close", prefix="dq")
    (sent,) = q.peek("ready").messages
    parsed = parse_tick_id(sent.id)
    assert parsed is not None and parsed[0] == "nightly-report"
    assert sent.payload == {"kind": "unpaid"}


@pytest.mark.django_db(transaction=True)
def test_a_late_queue_is_flagged_with_its_p50_and_p99(
    browser, live_server, redis_client, django_user_model
):
    from django.conf import settings
    from django.test import override_settings
    from lateness_support import LATE_QUEUE, LATE_QUEUE_SETTINGS, deliver_late
    from selenium.webdriver.common.by import By

    django_user_model.objects.create_superuser("boss", "boss@example.com", "s3cret-pass")
    queues = {
        **settings.DELAYQUEUE["QUEUES"],
        LATE_QUEUE: {**LATE_QUEUE_SETTINGS, "lateness_warning_ms": 20},
    }
    with override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "QUEUES": queues}):
        deliver_late(redis_client, list(range(10)), late_ms=30)  # p99 50 ms: past 20 ms
        _log_in(browser, live_server.url)
        overview = f"{live_server.url}/admin/django_delayqueue/queuemessage/"
        _open(browser, overview, f'tr[data-queue="{LATE_QUEUE}"]')
        cell = browser.find_element(
            By.CSS_SELECTOR, f'tr[data-queue="{LATE_QUEUE}"] td.dq-lateness'
        )
        assert "p50 38 ms, p99 50 ms" in cell.text and "late" in cell.text
        assert "dq-alert" in cell.get_attribute("class")
        flag = cell.find_element(By.CSS_SELECTOR, ".dq-late-flag")
        assert flag.is_displayed()
        _screenshot(browser, "overview-lateness")
        # Its own page says the same, next to the counts.
        _open(browser, f"{overview}{LATE_QUEUE}/", "#dq-lateness")
        row = browser.find_element(By.ID, "dq-lateness").text
        assert "last 5 min: p50 38 ms, p99 50 ms" in row and "warning above 20 ms" in row
