"""What the stats show of flow keys: the key limits and the busiest keys in ``queuestats`` (text
and ``--json``) and on the admin's queue page, and in the metrics, where the busiest keys are
gauges by rank, never by key (docs/flow-control.md, "What the stats show of keys")."""

from __future__ import annotations

import json
from collections.abc import Iterator
from io import StringIO

import pytest
import redis
from admin_support import page
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings
from prometheus_client.parser import text_string_to_metric_families

from django_delayqueue.core import Queue

QUEUE = "activation-sms"  # configured in tests/settings.py
OC = (("queue", QUEUE),)


@pytest.fixture
def q(redis_client: redis.Redis) -> Iterator[Queue]:
    """The queue with key limits in the settings, six messages of one key (one in flight), two
    of another, one each of two more, one of them a key with markup in it."""
    limits = {"key_concurrency": 1, "key_rate_limit": "10/s"}
    queues = {**settings.DELAYQUEUE["QUEUES"], QUEUE: limits}
    with override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "QUEUES": queues}):
        queue = Queue(redis_client, QUEUE, prefix="dq")
        queue.settings = queue.settings.replace(**limits)
        items = [{"payload": n, "key": "+33612345678"} for n in range(6)]
        items += [{"payload": "s", "key": "store-42"}] * 2
        items += [{"payload": "x", "key": "<b>x</b>"}, {"payload": "plain"}]
        assert queue.schedule_many(items).scheduled == 10
        assert len(queue.claim(10)) == 4  # one per key (and the plain one)
        yield queue


def run(*args: str) -> str:
    out = StringIO()
    call_command("queuestats", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def test_queuestats_shows_the_key_limits_and_the_busiest_keys(q: Queue) -> None:
    out = run(QUEUE)
    flow_header = next(line for line in out.splitlines() if "PER KEY" in line)
    assert flow_header.split()[-4:] == ["PER", "KEY", "ON", "KEYS"]
    flow_row = out.splitlines()[out.splitlines().index(flow_header) + 1]
    assert "10/s, 1 in flight" in flow_row and flow_row.split()[-1] == "6"  # 5 + 1 waiting
    lines = out.split("\n\n")[2].splitlines()
    assert lines[0].split() == ["QUEUE", "KEY", "READY", "IN", "FLIGHT"]
    assert [line.split()[1:] for line in lines[1:4]] == [
        ["+33612345678", "5", "1"],
        ["store-42", "1", "1"],
        ["<b>x</b>", "0", "1"],
    ]
    assert f"{QUEUE}: busiest keys of 3 key(s) with messages, 2 with ready ones" in lines[4]


def test_queuestats_json_has_the_busiest_keys(q: Queue) -> None:
    (stats,) = json.loads(run(QUEUE, "--json"))["queues"]
    busiest = stats["busiest_keys"]
    assert busiest["keys"][0] == {"key": "+33612345678", "ready": 5, "in_flight": 1}
    assert (busiest["keys_with_ready_messages"], busiest["keys_with_messages"]) == (2, 3)
    flow = stats["flow"]
    assert (flow["key_concurrency"], flow["key_rate_limit"]) == (1, "10/s")


@pytest.mark.django_db
def test_the_admin_queue_page_shows_the_key_limits_and_the_busiest_keys(
    q: Queue, admin_client: object
) -> None:
    response = admin_client.get(page(QUEUE))  # type: ignore[attr-defined]
    text = response.content.decode()
    assert 'id="dq-flow-keys"' in text and "per key rate <code>10/s</code>" in text
    assert "at most 1 in flight" in text
    assert 'id="dq-busiest-keys"' in text and "of 3 key(s) with messages, 2 with ready ones" in text
    assert '<code>+33612345678</code></td><td class="dq-num">5</td>' in text
    assert "<code>&lt;b&gt;x&lt;/b&gt;</code>" in text and "<b>x</b>" not in text  # escaped


def test_the_metrics_export_the_key_limits_and_the_busiest_keys_by_rank(
    q: Queue, client: object
) -> None:
    response = client.get("/delayqueue/metrics/")  # type: ignore[attr-defined]
    m = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.content.decode())
        for s in family.samples
    }
    assert m[("delayqueue_key_concurrency", OC)] == 1
    assert m[("delayqueue_key_rate_limit_per_second", OC)] == 10
    assert m[("delayqueue_waiting_on_limit", (("limit", "key"), *OC))] == 6
    assert m[("delayqueue_keys_with_ready_messages", OC)] == 2
    ranks = {
        labels: value
        for (name, labels), value in m.items()
        if name == "delayqueue_busiest_key_messages"
    }
    assert ranks == {
        (("queue", QUEUE), ("rank", "1")): 6,
        (("queue", QUEUE), ("rank", "2")): 2,
        (("queue", QUEUE), ("rank", "3")): 1,
    }
    assert not any("+336" in str(labels) for _, labels in m)  # no key is a label
