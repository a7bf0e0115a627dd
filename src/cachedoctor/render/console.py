"""The consoles every renderer writes to: data on stdout, messages on stderr."""

from __future__ import annotations

import io
import os
import re
import sys
from typing import TextIO, cast

from rich.cells import cell_len
from rich.console import Console
from rich.control import STRIP_CONTROL_CODES, strip_control_codes
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text


def stdout_console() -> Console:
    """Data goes to stdout; rich decides colour from the terminal and NO_COLOR. Off a terminal
    (a pipe, a file, a CI log) it is :func:`file_console`'s."""
    if sys.stdout.isatty():
        return Console(highlight=False, soft_wrap=False)
    return file_console(sys.stdout, width=None if os.environ.get("COLUMNS") else 120)


def file_console(file: TextIO, *, width: int | None = 120, no_color: bool = False) -> Console:
    """A console for what is not a terminal: no line is wrapped (a sentence, a path, a key stays
    on its line: a reader's pager or a ``grep`` sees it whole; tables widen to what they need,
    :func:`print_table`) and none ends in spaces (rich pads a table's last column, and a line
    it wraps, to the width). ``width`` is only where tables start."""
    return Console(
        file=cast(TextIO, NoTrailingSpaces(file)),  # a text file: rich needs only write
        width=width,
        soft_wrap=True,
        highlight=False,
        no_color=no_color,
    )


class NoTrailingSpaces(io.TextIOBase):
    """A text file that writes each line without the spaces at its end. A line is held until
    its newline (only then are its last spaces known); ``flush`` writes what is held."""

    def __init__(self, out: TextIO) -> None:
        super().__init__()
        self.out = out
        self.held = ""

    def write(self, text: str) -> int:
        *lines, self.held = (self.held + text).split("\n")
        if lines:
            self.out.write("".join(line.rstrip(" ") + "\n" for line in lines))
        return len(text)

    def flush(self) -> None:
        if self.held:
            self.out.write(self.held)
            self.held = ""
        self.out.flush()

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.out, "encoding", None) or "utf-8"


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False)


def print_table(console: Console, table: Table) -> None:
    """Print a table without losing text: folded on a terminal, as wide as it needs elsewhere.

    Off a terminal (a pipe, a CI log) the console is 120 columns; a long key, module name or
    reason would be cropped there, so the table gets the width its widest row asks for.
    """
    widest = _widest_possible(table)
    if console.is_terminal or (widest is not None and widest <= console.width):
        console.print(table)  # fits as it is: measuring it first costs as much as printing it
        return
    unbounded = console.options.update_width(1 << 20)  # measure without the console's limit
    needed = Measurement.get(console, unbounded, table).maximum
    width = console.width
    console.width = max(width, needed)  # print(width=) cannot exceed the console's own width
    try:
        console.print(table)
    finally:
        console.width = width


def _widest_possible(table: Table) -> int | None:
    """A width no row of ``table`` can need more than (each column's longest text, its
    padding and a rule), or None when a cell could grow when rendered (a tab, not text)."""
    _, right, _, left = table.padding
    total = 1
    for column in table.columns:
        longest = 0
        for cell in (column.header, *column.cells):
            text = cell.plain if isinstance(cell, Text) else cell
            if not isinstance(text, str) or "\t" in text:
                return None
            longest = max(longest, cell_len(text))
        total += longest + left + right + 1
    return total


Line = list[tuple[str, str | None]]  # the pieces of one line: text and its style
LINES_PER_CALL = 200  # rich's cost is per call, but it splits one text's lines in O(n^2)


def print_lines(console: Console, lines: list[Line], *, soft_wrap: bool = False) -> None:
    """Print many lines (a cache may have thousands of findings), each wrapped as if printed
    alone. Where rich writes no styles at all (no colour system: a pipe, a file) they are
    written at once, as rich would write them (``_write_as_rich_would``, ``_write_wrapped``);
    elsewhere printed in a few calls."""
    plain = console.color_system is None
    soft_wrap = soft_wrap or console.soft_wrap  # off a terminal nothing wraps (file_console)
    if plain and soft_wrap:
        if lines:
            _write_as_rich_would(console, "\n".join("".join(p for p, _ in line) for line in lines))
        return
    if plain:
        _write_wrapped(console, ["".join(p for p, _ in line) for line in lines])
        return
    for start in range(0, len(lines), LINES_PER_CALL):
        text = Text()
        for n, line in enumerate(lines[start : start + LINES_PER_CALL]):
            if n:
                text.append("\n")
            for piece, style in line:
                text.append(piece, style=style)
        console.print(text, soft_wrap=soft_wrap)


_CONTROL_CODE = re.compile("[" + "".join(map(chr, STRIP_CONTROL_CODES)) + "]")


def _write_as_rich_would(console: Console, text: str) -> None:
    """Write what ``console.print(Text(text), soft_wrap=True)`` writes on a console without
    colour, at once: control codes stripped (``Text``), tabs expanded line by line (``wrap``),
    no line broken or cropped, one newline at the end. rich spends ~10 us a line on it."""
    if _CONTROL_CODE.search(text):  # translate() costs ~50 ns a character: only when needed
        text = strip_control_codes(text)
    if "\t" in text:
        text = "\n".join(_tabs_expanded(console, line) for line in text.split("\n"))
    console.file.write(text + "\n")
    console.file.flush()


def _write_wrapped(console: Console, lines: list[str]) -> None:
    """Write what printing each line alone writes on a console without colour: a line that
    fits the width as it is (rich breaks, pads and crops nothing there); any other through rich
    itself, once per distinct text (thousands of findings share a few advice lines)."""
    width = console.width
    wrapped: dict[str, str] = {}
    scratch = io.StringIO()
    alone = Console(
        file=scratch, width=width, tab_size=console.tab_size, color_system=None, highlight=False
    )
    out = []
    for line in lines:
        if "\t" not in line and "\n" not in line and cell_len(line) <= width:
            out.append(strip_control_codes(line) if _CONTROL_CODE.search(line) else line)
            continue
        text = wrapped.get(line)
        if text is None:
            scratch.seek(0)
            scratch.truncate()
            alone.print(Text(line))
            text = wrapped[line] = scratch.getvalue()[:-1]
        out.append(text)
    console.file.write("".join(f"{text}\n" for text in out))
    console.file.flush()


def _tabs_expanded(console: Console, line: str) -> str:
    if "\t" not in line:
        return line
    text = Text(line)
    text.expand_tabs(console.tab_size)
    return text.plain
