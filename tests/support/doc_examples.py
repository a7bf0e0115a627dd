"""The generated-examples block of a docs page: cut it out, compare it with a new run, rewrite it.

Each page whose examples come from real runs (docs/why.md, pytest.md, openmetrics.md) has a
``tests/support/*_example(s).py`` that makes the block anew; this is what they share."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

END = "<!-- end of the generated examples -->"


def page_block(text: str, begin: str) -> str:
    """The page's block from its ``begin`` marker to :data:`END`, both included."""
    start, end = text.index(begin), text.index(END) + len(END)
    return text[start:end]


def main(
    module: str,
    page: Path,
    begin: str,
    generate: Callable[[], str],
    comparable: Callable[[str], Any],
) -> int:
    """The command line of ``python -m module``: with ``--write``, put a new run's block into
    ``page``; without, exit 1 when the page's block and a new run's differ in what
    ``comparable`` keeps."""
    parser = argparse.ArgumentParser(description=f"the examples of docs/{page.name}")
    parser.add_argument("--write", action="store_true", help=f"rewrite {page.name}'s examples")
    args = parser.parse_args()
    new = generate()
    text = page.read_text()
    if args.write:
        page.write_text(text.replace(page_block(text, begin), new))
        print(f"wrote {page}")
        return 0
    if comparable(page_block(text, begin)) != comparable(new):
        print(f"docs/{page.name}'s examples differ from a new run: python -m {module} --write")
        return 1
    return 0
