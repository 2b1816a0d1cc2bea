"""The "Delay queues" admin in a real browser: Debian's headless Chromium driven by Selenium, in
a laptop's window (1,280 x 800; tests/support/browser_support.py).

Logs in, watches the counts move when messages are scheduled, requeues dead letters (one, and
all of one reason); the overview fits the window without scrolling sideways and says what needs
attention; a queue's page draws its charts, in the light theme and the dark. Every test saves
screenshots in its ``tmp_path`` (or ``$DELAYQUEUE_SCREENSHOTS``), to look at.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import browser_support
import pytest
from browser_support import (
    chromium,
    missing,
    open_page,
    require_browser,
    screenshot,
    screenshot_folder,
    set_theme,
    sideways,
    wait_for,
)

from django_delayqueue.core import Queue

BOSS = ("boss", "s3cret-pass")


@pytest.fixture
def browser() -> Iterator[Any]:
    with chromium() as driver:
        yield driver


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    return screenshot_folder(tmp_path)


@pytest.mark.parametrize("ci", ["true", ""])
def test_a_missing_browser_skips_locally_and_fails_in_ci(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, ci: str
) -> None:
    monkeypatch.setattr(browser_support, "CHROMEDRIVER", str(tmp_path / "no-chromedriver"))
    monkeypatch.setenv("CI", ci)
    reason = missing()
    assert reason and "no-chromedriver not found" in reason
    expected = pytest.fail.Exception if ci else pytest.skip.Exception
    with pytest.raises(expected, match="no-chromedriver not found"):
        require_browser()


_wait_for = wait_for  # the name test_admin_stop.py imports


def _count(driver: Any, queue: str, state: str) -> str:
    cell = wait_for(driver, f'tr[data-queue="{queue}"] td[data-state="{state}"]')
    return cell.text.strip()


def _open(driver: Any, url: str, css: str) -> None:
    open_page(driver, url, css)


def _log_in(driver: Any, base_url: str) -> None:
    """Log in as the superuser "boss" through the admin's login page."""
    browser_support.log_in(driver, base_url, *BOSS)


def _screenshot(driver: Any, folder: Path, name: str) -> None:
    screenshot(driver, folder, name)


@pytest.mark.django_db(transaction=True)
def test_login_watch_counts_and_requeue_a_dead_letter(
    browser, live_server, redis_client, django_user_model, shots
):
    from selenium.webdriver.common.by import By

    django_user_model.objects.create_superuser("boss", "boss@example.com", "s3cret-pass")
    q = Queue(redis_client, "order-close", prefix="dq")
    overview = f"{live_server.url}/admin/django_delayqueue/queuemessage/"

    # Anonymous: the admin's login page, then back to the overview.
    browser.get(overview)
    wait_for(browser, "#login-form")
    browser.find_element(By.NAME, "username").send_keys("boss")
    browser.find_element(By.NAME, "password").send_keys("s3cret-pass")
    browser.find_element(By.CSS_SELECTOR, "#login-form [type=submit]").click()
    wait_for(browser, 'tr[data-queue="order-close"]')
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
    _screenshot(browser, shots, "overview")

    # The queue's garbage page shows the dead letter and its reason; requeue it.
    browser.find_element(
        By.CSS_SELECTOR, 'tr[data-queue="order-close"] td[data-state="garbage"] a'
    ).click()
    row = wait_for(browser, 'tr[data-id="order-99"]')
    assert "card declined: do not retry" in row.text
    assert '"order_id": 99' in row.text
    _screenshot(browser, shots, "queue-garbage")
    row.find_element(By.CSS_SELECTOR, 'button[data-action="requeue"]').click()
    message = wait_for(browser, "ul.messagelist li")
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
    browser, live_server, redis_client, django_user_model, shots
):
    from selenium.webdriver.common.by import By

    django_user_model.objects.create_superuser("boss", "boss@example.com", "s3cret-pass")
    q = Queue(redis_client, "activation-sms", prefix="dq")
    for i in range(3):
        q.schedule({"store_id": i}, delay=3600, id=f"store-{i}")
    _log_in(browser, live_server.url)

    page = f"{live_server.url}/admin/django_delayqueue/queuemessage/activation-sms/?state=pending"
    _open(browser, page, 'tr[data-id="store-2"]')
    _screenshot(browser, shots, "queue-pending")
    browser.find_element(By.ID, "dq-toggle").click()  # the select-all script
    boxes = browser.find_elements(By.CSS_SELECTOR, "input.action-select")
    assert len(boxes) == 3 and all(b.is_selected() for b in boxes)
    browser.find_element(By.CSS_SELECTOR, 'button[data-action="cancel-selected"]').click()
    message = wait_for(browser, "ul.messagelist li")
    assert "Cancelled 3 message" in message.text
    assert q.counts()["pending"] == 0


@pytest.mark.django_db(transaction=True)
def test_recurring_schedules_list_and_run_now(
    browser, live_server, redis_client, django_user_model, shots
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
    _screenshot(browser, shots, "recurring-schedules")
    browser.find_element(By.CSS_SELECTOR, f'input.action-select[value="{row.pk}"]').click()
    Select(browser.find_element(By.NAME, "action")).select_by_value("run_now")
    browser.find_element(By.CSS_SELECTOR, 'button[name="index"]').click()
    message = wait_for(browser, "ul.messagelist li")
    assert "Sent a tick of nightly-report now." in message.text
    q = Queue(redis_client, "order-close", prefix="dq")
    (sent,) = q.peek("ready").messages
    parsed = parse_tick_id(sent.id)
    assert parsed is not None and parsed[0] == "nightly-report"
    assert sent.payload == {"kind": "unpaid"}


@pytest.mark.django_db(transaction=True)
def test_a_late_queue_is_flagged_with_its_p50_and_p99(
    browser, live_server, redis_client, django_user_model, shots
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
        assert cell.text.splitlines()[:2] == ["p50 38 ms", "p99 50 ms"] and "late" in cell.text
        assert "dq-alert" in cell.get_attribute("class")
        flag = cell.find_element(By.CSS_SELECTOR, ".dq-late-flag")
        assert flag.is_displayed()
        _screenshot(browser, shots, "overview-lateness")
        # Its own page says the same, next to the counts.
        _open(browser, f"{overview}{LATE_QUEUE}/", "#dq-lateness")
        row = browser.find_element(By.ID, "dq-lateness").text
        assert "last 5 min: p50 38 ms, p99 50 ms" in row and "warning above 20 ms" in row


# --- at a glance: the overview fits a laptop, a queue's page draws its charts -------------------

WIDE = {  # long names and every state filled: the widest the overview gets
    "partner-callback-notifications": {},
    "nightly-export-of-every-order": {},
}


def _busy_queues(redis_client: Any) -> None:
    """Every column filled: messages in each state, dead letters, a queue late, none consumed."""
    from lateness_support import deliver_late

    deliver_late(redis_client, [*range(10), "reject"], late_ms=30)  # p99 50 ms, one dead
    for name in ("order-close", *WIDE):
        q = Queue(redis_client, name, prefix="dq")
        for i in range(12):
            q.schedule({"n": i}, delay=3600 * (i + 1), id=f"{name}-{i}")
        for i in range(3):
            q.schedule({"n": i}, id=f"{name}-now-{i}")
        (taken,) = q.claim(1)
        q.nack(taken, delay=60, reason="flaky")
        (dead,) = q.claim(1)
        q.bury(dead, "PartnerDown: 503 Service Unavailable")


@pytest.fixture
def busy_settings() -> Iterator[None]:
    from django.conf import settings
    from django.test import override_settings
    from lateness_support import LATE_QUEUE, LATE_QUEUE_SETTINGS

    queues = {
        **settings.DELAYQUEUE["QUEUES"],
        **WIDE,
        LATE_QUEUE: {**LATE_QUEUE_SETTINGS, "lateness_warning_ms": 20},
    }
    with override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "QUEUES": queues}):
        yield


@pytest.mark.django_db(transaction=True)
def test_the_overview_fits_a_laptop_and_says_what_needs_attention(
    browser, live_server, redis_client, django_user_model, shots, busy_settings
):
    from selenium.webdriver.common.by import By

    django_user_model.objects.create_superuser("boss", "boss@example.com", "s3cret-pass")
    _busy_queues(redis_client)
    _log_in(browser, live_server.url)
    overview = f"{live_server.url}/admin/django_delayqueue/queuemessage/"
    for theme in ("light", "dark"):
        set_theme(browser, theme)
        _open(browser, overview, 'tr[data-queue="nightly-export-of-every-order"]')
        _screenshot(browser, shots, f"overview-{theme}")
        assert sideways(browser) == [], f"the overview scrolls sideways ({theme})"
    rows = browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    assert len(rows) == 5
    # What needs attention is said in words, first, within the window's height.
    box = browser.find_element(By.ID, "dq-attention")
    assert box.rect["y"] < browser.execute_script("return window.innerHeight")
    said = box.text
    # One line for the queues that share a finding, each queue's own sentence in its link.
    assert (
        "order-close, partner-callback-notifications and nightly-export-of-every-order have no "
        "live consumer" in said
    )
    assert "late-q starts handlers late: p99 50 ms" in said
    assert "late-q has new dead letters: 1 in the last 5 minutes, 1 in all." in said
    # Each says where to look: a dead letter's finding opens the queue's dead letters.
    box.find_element(By.CSS_SELECTOR, 'li[data-kind="dead-letters"][data-for="late-q"] a').click()
    wait_for(browser, '.dq-tabs a.selected[data-state="garbage"]')


@pytest.mark.django_db(transaction=True)
def test_a_queue_page_draws_its_charts_in_light_and_dark(
    browser, live_server, redis_client, django_user_model, shots, busy_settings
):
    from lateness_support import LATE_QUEUE
    from selenium.webdriver.common.by import By

    django_user_model.objects.create_superuser("boss", "boss@example.com", "s3cret-pass")
    _busy_queues(redis_client)
    _log_in(browser, live_server.url)
    colours = {}
    for theme in ("light", "dark"):
        set_theme(browser, theme)
        _open(
            browser,
            f"{live_server.url}/admin/django_delayqueue/queuemessage/{LATE_QUEUE}/",
            "#dq-charts",
        )
        _screenshot(browser, shots, f"queue-charts-{theme}")
        assert sideways(browser) == [], f"the queue page scrolls sideways ({theme})"
        figures = browser.find_elements(By.CSS_SELECTOR, "#dq-charts figure.dq-chart")
        kinds = [f.get_attribute("data-chart") for f in figures]
        assert kinds == ["deliveries", "lateness", "limit-wait"], "a chart is missing"
        for figure in figures:
            svg = figure.find_element(By.TAG_NAME, "svg")
            assert svg.size["width"] > 300 and svg.size["height"] > 100, "a chart is not drawn"
        deliveries, lateness, _ = figures
        assert deliveries.find_elements(By.CSS_SELECTOR, "g.dq-chart-ok rect")
        assert lateness.find_elements(By.CSS_SELECTOR, "g.dq-chart-p99 circle")
        assert lateness.find_elements(By.CSS_SELECTOR, "line.dq-chart-warning")
        colours[theme] = browser.execute_script(
            "const s = el => getComputedStyle(document.querySelector(el));"
            "return [s('body').backgroundColor, s('.dq-chart-label').fill,"
            " s('g.dq-chart-ok rect').fill];"
        )
    # The charts take the admin's colours: light text on the dark theme's background.
    assert colours["light"] != colours["dark"]
    light_bg, dark_bg = colours["light"][0], colours["dark"][0]
    assert light_bg == "rgb(255, 255, 255)" and dark_bg == "rgb(18, 18, 18)"
    # --body-quiet-color of the dark theme: #d0d0d0 since Django 5.0, #e0e0e0 in 4.2.
    assert colours["dark"][1] in ("rgb(208, 208, 208)", "rgb(224, 224, 224)")


@pytest.mark.django_db(transaction=True)
def test_dead_letters_by_reason_are_one_click_from_requeue_all(
    browser, live_server, redis_client, django_user_model, shots
):
    from admin_support import bury
    from selenium.webdriver.common.by import By

    django_user_model.objects.create_superuser("boss", "boss@example.com", "s3cret-pass")
    q = Queue(redis_client, "order-close", prefix="dq")
    bury(q, "down-1", "down-2", "down-3", reason="PartnerDown: 503 Service Unavailable")
    bury(q, "refused-1", reason="422: amount above the partner's limit")
    _log_in(browser, live_server.url)
    page = f"{live_server.url}/admin/django_delayqueue/queuemessage/order-close/?state=garbage"
    _open(browser, page, "#dq-reasons")
    _screenshot(browser, shots, "dead-letters-by-reason")
    assert sideways(browser) == []
    first = browser.find_element(By.CSS_SELECTOR, "#dq-reasons tbody tr")
    assert "PartnerDown: 503 Service Unavailable" in first.text and " 3 " in f" {first.text} "
    first.find_element(By.CSS_SELECTOR, 'button[data-action="requeue-reason"]').click()
    wait_for(browser, "#dq-confirm-reason")
    _screenshot(browser, shots, "dead-letters-requeue-confirm")
    browser.find_element(By.CSS_SELECTOR, '#content-main input[type="submit"]').click()
    message = wait_for(browser, "ul.messagelist li")
    assert "Requeued 3 message" in message.text
    assert q.counts()["garbage"] == 1 and q.counts()["ready"] == 3
    (left,) = browser.find_elements(By.CSS_SELECTOR, "#dq-reasons tbody tr")
    assert "422" in left.text
