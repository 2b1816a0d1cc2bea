"""core.scripts.contracts: each script's KEYS and ARGV declared once, said the same in its .lua
header, and its KEYS named once at its top by the same names; calls built from the declaration,
refusing a missing or unexpected name."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources

import pytest
import redis

from django_delayqueue.core import ManualClock, Queue, QueueKeys
from django_delayqueue.core.scripts import loader
from django_delayqueue.core.scripts.contract import Contract
from django_delayqueue.core.scripts.contracts import CANCEL, CLAIM, CONTRACTS, PROMOTE, SCHEDULE
from django_delayqueue.core.scripts.loader import script_names

# A header entry: KEYS[n] or ARGV[n] (n, or a range "n.." / "n..m+k" for a group of any length)
# at the start of a contract line or after two spaces, followed by its description.
_LINE = re.compile(r"^-- (?:KEYS|ARGV)\[")
_CONTINUED = re.compile(r"^--\s{2,}\S")
_ENTRY = re.compile(r"(?:^-- |\s{2,})(KEYS|ARGV)\[([^\]]+)\] ")


@dataclass(frozen=True)
class Entry:
    kind: str  # KEYS or ARGV
    index: str  # "3", or "4.." for a group
    text: str  # its description, continuation lines included

    @property
    def group(self) -> bool:
        return ".." in self.index


def header_entries(name: str) -> list[Entry]:
    """The KEYS and ARGV entries of ``<name>.lua``'s header, in order."""
    lines: list[str] = []
    for line in loader.read_lua(f"{name}.lua").splitlines():
        if _LINE.match(line):
            lines.append(line)
        elif lines and _CONTINUED.match(line) and not line.startswith("--- "):
            lines[-1] += " " + line[2:].strip()
        elif lines:
            break  # the header's contract lines are together
    entries = []
    for line in lines:
        marks = list(_ENTRY.finditer(line))
        for mark, after in zip(marks, [*marks[1:], None], strict=True):
            end = after.start() if after is not None else len(line)
            entries.append(Entry(mark.group(1), mark.group(2), line[mark.end() : end].strip()))
    return entries


def words(text: str) -> set[str]:
    """The words of ``text`` (or of a name, split at "_"), lower case, a plural's "s" dropped."""
    found = re.findall(r"[a-z0-9]+", text.lower().replace("_", " "))
    return {w[:-1] if len(w) > 3 and w.endswith("s") else w for w in found}


# Every name a key may have: a queue's keys, and those its callers give.
KEY_NAMES = sorted(
    {n for n, v in vars(QueueKeys).items() if isinstance(v, property)}
    | {n for contract in CONTRACTS.values() for n in contract.keys}
)


def says(text: str, name: str, vocabulary: Sequence[str]) -> bool:
    """Whether a header entry saying ``text`` names ``name``: all its words are there, and no
    name of ``vocabulary`` with more words is ("ready_since hash" is not ``ready``)."""
    said = words(text)
    fits = [len(words(n)) for n in vocabulary if words(n) <= said]
    return words(name) <= said and len(words(name)) == max(fits)


def test_every_script_has_a_contract_and_every_contract_a_script() -> None:
    assert sorted(CONTRACTS) == script_names()
    assert all(name == contract.name for name, contract in CONTRACTS.items())


def test_every_key_name_is_a_queue_key_or_given_by_name() -> None:
    # A name that is not a QueueKeys property is given by the caller: list them all here, so
    # that a QueueKeys property renamed (or misspelled in a contract) fails this test rather
    # than turning into a key the caller is asked for.
    given = {
        name.lstrip("*")
        for contract in CONTRACTS.values()
        for name in contract.keys
        if not isinstance(getattr(QueueKeys, name.lstrip("*"), None), property)
    }
    assert given == {"record", "records", "receipt", "published", "minute", "minutes"}


@pytest.mark.parametrize("name", script_names())
def test_the_header_says_what_the_contract_declares(name: str) -> None:
    contract = CONTRACTS[name]
    entries = header_entries(name)
    for kind, declared in (("KEYS", contract.keys), ("ARGV", contract.args)):
        said = [e for e in entries if e.kind == kind]
        assert len(said) == len(declared), f"{name}.lua {kind}: {said} against {declared}"
        fixed = [e for e in said if not e.group]
        # Numbered in order from 1; then the groups of any length, the first right after.
        assert [e.index for e in fixed] == [str(i) for i in range(1, len(fixed) + 1)], said
        assert all(e.group for e in said[len(fixed) :]), f"{name}.lua: a fixed {kind} last"
        if len(said) > len(fixed):
            assert said[len(fixed)].index.startswith(f"{len(fixed) + 1}.."), said
        for entry, declared_name in zip(said, declared, strict=True):
            assert entry.group == declared_name.startswith("*"), (entry, declared_name)
            # A group is told from the other groups: its description lists what it holds.
            vocabulary = [
                n
                for n in (KEY_NAMES if kind == "KEYS" else contract.args)
                if n.startswith("*") == entry.group
            ]
            assert says(entry.text, declared_name, vocabulary), (
                f"{name}.lua {kind}[{entry.index}] says {entry.text!r}, "
                f"the contract {declared_name!r}"
            )


def test_the_header_check_catches_names_out_of_order() -> None:
    # What the test above relies on: two names swapped, or one name for another it is part of.
    keys = {e.index: e.text for e in header_entries("claim") if e.kind == "KEYS"}
    assert says(keys["1"], "ready", KEY_NAMES) and says(keys["10"], "ready_since", KEY_NAMES)
    assert not says(keys["10"], "ready", KEY_NAMES)
    assert not says(keys["1"], "unack", KEY_NAMES)
    args = {e.index: e.text for e in header_entries("claim") if e.kind == "ARGV"}
    assert not says(args["1"], "deadline_ms", CLAIM.args)
    assert not says(args["2"], "now_ms", CLAIM.args)


def test_a_group_of_any_length_and_a_range_in_the_header_are_read() -> None:
    entries = header_entries("advance_recurrence")
    assert [e.index for e in entries if e.kind == "ARGV"][-2:] == ["9..8+n", "9+n.."]
    assert [e.index for e in header_entries("send_once") if e.kind == "ARGV"][-3:] == [
        "10",
        "11",
        "12",
    ]  # "(ARGV[10] and ARGV[11]: mode 'task' only)" is a remark, not an entry


def test_a_call_is_built_in_the_declared_order() -> None:
    keys = QueueKeys("dq", "q")
    call = CANCEL.call(
        keys,
        ids=["a", "b"],
        records=[keys.task_result("a"), keys.task_result("b")],
        record_kept_seconds=60,
        journal_max_length=10,
        now_ms=5,
    )
    assert call.script.name == "cancel"
    assert call.keys[:3] == [keys.pending, keys.retry, keys.ready]
    assert call.keys[-3:] == [keys.progress, keys.task_result("a"), keys.task_result("b")]
    assert len(call.keys) == 25
    assert call.args == [5, 10, 60, "a", "b"]
    claim = CLAIM.call(keys, now_ms=1, deadline_ms=2, most_ids=3, limits="", reads_format=2)
    assert (len(claim.keys), claim.args) == (20, [1, 2, 3, "", 2])
    assert claim.keys[-2:] == [keys.key_lists, keys.key_load]
    receipt = keys.claim_receipt("c")
    given = {"receipt": receipt, "claim_id": "7", "replay_only": "0"}
    claim = CLAIM.call(
        keys, now_ms=1, deadline_ms=2, most_ids=3, limits="", reads_format=2, **given
    )
    assert (claim.keys[-1], claim.args) == (receipt, [1, 2, 3, "", 2, "7", "0"])


def test_a_missing_or_unexpected_name_is_refused_naming_the_script() -> None:
    keys = QueueKeys("dq", "q")
    with pytest.raises(TypeError, match=r"promote\.lua: missing limit"):
        PROMOTE.call(keys, now_ms=1)
    with pytest.raises(TypeError, match=r"promote\.lua: unexpected count"):
        PROMOTE.call(keys, now_ms=1, limit=2, count=3)
    with pytest.raises(TypeError, match=r"claim\.lua: missing claim_id, replay_only"):
        CLAIM.call(
            keys, now_ms=1, deadline_ms=2, most_ids=3, limits="", reads_format=2, receipt="r"
        )
    with pytest.raises(TypeError, match=r"schedule\.lua: triples takes a sequence"):
        SCHEDULE.call(keys, now_ms=1, horizon_ms=2, wake_channel="w", triples="abc")
    with pytest.raises(TypeError, match=r"promote\.lua takes a queue's keys"):
        PROMOTE.call(now_ms=1, limit=2)


def test_a_contract_that_cannot_be_followed_is_refused_when_declared() -> None:
    with pytest.raises(ValueError, match="used twice"):
        Contract("s", keys="pending", args="pending")
    with pytest.raises(ValueError, match="only \\*groups may follow"):
        Contract("s", keys="pending", args="*ids now_ms")
    with pytest.raises(ValueError, match="must end their list"):
        Contract("s", keys="pending", args="a b", optional="a")


def test_a_bound_call_runs_what_the_contract_builds(redis_client: redis.Redis) -> None:
    q = Queue(redis_client, "q", clock=ManualClock())
    assert q.scheduling.schedule_one.keys == SCHEDULE.keys_for(q.keys)
    with pytest.raises(TypeError, match=r"cancel\.lua: its keys take"):
        CANCEL.keys_for(q.keys)
    assert q.schedule("x", id="m1").created
    assert redis_client.hexists(q.keys.messages, "m1")


# --- each script names its keys once, at the top ------------------------------------------------
# A script's first code lines (after its header, before its includes) name its KEYS, in order and
# by the contract's names; nothing after them reads KEYS, and no include does: an include's
# functions take the keys they use as parameters, given by those names (schedule_triples(pending,
# ready, ...)).
_PROLOGUE_NAMES = re.compile(r"^local (\w+(?:, \w+)*) = (KEYS\[\d+\](?:, KEYS\[\d+\])*)$")
# A *group of keys: KEYS itself when it holds nothing else, else a copy of its tail (a loop, not
# unpack(), which has a limit on what it returns).
_PROLOGUE_ALL = re.compile(r"^local (\w+) = KEYS$")
_PROLOGUE_TABLE = re.compile(r"^local (\w+) = \{\}$")
_PROLOGUE_FILL = re.compile(r"^for i = (\d+), #KEYS do (\w+)\[i - (\d+)\] = KEYS\[i\] end$")
# A line's code: its comment cut off and its strings emptied. Enough for these files, which hold
# no long strings or block comments (code_lines refuses them).
_TOKEN = re.compile(r"""--.*|'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|[^-'"]+|-""")


def code_of(line: str) -> str:
    """``line`` without its comment, each string in it emptied."""
    parts = []
    for token in _TOKEN.finditer(line):
        text = token.group()
        if text.startswith("--"):
            break
        parts.append("''" if text[0] in "'\"" else text)
    return "".join(parts)


def code_lines(text: str) -> list[tuple[int, str]]:
    """The numbered lines of ``text`` that hold code, as code_of reads them."""
    lines = [(n, code_of(line)) for n, line in enumerate(text.splitlines(), 1)]
    assert not any(
        "[[" in code or "--[[" in line for line in text.splitlines() for code in [code_of(line)]
    ), "a long string or block comment: code_of cannot read it"
    return [(n, code) for n, code in lines if code.strip()]


def key_name_problems(text: str, keys: Sequence[str]) -> list[str]:
    """What is wrong with how script ``text`` names ``keys`` (its contract's KEYS, in order):
    [] when its first code lines name them all, in order, and nothing else reads KEYS."""
    lines = text.splitlines()
    first = 0
    while first < len(lines) and (
        not lines[first].strip()
        or (lines[first].startswith("--") and not lines[first].startswith("--- @include"))
    ):
        first += 1
    named: list[str] = []
    group, problems, at = None, [], first
    while at < len(lines) and group is None:
        line, following = lines[at], lines[at + 1] if at + 1 < len(lines) else ""
        if match := _PROLOGUE_NAMES.match(line):
            names = match.group(1).split(", ")
            indexes = [int(i) for i in re.findall(r"\d+", match.group(2))]
            if len(names) != len(indexes):
                problems.append(f"line {at + 1}: {len(names)} names for {len(indexes)} keys")
            for name, index in zip(names, indexes, strict=False):
                if index != len(named) + 1:
                    problems.append(
                        f"line {at + 1}: {name} is KEYS[{index}], next is {len(named) + 1}"
                    )
                named.append(name)
            at += 1
        elif (match := _PROLOGUE_ALL.match(line)) and not named:
            group, at = match.group(1), at + 1
        elif (match := _PROLOGUE_TABLE.match(line)) and (fill := _PROLOGUE_FILL.match(following)):
            first_index, into, offset = int(fill.group(1)), fill.group(2), int(fill.group(3))
            if into != match.group(1) or (first_index, offset) != (len(named) + 1, len(named)):
                problems.append(f"line {at + 2}: not KEYS[{len(named) + 1}..] into {into}")
            group, at = match.group(1), at + 2
        else:
            break
    fixed = [k for k in keys if not k.startswith("*")]
    groups = [k[1:] for k in keys if k.startswith("*")]
    if named != fixed:
        problems.append(f"the prologue names {named}, the contract {fixed}")
    if [group] != (groups or [None]):
        problems.append(f"the prologue's group is {group}, the contract's {groups}")
    body = "\n".join(lines[at:])
    for n, code in code_lines(body):
        if re.search(r"\bKEYS\b", code):
            problems.append(f"line {at + n} reads KEYS outside the prologue: {code.strip()}")
    return problems


# What declares a name: a local (a function's, with its parameters, which may take lines), a
# function's parameters, a loop's variables.
_DECLARED = re.compile(
    r"\blocal[ \t]+function[ \t]+(\w+)[ \t]*\(([^)]*)\)|\blocal[ \t]+([\w \t,]+)"
    r"|\bfunction[ \t]*\(([^)]*)\)|\bfor[ \t]+([\w \t,]+?)[ \t]*(?:=|\bin\b)"
)
# A name that is read: not a field (after "." or ":"), nor a field named in a table constructor
# (before a lone "=": an assignment to a key's name would fail the prologue check anyway).
_READ = re.compile(r"(?<![.:\w])([a-z_]\w*)\b(?!\s*=[^=])")


def free_names(code: Sequence[str]) -> set[str]:
    """The names the lines ``code`` read and do not declare."""
    text = "\n".join(code)
    declared = {
        name
        for match in _DECLARED.finditer(text)
        for group in match.groups()
        if group
        for name in re.split(r"[\s,]+", group.strip())
    }
    return {m.group(1) for m in _READ.finditer(text)} - declared


def undeclared_keys(path: str) -> set[str]:
    """The key names ``lua/<path>`` reads without declaring them: globals, which Redis refuses
    only when the line that reads one runs."""
    code = [line for _, line in code_lines(loader.read_lua(path))]
    return free_names(code) & {k.lstrip("*") for k in KEY_NAMES}


@pytest.mark.parametrize("name", script_names())
def test_a_script_names_its_keys_once_at_the_top(name: str) -> None:
    assert key_name_problems(loader.read_lua(f"{name}.lua"), CONTRACTS[name].keys) == []


INCLUDES = sorted(
    f"includes/{f.name}"
    for f in resources.files(loader.LUA_PACKAGE).joinpath("includes").iterdir()
    if f.name.endswith(".lua")
)


@pytest.mark.parametrize("path", INCLUDES)
def test_an_include_reads_no_key_by_number(path: str) -> None:
    reads = [code for _, code in code_lines(loader.read_lua(path)) if re.search(r"\bKEYS\b", code)]
    assert reads == []


@pytest.mark.parametrize("path", [*(f"{name}.lua" for name in script_names()), *INCLUDES])
def test_every_key_read_is_declared_where_it_is_read(path: str) -> None:
    # A script reads the names its prologue gives; an include, the keys its functions are given
    # (schedule_triples(pending, ready, ...)). An include's function that read its script's
    # names instead would be a closure over them, its upvalues built at every call: schedule.lua
    # of one message took 8% longer in Redis so (a global, a name not given, fails at run time).
    assert undeclared_keys(path) == set()


def test_the_prologue_check_catches_keys_read_by_number_or_misnamed() -> None:
    header = "-- s: a test\n-- KEYS[1] pending zset   KEYS[2] ready list\n"
    good = header + "local pending, ready = KEYS[1], KEYS[2]\nreturn redis.call('LLEN', ready)\n"
    assert key_name_problems(good, ["pending", "ready"]) == []
    in_body = good + "redis.call('DEL', KEYS[2])  -- KEYS[1] in a comment is fine\n"
    assert key_name_problems(in_body, ["pending", "ready"]) == [
        "line 5 reads KEYS outside the prologue: redis.call('', KEYS[2])"
    ]
    swapped = header + "local ready, pending = KEYS[1], KEYS[2]\n"
    assert key_name_problems(swapped, ["pending", "ready"]) == [
        "the prologue names ['ready', 'pending'], the contract ['pending', 'ready']"
    ]
    after_include = header + '--- @include "includes/guard.lua"\nlocal pending = KEYS[1]\n'
    assert len(key_name_problems(after_include, ["pending"])) == 2  # nothing named, then a read
    aliased = header + "local pending = KEYS[1]\nlocal all = KEYS\n"
    assert key_name_problems(aliased, ["pending"]) == [
        "line 4 reads KEYS outside the prologue: local all = KEYS"
    ]
    group = (
        "local pending = KEYS[1]\nlocal records = {}\n"
        "for i = 2, #KEYS do records[i - 1] = KEYS[i] end\n"
    )
    assert key_name_problems(group, ["pending", "*records"]) == []
    assert key_name_problems("local records = KEYS\nreturn #records\n", ["*records"]) == []
    assert key_name_problems("local records = KEYS\n", ["pending"]) != []
    assert key_name_problems("return redis.call('GET', 'KEYS[1]')\n", []) == []  # a string


def test_the_declaration_check_tells_a_key_given_from_one_read_behind_its_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    text = (
        "local function unused()\n  return redis.call('HLEN', flow_keys)\nend\n"
        "local function tail(ready)  -- a parameter\n  return redis.call('LLEN', ready)\nend\n"
        "local K = {flow_keys = 'f', turns = 't'}  -- a table's fields\n"
        "return redis.call('ZCARD', K.turns) + redis.call('ZCARD', retry)\n"
    )
    monkeypatch.setattr(loader, "read_lua", lambda path: text)
    assert undeclared_keys("includes/a.lua") == {"flow_keys", "retry"}
