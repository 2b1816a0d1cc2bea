"""Envelope formats (docs/upgrades.md): an envelope says its format when it is newer than 1; a
consumer leaves what it cannot read for a consumer that reads it (defer.lua: retry, no attempt
used, a growing wait), never the dead letters; envelopes without a number read as before.

The "new producer" writes format ENVELOPE_FORMAT; the consumer "of the previous release" is
one pinned to ENVELOPE_FORMAT - 1 (``reads_format``), so these tests hold for every later
format too.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
import redis
from core_consumer_support import EMPTY, T0, Recorder, burst
from waiting import wait_until

from django_delayqueue.core import (
    ConfigurationError,
    CorruptEnvelope,
    Message,
    NewerEnvelope,
    Queue,
)
from django_delayqueue.core.consumer.loop import Consumer
from django_delayqueue.core.consumer.rounds.details import heartbeat_details
from django_delayqueue.core.delivery import NEWER_FIRST_WAIT_MS, NEWER_LONGEST_WAIT_MS
from django_delayqueue.core.envelope import (
    ENVELOPE_FORMAT,
    FORMAT_MARK,
    decode_envelope,
    decode_envelope_parts,
    encode_envelope,
    encode_payload,
    validate_format,
)
from django_delayqueue.core.errors import PayloadError
from django_delayqueue.core.formats import FormatGate, announced_format, live_formats
from django_delayqueue.core.results import Prepared
from django_delayqueue.core.scripts.contracts import NEWER_WAITING

NEW = ENVELOPE_FORMAT  # what a new producer may write
PREVIOUS = ENVELOPE_FORMAT - 1  # what a consumer of the previous release reads
TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
# What the release before formats had numbers writes (its encoder, byte for byte): a message
# with a key, a trace and the task mark. Every release from this one on reads it as it did.
UNNUMBERED = f'18bcfe5dd30,7530,k3,abc^{TRACE}\nt,{{"a":1}}'


def send(
    q: Queue,
    message_id: str,
    payload: Any,
    *,
    format: int | None,
    key: str | None = None,
    delay_ms: int = 0,
) -> None:
    """Store a message as a producer writing ``format`` would (None: the lowest that holds it)."""
    now = q.clock.now_ms()
    envelope = encode_envelope(encode_payload(payload), now + delay_ms, now, key=key, format=format)
    assert q.send_prepared(Prepared(message_id, now + delay_ms, envelope)).created


def newer_waiting(q: Queue, most: int = 1000) -> list[int]:
    return [int(x) for x in NEWER_WAITING.call(q.keys, most_entries=most).run(q.client)]


# --- the envelope ---------------------------------------------------------------------------


def test_a_producer_writes_the_lowest_format_so_earlier_consumers_read_all_it_writes() -> None:
    payload = encode_payload({"a": 1})
    envelope = encode_envelope(
        payload, 1_700_000_030_000, 1_700_000_000_000, task=True, key="abc", trace=TRACE
    )
    assert envelope == UNNUMBERED  # no number: format 1, what every earlier release reads
    assert FORMAT_MARK + "2," not in envelope


def test_envelopes_without_a_number_are_read_as_before_as_format_1() -> None:
    parts = decode_envelope_parts(UNNUMBERED)
    assert (parts.due_ms, parts.scheduled_ms, parts.payload) == (
        1_700_000_030_000,
        1_700_000_000_000,
        {"a": 1},
    )
    assert (parts.key, parts.trace, parts.task, parts.format) == ("abc", TRACE, True, 1)
    assert decode_envelope_parts(UNNUMBERED, reads=1).format == 1  # pinned to 1: read too
    assert decode_envelope(b'{"d":5,"s":3,"p":{"a":1}}') == (5, 3, {"a": 1})  # the first form


def test_a_numbered_envelope_says_its_format_after_the_key_and_reads_the_same() -> None:
    payload = encode_payload({"a": 1})
    envelope = encode_envelope(payload, 5_000, 1_000, task=True, key="k,1", trace=TRACE, format=NEW)
    # The times and the key keep their places (every release's Lua reads them there).
    assert envelope.startswith(f"1388,fa0,k3,k,1{FORMAT_MARK}{NEW},^")
    parts = decode_envelope_parts(envelope)
    assert (parts.due_ms, parts.scheduled_ms, parts.payload, parts.key, parts.trace) == (
        5_000,
        1_000,
        {"a": 1},
        "k,1",
        TRACE,
    )
    assert parts.task and parts.format == NEW


def test_a_reader_of_an_older_format_raises_newer_envelope_not_a_plain_corrupt_one() -> None:
    envelope = encode_envelope("1", 5_000, 1_000, format=NEW)
    with pytest.raises(NewerEnvelope) as info:
        decode_envelope_parts(envelope, reads=PREVIOUS)
    assert (info.value.format, info.value.reads) == (NEW, PREVIOUS)
    assert f"format {NEW} is newer" in str(info.value)
    # What only shows an envelope (the admin, a task's result) treats it as one it cannot read.
    assert isinstance(info.value, CorruptEnvelope)


def test_a_later_release_format_is_newer_whatever_follows_its_number() -> None:
    future = f"1388,fa0,k1,x{FORMAT_MARK}{NEW + 1},@anything a later format may hold"
    with pytest.raises(NewerEnvelope, match=f"format {NEW + 1} is newer"):
        decode_envelope(future)


@pytest.mark.parametrize("number", ["0", "1", "01"])
def test_format_1_has_no_number(number: str) -> None:
    with pytest.raises(CorruptEnvelope, match="corrupt: envelope says format"):
        decode_envelope(f"1388,fa0,{FORMAT_MARK}{number},1")


@pytest.mark.parametrize("value", [0, -1, NEW + 1, "2", 2.0, True, None])
def test_a_format_this_release_does_not_know_is_refused_naming_it(value: Any) -> None:
    with pytest.raises(PayloadError, match="envelope format must be"):
        validate_format(value)
    if value is not None:
        with pytest.raises(PayloadError, match="envelope format must be"):
            encode_envelope("1", 5_000, 1_000, format=value)


def test_the_scripts_read_the_times_and_the_key_of_any_format(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue()
    future = f"{T0 + 5000:x},1388,k3,abc{FORMAT_MARK}{NEW + 7},whatever it holds"
    q.send_prepared(Prepared("later", T0 + 5000, future))
    assert redis_client.zscore(q.keys.pending, "later") == T0 + 5000
    assert redis_client.hget(q.keys.flow_keys, "later") == b"abc"


# --- a consumer of the previous format beside a new producer -------------------------------


def test_a_message_of_a_newer_format_is_left_in_retry_without_an_attempt_and_never_buried(
    redis_client: redis.Redis, make_queue: Any, manual_clock: Any
) -> None:
    q = make_queue()
    send(q, "new", {"n": 1}, format=NEW)
    send(q, "plain", {"n": 2}, format=None)
    claimed = q.claim(10, reads_format=PREVIOUS)
    assert [m.id for m in claimed] == ["plain"]  # what it reads is delivered as ever
    assert q.counts() == {**EMPTY, "unack": 1, "retry": 1}
    assert redis_client.zscore(q.keys.retry, "new") == T0 + NEWER_FIRST_WAIT_MS
    assert not redis_client.hexists(q.keys.attempts, "new")  # its attempt given back
    assert not redis_client.hexists(q.keys.tokens, "new")
    reason = redis_client.hget(q.keys.reasons, "new").decode()
    assert reason == (
        f"waits for a consumer that reads envelope format {NEW} "
        f"(left by one that reads formats up to {PREVIOUS})"
    )
    assert newer_waiting(q) == [1, NEW, 1]
    # The new consumer delivers it, as a first attempt, once its wait is over.
    manual_clock.advance(NEWER_FIRST_WAIT_MS / 1000)
    q.promote()
    (m,) = q.claim(10)
    assert (m.id, m.payload, m.attempt) == ("new", {"n": 1}, 1)
    assert newer_waiting(q) == [0, 0, 1]  # in flight: not waiting any more
    assert q.ack(m, *claimed) == 2
    assert newer_waiting(q) == [0, 0, 1]
    assert redis_client.hlen(q.keys.newer) == 0  # the delivered message's entry forgotten
    assert q.counts() == EMPTY


def test_each_time_it_is_left_again_it_waits_twice_as_long_up_to_a_minute(
    redis_client: redis.Redis, make_queue: Any, manual_clock: Any
) -> None:
    q = make_queue()
    send(q, "new", 1, format=NEW)
    waits = []
    for _ in range(9):
        assert q.claim(10, reads_format=PREVIOUS) == []
        at = int(redis_client.zscore(q.keys.retry, "new"))
        waits.append(at - manual_clock.now_ms())
        manual_clock.advance((at - manual_clock.now_ms()) / 1000)
        q.promote()
    assert waits == [min(NEWER_FIRST_WAIT_MS * 2**i, NEWER_LONGEST_WAIT_MS) for i in range(9)]
    assert waits[-1] == NEWER_LONGEST_WAIT_MS
    assert redis_client.zcard(q.keys.garbage) == 0
    assert not redis_client.hexists(q.keys.attempts, "new")  # nine claims, no attempt used


def test_an_earlier_failure_keeps_its_attempt_count(
    redis_client: redis.Redis, make_queue: Any, manual_clock: Any
) -> None:
    q = make_queue(max_attempts=2)
    send(q, "new", 1, format=NEW)
    (first,) = q.claim(10)
    q.nack(first, delay=1)  # attempt 1 failed, on a consumer that reads it
    manual_clock.advance(1)
    q.promote()
    for _ in range(3):  # left three times: no attempt used, so not dead on its last one
        assert q.claim(10, reads_format=PREVIOUS) == []
        manual_clock.advance(NEWER_LONGEST_WAIT_MS / 1000)
        q.promote()
    assert redis_client.hget(q.keys.attempts, "new") == b"1"
    (second,) = q.claim(10)
    assert second.attempt == 2


def test_a_keyed_message_left_frees_its_keys_slot(
    redis_client: redis.Redis, make_queue: Any, manual_clock: Any
) -> None:
    q = make_queue(key_concurrency=1)
    send(q, "new", 1, format=NEW, key="store-7")
    send(q, "plain", 2, format=None, key="store-7")
    assert q.claim(10, reads_format=PREVIOUS) == []  # took "new" (the key's one slot), left it
    (m,) = q.claim(10, reads_format=PREVIOUS)  # the slot is free: the key's next message
    assert m.id == "plain"
    q.ack(m)
    manual_clock.advance(NEWER_FIRST_WAIT_MS / 1000)
    q.promote()
    (m,) = q.claim(10)
    assert (m.id, m.key) == ("new", "store-7")
    q.ack(m)
    assert q.counts() == EMPTY
    # Nothing of the key is left in flight (its fields: the rotation's own start with " ").
    assert [f for f in redis_client.hkeys(q.keys.key_state) if not f.startswith(b" ")] == []
    assert redis_client.zcard(q.keys.key_load) == 0


def test_a_message_aborted_while_claimed_is_dead_with_the_aborts_reason(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue()
    send(q, "new", 1, format=NEW)
    (claimed,) = q.claim(10)
    # As claim() of a pinned consumer would, by hand: the abort lands before it is left.
    assert q.abort("new", reason="staff")
    assert q.leave_for_newer([(claimed, NEW)], PREVIOUS) == [2]
    assert redis_client.zscore(q.keys.garbage, "new") is not None
    assert redis_client.hget(q.keys.reasons, "new") == b"aborted: staff"
    assert q.leave_for_newer([(claimed, NEW)], PREVIOUS) == [0]  # stale now


def test_the_waiting_count_forgets_messages_that_are_gone_and_counts_within_its_bound(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue()
    for i in range(5):
        send(q, f"m{i}", i, format=NEW)
    assert q.claim(10, reads_format=PREVIOUS) == []
    assert newer_waiting(q) == [5, NEW, 1]
    q.cancel("m0")
    assert newer_waiting(q) == [4, NEW, 1]
    assert redis_client.hlen(q.keys.newer) == 4  # m0's entry forgotten
    assert newer_waiting(q, most=2)[0] == 4  # a bounded look still counts every entry


def _left_then_read(q: Queue, manual_clock: Any, key: str | None) -> Message:
    """A message of the new format, left once by a consumer of the previous release, then
    claimed by one that reads it."""
    send(q, "new", {"n": 1}, format=NEW, key=key)
    assert q.claim(10, reads_format=PREVIOUS) == []
    assert newer_waiting(q) == [1, NEW, 1]
    manual_clock.advance(NEWER_FIRST_WAIT_MS / 1000)
    q.promote()
    (m,) = q.claim(10)  # the new consumer reads it
    return m


@pytest.mark.parametrize("key", [None, "store-7"])  # the list's path of the claim, the keys'
@pytest.mark.parametrize("then", ["retried", "dead", "released", "timed out"])
def test_a_message_a_reader_claimed_waits_for_no_newer_consumer_whatever_its_delivery_does(
    redis_client: redis.Redis, make_queue: Any, manual_clock: Any, key: str | None, then: str
) -> None:
    # Its handler failed, it used up its attempts, its consumer stopped or died: it waits for
    # a retry, or is dead, not for a consumer that reads its format (one did).
    q = make_queue(max_attempts=5, visibility_timeout=30)
    m = _left_then_read(q, manual_clock, key)
    if then == "retried":
        assert q.nack(m, delay=3600, reason="handler failed") == 1
    elif then == "dead":
        assert q.bury(m, "handler failed")
    elif then == "released":
        assert q.release(m) == 1
    else:
        manual_clock.advance(31)
        q.reap()
    assert q.counts()["unack"] == 0
    assert newer_waiting(q) == [0, 0, 1]
    assert redis_client.hlen(q.keys.newer) == 0


def test_a_consumer_that_does_not_read_a_keyed_message_leaves_it_counted_each_time(
    redis_client: redis.Redis, make_queue: Any, manual_clock: Any
) -> None:
    # The claim reads the envelope's format past its key: a consumer of the previous release
    # takes no entry away, the count of times it was left goes on.
    q = make_queue()
    send(q, "new", 1, format=NEW, key="store-7")
    for times in (1, 2):
        assert q.claim(10, reads_format=PREVIOUS) == []
        assert redis_client.hget(q.keys.newer, "new") == f"{NEW} {times}".encode()
        manual_clock.advance(NEWER_LONGEST_WAIT_MS / 1000)
        q.promote()
    assert newer_waiting(q) == [1, NEW, 1]


def test_the_same_id_scheduled_again_in_a_format_its_reader_reads_waits_for_no_newer_one(
    redis_client: redis.Redis, make_queue: Any, manual_clock: Any
) -> None:
    q = make_queue()
    send(q, "m", 1, format=NEW)
    assert q.claim(10, reads_format=PREVIOUS) == []
    q.cancel("m")
    send(q, "m", 2, format=None)  # a producer of the previous release: format 1
    (m,) = q.claim(10, reads_format=PREVIOUS)  # read by a consumer of the previous release
    assert q.nack(m, delay=3600, reason="handler failed") == 1
    assert newer_waiting(q) == [0, 0, 1]


def test_it_says_so_once_in_its_log_per_format(
    make_queue: Any, manual_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    q = make_queue()
    for i in range(3):
        send(q, f"m{i}", i, format=NEW)
    with caplog.at_level(logging.WARNING, logger="django_delayqueue.core.delivery"):
        assert q.claim(2, reads_format=PREVIOUS) == []
        assert q.claim(2, reads_format=PREVIOUS) == []
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert lines == [
        f"queue q: 2 message(s) written in envelope format {NEW} wait for a consumer that "
        f"reads it: this one reads formats up to {PREVIOUS}. Left in retry (no attempt used), "
        "not dead-lettered; upgrade this consumer (said once per format)"
    ]


def test_a_pinned_consumer_delivers_what_it_reads_and_the_new_one_the_rest_each_once(
    redis_client: redis.Redis, make_queue: Any, manual_clock: Any
) -> None:
    q = make_queue()
    for i in range(4):
        send(q, f"new{i}", i, format=NEW, key="k" if i % 2 else None)
        send(q, f"old{i}", i, format=None, key="k" if i % 2 else None)
    old = Recorder()
    burst([q], old, reads_format=PREVIOUS)
    assert sorted(m.id for m in old.calls) == [f"old{i}" for i in range(4)]
    assert q.counts() == {**EMPTY, "retry": 4}
    assert newer_waiting(q)[0] == 4
    manual_clock.advance(NEWER_FIRST_WAIT_MS / 1000)
    new = Recorder()
    burst([q], new)
    assert sorted(m.id for m in new.calls) == [f"new{i}" for i in range(4)]
    assert all(m.attempt == 1 for m in new.calls)
    assert q.counts() == EMPTY
    assert redis_client.zcard(q.keys.garbage) == 0


def test_a_consumer_whose_handler_failed_on_what_it_reads_says_no_newer_one_is_awaited(
    make_queue: Any, manual_clock: Any
) -> None:
    # The consumer's own claims (with their receipts) say the format it reads.
    q = make_queue(max_attempts=5)
    send(q, "new", 1, format=NEW)
    burst([q], Recorder(), reads_format=PREVIOUS)
    assert newer_waiting(q) == [1, NEW, 1]
    manual_clock.advance(NEWER_FIRST_WAIT_MS / 1000)

    def fails(message: Message) -> None:
        raise RuntimeError("handler failed")

    burst([q], Recorder(fails))
    assert q.counts() == {**EMPTY, "retry": 1}
    assert newer_waiting(q) == [0, 0, 1]


def test_a_new_consumer_reads_what_a_producer_of_the_previous_format_writes(
    make_queue: Any,
) -> None:
    q = make_queue()
    for i in range(3):
        send(q, f"m{i}", i, format=PREVIOUS, key="k" if i else None)
    q.send_prepared(Prepared("unnumbered", T0, UNNUMBERED.replace("18bcfe5dd30", f"{T0:x}")))
    recorder = Recorder()
    burst([q], recorder)
    assert sorted(m.id for m in recorder.calls) == ["m0", "m1", "m2", "unnumbered"]
    assert q.counts() == EMPTY


@pytest.mark.parametrize("value", [0, NEW + 1, "2"])
def test_a_consumer_cannot_read_a_format_its_release_does_not_know(
    make_queue: Any, value: Any
) -> None:
    with pytest.raises(ConfigurationError, match="reads_format must be"):
        Consumer([make_queue()], lambda m: None, reads_format=value)


# --- what consumers announce, and the producer's gate ----------------------------------------


def beat(q: Queue, name: str, details: str | None) -> None:
    """A heartbeat of consumer ``name`` now, with its details as its release writes them."""
    q.client.zadd(q.keys.heartbeats, {name: q.clock.now_ms()})
    if details is not None:
        q.client.hset(q.keys.consumer_details, name, details)


def test_a_consumer_announces_the_format_it_reads_with_its_heartbeat() -> None:
    assert json.loads(heartbeat_details("q", 0, []))["reads_format"] == ENVELOPE_FORMAT
    pinned = heartbeat_details("q", 0, [], reads_format=PREVIOUS)
    assert announced_format(pinned) == PREVIOUS
    assert announced_format('{"pid": 1}') == 1  # a release before formats had numbers
    assert announced_format(None) == 1
    assert announced_format(b"not json") == 1


def test_a_running_consumer_announces_its_format(make_queue: Any, running: Any) -> None:
    q = make_queue()
    run = running(Consumer([q], lambda m: None, reads_format=PREVIOUS, idle_seconds=0.05))
    wait_until(lambda: live_formats([q], T0 - 1) == {run.consumer.name: PREVIOUS})


def test_the_gate_holds_a_format_back_until_every_live_consumer_reads_it(
    make_queue: Any, manual_clock: Any
) -> None:
    q = make_queue()
    ticks = [0.0]
    gate = FormatGate([q], alive_seconds=30, refresh_seconds=5, monotonic=lambda: ticks[0])
    assert not gate.all_read(1)  # no live consumer: held back
    ticks[0] += 5
    beat(q, "new", heartbeat_details("q", 0, []))
    beat(q, "previous-release", json.dumps({"pid": 1}))
    assert gate.all_read(1) and not gate.all_read(NEW)
    beat(q, "previous-release", heartbeat_details("q", 0, []))  # upgraded...
    assert not gate.all_read(NEW)  # ...not seen before the next read
    ticks[0] += 5
    assert gate.all_read(NEW)
    manual_clock.advance(31)  # both silent past alive_seconds: no live consumer
    ticks[0] += 5
    assert gate.lowest() is None and not gate.all_read(1)
