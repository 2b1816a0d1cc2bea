"""The README's quick start, run as written in a new ``django-admin startproject`` (issue 38:
"two minutes from zero"), ends with the message delivered.

The blocks of the README's "Quick start" section, up to its first sentence after them, run in
order in a temporary directory with this interpreter's environment (``django-admin`` and
``python`` from its virtualenv, this checkout's package first on the path): shell lines with
bash, a Python block that names a file (``# mysite/settings.py: add at the end``) appended to
or written as that file. The one change: the Redis URL of the settings block becomes the
session's private redis-server. ``runqueue`` runs as written, until stopped: the test waits
(with a generous bound against hangs, not a timing check) for the handler's line, then sends
SIGINT, as Ctrl-C would, and expects exit 0.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from paths import ROOT
from waiting import wait_until

README = ROOT / "README.md"
README_REDIS_URL = "redis://127.0.0.1:6379/0"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.S | re.M)
WAIT = 120.0  # bound on each step: a new project's first migrate is the slowest


def quick_start_blocks() -> list[tuple[str, str]]:
    text = README.read_text()
    start = text.index("## Quick start\n")
    end = text.index("\n## ", start + 1)
    section = text[start:end]
    # The blocks of the new project: those before the first block of "a real shop".
    section = section[: section.index("In a real shop")]
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(section)]


def test_the_quick_start_has_the_blocks_this_test_runs() -> None:
    langs = [lang for lang, _ in quick_start_blocks()]
    assert langs == ["bash", "python", "python", "bash"]
    settings_block = quick_start_blocks()[1][1]
    assert README_REDIS_URL in settings_block


def commands(code: str) -> list[str]:
    """A bash block's commands, one a line, comments dropped."""
    out = []
    for line in code.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            out.append(shlex.join(words))
    return out


@pytest.mark.slow
def test_the_readme_quick_start_delivers_a_message_in_a_new_project(
    tmp_path: Path, redis_server: Any
) -> None:
    venv_bin = Path(sys.executable).parent
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "REDIS_URL")},
        "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(ROOT),  # this checkout's django_delayqueue
        "PYTHONUNBUFFERED": "1",  # the handler's print reaches the log as it happens
    }
    cwd = tmp_path
    log = tmp_path / "runqueue.log"
    delivered = False
    for lang, code in quick_start_blocks():
        if lang == "python":
            first, _, body = code.partition("\n")
            target = cwd / first.lstrip("# ").split(":")[0]
            if "add at the end" in first:
                body = body.replace(README_REDIS_URL, redis_server.url)
                assert redis_server.url in body
                with target.open("a") as f:
                    f.write("\n" + body)
            else:
                target.write_text(code)
            continue
        for command in commands(code):
            if command.startswith("cd "):
                cwd = cwd / shlex.split(command)[1]
                continue
            if "manage.py runqueue" in command:
                delivered = run_until_delivered(command, cwd, env, log)
                continue
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", command],
                cwd=cwd,
                env=env,
                capture_output=True,
                text=True,
                timeout=WAIT,
                check=False,
            )
            assert done.returncode == 0, f"{command}:\n{done.stdout}{done.stderr}"
    assert delivered


def run_until_delivered(command: str, cwd: Path, env: dict[str, str], log: Path) -> bool:
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["bash", "-c", f"exec {command}"], cwd=cwd, env=env, stdout=out, stderr=out
        )
    try:
        wait_until(
            lambda: (
                "closing order 42 (due at " in log.read_text(errors="replace")
                or proc.poll() is not None
            ),
            WAIT,
            "the quick start's message to be delivered",
            every=0.1,
            details=lambda: log.read_text(errors="replace"),
        )
        output = log.read_text(errors="replace")
        assert proc.poll() is None, f"runqueue exited ({proc.returncode}):\n{output}"
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        assert proc.wait(WAIT) == 0, log.read_text(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return "closing order 42 (due at " in output
