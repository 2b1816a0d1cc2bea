"""supervisor/start_marks.py: the table a consumer process marks what it claimed and has not
started in, and that its supervisor reads once the process is gone.

The drill (tests/drills/test_faults_supervisor.py) kills a real process stuck in a call that
holds the GIL with messages claimed ahead; here the table itself, across a real fork.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator

import pytest

from django_delayqueue.core import Message
from django_delayqueue.supervisor.start_marks import (
    SLOT_SIZE,
    SLOTS,
    TABLE_SIZE,
    TEXT_SIZE,
    MarkTable,
    StartMarkTable,
    Unstarted,
)


def _message(
    mid: str, token: str, queue: str = "q", attempt: int = 1, since: int | None = None
) -> Message:
    return Message(mid, queue, None, 0, 0, attempt, token, ready_since_ms=since)


@pytest.fixture
def table() -> Iterator[MarkTable]:
    made = MarkTable.create()
    yield made
    made.close()


def _child_side(table: MarkTable) -> StartMarkTable:
    marks = StartMarkTable.open(os.dup(table.fd))  # open() closes the descriptor it is given
    assert marks is not None
    return marks


def test_what_is_marked_and_not_cleared_is_read_back_whole(table: MarkTable) -> None:
    marks = _child_side(table)
    marks.mark(
        [
            _message("m1", "11", attempt=2, since=1_700_000_000_123),
            _message("m2", "12"),
            _message("idé", "13", queue="orders#2", attempt=3),
        ]
    )
    marks.clear(_message("m2", "12"))
    marks.clear(_message("m9", "99"))  # never marked: nothing happens
    assert marks.marked() == 2
    assert table.read(pid=42) == [
        Unstarted("q", "m1", "11", 1_700_000_000_123, 42),
        Unstarted("orders#2", "idé", "13", None, 42),
    ]
    released = table.read(pid=42)[0].message()
    assert (released.id, released.token, released.ready_since_ms) == ("m1", "11", 1_700_000_000_123)


def test_a_cleared_slot_is_used_again_and_reads_as_the_new_mark(table: MarkTable) -> None:
    marks = _child_side(table)
    marks.mark([_message("a-long-first-id", "1")])
    marks.clear(_message("a-long-first-id", "1"))
    marks.mark([_message("b", "2")])  # the same slot: no trace of the longer id before it
    assert [(u.message_id, u.token) for u in table.read(pid=1)] == [("b", "2")]


def test_the_same_token_on_two_queues_is_two_marks(table: MarkTable) -> None:
    marks = _child_side(table)
    marks.mark([_message("a", "1", queue="q1"), _message("b", "1", queue="q2")])
    marks.clear(_message("a", "1", queue="q1"))
    assert [(u.queue, u.message_id) for u in table.read(pid=1)] == [("q2", "b")]


def test_a_full_table_marks_nothing_more_until_a_mark_is_cleared(table: MarkTable) -> None:
    """No slot free: that message is not marked (a kill charges it, as without marks)."""
    marks = _child_side(table)
    marks.mark([_message(f"m{i}", str(i)) for i in range(SLOTS + 5)])
    assert marks.marked() == SLOTS
    assert len(table.read(pid=1)) == SLOTS
    marks.clear(_message("m3", "3"))
    marks.mark([_message("late", "9999")])
    ids = {u.message_id for u in table.read(pid=1)}
    assert "late" in ids and "m3" not in ids and f"m{SLOTS}" not in ids and len(ids) == SLOTS


def test_names_too_long_for_a_slot_are_not_marked_and_the_others_are(table: MarkTable) -> None:
    marks = _child_side(table)
    long_id = "é" * 200  # 200 characters, the longest id, 400 bytes of UTF-8
    fits = "x" * (TEXT_SIZE - len("\x1fq\x1f7\x1f"))
    marks.mark([_message(long_id, "5"), _message("short", "6"), _message(fits, "7")])
    assert [u.message_id for u in table.read(pid=1)] == ["short", fits]
    marks.clear(_message(long_id, "5"))  # nothing to clear
    assert marks.marked() == 2


def test_the_supervisor_reads_what_a_forked_child_left_after_it_is_reaped(
    table: MarkTable,
) -> None:
    """Across a real fork, as the supervisor and its child: the child marks, clears one (its
    handler started) and dies without a word; the parent reads the rest."""
    pid = os.fork()
    if pid == 0:  # the child: never back into pytest
        try:
            marks = StartMarkTable.open(table.fd)
            assert marks is not None
            marks.mark([_message("ahead", "1"), _message("running", "2")])
            marks.clear(_message("running", "2"))
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert [u.message_id for u in table.read(pid)] == ["ahead"]
    assert table.read(pid)[0].pid == pid


def test_a_table_of_another_layout_is_not_used(table: MarkTable) -> None:
    """A fresh interpreter of another release after a SIGHUP: it marks nothing, rather than
    writing what its supervisor would misread."""
    os.pwrite(table.fd, b"DQMARKS0", 0)
    assert StartMarkTable.open(os.dup(table.fd)) is None
    assert table.read(pid=1) == []


def test_a_slot_whose_state_byte_was_not_written_is_not_read(table: MarkTable) -> None:
    """A process killed between a mark's fields and its state byte: that slot reads as free."""
    marks = _child_side(table)
    marks.mark([_message("m1", "1")])
    view = mmap.mmap(os.dup(table.fd), TABLE_SIZE)
    first = TABLE_SIZE - SLOTS * SLOT_SIZE
    view[first] = 0
    assert table.read(pid=1) == []


def test_an_id_holding_the_separator_is_read_whole(table: MarkTable) -> None:
    """Ids written by other producers (a script, another language) may hold anything: the id
    comes last in a slot, so it is read back whole."""
    marks = _child_side(table)
    marks.mark([_message("a\x1fb\x1fc", "1", since=5)])
    assert table.read(pid=1) == [Unstarted("q", "a\x1fb\x1fc", "1", 5, 1)]
