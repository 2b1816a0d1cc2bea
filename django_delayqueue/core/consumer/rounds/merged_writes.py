"""The writes a round's outcomes left for their acks (``WritesWithAck``), merged: the task results
of one queue go as one write_records.lua call, whose reply is read here.

A consumer packs every argument of its pipeline and parses every reply in Python, on the thread
that also claims, under the GIL its handler threads share: so a round of task results costs one
EVALSHA, a key per task and one argument and one reply for them all (the writes joined by
newlines, the replies a string of one character each), not an argument and a reply per task.
"""

from __future__ import annotations

from typing import Any

from django_delayqueue.core.scripts.calls import ScriptCall
from django_delayqueue.core.scripts.contracts import WRITE_RECORDS

# Scripts whose call writes KEYS[i] with the i-th line of ARGV[1] alone and replies as
# record_replies reads (an error among them failing its own write only): calls of one queue
# merge into one.
MERGEABLE_SCRIPTS = frozenset({WRITE_RECORDS.name})


def is_merged(entry: Any) -> bool:
    """Whether ``entry``'s (an outcome's) write is one of a mergeable script."""
    writes = entry.outcome.writes
    return writes is not None and writes.call.script.name in MERGEABLE_SCRIPTS


def merged_writes(entries: list[Any]) -> list[tuple[ScriptCall, list[Any]]]:
    """The calls that send the writes of ``entries`` (one queue's outcomes with writes), and
    the entries each carries: those of a mergeable script as one call, the others one each,
    in order. A write with a newline of its own (JSON escapes them, but a success's compact
    text holds its worker id as it is, and a --name may hold one) goes alone, as the one line
    of its call."""
    calls: list[tuple[ScriptCall, list[Any]]] = []
    merged: dict[str, tuple[list[str], list[str], list[Any]]] = {}
    for e in entries:
        call = e.outcome.writes.call
        name = call.script.name
        if name not in MERGEABLE_SCRIPTS or len(call.args) != 1 or "\n" in call.args[0]:
            calls.append((call, [e]))
            continue
        found = merged.get(name)
        if found is None:
            found = merged[name] = ([], [], [])
            calls.append((ScriptCall(call.script, found[0], found[1]), found[2]))
        found[0].extend(call.keys)
        found[1].append(call.args[0])
        found[2].append(e)
    for _, writes, _ in merged.values():
        writes[:] = ["\n".join(writes)]
    return calls


_CODES = {ord("1"): 1, ord("0"): 0, ord("-"): -1}
_ERROR = ord("e")


def record_replies(result: Any, count: int) -> list[Any]:
    """Per write of a write_records.lua call of ``count`` writes, what write_record.lua would
    have replied to it alone (1, 0, -1, or its error); the call's error for each if it failed
    as a whole (``result`` an exception, or a reply not understood)."""
    codes = result[0] if isinstance(result, list) and result else None
    if isinstance(codes, str):
        codes = codes.encode()
    if not isinstance(codes, bytes) or len(codes) != count:
        return [result] * count
    if codes == b"1" * count:  # the common round: every record written in order
        return [1] * count
    errors = iter(result[1:])
    return [next(errors, None) if c == _ERROR else _CODES.get(c) for c in codes]
