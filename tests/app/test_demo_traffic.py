"""``make demo`` is alive: run_demo.py with its traffic generator, against a private Redis, until
every capability it shows has done something real; then how it looks, in Chromium.

The demo runs as a user starts it (run_demo.py: migrations, runserver, ``runqueue --processes
2``, ``demo_traffic``), on the demo's own settings (demo_project/settings.py), with shorter
delays and a sales report every 2 seconds so that it is all seen in seconds rather than a
minute. What it did is read from where it lands (Redis, the demo's database, the shop's page),
polled until all of it was seen: the bound is against a hang, not a timing check. The demo
runs once for the module: the second test logs in as admin / admin (as the README says) and
saves screenshots of the shop, the overview, a queue's charts and the dead letters.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from paths import ROOT
from waiting import wait_until

from django_delayqueue.core import QueueKeys
from django_delayqueue.core.envelope import to_str
from django_delayqueue.core.recurring import parse_tick_id
from django_delayqueue.embedded import RedisServerProcess, free_port

pytestmark = pytest.mark.slow

PREFIX = "dq"  # demo_project/settings.py
PHONES = {"+15550101", "+15550102", "+15550103", "+15550104", "+15550105"}  # the generator's
BOUND = 240.0  # seconds: a hang on a loaded machine, not what a passing run takes
STOP_BOUND = 60.0


def keys(queue: str) -> QueueKeys:
    return QueueKeys(PREFIX, queue)


def journal_rows(client: redis.Redis, queue: str) -> list[list[Any]]:
    """Every row of ``queue``'s delivery journal (core.journal.JOURNAL_FIELDS)."""
    rows = []
    for _, fields in client.xrange(keys(queue).journal):
        rows += json.loads(fields[b"o"])
    return rows


class Demo:
    """run_demo.py as ``make demo`` runs it, with its output in a file."""

    def __init__(self, tmp_path: Path, redis_url: str) -> None:
        self.db = tmp_path / "demo.sqlite3"
        self.exports = tmp_path / "exports"
        self.port = free_port()
        self.log = tmp_path / "demo.log"
        env = {
            **os.environ,
            "REDIS_URL": redis_url,
            "DEMO_DB": str(self.db),
            "DEMO_EXPORT_DIR": str(self.exports),
            "DEMO_REPORT_EVERY": "2",
            "DEMO_GATEWAY_HANG_EVERY": "4",
            "DEMO_EXPORT_STEP_SECONDS": "0.2",
            "ORDER_CLOSE_DELAY": "4",
            "ACTIVATION_SMS_DELAY": "3",
            "PYTHONUNBUFFERED": "1",
        }
        env.pop("DJANGO_SETTINGS_MODULE", None)  # run_demo.py names the demo's
        command = [sys.executable, str(ROOT / "demo_project" / "run_demo.py")]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [*command, "--port", str(self.port)],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        """A query of the demo's database (empty until its tables exist)."""
        if not self.db.exists():
            return []
        with sqlite3.connect(self.db, timeout=20) as db:
            try:
                return db.execute(sql).fetchall()
            except sqlite3.OperationalError:  # not migrated yet
                return []

    def page(self, path: str = "/") -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=30) as r:
            return r.read().decode()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # Ctrl-C in the terminal
            try:
                return self.proc.wait(STOP_BOUND)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Demo, redis.Redis]]:
    with RedisServerProcess() as server:
        client = redis.Redis.from_url(server.url)
        running = Demo(tmp_path_factory.mktemp("demo"), server.url)
        try:
            yield running, client
        finally:
            running.stop()
            client.close()


class Seen:
    """What the demo was seen doing, as it happened: some of it lasts a moment (a message
    waiting with its key, a running export's progress), so each is noted when first seen."""

    def __init__(self, demo: Demo, client: redis.Redis) -> None:
        self.demo, self.client = demo, client
        self.found: set[str] = set()
        c = client
        self.checks = {
            "an SMS waiting with its phone as its key": lambda: any(
                to_str(v) in PHONES for v in c.hvals(keys("activation-sms").flow_keys)
            ),
            "an SMS held back by the rate limit or its key, then sent": lambda: any(
                r[6] == "ack" and len(r) > 8 and r[8] > 0 for r in journal_rows(c, "activation-sms")
            ),
            "an SMS sent through the gateway": lambda: self.count("shop_sentsms"),
            "a hung gateway call stopped by the time limit": lambda: any(
                r[7] == "TimeLimitExceeded" for r in journal_rows(c, "activation-sms")
            ),
            "an unpaid order closed": lambda: any(
                r[6] == "ack" for r in journal_rows(c, "order-close")
            ),
            "a paid order's close cancelled": lambda: any(
                r[6] == "cancel" for r in journal_rows(c, "order-close")
            ),
            "a partner callback delivered": lambda: any(
                r[6] == "ack" for r in journal_rows(c, "partner-callback")
            ),
            "a partner callback dead with its reason": lambda: any(
                c.hget(keys("partner-callback").reasons, i)
                for i in c.zrange(keys("partner-callback").garbage, 0, -1)
            ),
            "a tick of the recurring sales report": lambda: any(
                r[6] == "ack" and parse_tick_id(r[0]) for r in journal_rows(c, "shop-reports")
            ),
            "a sales report written": lambda: self.count("traffic_salesreport"),
            "an export task reporting its progress": lambda: c.hlen(keys("shop-tasks").progress),
            "an export written": lambda: list(demo.exports.glob("orders-*.csv")),
            "two consumer processes": lambda: c.zcard(keys("order-close").heartbeats) == 2,
        }

    def count(self, table: str) -> int:
        rows = self.demo.rows(f"select count(*) from {table}")
        return int(rows[0][0]) if rows else 0

    def look(self) -> bool:
        """Note what is seen now; True once everything was."""
        for what, check in self.checks.items():
            if what not in self.found and check():
                self.found.add(what)
        return len(self.found) == len(self.checks)

    def missing(self) -> list[str]:
        return [what for what in self.checks if what not in self.found]


def test_the_demo_shows_every_capability_within_its_bound(demo: tuple[Demo, redis.Redis]) -> None:
    running, client = demo
    seen = Seen(running, client)
    wait_until(
        lambda: running.proc.poll() is not None or seen.look(),
        timeout=BOUND,
        every=0.1,
        what="every capability of the demo",
        details=lambda: f"not seen: {seen.missing()}\n{running.output()[-8000:]}",
    )
    assert running.proc.poll() is None, f"run_demo.py ended early:\n{running.output()[-8000:]}"

    # The shop's page shows the timeline of what was delivered, with lateness.
    page = running.page("/")
    assert "What the queues are doing" in page and 'class="mark ack"' in page
    fragment = running.page("/timeline/")
    assert "Latest deliveries" in fragment and " ms</td>" in fragment

    # The dead letter's reason is the partner's answer or the last error: words, not empty.
    garbage = keys("partner-callback")
    reasons = {
        to_str(client.hget(garbage.reasons, i)) for i in client.zrange(garbage.garbage, 0, -1)
    }
    assert all(reasons) and any("partner" in r or "503" in r or "answer" in r for r in reasons)


def test_how_the_demo_looks_in_a_browser(demo: tuple[Demo, redis.Redis], tmp_path: Path) -> None:
    """The shop's timeline, the overview (no sideways scrolling), a queue's charts and the dead
    letters by reason, as a person sees them at 1,280 x 800; screenshots in ``tmp_path``."""
    from browser_support import chromium, log_in, screenshot, screenshot_folder, sideways, wait_for
    from selenium.webdriver.common.by import By

    running, client = demo
    seen = Seen(running, client)
    wait_until(seen.look, timeout=BOUND, every=0.1, what="the demo at work")
    base = f"http://127.0.0.1:{running.port}"
    shots = screenshot_folder(tmp_path)
    with chromium() as browser:
        browser.get(f"{base}/")
        wait_for(browser, "#timeline svg circle.mark")
        screenshot(browser, shots, "demo-shop")
        log_in(browser, base, "admin", "admin")
        browser.get(f"{base}/admin/django_delayqueue/queuemessage/")
        wait_for(browser, 'tr[data-queue="partner-callback"]')
        screenshot(browser, shots, "demo-overview")
        assert sideways(browser) == []
        assert len(browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")) == 5
        browser.get(f"{base}/admin/django_delayqueue/queuemessage/activation-sms/")
        wait_for(browser, "#dq-charts")
        screenshot(browser, shots, "demo-activation-sms")
        assert sideways(browser) == []
        kinds = [
            f.get_attribute("data-chart")
            for f in browser.find_elements(By.CSS_SELECTOR, "#dq-charts figure")
        ]
        assert kinds == ["deliveries", "lateness", "limit-wait"]
        held = browser.find_element(By.CSS_SELECTOR, 'figure[data-chart="limit-wait"]')
        assert held.find_elements(By.CSS_SELECTOR, "rect"), "the rate limit held nothing"
        browser.get(f"{base}/admin/django_delayqueue/queuemessage/partner-callback/?state=garbage")
        wait_for(browser, "#dq-reasons tbody tr")
        screenshot(browser, shots, "demo-dead-letters")


def test_the_demo_stops_cleanly_on_ctrl_c(demo: tuple[Demo, redis.Redis]) -> None:
    running, _ = demo
    assert running.stop() == 0
    output = running.output()
    # the failures it makes on purpose take one line each; a traceback is shown where it starts
    first = output.find("Traceback")
    assert first == -1, output[max(0, first - 2000) : first + 6000]
