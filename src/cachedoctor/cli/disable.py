"""``cachedoctor disable``: remove exactly what ``enable`` added."""

from __future__ import annotations

import click

from cachedoctor.stablekeys import activation


@click.command("disable")
def disable() -> None:
    """Remove the config file written by `enable` (cache entries are kept)."""
    report = activation.disable()
    if not report.was_enabled:
        click.echo(f"not enabled: {report.config_path} does not exist")
        return
    for path in report.removed:
        click.echo(f"removed {path}")
    click.echo("disabled: new processes use JAX's own settings and keys (cache entries kept)")
