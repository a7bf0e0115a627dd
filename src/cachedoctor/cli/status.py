"""``cachedoctor status``: effective configuration, where each value comes from, and proof."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import click

from cachedoctor.errors import ExitCode
from cachedoctor.stablekeys import activation, settings


@click.command("status")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Show the effective cache settings and prove the hook is active in a fresh interpreter.

    Exit status: 0 as configured; 1 the fresh interpreter does not run as configured (it
    cannot import jax or cachedoctor, activation failed, the hook or recording is off although
    configured, or max_size is set without the filelock package JAX's LRU eviction needs);
    2 a broken config file (bad TOML or a wrong-typed value, each named with its line) or
    another error.
    """
    report = activation.status()
    problems = report.problems
    if as_json:
        data = asdict(report)
        data["config_path"] = str(report.config_path)
        data["problems"] = problems
        data["schema_version"] = 1
        click.echo(json.dumps(data, default=str, indent=2))
        ctx.exit(int(ExitCode.FINDINGS if problems else ExitCode.OK))
    state = "present" if report.config_exists else "absent (not enabled)"
    if report.disabled:
        state += f"; ignored: {settings.DISABLE_ENV}=1"
    click.echo(f"config file: {report.config_path} ({state})")
    click.echo("effective settings (env > config file > JAX default):")
    for r in report.settings:
        click.echo(f"  {r.key:<22} {_shown(r.key, r.value):<50} [{r.source}]")
    p = report.probe
    click.echo("fresh interpreter:")
    if "error" in p:
        click.echo(f"  {p['error']}")
    else:
        click.echo(f"  python {p.get('python')}  jax {p.get('jax', p.get('jax_error'))}")
        click.echo(f"  hook active: {p.get('hook') or 'no'}")
        recording = p.get("stats")
        if recording:
            where = recording.get("records") or "nowhere: no cache dir is set"
            mode = recording["mode"]
            click.echo(f"  stats recording: active ({mode} mode), records go to {where}")
        else:
            click.echo("  stats recording: no")
        for err in report.activation_errors:
            click.echo(f"  activation error: {err}")
        if not p.get("pth"):
            click.echo("  start-up .pth not found on sys.path: reinstall cachedoctor")
    _echo_key_modes(report.key_modes)
    click.echo("multi-host roles (asked of JAX in the fresh interpreter):")
    for role in report.roles:
        click.echo(f"  - {role}")
    for w in report.warnings:
        click.echo(f"warning: {w.code}: {w.message}\n  fix: {w.fix}", err=True)
    if problems:
        for problem in problems:
            click.echo(f"status: {problem}", err=True)
        click.echo("status: the fresh interpreter does not run as configured", err=True)
        ctx.exit(int(ExitCode.FINDINGS))


def _echo_key_modes(summary: dict[str, Any] | None) -> None:
    """Modules per key mode of the cache dir's manifests; each fallback with why."""
    if summary is None:
        return
    modes = summary["modes"]
    if not modes:
        click.echo("key modes: no key manifests in the cache dir yet")
        return
    click.echo("key modes (cache dir manifests, modules per mode):")
    for mode, modules in modes.items():
        more = ", …" if len(modules) > 8 else ""
        click.echo(f"  {mode:<9} {len(modules):>4}  {', '.join(modules[:8])}{more}")
    for module, why in summary["fallbacks"].items():
        click.echo(f"  fell back: {module}: {why}")
    per_process = summary.get("per_process") or []
    for found in per_process[:8]:
        click.echo(f"  per-process key: {found['line']}")
    if len(per_process) > 8:
        click.echo(f"  … and {len(per_process) - 8} more per-process keys (status --json)")


def _shown(key: str, value: object) -> str:
    """A value as `enable` spells it: sub-caches by choice name, an unset value as such."""
    if value is None:
        return "unset"
    if key == "xla_caches":
        names = {v: k for k, v in settings.XLA_CACHE_CHOICES.items()}
        return names.get(str(value), str(value))
    return str(value)
