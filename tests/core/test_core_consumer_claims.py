"""Claims whose reply was lost (core/consumer/rounds/claims.py and claim.lua's receipt): asked for
again by their claim id, they return the same messages, so none waits out its visibility
timeout (losing an attempt, or dying on its last) without ever having started."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from core_consumer_support import EMPTY, T0, Recorder
from waiting import wait_until

from django_delayqueue.core import ManualClock, Queue, QueueSettings
from django_delayqueue.core.consumer.loop import Consumer
from django_delayqueue.core.consumer.rounds.claims import ClaimReceipts
from django_delayqueue.core.errors import RedisUnavailable
from django_delayqueue.embedded import RedisServerProcess


def claimed(q: Queue, claims: ClaimReceipts, count: int, **kwargs: Any) -> list[Any]:
    return [(m.id, m.attempt, m.token) for m in q.claimed(run(q, claims, count, **kwargs), T0)]


def run(q: Queue, claims: ClaimReceipts, count: int, now: int = T0, **kwargs: Any) -> Any:
    return claims.call(q, now, count, **kwargs).run(q.client)


def test_a_claim_asked_again_by_its_id_returns_the_same_messages_not_new_ones(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue()
    q.schedule_many([{"payload": i, "id": f"m{i}"} for i in range(4)])
    q.promote()
    claims = ClaimReceipts()
    first = claimed(q, claims, 2)
    assert [(i, a) for i, a, _ in first] == [("m0", 1), ("m1", 1)]
    claims.lost([q.name])  # its reply never arrived
    assert claimed(q, claims, 2) == first  # same ids, attempts and tokens: nothing new taken
    assert redis_client.lrange(q.keys.ready, 0, -1) == [b"m2", b"m3"]
    claims.answered(q.name)
    assert [i for i, _, _ in claimed(q, claims, 2)] == ["m2", "m3"]  # a new claim id


def test_a_claim_sent_twice_by_a_retried_pipeline_takes_its_messages_once(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    """redis-py may send a pipeline again after a broken connection: the same call twice."""
    q = make_queue()
    q.schedule_many([{"payload": i, "id": f"m{i}"} for i in range(3)])
    q.promote()
    claims = ClaimReceipts()
    call = claims.call(q, T0, 2)
    call.run(redis_client)  # ran; its reply lost
    again = q.claimed(call.run(redis_client), T0)
    assert [(m.id, m.attempt) for m in again] == [("m0", 1), ("m1", 1)]
    assert q.counts() == {**EMPTY, "unack": 2, "ready": 1}


def test_a_replay_returns_only_what_is_still_in_flight_under_its_token(
    redis_client: redis.Redis, make_queue: Any, manual_clock: ManualClock
) -> None:
    q = make_queue(visibility_timeout=10)
    q.schedule_many([{"payload": i, "id": f"m{i}"} for i in range(3)])
    q.promote()
    claims = ClaimReceipts()
    messages = q.claimed(run(q, claims, 3), T0)
    claims.lost([q.name])
    q.ack(messages[0])  # gone meanwhile
    q.nack(messages[1], delay=0)  # back in retry
    manual_clock.advance(5)
    replayed = q.claimed(run(q, claims, 3, now=manual_clock.now_ms()), manual_clock.now_ms())
    assert [(m.id, m.token) for m in replayed] == [("m2", messages[2].token)]
    # With a deadline counted from the replay, so the extender has its full interval.
    assert redis_client.zscore(q.keys.unack, "m2") == manual_clock.now_ms() + 10_000


def test_the_receipt_outlives_the_claimed_messages_deadline_by_a_minute(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    """Expiring with the deadline, the receipt was gone after an outage longer than the
    visibility timeout while its messages could still sit in unack (not reaped yet): the
    replay found nothing and they timed out, an attempt lost, though they never started."""
    q = make_queue(visibility_timeout=30)
    q.schedule("x", id="x")
    q.promote()
    claims = ClaimReceipts()
    assert run(q, claims, 1)
    key = q.keys.claim_receipt(claims.consumer)
    assert key.startswith(q.keys.tag)  # the queue's slot on a cluster
    assert 89_000 < redis_client.pttl(key) <= 90_000


def test_replay_only_takes_nothing_new_and_an_empty_claim_writes_no_receipt(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    q = make_queue()
    q.schedule("x", id="x")
    q.promote()
    claims = ClaimReceipts()
    assert run(q, claims, 1, replay_only=True) == []
    assert redis_client.lrange(q.keys.ready, 0, -1) == [b"x"]
    assert not redis_client.exists(q.keys.claim_receipt(claims.consumer))
    q.claim()  # someone else takes it
    assert run(q, claims, 1) == []
    assert not redis_client.exists(q.keys.claim_receipt(claims.consumer))


def test_two_consumer_instances_never_share_a_receipt(make_queue: Any) -> None:
    q = make_queue()
    q.schedule_many([{"payload": i, "id": f"m{i}"} for i in range(2)])
    q.promote()
    a, b = ClaimReceipts(), ClaimReceipts()
    first = claimed(q, a, 1)
    a.lost([q.name])
    assert [i for i, _, _ in claimed(q, b, 1)] == ["m1"]  # b's first claim id is a's too
    assert claimed(q, a, 1) == first


# --- a consumer whose claim reply is lost --------------------------------------------------------


class ReplyDropper:
    """A TCP proxy to a redis-server that, once armed with some bytes, closes the client's
    connection instead of passing on the next reply that holds them: Redis ran the commands
    and their reply is lost, as when a connection breaks at the wrong moment."""

    def __init__(self, port: int) -> None:
        self._upstream_port = port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.drop: bytes | None = None
        self.dropped = 0
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self._upstream_port))
            self._sockets += (client, upstream)
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket, replies: bool) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if replies and self.drop is not None and self.drop in data:
                    self.drop = None
                    self.dropped += 1
                    break
                target.sendall(data)
        for s in (source, target):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self._listener.close()
        for s in self._sockets:
            s.close()


@pytest.fixture
def dropper(redis_server: RedisServerProcess) -> Iterator[ReplyDropper]:
    proxy = ReplyDropper(redis_server.port)
    yield proxy
    proxy.close()


def test_a_message_whose_claim_reply_was_lost_is_delivered_on_its_only_attempt(
    redis_client: redis.Redis, dropper: ReplyDropper, manual_clock: ManualClock
) -> None:
    """With ``max_attempts=1`` the message sat in unack until its visibility timeout, then
    went to the dead letters ("the consumer died or hung") without ever starting. redis-py 8
    sends the pipeline again on a fresh connection (the claim runs twice); redis-py 5 raises
    and the next round asks again. Either way the message arrives, on attempt 1."""
    client = redis.Redis(port=dropper.port, socket_timeout=10)
    q = Queue(client, "q", settings=QueueSettings(max_attempts=1), clock=manual_clock)
    handler = Recorder()
    consumer = Consumer([q], handler)
    try:
        consumer.step()  # scripts loaded, nothing due yet
        q.schedule("only once", id="lost-1")
        dropper.drop = b"lost-1"
        try:
            got = consumer.step()
        except RedisUnavailable:  # not retried by redis-py: the next round asks again
            got = consumer.step()
        assert dropper.dropped == 1
        assert got == 1
        wait_until(lambda: handler.calls)
        wait_until(lambda: consumer.step() == 0 and q.counts() == EMPTY)  # acknowledged
        assert [(m.id, m.attempt) for m in handler.calls] == [("lost-1", 1)]
        assert redis_client.zcard(q.keys.garbage) == 0
    finally:
        consumer._threads.close()
        client.close()


def test_a_consumer_stopping_gives_back_what_a_lost_claim_took(
    redis_client: redis.Redis, make_queue: Any
) -> None:
    """A stop right after the lost reply: the claim is asked for once more (nothing new) and
    its messages go back to ready unstarted, their attempt given back."""
    q = make_queue(max_attempts=1)
    q.schedule("x", id="x")
    handler = Recorder()
    consumer = Consumer([q], handler)
    q.promote()
    consumer._start_threads()
    claims = consumer._round_trip.claims
    call = claims.call(q, T0, 10)
    call.run(redis_client)  # the claim ran; its reply is lost
    claims.lost([q.name])
    consumer.request_stop()
    try:
        assert consumer._shutdown() == 0
    finally:
        consumer._threads.close()
    assert handler.calls == []
    assert redis_client.lrange(q.keys.ready, 0, -1) == [b"x"]
    assert not redis_client.hexists(q.keys.attempts, "x")  # no attempt used


def test_a_shutdown_replays_a_lost_claim_only_and_starts_nothing(
    redis_client: redis.Redis, make_queue: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A burst consumer's end, or two stop requests in one round: the loop returns before
    it holds the slots, and ``stopping`` may be False. The give-back was a full round: it
    claimed new messages on every queue and put them, with the lost claim's, into slots no
    one held, whose idle threads started them (then abandoned: attempt used, outcome lost)."""
    from django_delayqueue.core.consumer.handlers.threads import HandlerThreads
    from django_delayqueue.core.scripts.calls import ScriptBatch

    q, other = make_queue("q"), make_queue("other")
    q.schedule("lost", id="lost")
    q.promote()
    handler = Recorder()
    consumer = Consumer([q, other], handler, burst=True)  # not stopping: a burst's end
    consumer._start_threads()
    consumer._round_trip.claims.call(q, T0, 10).run(
        redis_client
    )  # the claim ran; its reply is lost
    consumer._round_trip.claims.lost([q.name])
    q.schedule("new", id="new")
    other.schedule("new elsewhere", id="elsewhere")
    q.promote()
    other.promote()
    sent: list[tuple[str, str]] = []  # (queue, claim's replay flag) of every claim sent
    added: list[tuple[bool, list[str]]] = []  # (slots held?, ids) of every add to the slots
    run_batch, add = ScriptBatch.run, HandlerThreads.add

    def spy_run(self: ScriptBatch, client: Any, raise_errors: bool = True) -> Any:
        for call in self.calls:
            if call.script.name == "claim":
                sent.append((call.keys[0], call.args[-1]))
        return run_batch(self, client, raise_errors=raise_errors)

    def spy_add(self: HandlerThreads, messages: list[Any]) -> None:
        added.append((self._holding, [m.id for m in messages]))
        add(self, messages)

    monkeypatch.setattr(ScriptBatch, "run", spy_run)
    monkeypatch.setattr(HandlerThreads, "add", spy_add)
    try:
        assert consumer._shutdown() == 0
    finally:
        consumer._threads.close()
        consumer._waiter.close()
    assert sent == [(q.keys.ready, "1")]  # one replay, on the queue whose reply was lost
    assert added == [(True, ["lost"])]  # into held slots: no thread may start it
    assert handler.calls == []
    assert sorted(redis_client.lrange(q.keys.ready, 0, -1)) == [b"lost", b"new"]
    assert redis_client.lrange(other.keys.ready, 0, -1) == [b"elsewhere"]
    assert not redis_client.hexists(q.keys.attempts, "lost")  # no attempt used


def test_a_replayed_claim_still_says_when_a_requeued_message_came_back(
    make_queue: Any, manual_clock: ManualClock
) -> None:
    """A claim replayed after its reply was lost (or a pipeline redis-py sent again) returns
    the same messages: with the same ready_since as the claim it replays, or a dead letter
    requeued a day after its due time reads a day late (the +Inf bucket, a flagged queue, a
    failing health probe: see test_a_requeued_dead_letter_is_not_late_from_its_first_due_time)."""
    q = make_queue(max_attempts=1)
    q.schedule("x", id="x")
    q.promote()
    (m,) = q.claim(1)
    q.nack_many([(m, None, "bug")], bury=True)
    manual_clock.advance(ms=86_400_000)
    assert q.requeue("x") == 1
    requeued_at = manual_clock.now_ms()
    claims = ClaimReceipts()
    now = manual_clock.now_ms()
    (first,) = q.claimed(run(q, claims, 1, now=now), now)
    assert first.ready_since_ms == requeued_at
    claims.lost([q.name])  # its reply never arrived: asked again by the same claim id
    (again,) = q.claimed(run(q, claims, 1, now=now), now)
    assert (again.id, again.token) == (first.id, first.token)
    assert again.ready_since_ms == requeued_at
