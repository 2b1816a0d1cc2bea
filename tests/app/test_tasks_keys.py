"""Flow keys of tasks (docs/flow-control.md, "Keys of tasks"): the backend's ``KEY_ARGUMENT``
option names the argument a task's key is read from, and ``flow_key()`` gives the tasks enqueued
in its block a key, whatever their argument says. Through the framework's own API
(``enqueue``, ``aenqueue``, ``using``), against the session's real Redis; the tasks run in a real
``Worker`` (burst) where a test needs them to."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.conf import settings
from django.core.checks import Error
from django.db import transaction
from django.test import override_settings

from django_delayqueue.core import QueueKeys
from django_delayqueue.core.envelope import decode_envelope_parts
from django_delayqueue.core.errors import PayloadError
from django_delayqueue.models import OutboxMessage
from django_delayqueue.tasks import flow_key, framework
from django_delayqueue.worker import Worker

QUEUE = "shop-tasks"
KEYS = QueueKeys("dq", QUEUE)
pytestmark = pytest.mark.django_db(transaction=True)

examples: Any = None  # tests/support/task_key_examples.py, imported once TASKS names the backend


def tasks_setting(key_argument: Any) -> dict[str, Any]:
    from tests.settings import TASKS_SETTING

    default = TASKS_SETTING["default"]
    options = {**default["OPTIONS"], "KEY_ARGUMENT": key_argument}
    return {"default": {**default, "OPTIONS": options}}


@pytest.fixture
def key_argument() -> Any:
    return {"task_key_examples.sync_store": "store_id", "task_key_examples.send_sms": "phone"}


@pytest.fixture(autouse=True)
def keyed_backend(key_argument: Any) -> Iterator[None]:
    global examples
    queues = {**settings.DELAYQUEUE["QUEUES"], QUEUE: {"backoff_base": 0, "backoff_max": 0}}
    delayqueue = {**settings.DELAYQUEUE, "QUEUES": queues}
    with override_settings(DELAYQUEUE=delayqueue, TASKS=tasks_setting(key_argument)):
        import task_key_examples

        examples = task_key_examples
        yield


def key_of(client: redis.Redis, result: Any) -> str | None:
    return decode_envelope_parts(client.hget(KEYS.messages, result.id)).key


def flow_keys(client: redis.Redis) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in client.hgetall(KEYS.flow_keys).items()}


def test_the_key_is_read_from_the_named_argument_by_name_or_position(
    redis_client: redis.Redis,
) -> None:
    by_name = examples.sync_store.enqueue(store_id="store-42")
    by_position = examples.sync_store.enqueue(7)  # an int is taken as its text
    with_context = examples.send_sms.enqueue("+33612345678", text="hi")  # after the context
    other = examples.unkeyed.enqueue(1)  # not named in KEY_ARGUMENT
    assert key_of(redis_client, by_name) == "store-42"
    assert key_of(redis_client, by_position) == "7"
    assert key_of(redis_client, with_context) == "+33612345678"
    assert key_of(redis_client, other) is None
    assert flow_keys(redis_client) == {
        by_name.id: "store-42",
        by_position.id: "7",
        with_context.id: "+33612345678",
    }
    Worker.for_queues([QUEUE], burst=True, name="keys-worker").run()
    traced = {t.decode() for t in redis_client.lrange(examples.TRACE, 0, -1)}
    assert traced == {"sync store-42", "sync 7", "sms +33612345678", "unkeyed 1"}
    assert flow_keys(redis_client) == {}  # acknowledged: the keys went with the messages
    assert examples.sync_store.get_result(by_name.id).status == framework.SUCCESSFUL


def test_a_none_argument_is_no_key(redis_client: redis.Redis) -> None:
    result = examples.sync_store.enqueue(None)
    assert key_of(redis_client, result) is None


@pytest.mark.parametrize("value", ["", 4.5, ["a"], True])
def test_an_argument_that_cannot_be_a_key_is_refused_at_enqueue(
    redis_client: redis.Redis, value: Any
) -> None:
    with pytest.raises(TypeError, match=r"task_key_examples\.sync_store: argument 'store_id'") as e:
        examples.sync_store.enqueue(value)
    assert isinstance(e.value, PayloadError)
    assert redis_client.hlen(KEYS.messages) == 0


def test_flow_key_wins_over_the_argument_and_none_clears_it(redis_client: redis.Redis) -> None:
    with flow_key("region-eu"):
        report = examples.regional_report.enqueue()
        store = examples.sync_store.enqueue("store-1")
        with flow_key(None):
            cleared = examples.sync_store.enqueue("store-2")
    after = examples.sync_store.enqueue("store-3")
    assert key_of(redis_client, report) == "region-eu"
    assert key_of(redis_client, store) == "region-eu"
    assert key_of(redis_client, cleared) is None
    assert key_of(redis_client, after) == "store-3"  # the block is over


def test_flow_key_refuses_a_bad_key_at_once() -> None:
    with pytest.raises(PayloadError, match="non-empty"), flow_key(""):
        pass


def test_aenqueue_sees_the_callers_flow_key_and_the_argument(redis_client: redis.Redis) -> None:
    async def go() -> tuple[Any, Any]:
        with flow_key("async-key"):
            inside = await examples.unkeyed.aenqueue(1)
        return inside, await examples.sync_store.aenqueue("store-9")

    inside, by_argument = asyncio.run(go())
    assert key_of(redis_client, inside) == "async-key"
    assert key_of(redis_client, by_argument) == "store-9"


def test_a_keyed_task_with_a_priority_is_refused_at_enqueue(redis_client: redis.Redis) -> None:
    with pytest.raises(framework.InvalidTask, match="cannot have a priority"):
        examples.sync_store.using(priority=5).enqueue("store-1")
    refused = pytest.raises(framework.InvalidTask, match="cannot have a priority")
    with refused, transaction.atomic():  # refused at the call, not after the commit
        examples.sync_store.using(priority=5).enqueue("store-1")
    assert OutboxMessage.objects.count() == 0 and redis_client.hlen(KEYS.messages) == 0
    with flow_key(None):
        assert key_of(redis_client, examples.sync_store.using(priority=5).enqueue("s")) is None


def test_a_task_enqueued_in_a_transaction_keeps_its_key_through_the_outbox(
    redis_client: redis.Redis,
) -> None:
    with transaction.atomic():
        result = examples.sync_store.enqueue("store-5")
        (row,) = OutboxMessage.objects.all()
        assert decode_envelope_parts(row.envelope).key == "store-5"
    assert flow_keys(redis_client) == {result.id: "store-5"}


@pytest.mark.parametrize("key_argument", ["store_id"])
def test_a_single_name_keys_every_task_that_takes_that_argument(
    redis_client: redis.Redis,
) -> None:
    keyed = examples.sync_store.enqueue("store-1", full=True)
    other = examples.send_sms.enqueue("+33612345678")  # takes no store_id: no key
    assert key_of(redis_client, keyed) == "store-1"
    assert key_of(redis_client, other) is None


@pytest.mark.parametrize("key_argument", ["store id", 42, {"sync_store": "store_id"}])
def test_a_bad_key_argument_option_is_a_check_error() -> None:
    errors = list(framework.task_backends["default"].check())
    (error,) = [e for e in errors if e.id == "delayqueue.E017"]
    assert isinstance(error, Error) and "KEY_ARGUMENT must be the name of an argument" in error.msg


def test_keyed_tasks_on_a_sharded_queue_live_on_their_keys_shard_and_run(
    redis_client: redis.Redis,
) -> None:
    from django_delayqueue.core.sharding import key_shard, shard_index

    queues = {**settings.DELAYQUEUE["QUEUES"], QUEUE: {"shards": 3, "backoff_base": 0}}
    with override_settings(DELAYQUEUE={**settings.DELAYQUEUE, "QUEUES": queues}):
        results = {f"store-{n}": examples.sync_store.enqueue(f"store-{n}") for n in range(12)}
        for key, result in results.items():
            assert shard_index(result.id, 3) == key_shard(key, 3)  # found by its id
            shard = QueueKeys("dq", QUEUE, shard=key_shard(key, 3))
            assert redis_client.hget(shard.flow_keys, result.id) == key.encode()
        Worker.for_queues([QUEUE], burst=True, name="keys-worker").run()
        for result in results.values():
            assert examples.sync_store.get_result(result.id).status == framework.SUCCESSFUL
