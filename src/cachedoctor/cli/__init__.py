"""The command-line layer: parse options, call one core function, hand its report to a renderer.

Commands are loaded lazily (name -> module) so that ``cachedoctor --help`` and a scan of an
empty directory never import jax.
"""

from __future__ import annotations

import gc
import importlib
import logging
import os
import sys
import traceback
import warnings
from typing import Any

import click

from cachedoctor._version import __version__
from cachedoctor.errors import CachedoctorError, ExitCode

# command name -> (module under cachedoctor.cli, attribute, one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "scan": ("scan", "scan", "Summarise a cache directory and report findings."),
    "show": ("show", "show", "Show everything known about one cache entry."),
    "demo": ("demo", "demo", "Reproduce the custom_partitioning cache bug and show the fix."),
    "diff": ("diff", "diff", "Explain why two cache entries are different entries."),
    "lint": ("lint", "lint", "Check a cache in CI: findings as annotations or JUnit, baselines."),
    "check": ("check", "check", "Run a command repeatedly and report unstable cache keys."),
    "enable": ("enable", "enable", "Turn on the cache and stable keys for this environment."),
    "disable": ("disable", "disable", "Undo `enable`."),
    "status": ("status", "status", "Show effective cache settings and whether the hook is active."),
    "prune": ("prune", "prune", "Remove entries by rule (dry run unless --apply); --repair fixes."),
    "rekey": ("rekey", "rekey", "Move manifest-bearing entries to their current stable key."),
    "stats": ("stats", "stats", "Hit rate and compile time saved, from per-process records."),
    "why": ("why", "why", "Why did a run miss: what differs from the nearest earlier key."),
    "preflight": (
        "preflight",
        "preflight",
        "Will this cache hit here: each module, before the run.",
    ),
    "pack": ("pack", "pack", "Pack the entries that can still hit into one file to take along."),
    "unpack": ("pack", "unpack", "Check a bundle against this machine, then write it (--apply)."),
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported only when they run."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module_name, attr, _ = COMMANDS[cmd_name]
        module = importlib.import_module(f"cachedoctor.cli.{module_name}")
        command: click.Command = getattr(module, attr)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Help text comes from the table above, so --help imports no command module.
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _print_version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """``--version``: cachedoctor's, and the JAX it reads caches with (from the installed
    packages' metadata: no jax import)."""
    if not value or ctx.resilient_parsing:
        return
    import platform
    from importlib import metadata

    def version_of(name: str) -> str:
        try:
            return f"{name} {metadata.version(name)}"
        except metadata.PackageNotFoundError:
            return f"{name} not installed"

    click.echo(
        f"cachedoctor {__version__} ({version_of('jax')}, {version_of('jaxlib')}; "
        f"Python {platform.python_version()})"
    )
    ctx.exit()


@click.group(cls=LazyGroup)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show the version, and the installed jax and jaxlib, and exit.",
)
def cli() -> None:
    """Inspect, explain and repair JAX's persistent compilation cache."""


def main(argv: list[str] | None = None) -> Any:
    """Console entry point: one line per error, a traceback only with CACHEDOCTOR_DEBUG=1."""
    _no_startup_activation()
    _quiet_bucket_clients()
    args = sys.argv[1:] if argv is None else argv
    if args and not args[0].startswith("-"):  # a command runs (not --help or --version alone)
        _keep_freed_memory()
    from cachedoctor.core.where import telling_waits

    try:
        with telling_waits(lambda line: click.echo(line, err=True)):
            return cli.main(args=argv, standalone_mode=False)
    except CachedoctorError as exc:
        click.echo(f"cachedoctor: {exc.slug}: {exc}", err=True)
        sys.exit(int(exc.code))
    except click.exceptions.Abort:
        click.echo("cachedoctor: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(int(ExitCode.USAGE))
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("cachedoctor: interrupted", err=True)
        sys.exit(130)
    except Exception as exc:  # never a bare traceback for the user
        if os.environ.get("CACHEDOCTOR_DEBUG"):
            traceback.print_exc()
        click.echo(
            f"cachedoctor: internal-error: {type(exc).__name__}: {exc} "
            "(set CACHEDOCTOR_DEBUG=1 for the traceback)",
            err=True,
        )
        sys.exit(int(ExitCode.USAGE))


def run() -> None:
    """The console script and ``python -m cachedoctor``: :func:`main`, then an exit that skips
    the interpreter's last garbage collections (``gc.freeze``). They walk every object the
    command made, about 0.1 s of a 0.6 s ``scan`` of a small cache, to free memory the process
    gives back whole as it ends; objects are still released as modules are cleared. Not in
    :func:`main`, which tests and programs call inside a process that goes on."""
    try:
        code = main()
    finally:
        gc.freeze()
    sys.exit(code)


def _quiet_bucket_clients() -> None:
    """Keep two lines of the bucket clients off stderr, so that a command's first line is
    cachedoctor's own (its one-line error says what failed): gcsfs's "Could not determine bucket
    type ..., falling back to GCSFileSystem" (it falls back by itself; google-auth's "default
    credentials were not found" inside it), and google-auth's warning about gcloud user
    credentials without a quota project (a billing note for API calls, not about the cache).
    CACHEDOCTOR_DEBUG=1 keeps both."""
    if os.environ.get("CACHEDOCTOR_DEBUG"):
        return
    warnings.filterwarnings(
        "ignore",
        message="Your application has authenticated using end user credentials",
        category=UserWarning,
    )
    gcsfs = logging.getLogger("gcsfs")
    if _not_the_fallback not in gcsfs.filters:  # main() runs more than once in a test process
        gcsfs.addFilter(_not_the_fallback)


def _not_the_fallback(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("Could not determine bucket type")


def _keep_freed_memory() -> None:
    """Let this process reuse the memory it frees instead of handing it back to the system.

    A scan decompresses each entry into a fresh buffer (MBs for a large program), and glibc's
    defaults hand such buffers back when freed until its thresholds adapt: their pages were
    faulted in anew, 12,000 faults (~45 ms on a VM) in the first scan of 20 large programs,
    3,500 now. Buffers under 64 MiB come from the heap, which keeps up to 256 MiB freed; the
    process is short-lived, and its peak grew by 1 MB there and 9 of 87 MB for 10,000 entries.
    Forked pool workers inherit it. Only with glibc (whose ``mallopt`` parameters these are);
    elsewhere, and for the API inside a user's program, nothing changes. Not for ``--help``:
    importing ctypes costs ~6 ms of its start-up.
    """
    if not _glibc():
        return
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's malloc.h
    mallopt(m_mmap_threshold, 64 << 20)
    mallopt(m_trim_threshold, 256 << 20)


def _glibc() -> bool:
    try:
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (ValueError, OSError, AttributeError):  # no such name off glibc, or no confstr
        return False


def _no_startup_activation() -> None:
    """cachedoctor itself never compiles: its own process needs no start-up activation.

    (``status`` and ``check`` ask fresh interpreters, which still activate as configured.)
    """
    startup = sys.modules.get("cachedoctor.stablekeys._startup")
    if startup is not None:
        startup._remove_watcher()
