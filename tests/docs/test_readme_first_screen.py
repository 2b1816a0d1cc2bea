"""The README's first screen: the two commands first (``make demo``, ``make test``), then what
the product does that other task queues do not, one sentence each, and a picture of the admin's
overview as the demo shows it (docs/images/overview.png, a screenshot of
tests/app/test_demo_traffic.py at the browser tests' 1,280 pixels: docs/demo.md says how to take
it again)."""

from __future__ import annotations

import re
import struct
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SCREENSHOT = ROOT / "docs" / "images" / "overview.png"
PNG = b"\x89PNG\r\n\x1a\n"


def first_screen() -> str:
    """The README up to its first section heading (``## Install``)."""
    text = README.read_text()
    return text[: text.index("\n## ")]


def bullets(text: str) -> list[str]:
    """The top-level list items of ``text``, each on one line."""
    items = re.findall(r"^- (.*?)(?=^- |^$|\Z)", text, re.M | re.S)
    return [" ".join(item.split()) for item in items]


def test_the_commands_come_first() -> None:
    items = bullets(first_screen())
    assert items[0].startswith("`make demo` starts the demo shop")
    assert items[1].startswith("`make test` ")


def test_what_it_does_that_others_do_not_is_one_sentence_each() -> None:
    heading = re.search(
        r"What it\s+does\s+that\s+other\s+task\s+queues\s+do\s+not:\n", first_screen()
    )
    assert heading, "no list of what it does that others do not"
    claims = bullets(first_screen()[heading.end() :].split("\n\n")[0])
    assert len(claims) >= 4
    for claim in claims:
        assert re.match(r"\*\*[^*]+\*\*", claim), claim  # named first, in bold
        assert claim.endswith("."), claim
        assert not re.search(r"\. [A-Z]", claim), f"more than one sentence: {claim}"


def test_the_first_screen_shows_the_overview() -> None:
    pictures = re.findall(r"!\[([^\]]+)\]\(([^)]+)\)", first_screen(), re.S)
    assert pictures, "no picture on the README's first screen"
    (alt, path) = pictures[0]
    assert (ROOT / path).resolve() == SCREENSHOT
    assert "overview" in alt
    data = SCREENSHOT.read_bytes()
    assert data[:8] == PNG
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk comes first
    assert width == 1280 and height >= 800
    assert len(data) < 400_000  # a README picture, not a weight on every clone
