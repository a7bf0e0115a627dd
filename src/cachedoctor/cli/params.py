"""click parameter types for what users type: sizes, durations, moments, seconds, executors.

Each one is the grammar of ``units.py`` (shared with the Python API), so ``prune --older-than``,
``prune --stale-after`` and ``stats --since`` read ``2w`` alike, and a value that is not one
is a usage error (exit 2) that shows the accepted forms.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click
from click.shell_completion import CompletionItem

from cachedoctor import units


class _UnitType(click.ParamType):  # type: ignore[type-arg]  # generic from click 8.2 on
    """A parameter parsed by one function of ``units``."""

    def __init__(self, name: str, parse: Callable[[str], Any]) -> None:
        self.name = name
        self._parse = parse

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):  # a default given as a number, or already converted
            return value
        try:
            parsed = self._parse(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        if ctx is not None and param is not None and param.name:
            ctx.meta.setdefault(_TYPED, {})[param.name] = value
        return parsed


_TYPED = "cachedoctor.typed"


def as_typed(ctx: click.Context, name: str) -> str | None:
    """What the user typed for parameter ``name`` (``24h``, not 86400.0), for reports."""
    typed: dict[str, str] = ctx.meta.get(_TYPED, {})
    return typed.get(name)


SIZE = _UnitType("size", units.parse_size)  # bytes: 50GB, 800MiB, 1000000
DURATION = _UnitType("duration", units.parse_duration)  # seconds: 30d, 12h, 90min, 2w, 45
SINCE = _UnitType("when", units.parse_since)  # a Unix time: 7d ago, 2026-01-31, 1767225600


def _seconds(text: str) -> float:
    """A plain number of seconds (a threshold JAX takes in seconds): 0, 1.5; not 1h or -5."""
    try:
        return units.parse_duration(float(text))
    except ValueError:
        raise ValueError(f"not a number of seconds >= 0: {text!r}") from None


SECONDS = _UnitType("seconds", _seconds)


def _executor(text: str) -> Any:
    from cachedoctor.core.where import parse_executor

    return parse_executor(text)


EXECUTOR = _UnitType("executor", _executor)  # local, processes:N, dask://HOST:PORT, tcp://...
EXECUTOR_HELP = (
    "Where entries are decoded: local (this machine's cores), processes:N, or a Dask "
    "scheduler dask://HOST:PORT or tcp://HOST:PORT (the dask extra)."
)


class _LocationType(click.ParamType):  # type: ignore[type-arg]  # generic from click 8.2 on
    """A cache folder or bucket prefix (DIR, --dir), parsed once into a ``Location``: what the
    commands hand down. A scheme that is neither gs:// nor s3:// is a usage error (exit 2)."""

    name = "location"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from cachedoctor.core.where import Location
        from cachedoctor.errors import CachedoctorError

        try:
            return Location.parse(value)
        except CachedoctorError as exc:
            self.fail(str(exc), param, ctx)


LOCATION = _LocationType()


# Shell completion (click's: docs/commands.md says how to turn it on). A DIR argument completes
# folder names and a FILE option file names, through the shell itself; KIND offers the kinds.


def complete_dir(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    return [CompletionItem(incomplete, type="dir")]


def complete_file(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    return [CompletionItem(incomplete, type="file")]


def complete_kind(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    from cachedoctor.core.findings import FindingKind

    return [CompletionItem(k.value) for k in FindingKind if k.value.startswith(incomplete)]
