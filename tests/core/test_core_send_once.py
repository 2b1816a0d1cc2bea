"""``Queue.send_once``: the outbox's send, which stores a row's message once whatever happens."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

from django_delayqueue.core import ManualClock, Queue
from django_delayqueue.core.errors import ConfigurationError, PayloadError
from django_delayqueue.core.queue import SEND_TOKEN_MEMORY_MS


def test_a_token_sent_once_is_not_sent_again_even_after_its_message_was_acked(
    make_queue: Callable[..., Queue],
) -> None:
    q = make_queue()
    prepared = q.prepare({"order": 7}, id="close-7")
    first = q.send_once(prepared, "row-1")
    assert first is not None and first.created
    (message,) = q.claim(10)
    assert q.ack(message)
    # The row's sender died before deleting it, and a relay sends it again: nothing is stored.
    assert q.send_once(prepared, "row-1") is None
    assert q.counts()["ready"] == 0 and q.claim(10) == []
    # Another row (another token) with the same id is an ordinary schedule again.
    again = q.send_once(prepared, "row-2")
    assert again is not None and again.created


def test_a_token_is_forgotten_after_its_memory(
    make_queue: Callable[..., Queue], manual_clock: ManualClock
) -> None:
    q = make_queue()
    prepared = q.prepare({"n": 1}, id="m")
    assert q.send_once(prepared, "row") is not None
    q.ack(q.claim(10)[0])
    manual_clock.advance(SEND_TOKEN_MEMORY_MS / 1000 - 1)
    assert q.send_once(prepared, "row") is None  # renews the token: remembered from now
    manual_clock.advance(SEND_TOKEN_MEMORY_MS / 1000 + 1)
    assert q.send_once(prepared, "row") is not None
    assert q.client.zcard(q.keys.sent) == 1  # the old entry was trimmed, the new one kept


def test_send_once_keeps_a_future_due_time_and_idempotency_on_the_id(
    make_queue: Callable[..., Queue], manual_clock: ManualClock
) -> None:
    q = make_queue()
    later = q.prepare({"n": 1}, delay=60, id="later")
    assert q.send_once(later, "a").created  # type: ignore[union-attr]
    assert q.client.zscore(q.keys.pending, "later") == later.due_ms
    taken = q.send_once(q.prepare({"n": 2}, id="later"), "b")
    assert taken is not None and not taken.created and taken.state == "pending"


def test_send_once_replaces_with_replace(make_queue: Callable[..., Queue]) -> None:
    q = make_queue()
    q.schedule({"n": "old"}, delay=60, id="x")
    result = q.send_once(q.prepare({"n": "new"}, id="x"), "t", replace=True)
    assert result is not None and result.replaced and result.state == "pending"
    (message,) = q.claim(10)
    assert message.payload == {"n": "new"}
    assert q.send_once(q.prepare({"n": "newer"}, id="x"), "t", replace=True) is None


def test_send_once_with_a_record_writes_the_task_record_and_priority(
    make_queue: Callable[..., Queue], redis_client: redis.Redis
) -> None:
    q = make_queue()
    key = q.keys.task_result("t1")
    q.schedule({"n": "plain"}, id="plain")
    prepared = q.prepare({"n": 1}, id="t1")
    result = q.send_once(prepared, "tok", record_key=key, record="{}", priority=5)
    assert result is not None and result.created
    assert redis_client.hgetall(key) == {b"enqueued": b"{}", b"status": b"READY"}
    assert [m.id for m in q.claim(10)] == ["t1", "plain"]  # the priority goes first


TASK = {"token": "t", "record_key": "{dq:q}:task:x", "record": "{}"}


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"token": ""}, PayloadError),
        ({"token": "t", "record_key": "{dq:q}:task:x"}, ConfigurationError),
        ({**TASK, "record_key": "{dq:other}:task:x"}, ConfigurationError),
        ({**TASK, "priority": 101}, PayloadError),
        ({**TASK, "replace": True}, ConfigurationError),
    ],
)
def test_send_once_refuses_bad_arguments_before_sending(
    make_queue: Callable[..., Queue], kwargs: dict[str, object], error: type[Exception]
) -> None:
    q = make_queue()
    with pytest.raises(error):
        q.send_once(q.prepare({"n": 1}, id="x"), **kwargs)  # type: ignore[arg-type]
    assert q.counts()["ready"] == 0


def test_a_token_sent_again_and_again_is_remembered_from_its_last_send(
    make_queue: Callable[..., Queue], manual_clock: ManualClock
) -> None:
    """An outbox row whose sender cannot delete it (its replicas never confirm, say) is resent
    for longer than the memory: before, the token was forgotten an hour after the first send,
    and the next resend stored the long-acknowledged message a second time."""
    q = make_queue()
    prepared = q.prepare({"n": 1}, id="m")
    assert q.send_once(prepared, "row") is not None
    q.ack(q.claim(10)[0])
    for _ in range(3):  # resent every 40 minutes for two hours: stored nothing each time
        manual_clock.advance(40 * 60)
        assert q.send_once(prepared, "row") is None
    assert q.counts()["ready"] == 0
