""".ci/install-system-deps: best effort on a developer's machine, strict under CI=true.

Run with a PATH holding only what the script needs to decide, so it never finds (or runs)
apt-get: it is "not root" or has "no apt-get", and must say so, then exit 0 locally and 1 in CI.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / ".ci" / "install-system-deps"
BASH = shutil.which("bash") or "/bin/bash"


def run(bin_dir: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    for tool in ("id", "sort"):  # the script's only external commands besides apt-get
        (bin_dir / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    env = {"PATH": str(bin_dir), "HOME": os.environ.get("HOME", "/tmp")}
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [BASH, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize(("ci", "code", "word"), [(None, 0, "warning"), ("true", 1, "error")])
def test_missing_tools_are_a_warning_locally_and_an_error_in_ci(
    tmp_path: Path, ci: str | None, code: int, word: str
) -> None:
    done = run(tmp_path, ci)
    assert done.returncode == code, done.stderr
    assert done.stderr.startswith(f"{word}: ")
    assert "cannot apt-get install" in done.stderr or "no apt-get" in done.stderr
    for package in ("chromium", "chromium-driver", "redis-server", "redis-tools", "prometheus"):
        assert package in done.stderr


def test_nothing_to_do_when_every_tool_is_there(tmp_path: Path) -> None:
    for tool in ("chromium", "chromedriver", "redis-server", "redis-cli", "promtool", "prometheus"):
        (tmp_path / tool).write_text("#!/bin/sh\n")
        (tmp_path / tool).chmod(0o755)
    done = run(tmp_path, "true")
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
