"""A Lua script as it was at an earlier commit, to measure a feature's cost against the scripts
before it in the same run (bench sections rate_limit, progress, flow_keys); and the whole
package as it was, for a consumer of that commit run beside this checkout's (claim_ahead).

The script's own text comes from ``git show <ref>:<path>``; its includes are resolved from this
checkout (each feature's includes take its new arguments as optional, nil for a base script).
None when the ref cannot be read (no git, a shallow clone) or the script there already has the
feature (``marker`` in its text): there is nothing to compare with then.
"""

from __future__ import annotations

import hashlib
import subprocess
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

from django_delayqueue.core.scripts.calls import LuaScript
from django_delayqueue.core.scripts.loader import _INCLUDE, _resolve

from .harness import ROOT

LUA = "django_delayqueue/core/scripts/lua"


def script_at(ref: str, name: str, marker: str) -> LuaScript | None:
    """``<name>.lua`` at ``ref`` (see the module's docstring), named ``<name>@base``."""
    try:
        text = subprocess.run(
            ["git", "show", f"{ref}:{LUA}/{name}.lua"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    if marker in text:
        return None
    included: set[str] = set()
    filename = f"{name}.lua"
    source = _INCLUDE.sub(lambda m: _resolve(m.group(1), included, (filename,)).rstrip("\n"), text)
    return LuaScript(f"{name}@base", source, hashlib.sha1(source.encode()).hexdigest())


def commit_of(ref: str) -> str | None:
    """The commit ``ref`` names now (``git rev-parse``); None when it cannot be read."""
    try:
        return subprocess.run(
            ["git", "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def checkout_differs(paths: tuple[str, ...] = ("django_delayqueue",)) -> bool | None:
    """Whether this checkout's ``paths`` differ from its HEAD (None: git cannot tell)."""
    try:
        done = subprocess.run(
            ["git", "diff", "--quiet", "HEAD", "--", *paths], cwd=ROOT, capture_output=True
        )
    except OSError:
        return None
    return {0: False, 1: True}.get(done.returncode)


class PackageAt:
    """``django_delayqueue`` as it was at ``ref`` (``git archive``), in a temporary directory:
    ``root`` goes first on a child's path (beside this checkout's bench app), or is a child's
    working directory when ``paths`` also holds ``bench`` (the whole bench as it was). ``root``
    is None when the ref cannot be read; :meth:`close` removes the files."""

    def __init__(self, ref: str, paths: tuple[str, ...] = ("django_delayqueue",)) -> None:
        self.ref = ref
        self.commit = commit_of(ref)  # what the ref named when measured ("HEAD" moves)
        self._tmp = tempfile.TemporaryDirectory(prefix="dq-bench-base-")
        self.root: Path | None = Path(self._tmp.name)
        try:
            archive = subprocess.run(
                ["git", "archive", ref, *paths],
                cwd=ROOT,
                capture_output=True,
                check=True,
            ).stdout
            with tarfile.open(fileobj=BytesIO(archive)) as tar:
                tar.extractall(self.root, filter="data")
        except (OSError, subprocess.CalledProcessError, tarfile.TarError):
            self.root = None

    def close(self) -> None:
        self._tmp.cleanup()
