"""``cachedoctor enable``: turn on the cache and the stable-key hook for this environment."""

from __future__ import annotations

import click

from cachedoctor.cli.params import SECONDS, SIZE, complete_dir
from cachedoctor.stablekeys import activation, settings

# Values a second `enable` keeps from the config file unless given again.
_KEPT = (
    "cache_dir",
    "xla_caches",
    "min_compile_time_secs",
    "min_entry_size_bytes",
    "max_size",
    "read_only",
    "records_dir",
)


@click.command("enable")
@click.option(
    "--dir",
    "cache_dir",
    shell_complete=complete_dir,
    metavar="DIR",
    help="Cache directory (default: the one configured before, else $JAX_COMPILATION_CACHE_DIR).",
)
@click.option(
    "--xla-caches",
    type=click.Choice(sorted(settings.XLA_CACHE_CHOICES)),
    help="XLA sub-caches kept under the cache dir (default: autotune, as JAX).",
)
@click.option(
    "--min-compile-time",
    type=SECONDS,
    metavar="SECONDS",
    help="Only cache compiles slower than this (s; JAX's default 1 s skips quick programs, "
    "0 caches every compile).",
)
@click.option(
    "--min-entry-size", type=click.IntRange(0), help="Only cache entries at least this big (bytes)."
)
@click.option(
    "--max-size",
    type=SIZE,
    metavar="SIZE",
    help="Evict least recently used entries above this size (50GB, 800MiB, bytes).",
)
@click.option(
    "--mode",
    type=click.Choice(settings.HOOK_CHOICES),
    default="stable",
    show_default=True,
    help="stable: use stable keys; observe: keep JAX's keys, record stable ones; stats: only "
    "record hits and misses (`cachedoctor stats`); off: no hook.",
)
@click.option("--stats-only", is_flag=True, help="Same as --mode stats: keys stay JAX's own.")
@click.option("--record-ir", is_flag=True, help="Keep each module's canonical text (for diff).")
@click.option(
    "--read-only/--writable",
    "read_only",
    default=None,
    help="Hit the cache, never write to it: no entry, -atime file or manifest (PR builds, "
    "serving hosts); stats records go to --records-dir. Kept by a later `enable` until "
    "--writable.",
)
@click.option(
    "--records-dir",
    metavar="DIR",
    shell_complete=complete_dir,
    help="Where a read-only process writes its stats record (default: a folder of this user's; "
    "`cachedoctor stats DIR` reads it).",
)
@click.option("--print-env", is_flag=True, help="Print the environment instead of installing.")
@click.option(
    "--shell",
    type=click.Choice(activation.SHELLS),
    help="Syntax for --print-env (default: sh).",
)
def enable(
    cache_dir: str | None,
    xla_caches: str | None,
    min_compile_time: float | None,
    min_entry_size: int | None,
    max_size: int | None,
    mode: str,
    stats_only: bool,
    record_ir: bool,
    read_only: bool | None,
    records_dir: str | None,
    print_env: bool,
    shell: str | None,
) -> None:
    """Activate the cache and the stable-key hook for every Python process of this environment.

    Writes one config file (see `cachedoctor status`); a static start-up .pth reads it when JAX is
    imported. Environment variables still override each value. Run again, it keeps the
    directory, sub-caches, thresholds and size limit of the previous config unless given again
    (it says which); a broken config file is replaced.
    """
    if shell is not None and not print_env:
        raise click.UsageError("--shell only applies to --print-env")
    existing, broken = activation.previous_values()
    if broken is not None:
        _warn(broken)
    values = activation.build_values(
        existing=existing,
        cache_dir=cache_dir,
        xla_caches=xla_caches,
        min_compile_time=min_compile_time,
        min_entry_size=min_entry_size,
        max_size=max_size,
        hook="stats" if stats_only else mode,
        record_ir=record_ir,
        read_only=read_only,
        records_dir=records_dir,
    )
    local = activation.local_subcaches(values)
    if print_env:
        for w in activation.preflight(values):
            _warn(w)
        if local:
            click.echo(_local_note(local), err=True)
        click.echo(activation.format_env(settings.environment(values), shell or "sh"), nl=False)
        return
    report = activation.enable(values)
    for w in report.warnings:
        _warn(w)
    click.echo(f"enabled: wrote {report.config_path}")
    for key, value in report.values.items():
        if key != "created_dirs":
            click.echo(f"  {key} = {value}")
    given = {
        "cache_dir": cache_dir,
        "xla_caches": xla_caches,
        "min_compile_time_secs": min_compile_time,
        "min_entry_size_bytes": min_entry_size,
        "max_size": max_size,
        "read_only": read_only,
        "records_dir": records_dir,
    }
    kept = [k for k in _KEPT if given[k] is None and k in existing]
    if kept:
        click.echo("  kept from the previous config: " + ", ".join(kept))
    if "min_compile_time_secs" not in values:
        click.echo(
            "  note: JAX caches only compiles slower than 1 s by default; "
            "--min-compile-time 0 caches every compile"
        )
    if report.created_cache_dir:
        click.echo(f"  created {report.values['cache_dir']}")
    if report.local_subcaches:
        click.echo(f"  {_local_note(report.local_subcaches)}")
        for flag in settings.url_subcache_flags(report.values):
            click.echo(f"    XLA_FLAGS += {flag}")
    click.echo("new Python processes of this environment use it; check: `cachedoctor status`")


def _warn(w: activation.Warning_) -> None:
    click.echo(f"warning: {w.code}: {w.message}\n  fix: {w.fix}", err=True)


def _local_note(local: str) -> str:
    return (
        f"XLA sub-caches kept locally at {local} (XLA cannot write gs:// or s3://); "
        "JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES=none, the paths go in XLA_FLAGS"
    )
