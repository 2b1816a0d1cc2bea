"""Malformed data written straight into a queue's keys, as a buggy tool or a human might.

What happens, by case (the consumer never crashes and keeps serving its other queues):

- an envelope that is not JSON, JSON of the wrong shape, or an id in ready with no envelope:
  claimed, then sent to garbage with a ``corrupt: ...`` reason (visible and requeueable or
  purgeable in the admin); the other messages of the queue are delivered as usual;
- a key of the wrong type (e.g. ``SET`` on the ready or pending key): every script of that
  queue refuses to run *before changing anything* (``WRONGTYPE ... nothing was changed``), so
  no message is lost half-way; producers get a :class:`ScriptFailed`; the consumer logs the
  error and goes on with its other queues; once the key is fixed the queue works again.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis
from drill import consumers, producer, settled
from ledger import check, read

from django_delayqueue.core import DelayQueueError, ScriptFailed
from django_delayqueue.embedded import RedisServerProcess

pytestmark = pytest.mark.slow


def test_corrupt_envelopes_go_to_garbage_with_a_reason(
    redis_server: RedisServerProcess, redis_client: redis.Redis, tmp_path: Path
) -> None:
    q = producer(redis_server.url, "data")
    k = q.keys
    good = [q.schedule({"n": i}).id for i in range(3)]
    bad = {
        "not-json": ("18bcfe5b230,0,{not json", "corrupt: envelope payload is not JSON"),
        "wrong-shape": ("[1, 2, 3]", "corrupt: envelope does not start with hex due and lead"),
        "bad-times": ("soon,1,{}", "corrupt: envelope does not start with hex due and lead"),
        "old-form": (json.dumps({"d": "soon", "s": 1, "p": {}}), "not integers"),
        "no-envelope": (None, "corrupt: envelope missing"),
    }
    for message_id, (envelope, _) in bad.items():
        if envelope is not None:
            redis_client.hset(k.messages, message_id, envelope)
        redis_client.rpush(k.ready, message_id)
    good.append(q.schedule({"n": "after"}).id)
    ledger_path = tmp_path / "ledger.jsonl"
    with consumers(redis_server.url, "data", tmp_path, ledger=ledger_path) as cs:
        proc = cs.start()
        cs.wait(lambda: settled(q) and q.counts()["garbage"] == len(bad), 20, "corrupt ones buried")
        assert proc.poll() is None
        assert cs.stop(proc) == 0
        assert "corrupt envelope(s) sent to garbage" in cs.logs()
    report = check(good, read(ledger_path))  # handlers saw only the good ones, once each
    assert report.ok and report.delivered == len(good), report.summary()
    dead = {m.id: m.reason for m in q.peek("garbage").messages}
    assert set(dead) == set(bad)
    for message_id, (_, reason) in bad.items():
        assert reason in dead[message_id]
    # Dead letters stay inspectable and can be purged for good.
    assert q.purge() == len(bad) and redis_client.hlen(k.messages) == 0


@pytest.mark.parametrize("broken_key", ["ready", "pending", "unack"])
def test_key_of_the_wrong_type_loses_nothing_and_other_queues_go_on(
    broken_key: str, redis_server: RedisServerProcess, redis_client: redis.Redis, tmp_path: Path
) -> None:
    broken = producer(redis_server.url, "broken")
    good = producer(redis_server.url, "good")
    # A message waiting in another key than the broken one (pending, or ready if that broke).
    waiting = broken.schedule({"n": "waiting"}, delay=0 if broken_key == "pending" else 0.3).id
    key = getattr(broken.keys, broken_key)
    redis_client.delete(key)
    redis_client.set(key, "oops")
    if broken_key in ("ready", "pending"):  # the keys a schedule writes to
        # A message due now is written to ready, a later one to pending.
        delay = 0 if broken_key == "ready" else 60
        with pytest.raises(ScriptFailed, match="WRONGTYPE") as info:
            broken.schedule({"n": "refused"}, id="refused", delay=delay)
        assert isinstance(info.value, DelayQueueError)
        # The refused schedule wrote nothing: a retry with the same id is not a "duplicate".
        assert not redis_client.hexists(broken.keys.messages, "refused")

    ledger_path = tmp_path / "ledger.jsonl"
    # The last good message is due well after the waiting one, which has been handled by then.
    ids = [good.schedule({"n": i}, delay=i * 0.1).id for i in range(10)]
    with consumers(redis_server.url, ["broken", "good"], tmp_path, ledger=ledger_path) as cs:
        proc = cs.start()
        cs.wait(lambda: settled(good), 20, "the good queue to be served")
        assert proc.poll() is None, "the consumer crashed on a broken queue"
        assert "WRONGTYPE" in cs.logs()
        # The waiting message was delivered (its path avoids the broken key) or is still
        # where it was: never half-moved out of every state.
        in_pending = broken_key != "pending" and (
            redis_client.zscore(broken.keys.pending, waiting) is not None
        )
        in_ready = broken_key != "ready" and (
            waiting.encode() in redis_client.lrange(broken.keys.ready, 0, -1)
        )
        delivered = waiting in {d.id for d in read(ledger_path)}
        assert in_pending or in_ready or delivered, "the waiting message fell out of every state"
        # An operator fixes the key; the queue works again without a restart.
        redis_client.delete(key)
        assert broken.schedule({"n": "refused"}, id="refused").created
        cs.wait(lambda: settled(broken), 20, "the repaired queue to drain")
        assert cs.stop(proc) == 0
    delivered = {d.id for d in read(ledger_path)}
    assert set(ids) <= delivered and {waiting, "refused"} <= delivered
