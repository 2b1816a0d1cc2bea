"""Every log line about one message carries its id, queue and attempt as record attributes
(``dq_message_id``, ``dq_queue``, ``dq_attempt``: django_delayqueue.core.observability.log_fields),
so a JSON formatter writes them and a log search finds every line of one message: from the
schedule the producer logged to the handler's failure and the dead letters."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings

import django_delayqueue as dq

QUEUE = "logged"
SHARDED = "logged-sharded"


@pytest.fixture(autouse=True)
def logged_queue() -> Iterator[None]:
    queues = {
        **settings.DELAYQUEUE["QUEUES"],
        QUEUE: {"max_attempts": 2, "backoff_base": 0},
        SHARDED: {"max_attempts": 1, "shards": 3},
    }
    with override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "QUEUES": queues}):
        yield


@pytest.fixture
def failing() -> Iterator[None]:
    def fail(message: dq.Message, **kwargs: Any) -> None:
        raise ValueError(f"order {message.payload} cannot be closed")

    dq.topic(QUEUE).connect(fail)
    dq.topic(SHARDED).connect(fail)
    yield
    dq.topic(QUEUE).disconnect(fail)
    dq.topic(SHARDED).disconnect(fail)


def fields(record: logging.LogRecord) -> tuple[Any, Any, Any]:
    return (
        getattr(record, "dq_message_id", None),
        getattr(record, "dq_queue", None),
        getattr(record, "dq_attempt", None),
    )


@pytest.mark.django_db(transaction=True)
def test_every_line_about_a_message_carries_its_fields(
    redis_client: Any, failing: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="django_delayqueue")
    dq.schedule(QUEUE, 42, id="order-42", on_commit=False)
    dq.schedule(QUEUE, 42, id="order-42", on_commit=False)  # refused: the id is taken
    call_command("runqueue", QUEUE, "--burst")  # two attempts (no backoff), then dead

    about = [r for r in caplog.records if "order-42" in r.getMessage()]
    said = {(r.getMessage().split(":")[0][:40], fields(r)) for r in about}
    # The refused schedule (producer side: attempt 0), each failed attempt, the last one.
    assert ("not scheduled order-42 on logged", ("order-42", QUEUE, 0)) in said
    failed = [r for r in about if "failed on message" in r.getMessage()]
    assert [fields(r) for r in failed] == [("order-42", QUEUE, 1), ("order-42", QUEUE, 2)]
    last = [r for r in about if "used its last attempt" in r.getMessage()]
    assert [fields(r) for r in last] == [("order-42", QUEUE, 2)]
    # And no line names the message without them.
    assert all(fields(r)[0] == "order-42" for r in about), [
        r.getMessage() for r in about if fields(r)[0] is None
    ]


@pytest.mark.django_db(transaction=True)
def test_a_sharded_queues_lines_all_name_the_shard(
    redis_client: Any, failing: None, caplog: pytest.LogCaptureFixture
) -> None:
    """The handler's failure (worker.py, where the handler sees the logical queue) and the
    consumer's own lines about the same delivery name the same queue: its shard
    (docs/observability.md, "Logs"), so a search by dq_queue finds them together."""
    caplog.set_level(logging.INFO, logger="django_delayqueue")
    dq.schedule(SHARDED, 7, id="order-7", on_commit=False)
    call_command("runqueue", SHARDED, "--burst")

    about = [r for r in caplog.records if "order-7" in r.getMessage()]
    (failed,) = [r for r in about if "failed on message" in r.getMessage()]
    (last,) = [r for r in about if "used its last attempt" in r.getMessage()]
    shard = fields(last)[1]
    assert shard.startswith(f"{SHARDED}#"), shard
    assert fields(failed) == ("order-7", shard, 1)
    assert failed.getMessage().startswith(f"queue {shard}: ")
