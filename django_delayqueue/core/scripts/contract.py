"""A script's contract: its KEYS and ARGV by name, in order, and the calls built from it.

Each script's contract is declared once (``contracts.py``); each ``.lua`` file opens with the
same contract in words (``-- KEYS[1] ready list   KEYS[2] unack zset ...``), then names its keys
once, by the same names, before anything else (``local ready, unack = KEYS[1], KEYS[2]``): its
body, and the includes it names, read ``ready``, never ``KEYS[1]``. Both are checked against the
declaration by tests/core/test_core_scripts_contracts.py. Every call is built from it::

    PROMOTE.call(queue.keys, now_ms=now, limit=100)

A key name that is a :class:`~django_delayqueue.core.keys.QueueKeys` property (``ready``,
``unack``...) is filled from the queue's keys; any other key (a task's ``record``, a consumer's
claim ``receipt``) and every argument is given by keyword. A name starting with ``*`` takes a
sequence of any length, spread in place (ids, pairs of id and token); only such groups may
follow one. ``optional`` names are given all together or not at all (they end their lists).
A missing or unexpected name is a TypeError naming the script.

Building a call costs no more than the hand-built lists it replaced: how is worked out once per
contract (which names come from the queue's keys, which are given, where groups spread), and a
queue's keys are spelled once per contract, not on every call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any

from django_delayqueue.core.client import RedisClient
from django_delayqueue.core.keys import QueueKeys
from django_delayqueue.core.scripts.calls import LuaScript, ScriptCall
from django_delayqueue.core.scripts.fast_path import BoundScript

# Queues whose keys a contract keeps spelled (far more than any site has; a test may make more).
_MOST_QUEUES_KEPT = 10_000


def _names(value: str | Sequence[str]) -> tuple[str, ...]:
    return tuple(value.split()) if isinstance(value, str) else tuple(value)


def _is_queue_key(name: str) -> bool:
    return isinstance(getattr(QueueKeys, name, None), property)


class _Plan:
    """How one shape of a contract's call is built (with or without its optional names)."""

    def __init__(self, script: str, keys: Sequence[str], args: Sequence[str]) -> None:
        self.script = script
        given = [n for n in keys if not _is_queue_key(n)]
        self.names = frozenset(n.lstrip("*") for n in (*given, *args))  # what a caller names
        lead = []
        for name in keys:
            if not _is_queue_key(name):
                break
            lead.append(name)
        self._lead = tuple(lead)
        # The queue's keys that come first, per queue: spelled once, not on every call.
        self._lead_of: dict[QueueKeys, tuple[str, ...]] = {}
        self.rest_keys = tuple(
            (n.lstrip("*"), n.startswith("*"), _is_queue_key(n)) for n in keys[len(lead) :]
        )
        self.fixed_args = tuple(n for n in args if not n.startswith("*"))
        self.spread_args = tuple(n[1:] for n in args if n.startswith("*"))

    def keys(self, queue_keys: QueueKeys | None, values: Mapping[str, Any]) -> list[str]:
        out: list[str] = []
        if self._lead:
            assert queue_keys is not None  # Contract._plan checked
            lead = self._lead_of.get(queue_keys)
            if lead is None:
                if len(self._lead_of) >= _MOST_QUEUES_KEPT:
                    self._lead_of.clear()
                lead = self._lead_of[queue_keys] = tuple(getattr(queue_keys, n) for n in self._lead)
            out += lead
        for name, spread, from_queue in self.rest_keys:
            if from_queue:
                out.append(getattr(queue_keys, name))
            elif spread:
                out += _spread(values[name], self.script, name)
            else:
                out.append(values[name])
        return out

    def args(self, values: Mapping[str, Any]) -> list[Any]:
        out = [values[name] for name in self.fixed_args]
        for name in self.spread_args:
            out += _spread(values[name], self.script, name)
        return out


def _spread(value: Any, script: str, name: str) -> Sequence[Any]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{script}.lua: {name} takes a sequence of values, not {value!r}")
    return value


class Contract:
    """The KEYS and ARGV of script ``script`` (``lua/<script>.lua``), by name and in order."""

    def __init__(
        self,
        script: str,
        *,
        keys: str | Sequence[str],
        args: str | Sequence[str] = (),
        optional: str | Sequence[str] = (),
    ) -> None:
        self.name = script
        self.keys = _names(keys)
        self.args = _names(args)
        self.optional = _names(optional)
        bare = [n.lstrip("*") for n in (*self.keys, *self.args)]
        if len(set(bare)) != len(bare):
            raise ValueError(f"{script}: a name is used twice in {bare}")
        for names in (self.keys, self.args):
            spread = [n.startswith("*") for n in names]
            if True in spread and not all(spread[spread.index(True) :]):
                raise ValueError(f"{script}: only *groups may follow a *group: {names}")
            tail = [n for n in names if n.lstrip("*") in self.optional]
            if tail and list(names[-len(tail) :]) != tail:
                raise ValueError(f"{script}: optional names must end their list: {names}")
        unknown = set(self.optional) - set(bare)
        if unknown:
            raise ValueError(f"{script}: optional names {sorted(unknown)} are not declared")
        self._full = _Plan(script, self.keys, self.args)
        self._short = _Plan(
            script,
            [n for n in self.keys if n.lstrip("*") not in self.optional],
            [n for n in self.args if n.lstrip("*") not in self.optional],
        )
        self._needs_queue = any(_is_queue_key(n) for n in self.keys)

    def __repr__(self) -> str:
        return f"<Contract {self.name}: KEYS {self.keys} ARGV {self.args}>"

    @cached_property
    def script(self) -> LuaScript:
        return LuaScript.named(self.name)

    def call(self, queue_keys: QueueKeys | None = None, /, **values: Any) -> ScriptCall:
        """The call of this script with the keys of ``queue_keys`` and the names given."""
        plan = self._plan(queue_keys, values)
        return ScriptCall(self.script, plan.keys(queue_keys, values), plan.args(values))

    def keys_for(self, queue_keys: QueueKeys, **given_keys: Any) -> list[str]:
        """The KEYS of a call (without its optional keys), ``given_keys`` named as declared."""
        wanted = {n for n in self.keys if not _is_queue_key(n) and n not in self.optional}
        if given_keys.keys() != wanted:  # a *group of keys (one per id) is not known yet
            raise TypeError(f"{self.name}.lua: its keys take {sorted(wanted) or 'no name'}")
        return self._short.keys(queue_keys, given_keys)

    def bind(self, client: RedisClient, queue_keys: QueueKeys, **given_keys: Any) -> BoundScript:
        """This script on ``client`` with its keys bound, for a per-message path: the bound
        script takes the arguments positionally, in the order of :attr:`args`."""
        return BoundScript(self.script, client, self.keys_for(queue_keys, **given_keys))

    def _plan(self, queue_keys: QueueKeys | None, values: Mapping[str, Any]) -> _Plan:
        if values.keys() == self._short.names:
            plan = self._short
        elif values.keys() == self._full.names:
            plan = self._full
        else:
            raise TypeError(self._mismatch(values))
        if queue_keys is None and self._needs_queue:
            raise TypeError(f"{self.name}.lua takes a queue's keys: give its QueueKeys")
        return plan

    def _mismatch(self, values: Mapping[str, Any]) -> str:
        given = set(values)
        expected = self._full.names if given & set(self.optional) else self._short.names
        missing, extra = sorted(expected - given), sorted(given - expected)
        parts = [f"missing {', '.join(missing)}" if missing else ""]
        parts.append(f"unexpected {', '.join(extra)}" if extra else "")
        if self.optional and given & set(self.optional):
            parts.append(f"({', '.join(self.optional)} go together)")
        return f"{self.name}.lua: " + "; ".join(p for p in parts if p)
