"""The consoles every renderer writes to: data on stdout, messages on stderr."""

from __future__ import annotations

import os
import sys

from rich.console import Console


def stdout_console() -> Console:
    """Data goes to stdout; rich decides colour from the terminal and NO_COLOR."""
    width = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 120
    return Console(highlight=False, soft_wrap=False, width=width)


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False)
