"""One list of documentation pages: the MkDocs nav, the README's Documentation section and the
table of docs/index.md name the same pages in the same order, and every page is in it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _nav_pages() -> list[str]:
    nav = (ROOT / "mkdocs.yml").read_text().split("\nnav:\n", 1)[1]
    pages = []
    for line in nav.splitlines():
        if not line.startswith("  - "):
            break
        pages.append(line.rsplit(":", 1)[1].strip())
    return [page for page in pages if page != "index.md"]


def _linked(text: str, prefix: str) -> list[str]:
    return re.findall(rf"\]\({re.escape(prefix)}([\w-]+\.md)\)", text)


def test_the_nav_names_every_page_once() -> None:
    pages = _nav_pages()
    assert len(pages) == len(set(pages))
    assert sorted(pages) == sorted(p.name for p in DOCS.glob("*.md") if p.name != "index.md")


def test_the_readme_lists_the_nav_pages_in_order() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Documentation\n", 1)[1].split("\n## ", 1)[0]
    assert _linked(section, "docs/") == _nav_pages()


def test_the_docs_home_lists_the_nav_pages_in_order() -> None:
    assert _linked((DOCS / "index.md").read_text(), "") == _nav_pages()


def test_the_readme_stays_a_first_contact_page() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200
