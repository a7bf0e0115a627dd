"""Renderers: each turns a core report (plain dataclasses) into one output format.

The core never prints; commands pick a renderer by ``OutputFormat``.
"""

from __future__ import annotations

import enum


class OutputFormat(enum.StrEnum):
    TABLE = "table"
    JSON = "json"
    GITHUB = "github"
    JUNIT = "junit"
