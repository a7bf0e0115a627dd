"""The consoles every renderer writes to: data on stdout, messages on stderr."""

from __future__ import annotations

import os
import sys

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table


def stdout_console() -> Console:
    """Data goes to stdout; rich decides colour from the terminal and NO_COLOR."""
    width = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 120
    return Console(highlight=False, soft_wrap=False, width=width)


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False)


def print_table(console: Console, table: Table) -> None:
    """Print a table without losing text: folded on a terminal, as wide as it needs elsewhere.

    Off a terminal (a pipe, a CI log) the console is 120 columns; a long key, module name or
    reason would be cropped there, so the table gets the width its widest row asks for.
    """
    if console.is_terminal:
        console.print(table)
        return
    unbounded = console.options.update_width(1 << 20)  # measure without the console's limit
    needed = Measurement.get(console, unbounded, table).maximum
    width = console.width
    console.width = max(width, needed)  # print(width=) cannot exceed the console's own width
    try:
        console.print(table)
    finally:
        console.width = width
