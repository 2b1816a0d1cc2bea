"""A Lua script as it was at an earlier commit, to measure a feature's cost against the scripts
before it in the same run (bench sections rate_limit, progress, flow_keys).

The script's own text comes from ``git show <ref>:<path>``; its includes are resolved from this
checkout (each feature's includes take its new arguments as optional, nil for a base script).
None when the ref cannot be read (no git, a shallow clone) or the script there already has the
feature (``marker`` in its text): there is nothing to compare with then.
"""

from __future__ import annotations

import hashlib
import subprocess

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
