"""Every shell and Python block of README.md (and of docs/*.md) runs, so no example rots.

Blocks fenced as ```bash, ```sh or ```shell run with ``bash -euo pipefail`` from the repository
root, with ``python`` on PATH being this interpreter, ``REDIS_URL`` the session's private Redis,
the demo settings and a migrated database of the test's own (``DEMO_DB``). A path under ``/tmp/``
in a block is replaced by a temporary directory of the test's, so examples that write to
``/tmp/shop`` never touch a shared ``/tmp``. A block fails on a non-zero exit, on no exit within
``SHELL_TIMEOUT`` (a bound against hangs, not a timing check), or when it leaves something
new in the repository root. Its output traces each command with its line in the file.

Blocks fenced as ```python run in the demo project's Django context (demo_project.settings, the
test database, the private Redis), each in a fresh namespace, so each block must import what it
uses. A block whose first line names a file of an app (``# shop/views.py``) runs as that module
of the app, with the demo's apps importable by their short names, so ``from .models import
Order`` finds the demo shop's ``Order``. Names used inside the functions a block defines must
resolve too (an undefined name would only fail when the function is called), and a block that
defines ``DELAYQUEUE`` must pass the app's settings checks. Receivers a block connects are
disconnected afterwards.

Other fences (no language, text, the state diagram...) are not run.

Convention: HTML comments on the lines right above a fence (invisible on GitHub and PyPI), one
directive each, every one with its reason in parentheses::

    <!-- readme-test: skip (installs from PyPI) -->
        not run; the reason is the skip reason pytest prints. Only for what cannot run on a test
        machine (installs from a registry) or must not run inside the test suite (`make test`,
        `make demo`: a shell block running those without this directive fails).
    <!-- readme-test: burst (runqueue runs until stopped) -->
        each `manage.py runqueue` command of the block gets `--burst`: it delivers what is due
        and exits 0, instead of running until Ctrl-C.
    <!-- readme-test: replace "OLD" "NEW" (why) -->
        replace the text OLD (which must occur) by NEW before running, e.g. a smaller size.
    <!-- readme-test: slow (why) -->
        mark the block's test ``slow`` (``-m "not slow"`` leaves it out).

An unknown directive, one without a reason, or one that is not right above a fence fails.
"""

from __future__ import annotations

import ast
import builtins
import os
import re
import shlex
import signal
import subprocess
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.test import override_settings

from django_delayqueue.api import topics
from django_delayqueue.embedded import RedisServerProcess

ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
SHELL_LANGS = {"bash", "sh", "shell"}
PYTHON_LANGS = {"python", "py", "python3"}
SHELL_TIMEOUT = 600.0  # seconds; a hang guard only (the Spark block needs ~1-2 min here)
DIRECTIVES = {"skip", "burst", "replace", "slow"}
# A shell block must not start the suite or the demo from inside the suite.
RECURSIVE = re.compile(r"\bmake\s+(test|demo)\b|\.ci/run\b|run_demo\.py")


def runs_until_stopped(command: str) -> bool:
    """Commands that would only end on Ctrl-C, so the test would wait for its timeout."""
    words = command.split()
    if re.search(r"manage\.py\s+runqueue\b", command):
        return "--burst" not in words
    if re.search(r"manage\.py\s+runserver\b", command):
        return True
    if re.search(r"manage\.py\s+queuestats\b", command) and "--watch" in words:
        return "--count" not in words
    return False


FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\s]*)")
DIRECTIVE = re.compile(r"^\s*<!--\s*readme-test:(?P<body>.*?)-->\s*$")
DIRECTIVE_BODY = re.compile(r"^\s*(?P<name>[a-z-]+)(?P<args>.*?)\s*(?:\((?P<reason>[^()]+)\))?\s*$")
APP_MODULE = re.compile(r"^#\s*(?P<app>[A-Za-z_]\w*)/(?P<module>[A-Za-z_]\w*)\.py\b")


@dataclass(frozen=True)
class Directive:
    name: str
    args: tuple[str, ...]
    reason: str


@dataclass
class Block:
    path: Path
    line: int  # of the opening fence, 1-based: the code starts on the next line
    lang: str
    code: str
    directives: list[Directive] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{shown(self.path)}:{self.line}"

    @property
    def kind(self) -> str:
        return "shell" if self.lang in SHELL_LANGS else "python"

    def directive(self, name: str) -> list[Directive]:
        return [d for d in self.directives if d.name == name]


def shown(path: Path) -> str:
    """How failures name a file: relative to the repository."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def parse_directive(text: str) -> Directive | str:
    """A directive from the text after ``readme-test:``, or what is wrong with it."""
    match = DIRECTIVE_BODY.match(text)
    if not match:
        return f"cannot read the directive {text.strip()!r}"
    name, reason = match["name"], (match["reason"] or "").strip()
    if name not in DIRECTIVES:
        return f"unknown directive {name!r} (known: {', '.join(sorted(DIRECTIVES))})"
    if not reason:
        return f"directive {name!r} needs its reason in parentheses"
    try:
        args = tuple(shlex.split(match["args"]))
    except ValueError as e:
        return f"directive {name!r}: {e}"
    wanted = {"replace": 2}.get(name, 0)
    if len(args) != wanted:
        return f"directive {name!r} takes {wanted} quoted argument(s), not {len(args)}"
    return Directive(name, args, reason)


def parse(path: Path) -> tuple[list[Block], list[str]]:
    """The shell and Python blocks of a Markdown file, and directives that sit on no block."""
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    orphans: list[str] = []
    pending: list[tuple[int, str]] = []  # directive comments right above the current line
    i = 0
    while i < len(lines):
        line = lines[i]
        if DIRECTIVE.match(line):
            pending.append((i + 1, line))
            i += 1
            continue
        opening = FENCE.match(line)
        if not opening:
            orphans += [f"{shown(path)}:{n}: not right above a fence" for n, _ in pending]
            pending = []
            i += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        close = re.compile(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        end = i + 1
        while end < len(lines) and not close.match(lines[end]):
            end += 1
        body = [text[indent:] if text[:indent].isspace() else text for text in lines[i + 1 : end]]
        lang = opening["info"].lower()
        if lang in SHELL_LANGS | PYTHON_LANGS:
            block = Block(path, i + 1, lang, "\n".join(body) + "\n")
            for number, text in pending:
                parsed = parse_directive(DIRECTIVE.match(text)["body"])  # type: ignore[index]
                if isinstance(parsed, str):
                    block.problems.append(f"{shown(path)}:{number}: {parsed}")
                else:
                    block.directives.append(parsed)
            blocks.append(block)
        elif pending:
            orphans += [
                f"{shown(path)}:{n}: directive on a ```{lang} block, which is not run"
                for n, _ in pending
            ]
        pending = []
        i = end + 1
    orphans += [f"{shown(path)}:{n}: not right above a fence" for n, _ in pending]
    return blocks, orphans


def all_blocks() -> list[Block]:
    return [block for path in DOC_FILES for block in parse(path)[0]]


def params(kind: str) -> list[Any]:
    out = []
    for block in all_blocks():
        if block.kind != kind:
            continue
        marks = [
            pytest.mark.skip(reason=f"{block.where}: {d.reason}") for d in block.directive("skip")
        ]
        marks += [pytest.mark.slow for _ in block.directive("slow")[:1]]
        out.append(pytest.param(block, id=block.where, marks=marks))
    return out


def fail_on_problems(block: Block) -> None:
    if block.problems:
        pytest.fail(f"{block.where}: bad readme-test directive(s):\n" + "\n".join(block.problems))


# --- the convention itself ----------------------------------------------------------------------


def test_every_directive_sits_on_a_block_that_runs() -> None:
    orphans = [o for path in DOC_FILES for o in parse(path)[1]]
    assert not orphans, "\n".join(orphans)


def test_every_block_of_those_languages_is_collected() -> None:
    """A parser that missed blocks would let them rot: count the fences another way."""
    fences = 0
    for path in DOC_FILES:
        opening = True
        for line in path.read_text().splitlines():
            if line.lstrip().startswith("```"):
                lang = line.strip()[3:].strip().lower()
                fences += opening and lang in SHELL_LANGS | PYTHON_LANGS
                opening = not opening
    blocks = all_blocks()
    assert len(blocks) == fences
    # What this file exists for: the README's quick start and runqueue examples are in it.
    commands = "\n".join(b.code for b in blocks if b.kind == "shell")
    assert "python manage.py runqueue order-close -c 8" in commands
    assert sum(b.kind == "python" for b in blocks) >= 5


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (" skip", "needs its reason"),
        (" skipp (typo)", "unknown directive 'skipp'"),
        (' replace "a" (one argument)', "takes 2 quoted argument(s), not 1"),
        (" burst extra (no arguments)", "takes 0 quoted argument(s), not 1"),
    ],
)
def test_bad_directives_are_reported(text: str, problem: str) -> None:
    parsed = parse_directive(text)
    assert isinstance(parsed, str) and problem in parsed


def test_directives_parse(tmp_path: Path) -> None:
    doc = tmp_path / "sample.md"
    doc.write_text(
        "text\n"
        "<!-- readme-test: slow (a JVM) -->\n"
        '<!-- readme-test: replace "--n 1000000" "--n 5" (smaller) -->\n'
        "```bash\nrun --n 1000000\n```\n"
        "<!-- readme-test: skip (orphan) -->\n\n"
        "```python\nx = 1\n```\n"
        "<!-- readme-test: skip (on text) -->\n"
        "```text\nnot run\n```\n"
    )
    blocks, orphans = parse(doc)
    shell, python = blocks
    assert (shell.line, shell.lang, shell.code) == (4, "bash", "run --n 1000000\n")
    assert shell.directives == [
        Directive("slow", (), "a JVM"),
        Directive("replace", ("--n 1000000", "--n 5"), "smaller"),
    ]
    assert python.directives == [] and python.code == "x = 1\n"
    assert [o.split(": ", 1)[1] for o in orphans] == [
        "not right above a fence",
        "directive on a ```text block, which is not run",
    ]


@pytest.mark.parametrize(
    ("command", "forever"),
    [
        ("python manage.py runqueue order-close -c 8", True),
        ("python manage.py runqueue --burst", False),
        ("python manage.py runserver", True),
        ("python manage.py queuestats --watch 2", True),
        ("python manage.py queuestats --watch 2 --count 3", False),
        ("python manage.py migrate", False),
    ],
)
def test_commands_that_run_until_stopped_are_recognised(command: str, forever: bool) -> None:
    assert runs_until_stopped(command) is forever
    assert commands(f"{command} \\\n  -v 2  # comment\n\n") == [f"{command} -v 2"]


def test_burst_goes_before_the_comment_and_after_continued_lines() -> None:
    script = (
        "python manage.py migrate   # rows\n"
        "python manage.py runqueue  # every queue\n"
        "python manage.py runqueue order-close \\\n    -c 8\n"
        "python manage.py runqueue --burst\n"
        "echo '# not a comment'\n"
    )
    assert add_burst(script) == (
        "python manage.py migrate   # rows\n"
        "python manage.py runqueue --burst  # every queue\n"
        "python manage.py runqueue order-close \\\n    -c 8 --burst\n"
        "python manage.py runqueue --burst\n"
        "echo '# not a comment'\n"
    )


# --- shell blocks -------------------------------------------------------------------------------


def split_comment(line: str) -> tuple[str, str]:
    """``(code, comment)`` of a shell line; ``#`` inside quotes or words is not a comment."""
    quote = ""
    for i, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            code = line[:i]
            return code.rstrip(), line[len(code.rstrip()) :]
    return line, ""


def commands(script: str) -> list[str]:
    """The logical lines of a script (continuations joined, blanks squeezed), no comments."""
    out, command = [], ""
    for line in script.splitlines():
        code = split_comment(line)[0]
        if code.endswith("\\"):
            command += code[:-1] + " "
            continue
        out.append(command + code)
        command = ""
    return [" ".join(c.split()) for c in out if c.strip()]


def add_burst(script: str) -> str:
    """Append ``--burst`` to every ``manage.py runqueue`` command without it (at its end)."""
    out, command = [], ""
    for line in script.splitlines():
        code, comment = split_comment(line)
        command += code
        if code.endswith("\\"):
            out.append(line)
            continue
        if re.search(r"manage\.py\s+runqueue\b", command) and "--burst" not in command.split():
            line = f"{code} --burst{comment}"
        out.append(line)
        command = ""
    return "\n".join(out) + "\n"


def prepare_shell(block: Block, tmp: Path) -> str:
    """The script the test runs for ``block``: directives applied, ``/tmp/`` made private."""
    script = block.code
    for d in block.directive("replace"):
        old, new = d.args
        assert old in script, f"{block.where}: replace {old!r}: not in the block (stale directive?)"
        script = script.replace(old, new)
    if block.directive("burst"):
        burst = add_burst(script)
        assert burst != script, f"{block.where}: burst: no `manage.py runqueue` in the block"
        script = burst
    return re.sub(r"(?<![\w./])/tmp/", f"{tmp}/", script)


@pytest.fixture(scope="module")
def shell_env(
    redis_server: RedisServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    """What a developer's shell has after the quick start: the venv, Redis, a migrated DB."""
    db = tmp_path_factory.mktemp("readme-db") / "db.sqlite3"
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "demo_project.settings",
        "REDIS_URL": redis_server.url,
        "DEMO_DB": str(db),
        "PYTHONUNBUFFERED": "1",
    }
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "--verbosity", "0"],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=SHELL_TIMEOUT,
    )
    return env


def run_shell(block: Block, script: str, env: dict[str, str]) -> tuple[int | None, str]:
    """Run ``script`` with bash in its own process group; (exit code or None on timeout, log)."""
    # Each command is traced with its line in the Markdown file: the trace line is line 1 of
    # the script, so the block's first line (the one after the fence) is LINENO 2.
    trace = f"PS4='+ [{shown(block.path)}:$((LINENO + {block.line - 1}))] '; set -x\n"
    proc = subprocess.Popen(
        ["bash", "-euo", "pipefail", "-c", trace + script],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own group: a timeout ends every command it started
    )
    try:
        output, _ = proc.communicate(timeout=SHELL_TIMEOUT)
        return proc.returncode, output
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the group of the bash we started, nobody else's
        output, _ = proc.communicate()
        return None, output


@pytest.mark.parametrize("block", params("shell"))
def test_shell_block(
    block: Block, shell_env: dict[str, str], redis_client: redis.Redis, tmp_path: Path
) -> None:
    fail_on_problems(block)
    if RECURSIVE.search(block.code):
        pytest.fail(
            f"{block.where}: runs the test suite or the demo; mark it "
            "<!-- readme-test: skip (reason) --> instead"
        )
    script = prepare_shell(block, tmp_path)
    forever = [c.strip() for c in commands(script) if runs_until_stopped(c)]
    if forever:
        pytest.fail(
            f"{block.where}: {forever} would run until stopped: add --burst (runqueue) or "
            "--count (queuestats --watch) with a readme-test directive, or skip it with a reason"
        )
    before = set(os.listdir(ROOT))
    code, output = run_shell(block, script, shell_env)
    tail = "\n".join(output.splitlines()[-60:])
    status = f"did not finish within {SHELL_TIMEOUT:.0f}s" if code is None else f"exited {code}"
    assert code == 0, f"{block.where}: {block.lang} block {status}\n--- ran ---\n{script}\n{tail}"
    left = sorted(set(os.listdir(ROOT)) - before)
    assert not left, f"{block.where}: the block left {left} in the repository root (use /tmp/)"


# --- Python blocks ------------------------------------------------------------------------------


@contextmanager
def demo_apps_importable() -> Iterator[None]:
    """``shop`` and ``shop.models`` (...) are the demo's ``demo_project.shop`` modules."""
    added = []
    for app in settings.INSTALLED_APPS:
        if not app.startswith("demo_project."):
            continue
        short = app.split(".", 1)[1]
        __import__(f"{app}.models")
        for name, module in list(sys.modules.items()):
            if name == app or name.startswith(app + "."):
                alias = short + name[len(app) :]
                if alias not in sys.modules:
                    sys.modules[alias] = module
                    added.append(alias)
    try:
        yield
    finally:
        for alias in added:
            sys.modules.pop(alias, None)


@contextmanager
def receivers_restored() -> Iterator[None]:
    """Whatever a block connects to the queues' signals is gone afterwards."""
    saved = {queue: list(sig.receivers) for queue, sig in topics().items()}
    try:
        yield
    finally:
        for queue, sig in topics().items():
            with sig.lock:
                sig.receivers = list(saved.get(queue, []))
                sig.sender_receivers_cache.clear()


def namespace_for(block: Block) -> dict[str, Any]:
    first = block.code.lstrip().splitlines()[0] if block.code.strip() else ""
    match = APP_MODULE.match(first)
    if match:
        name, package = f"{match['app']}.{match['module']}", match["app"]
    else:
        name, package = "readme_block", None
    return {"__name__": name, "__package__": package, "__builtins__": builtins}


def run_python(block: Block) -> dict[str, Any]:
    """Execute the block; its tracebacks show the Markdown file's own line numbers."""
    namespace = namespace_for(block)
    filename = shown(block.path)
    code = compile("\n" * block.line + block.code, filename, "exec")
    try:
        exec(code, namespace)
    except Exception:
        pytest.fail(f"{block.where}: python block raised\n{traceback.format_exc()}")
    return namespace


def unresolved_names(block: Block, namespace: dict[str, Any]) -> list[str]:
    """Global names the block's functions read that neither the block nor builtins define."""
    found = []
    for fn in ast.walk(ast.parse(block.code)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        local = {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
        for node in ast.walk(fn):
            if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                local.add(node.id)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                local |= {(a.asname or a.name).split(".")[0] for a in node.names}
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                local.add(node.name)
        for node in ast.walk(fn):
            if (
                isinstance(node, ast.Name)
                and isinstance(node.ctx, ast.Load)
                and node.id not in local
                and node.id not in namespace
                and not hasattr(builtins, node.id)
            ):
                found.append(f"{node.id} (line {block.line + node.lineno})")
    return found


@pytest.mark.parametrize("block", params("python"))
@pytest.mark.django_db(transaction=True)
def test_python_block(
    block: Block, redis_client: redis.Redis, redis_server: RedisServerProcess
) -> None:
    fail_on_problems(block)
    with demo_apps_importable(), receivers_restored():
        namespace = run_python(block)
        unresolved = unresolved_names(block, namespace)
    assert not unresolved, f"{block.where}: undefined in the block's functions: {unresolved}"
    config = namespace.get("DELAYQUEUE")
    if isinstance(config, dict):
        from django_delayqueue.checks import check_settings

        # The block's settings, on the test's Redis: they must be a valid configuration.
        with override_settings(DELAYQUEUE={**config, "REDIS_URL": redis_server.url}):
            errors = [m for m in check_settings() if m.is_serious()]
        assert not errors, f"{block.where}: DELAYQUEUE fails the checks: {errors}"


def test_unresolved_names_are_found() -> None:
    block = Block(ROOT / "README.md", 10, "python", "def f(x):\n    return Order, x, len\n")
    assert unresolved_names(block, {}) == ["Order (line 12)"]
    assert unresolved_names(block, {"Order": object}) == []
