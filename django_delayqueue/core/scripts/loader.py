"""Reading the ``.lua`` files and resolving their ``--- @include`` lines: the exact text sent.

Redis runs each script on its own (no ``require``), so a helper two scripts need lives once in
``lua/includes/`` and a script names it on a line of its own::

    --- @include "includes/guard.lua"

The line is replaced by that file's text (its own includes resolved first, depth first), and a
file already included in this script is not included again. Nothing else is done to the text:
what a script runs is what its file and the files it names say. ``python -m
django_delayqueue.core.scripts render NAME`` prints the result.
"""

from __future__ import annotations

import re
from importlib import resources
from typing import TYPE_CHECKING

from django_delayqueue.core.errors import ConfigurationError

if TYPE_CHECKING:  # importlib.abc.Traversable is deprecated at run time from Python 3.12 on
    from importlib.abc import Traversable

LUA_PACKAGE = "django_delayqueue.core.scripts.lua"
_INCLUDE = re.compile(r'^--- @include "([\w./-]+\.lua)"[ \t]*$', re.MULTILINE)


def _lua_dir() -> Traversable:
    return resources.files(LUA_PACKAGE)


def script_names() -> list[str]:
    """The names of every script, sorted (the files of ``lua/includes/`` are not scripts)."""
    return sorted(
        f.name.removesuffix(".lua") for f in _lua_dir().iterdir() if f.name.endswith(".lua")
    )


def read_lua(path: str) -> str:
    """The text of ``lua/<path>`` as stored (includes not resolved)."""
    file = _lua_dir()
    for part in path.split("/"):
        file = file.joinpath(part)
    if not file.is_file():
        raise ConfigurationError(f"no Lua file {path!r} in {LUA_PACKAGE}")
    return file.read_text()


def render(name: str) -> str:
    """The source of script ``name`` as sent to Redis: its includes resolved."""
    if name not in script_names():
        raise ConfigurationError(f"no script {name!r}; scripts: {', '.join(script_names())}")
    return _resolve(f"{name}.lua", included=set(), stack=())


def _resolve(path: str, included: set[str], stack: tuple[str, ...]) -> str:
    text = read_lua(path)
    chain = (*stack, path)

    def include(match: re.Match[str]) -> str:
        target = match.group(1)
        if target in chain:  # its functions would be needed before they are defined
            raise ConfigurationError(f"Lua include cycle: {' -> '.join((*chain, target))}")
        if target in included:
            return f"-- (included above: {target})"
        included.add(target)
        return _resolve(target, included, chain).rstrip("\n")

    return _INCLUDE.sub(include, text)
