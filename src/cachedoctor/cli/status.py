"""``cachedoctor status``: effective configuration, where each value comes from, and proof."""

from __future__ import annotations

import click

from cachedoctor.cli._common import json_flag
from cachedoctor.errors import ExitCode
from cachedoctor.render.console import stdout_console
from cachedoctor.render.formats import renderer
from cachedoctor.stablekeys import activation


@click.command("status")
@json_flag()
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Show the effective cache settings and prove the hook is active in a fresh interpreter.

    Exit status: 0 as configured; 1 the fresh interpreter does not run as configured (it
    cannot import jax or cachedoctor, activation failed, the hook or recording is off although
    configured, or max_size is set without the filelock package JAX's LRU eviction needs);
    2 a broken config file (bad TOML, a key outside [cachedoctor] or not a setting, a value of the
    wrong type or one JAX would misread: a cache_dir with ~ or relative, max_size 0; each named
    with its line) or another error.
    """
    report = activation.status()
    problems = report.problems
    renderer("json" if as_json else "text").render(report, stdout_console())
    if as_json:
        ctx.exit(int(ExitCode.FINDINGS if problems else ExitCode.OK))
    for w in report.warnings:
        click.echo(f"warning: {w.code}: {w.message}\n  fix: {w.fix}", err=True)
    if problems:
        for problem in problems:
            click.echo(f"status: {problem}", err=True)
        click.echo("status: the fresh interpreter does not run as configured", err=True)
        ctx.exit(int(ExitCode.FINDINGS))
