"""The writes finished deliveries left for their ack (a task's result), merged per script.

A round of task results costs one EVALSHA and two arguments per task when their script allows
it (``MERGEABLE_SCRIPTS``), not one call each: see :mod:`.recording`, which sends them before
the acks.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

from django_delayqueue.core.consumer.outcomes import Outcome
from django_delayqueue.core.scripts.calls import ScriptCall
from django_delayqueue.core.scripts.contracts import WRITE_RECORDS


class CarriesOutcome(Protocol):
    """What the recorder keeps per outcome (its entries): the outcome and its writes."""

    @property
    def outcome(self) -> Outcome: ...


E = TypeVar("E", bound=CarriesOutcome)


# Scripts whose call writes KEYS[i] with ARGV[i] alone and replies with a list of one reply
# per key (an error among them failing its own write only): calls of one queue merge into one.
MERGEABLE_SCRIPTS = frozenset({WRITE_RECORDS.name})


def is_merged(entry: CarriesOutcome) -> bool:
    writes = entry.outcome.writes
    return writes is not None and writes.call.script.name in MERGEABLE_SCRIPTS


def merged_writes(entries: list[E]) -> list[tuple[ScriptCall, list[E]]]:
    """The calls that send the writes of ``entries`` (one queue's), and the entries each
    carries: those of a mergeable script as one call (a round of task results costs one
    EVALSHA and two arguments per task, not six), the others one each, in order."""
    calls: list[tuple[ScriptCall, list[E]]] = []
    merged: dict[str, tuple[list[Any], list[Any], list[E]]] = {}
    for e in entries:
        writes = e.outcome.writes
        assert writes is not None
        call = writes.call
        if call.script.name not in MERGEABLE_SCRIPTS:
            calls.append((call, [e]))
            continue
        found = merged.get(call.script.name)
        if found is None:
            found = merged[call.script.name] = ([], [], [])
            calls.append((ScriptCall(call.script, found[0], found[1]), found[2]))
        found[0].extend(call.keys)
        found[1].extend(call.args)
        found[2].append(e)
    return calls
