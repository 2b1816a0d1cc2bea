"""Flow keys at their edges: key limits edited live, due order within a key when an earlier
message is not promoted yet, the key hold kept for consumers still waiting, a replace that
meets an older promote."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from django_delayqueue.core import ManualClock, Queue


@pytest.fixture
def q(make_queue: Callable[..., Queue]) -> Queue:
    return make_queue("sms", visibility_timeout=30, backoff_base=0, backoff_max=0)


def claim_raw(q: Queue, count: int) -> tuple[list[str], int | None]:
    raw = q.claim_call(q.clock.now_ms(), count).run(q.client)
    return [m.id for m in q.claimed(raw, q.clock.now_ms())], q.claim_hold(raw)


def test_a_key_rate_limit_cleared_live_frees_the_keys_waiting_for_a_token(q: Queue) -> None:
    # docs/flow-control.md: the key limits are "followed live by running consumers".
    q.settings = q.settings.replace(key_rate_limit="1/h")
    first = q.schedule("a", key="+33600000000").id
    second = q.schedule("b", key="+33600000000").id
    assert claim_raw(q, 10)[0] == [first]
    assert claim_raw(q, 10)[0] == []  # the key waits an hour for its next token
    q.settings = q.settings.replace(key_rate_limit=None)  # staff clear the limit
    assert claim_raw(q, 10)[0] == [second]


def test_a_key_rate_limit_raised_live_does_not_wait_out_the_old_spacing(
    q: Queue, manual_clock: ManualClock
) -> None:
    q.settings = q.settings.replace(key_rate_limit="1/h")
    first = q.schedule("a", key="k").id
    second = q.schedule("b", key="k").id
    assert claim_raw(q, 10)[0] == [first]
    assert claim_raw(q, 10)[0] == []
    q.settings = q.settings.replace(key_rate_limit="100/s")
    taken, hold = claim_raw(q, 10)  # what was owed (an hour) is rescaled: 10 ms
    assert taken == [] and hold is not None and hold <= manual_clock.now_ms() + 10
    manual_clock.advance(0.01)
    assert claim_raw(q, 10)[0] == [second]


def test_due_order_within_a_key_when_an_earlier_message_is_not_promoted_yet(
    q: Queue, manual_clock: ManualClock
) -> None:
    # "order of due times is kept within a key" (issue 27; docs/flow-control.md).
    earlier = q.schedule("due first", delay=1, key="store-42").id
    manual_clock.advance(5)  # due, but no consumer has promoted it yet (busy, restarting)
    later = q.schedule("due now", key="store-42").id
    q.promote()
    assert [m.id for m in q.claim(10)] == [earlier, later]


def test_a_claim_that_got_all_it_wanted_keeps_the_key_hold_of_the_consumers_still_waiting(
    q: Queue,
) -> None:
    # A consumer whose claim found only a key out of slots sleeps until a slot frees
    # (slot_freed.lua wakes it while the limiter says 'key'). Another consumer's claim that gets
    # all it asks for (here an unkeyed message) must not clear that hold while the key still
    # waits for its slot: the wake of the slot's end would be lost (the max_in_flight hold is
    # kept so, flow_limits.lua's flow_taken).
    from django_delayqueue.core.scripts.contracts import SLOT_FREED

    q.settings = q.settings.replace(key_concurrency=1)
    q.schedule("a1", key="a")
    q.schedule("a2", key="a")
    (running,) = q.claim(1)  # a1 holds key a's slot
    taken, hold = claim_raw(q, 5)  # consumer 2: only a2, which waits for the slot
    assert taken == [] and hold == -1
    q.schedule("plain")
    taken, hold = claim_raw(q, 1)  # consumer 3 gets all it wanted
    assert len(taken) == 1 and hold is None
    q.ack(running)
    woken = SLOT_FREED.call(q.keys, wake_channel=q.keys.wake_channel, now_ms=q.clock.now_ms()).run(
        q.client
    )
    assert woken == 1  # consumer 2 is woken to claim a2


def test_a_replace_of_a_keyed_message_an_older_promote_put_in_the_list_leaves_one_copy(
    q: Queue, manual_clock: ManualClock
) -> None:
    # Rolling deploy: a consumer of the release before keys promotes a keyed message to the
    # ready list (it knows no key lists). A replace then must take it out of that list, as
    # cancel does, or the id is claimed twice.
    q.schedule("old", id="m", delay=1, key="k")
    manual_clock.advance(2)
    q.client.zrem(q.keys.pending, "m")  # promote.lua of the previous release
    q.client.rpush(q.keys.ready, "m")
    q.schedule("new", id="m", key="k", replace=True)
    claimed = q.claim(10)
    assert [(m.id, m.payload) for m in claimed] == [("m", "new")]
