"""``cachedoctor status``: effective configuration, where each value comes from, and proof."""

from __future__ import annotations

import json
from dataclasses import asdict

import click

from cachedoctor.stablekeys import activation


@click.command("status")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(as_json: bool) -> None:
    """Show the effective cache settings and prove the hook is active in a fresh interpreter."""
    report = activation.status()
    if as_json:
        data = asdict(report)
        data["config_path"] = str(report.config_path)
        data["schema_version"] = 1
        click.echo(json.dumps(data, default=str, indent=2))
        return
    state = "present" if report.config_exists else "absent (not enabled)"
    click.echo(f"config file: {report.config_path} ({state})")
    click.echo("effective settings (env > config file > JAX default):")
    for r in report.settings:
        click.echo(f"  {r.key:<22} {r.value!s:<50} [{r.source}]")
    p = report.probe
    click.echo("fresh interpreter:")
    if "error" in p:
        click.echo(f"  {p['error']}")
    else:
        click.echo(f"  python {p.get('python')}  jax {p.get('jax', p.get('jax_error'))}")
        click.echo(f"  hook active: {p.get('hook') or 'no'}")
        startup = p.get("startup") or {}
        for err in startup.get("errors", []):
            click.echo(f"  activation error: {err}")
        if not p.get("pth"):
            click.echo("  start-up .pth not found on sys.path: reinstall cachedoctor")
    click.echo("multi-host roles:")
    for role in report.roles:
        click.echo(f"  - {role}")
    for w in report.warnings:
        click.echo(f"warning: {w.code}: {w.message}\n  fix: {w.fix}", err=True)
