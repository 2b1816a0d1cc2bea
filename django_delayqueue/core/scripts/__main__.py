"""``python -m django_delayqueue.core.scripts list | render NAME``: the scripts as Redis runs them.

``render`` prints the exact source sent to Redis (includes resolved), e.g. to run one by hand::

    python -m django_delayqueue.core.scripts render promote > /tmp/promote.lua
    redis-cli --eval /tmp/promote.lua '{dq:q}:pending' '{dq:q}:retry' ... , 1700000000000 100
"""

from __future__ import annotations

import argparse
import hashlib
import sys

from django_delayqueue.core.errors import ConfigurationError
from django_delayqueue.core.scripts.loader import render, script_names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m django_delayqueue.core.scripts",
        description="List the Lua scripts, or print one as it is sent to Redis.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="the script names, with the SHA1 Redis knows each by")
    show = commands.add_parser("render", help="the exact source of a script, includes resolved")
    show.add_argument("name", help="a script name (see `list`)")
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            for name in script_names():
                print(f"{name:10} {hashlib.sha1(render(name).encode()).hexdigest()}")
        else:
            sys.stdout.write(render(args.name))
    except ConfigurationError as e:
        parser.exit(2, f"error: {e}\n")
    except BrokenPipeError:  # `... | head`: the reader has what it wanted
        sys.stderr.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
