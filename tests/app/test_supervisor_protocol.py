"""supervisor/protocol.py: messages from a child, whole lines over a pipe."""

from __future__ import annotations

import os

from django_delayqueue.core.consumer.limits.stopped import StoppedHandler
from django_delayqueue.supervisor.protocol import READY, STOPPED, ChildChannel, LineReader


def test_messages_arrive_whole_and_eof_is_seen() -> None:
    r, w = os.pipe()
    os.set_blocking(r, False)
    reader, channel = LineReader(r), ChildChannel(w)
    stopped = StoppedHandler("q", "id-1", "7", 2, "retry", "time limit exceeded (5 s)")
    channel.send(READY)
    os.write(w, b'{"kind": "rec')  # a line cut in two by the pipe
    assert [m["kind"] for m in reader.read()] == [READY]
    os.write(w, b'ycle"}\n')
    channel.send(STOPPED, handlers=[stopped.to_json()] * 300)  # longer than a pipe write
    messages = reader.read()
    assert [m["kind"] for m in messages] == ["recycle", STOPPED]
    assert [StoppedHandler.from_json(h) for h in messages[1]["handlers"]] == [stopped] * 300
    assert not reader.closed
    os.close(w)
    assert reader.read() == [] and reader.closed
    reader.close()
