"""supervisor/liveness.py: how long a consumer process may be silent, and its heartbeat.

The drills (tests/drills/test_faults_supervisor.py) kill a real process stuck in a call that
holds the GIL; here the rules, and the beats over a real pipe.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import threading

import pytest
from waiting import TIMEOUT

from django_delayqueue.core.consumer.limits.stopped import StoppedHandler
from django_delayqueue.supervisor.liveness import (
    IDLE_SILENCE_SECONDS,
    SHORTEST_SILENCE_SECONDS,
    Heartbeat,
    Held,
    Holding,
    QueueLimits,
    answer_within,
    beat_period,
)
from django_delayqueue.supervisor.protocol import ALIVE, READY, ChildChannel, LineReader


def _held(**fields: object) -> Held:
    defaults: dict[str, object] = {
        "queue": "q",
        "message_id": "m1",
        "token": "7",
        "attempt": 1,
    }
    return Held(**{**defaults, **fields})  # type: ignore[arg-type]


def test_a_process_on_long_leases_may_be_busy_as_long_as_its_leases_allow() -> None:
    """A handler of a queue with ten-minute leases holds the GIL for a minute: nothing is at
    risk, so the process is not killed (it was at 30 s, and its message dead-lettered after
    max_attempts such kills)."""
    assert answer_within([], []) == (IDLE_SILENCE_SECONDS, "a silent process")
    within, why = answer_within([QueueLimits("reports", 600.0)], [])
    assert within == pytest.approx(600 - 200 - 0.2 - 1)
    assert why == "a lease of queue reports (600 s visibility timeout)"


def test_every_queue_it_consumes_bounds_the_silence_by_what_a_lease_has_left() -> None:
    """A lease renewed every third of the visibility timeout (and a tick) has at least two
    thirds of it left: the process must answer a second before that, held messages or not
    (it may claim one the instant after a beat)."""
    within, why = answer_within([QueueLimits("slow", 60.0), QueueLimits("fast", 30.0)], [])
    assert within == pytest.approx(30 - 10 - 0.2 - 1)
    assert why == "a lease of queue fast (30 s visibility timeout)"


def test_a_running_handler_s_time_limit_bounds_the_silence_by_the_limit_and_a_margin() -> None:
    # A queue's time limit alone does not: it says nothing of another queue's handler that
    # holds the GIL (a 7 s report beside a 5 s SMS queue was killed at 7 s).
    within, why = answer_within([QueueLimits("q", 60.0, time_limit=5.0)], [])
    assert why == "a lease of queue q (60 s visibility timeout)"
    # A running handler: what is left of its limit; not once it was stopped (reported).
    running = [_held(time_limit=5.0, limit_in=1.5), _held(token="8", limit_in=-9, stopped=True)]
    within, why = answer_within([QueueLimits("q", 60.0, time_limit=5.0)], running)
    assert within == 3.5 and why == "the time limit of message m1 (5 s)"


def test_the_silence_asked_for_never_falls_under_a_floor_a_healthy_process_keeps() -> None:
    assert answer_within([QueueLimits("q", 1.0)], [])[0] == SHORTEST_SILENCE_SECONDS
    assert answer_within([], [_held(time_limit=1.0, limit_in=-30)])[0] == SHORTEST_SILENCE_SECONDS
    assert beat_period(SHORTEST_SILENCE_SECONDS) == SHORTEST_SILENCE_SECONDS / 4
    assert beat_period(IDLE_SILENCE_SECONDS) == 1.0


def test_a_beat_of_another_release_is_read_or_refused_never_raised_into_the_loop() -> None:
    """A fresh interpreter after SIGHUP runs the code on disk: its running handlers may carry
    a field this supervisor does not know (left out), or lack one it needs (ValueError, which
    the loop logs and skips, rather than a TypeError that ended runqueue)."""
    fields = {"queue": "q", "message_id": "m1", "token": "7", "attempt": 1}
    assert Held.from_json({**fields, "started_ms": 123}) == _held()
    with pytest.raises(ValueError, match="cannot read"):
        Held.from_json({"queue": "q"})
    with pytest.raises(ValueError, match="cannot read"):
        Held.from_json({**fields, "token": 7})
    stopped = StoppedHandler("q", "m1", "7", 2, "retry", "time limit exceeded (2 s)", False)
    data = json.loads(stopped.to_json())
    assert StoppedHandler.from_json(json.dumps({**data, "later": 1})) == stopped


def test_a_killed_process_s_messages_are_settled_as_a_stop_would_have() -> None:
    held = _held(attempt=2, task=True, time_limit=2.0)
    assert held.stopped_handler(True, 3.0) == StoppedHandler(
        "q", "m1", "7", 2, "retry", "time limit exceeded (2 s)", True
    )
    silent = held.stopped_handler(False, 3.04)
    assert (silent.settlement, silent.reason) == (
        "retry",
        "its consumer process stopped answering (3.0 s) and was killed",
    )
    aborted = _held(abort="staff said so", time_limit=2.0).stopped_handler(True, 3.0)
    assert (aborted.settlement, aborted.reason) == ("dead", "aborted: staff said so")
    assert Held.from_json(json.loads(json.dumps(held.to_json()))) == held


def _pipe() -> tuple[LineReader, ChildChannel]:
    r, w = os.pipe()
    os.set_blocking(r, False)
    return LineReader(r), ChildChannel(w)


def test_a_beat_names_the_running_handlers_only_when_they_changed() -> None:
    reader, channel = _pipe()
    holding = Holding([QueueLimits("q", 30.0)], [_held(time_limit=10.0, limit_in=9.0)])
    beats = Heartbeat(channel, lambda: holding)
    assert beats.beat() == 1.0
    first = reader.read()
    assert [m["kind"] for m in first] == [ALIVE]
    assert first[0]["within"] == 11.0 and [Held.from_json(h) for h in first[0]["running"]] == [
        holding.running[0]
    ]
    holding = Holding([QueueLimits("q", 30.0)], [_held(time_limit=10.0, limit_in=8.0)])
    beats.beat()
    (second,) = reader.read()
    assert "running" not in second and second["within"] == 10.0  # only its time moved
    holding = Holding([QueueLimits("q", 30.0)], [])
    beats.beat()
    assert reader.read()[0]["running"] == []
    os.close(channel.fd)
    reader.close()


def test_a_beat_that_cannot_read_the_process_still_beats_with_the_shortest_wait() -> None:
    reader, channel = _pipe()

    def broken() -> Holding:
        raise RuntimeError("a bug")

    assert Heartbeat(channel, broken).beat() == beat_period(SHORTEST_SILENCE_SECONDS)
    (beat,) = reader.read()
    assert beat["within"] == SHORTEST_SILENCE_SECONDS
    os.close(channel.fd)
    reader.close()


def test_two_writers_never_interleave_their_lines() -> None:
    """The loop thread and the heartbeat write on one pipe: lines longer than an atomic pipe
    write (PIPE_BUF) arrive whole all the same."""
    reader, channel = _pipe()
    long = "x" * 20_000
    count = 50

    def write(name: str) -> None:
        for i in range(count):
            channel.send(ALIVE, writer=name, n=i, padding=long)

    writers = [threading.Thread(target=write, args=(name,)) for name in ("loop", "beat")]
    for thread in writers:
        thread.start()
    got: list[dict[str, object]] = []
    while len(got) < 2 * count:
        select.select([reader.fd], [], [], 5)
        got += reader.read()
    for thread in writers:
        thread.join()
    for name in ("loop", "beat"):
        assert [m["n"] for m in got if m["writer"] == name] == list(range(count))
    assert all(m["padding"] == long for m in got)
    os.close(channel.fd)
    reader.close()


def _full_pipe() -> tuple[LineReader, int]:
    """A pipe the supervisor does not read (it is settling on a Redis that is down): full,
    its write end blocking as a child's pipe was."""
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    for line in (b"x" * 999 + b"\n", b"\n"):  # lines no one can read as a message
        with contextlib.suppress(BlockingIOError):
            while True:
                os.write(w, line)
    os.set_blocking(w, True)
    return LineReader(r), w


def _drain(reader: LineReader, until: str) -> list[dict[str, object]]:
    got: list[dict[str, object]] = []
    while not any(m["kind"] == until for m in got):
        select.select([reader.fd], [], [], TIMEOUT)
        got += reader.read()
    return got


def test_a_beat_on_a_full_pipe_is_dropped_and_never_holds_up_the_loop_thread() -> None:
    """Before: the heartbeat thread blocked in its write, holding the channel's lock, and the
    loop thread's next message (ready, recycle, a stopped handler) waited on that lock: the
    consumer's loop stood still until the supervisor read again."""
    reader, w = _full_pipe()
    channel = ChildChannel(w)
    beats = Heartbeat(channel, lambda: Holding([QueueLimits("q", 30.0)], [_held()]))
    beaten = threading.Event()
    loop_thread = threading.Thread(target=lambda: channel.send(READY), daemon=True)
    try:
        threading.Thread(target=lambda: (beats.beat(), beaten.set()), daemon=True).start()
        assert beaten.wait(TIMEOUT), "the beat waited for room in the pipe"
        loop_thread.start()  # waits for room, as it must: its message has to arrive
        got = _drain(reader, READY)
        loop_thread.join(TIMEOUT)
        assert not loop_thread.is_alive()
        assert [m["kind"] for m in got] == [READY]  # the beat was dropped, not kept
        beats.beat()  # the next one says it all: its running handlers too
        (beat,) = _drain(reader, ALIVE)
        assert [Held.from_json(h) for h in beat["running"]] == [_held()]  # type: ignore[union-attr]
    finally:
        os.close(w)
        reader.close()


def test_a_beat_begun_on_a_nearly_full_pipe_is_finished_before_the_next_line() -> None:
    reader, w = _full_pipe()
    channel = ChildChannel(w)
    os.read(reader.fd, 8192)  # room for part of a long beat
    long = "y" * 30_000
    try:
        assert not channel.offer(ALIVE, padding=long)  # begun, not finished
        sender = threading.Thread(target=lambda: channel.send(READY), daemon=True)
        sender.start()
        got = [m for m in _drain(reader, READY) if m["kind"] in (ALIVE, READY)]
        sender.join(TIMEOUT)
        assert [m["kind"] for m in got] == [ALIVE, READY]
        assert got[0]["padding"] == long
    finally:
        os.close(w)
        reader.close()
