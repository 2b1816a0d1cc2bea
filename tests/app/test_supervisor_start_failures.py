"""Consumer processes that keep dying before they consume: the supervisor logs the error once
in full, publishes it, and the stats, the admin, ``queuestats`` and the health probe say it."""

from __future__ import annotations

import json
import logging

import pytest
import redis
from django.core.management import call_command

from django_delayqueue.core.keys import start_failures_key
from django_delayqueue.monitoring.health import check_health
from django_delayqueue.monitoring.start_failures import STALE_SECONDS, StartFailure
from django_delayqueue.monitoring.stats import collect
from django_delayqueue.supervisor.start_failures import StartFailures

pytestmark = pytest.mark.django_db

ERROR = "RedisClusterException: The cluster has no default node"


class WallClock:
    def __init__(self, ms: int = 1_800_000_000_000) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


def tracker(client: redis.Redis, queues: list[str] | None, clock: WallClock) -> StartFailures:
    return StartFailures("runqueue-web-1", queues, "dq", client=lambda: client, now_ms=clock)


def published(client: redis.Redis) -> dict[str, StartFailure | None]:
    raw = client.hgetall(start_failures_key("dq"))
    return {k.decode(): StartFailure.from_json(v) for k, v in raw.items()}


def test_two_deaths_in_a_row_before_consuming_are_published_and_a_consumer_clears_them(
    redis_client: redis.Redis,
) -> None:
    clock = WallClock()
    failures = tracker(redis_client, ["order-close"], clock)
    failures.died(0, consumed=False, error=ERROR)
    assert published(redis_client) == {}  # one death may be bad luck
    clock.ms += 500
    failures.died(0, consumed=False, error=ERROR)
    entry = published(redis_client)["runqueue-web-1"]
    assert entry is not None
    assert (entry.error, entry.deaths, entry.queues) == (ERROR, 2, ["order-close"])
    assert entry.message == f"consumers keep dying at start: {ERROR}"
    failures.died(1, consumed=False, error=ERROR)  # the other slot: not 2 yet
    failures.consumed(0)
    assert published(redis_client) != {}  # slot 1 has not consumed yet
    failures.consumed(1)
    assert published(redis_client) == {}


def test_a_death_after_consuming_is_no_start_failure_and_stopping_clears(
    redis_client: redis.Redis,
) -> None:
    failures = tracker(redis_client, None, WallClock())
    for _ in range(3):
        failures.died(0, consumed=True, error="SystemExit: 3")
    assert published(redis_client) == {}
    failures.died(0, consumed=False, error=ERROR)
    failures.died(0, consumed=False, error=ERROR)
    assert published(redis_client)
    failures.stopped()
    assert published(redis_client) == {}


def test_each_distinct_error_is_logged_in_full_once(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    failures = tracker(redis_client, None, WallClock())
    with caplog.at_level(logging.ERROR, logger="django_delayqueue.supervisor"):
        for _ in range(5):
            failures.failed(ERROR, "Traceback: line 1\n")
            failures.died(0, consumed=False, error=ERROR)
        failures.failed("ImportError: shop", "Traceback: line 2")
        failures.died(0, consumed=False, error="ImportError: shop")
    full = [r.getMessage() for r in caplog.records if "Traceback:" in r.getMessage()]
    assert full == [
        f"consumer process failed: {ERROR}\nTraceback: line 1",
        "consumer process failed: ImportError: shop\nTraceback: line 2",
    ]
    again = [r for r in caplog.records if "traceback logged before" in r.getMessage()]
    assert len(again) == 4
    said = [r for r in caplog.records if "keep dying at start" in r.getMessage()]
    assert len(said) == 2  # once when first published, once when the error changed


def test_a_crash_of_one_slot_after_it_consumed_keeps_another_slots_start_failure(
    redis_client: redis.Redis,
) -> None:
    """Slot 0 dies at every start; slot 1 consumed, then crashed: the start failure of slot 0
    stays published (the health probe's "starting" check must not pass meanwhile)."""
    failures = tracker(redis_client, None, WallClock())
    failures.died(0, consumed=False, error=ERROR)
    failures.died(0, consumed=False, error=ERROR)
    assert published(redis_client)
    failures.died(1, consumed=True, error="SystemExit: 3")
    assert published(redis_client)
    failures.consumed(0)
    assert published(redis_client) == {}


@pytest.mark.django_db
def test_an_exception_a_stopping_child_dies_of_is_logged(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """A child told to stop that dies of an exception (in its last flush, say) sends it and
    logs nothing itself: the supervisor logs it, with its traceback."""
    import os
    import time

    from django_delayqueue.supervisor.children import Child, SupervisorOptions
    from django_delayqueue.supervisor.loop import Supervisor
    from django_delayqueue.supervisor.protocol import FAILED, LineReader

    supervisor = Supervisor(SupervisorOptions(queues=["order-close"], processes=1))
    read_fd, write_fd = os.pipe()
    line = {"kind": FAILED, "error": "ValueError: boom in the last flush", "traceback": "TB"}
    os.write(write_fd, (json.dumps(line) + "\n").encode())
    os.close(write_fd)
    os.set_blocking(read_fd, False)
    child = Child(0, 999_999_999, "x.1-999999999", LineReader(read_fd), time.monotonic())
    child.told_to_stop = True
    supervisor.slots[0].current = child
    with caplog.at_level(logging.INFO, logger="django_delayqueue"):
        supervisor._gone(child, 1 << 8)  # exit code 1
    assert "consumer process failed: ValueError: boom in the last flush\nTB" in caplog.text


def test_stats_queuestats_health_and_admin_say_it(
    redis_client: redis.Redis, admin_client: object, capsys: pytest.CaptureFixture[str]
) -> None:
    import time

    failures = tracker(redis_client, ["order-close"], WallClock(int(time.time() * 1000)))
    failures.died(0, consumed=False, error=ERROR)
    failures.died(0, consumed=False, error=ERROR)
    by_queue = {s.queue: s.start_failures for s in collect()}
    text = f"consumers keep dying at start: {ERROR}"
    assert by_queue["order-close"] == [text]
    assert by_queue["activation-sms"] == []
    healthy, report = check_health()
    assert not healthy
    assert report["checks"]["starting"] == {"ok": False, "failing": {"order-close": text}}
    page = admin_client.get("/admin/django_delayqueue/queuemessage/").content.decode()  # type: ignore[attr-defined]
    assert "Consumers keep dying at start: RedisClusterException" in page
    queue_page = admin_client.get(  # type: ignore[attr-defined]
        "/admin/django_delayqueue/queuemessage/order-close/"
    ).content.decode()
    assert "dq-start-failure" in queue_page
    call_command("queuestats", "order-close")
    assert f"error: {text} (queues: order-close)" in capsys.readouterr().err
    call_command("queuestats", "order-close", "--json")
    document = json.loads(capsys.readouterr().out)
    assert document["queues"][0]["start_failures"] == [text]


def test_an_entry_its_supervisor_stopped_refreshing_is_ignored(redis_client: redis.Redis) -> None:
    import time

    old = int((time.time() - STALE_SECONDS - 5) * 1000)
    failures = tracker(redis_client, None, WallClock(old))
    failures.died(0, consumed=False, error=ERROR)
    failures.died(0, consumed=False, error=ERROR)
    assert published(redis_client)  # a supervisor killed -9 leaves it behind
    assert all(s.start_failures == [] for s in collect())
