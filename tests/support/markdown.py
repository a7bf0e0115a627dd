"""Markdown as a reader sees it, for the tests of ``stats --format markdown`` and of the job
summary the Action writes: rendered by markdown-it-py (rich's own Markdown parser, so already
installed; CommonMark with GitHub's tables and strikethrough), then read back from the HTML as
headings, paragraphs, tables (the text of each cell) and list items. What a test compares is
the text shown, with every escape undone by a parser that is not cachedoctor's."""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser

from markdown_it import MarkdownIt

_PARSER = MarkdownIt("commonmark").enable(["table", "strikethrough"])
_BLOCKS = {"h1", "h2", "h3", "p", "li", "th", "td"}


@dataclass
class Shown:
    headings: list[str] = field(default_factory=list)
    paragraphs: list[str] = field(default_factory=list)
    tables: list[list[list[str]]] = field(default_factory=list)  # rows (the header first)
    items: list[str] = field(default_factory=list)
    tags: set[str] = field(default_factory=set)  # every HTML tag the page holds


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.shown = Shown()
        self.open: list[tuple[str, list[str]]] = []  # the block elements open, with their text

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.shown.tags.add(tag)
        if tag == "table":
            self.shown.tables.append([])
        elif tag == "tr":
            self.shown.tables[-1].append([])
        if tag in _BLOCKS:
            self.open.append((tag, []))

    def handle_endtag(self, tag: str) -> None:
        if tag not in _BLOCKS:
            return
        name, parts = self.open.pop()
        assert name == tag, (name, tag)
        text = "".join(parts).strip()
        if self.open and name != "li":  # a paragraph in a list item: the item's text
            self.open[-1][1].append(text)
        elif name in ("th", "td"):
            self.shown.tables[-1][-1].append(text)
        elif name == "li":
            self.shown.items.append(text)
        elif name == "p":
            self.shown.paragraphs.append(text)
        else:
            self.shown.headings.append(text)

    def handle_data(self, data: str) -> None:
        if self.open:
            self.open[-1][1].append(data)


def shown(markdown: str) -> Shown:
    """What ``markdown`` shows."""
    reader = _Reader()
    reader.feed(_PARSER.render(markdown))
    reader.close()
    return reader.shown
