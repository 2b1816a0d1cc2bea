"""dq.schedule(..., key=...): the flow key checked at the call, stored with the message whether
it is sent at once or through the outbox on commit, and seen by the handler."""

from __future__ import annotations

import pytest
import redis
from django.db import transaction

import django_delayqueue as dq
from django_delayqueue.core import PayloadError, QueueKeys
from django_delayqueue.core.envelope import decode_envelope_parts

KEYS = QueueKeys("dq", "order-close")


def test_the_key_is_stored_with_the_message(redis_client: redis.Redis) -> None:
    message_id = dq.schedule("order-close", {"o": 1}, key="store-42", on_commit=False)
    assert redis_client.hget(KEYS.flow_keys, message_id) == b"store-42"
    envelope = redis_client.hget(KEYS.messages, message_id)
    assert decode_envelope_parts(envelope).key == "store-42"
    (message,) = dq.get_queue("order-close").shards[0].claim()
    assert message.key == "store-42"


def test_a_bad_key_raises_at_the_call(redis_client: redis.Redis) -> None:
    with pytest.raises(PayloadError, match="key is 201 characters, over 200"):
        dq.schedule("order-close", {"o": 1}, key="x" * 201, on_commit=False)
    assert not redis_client.exists(KEYS.messages)


@pytest.mark.django_db(transaction=True)
def test_a_message_sent_on_commit_through_the_outbox_keeps_its_key(
    redis_client: redis.Redis,
) -> None:
    with transaction.atomic():
        message_id = dq.schedule("order-close", {"o": 1}, delay=60, key="store-7")
        assert not redis_client.exists(KEYS.flow_keys)  # not sent before the commit
    assert redis_client.hget(KEYS.flow_keys, message_id) == b"store-7"
