"""`cachedoctor check -- CMD`: run a command repeatedly and report unstable cache keys."""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType
from typing import TYPE_CHECKING

import click

from cachedoctor.cli._common import CI_FORMATS as FORMATS
from cachedoctor.cli.params import complete_dir
from cachedoctor.errors import CachedoctorError, ExitCode, clip
from cachedoctor.render.console import stdout_console
from cachedoctor.render.formats import renderer, write_report

if TYPE_CHECKING:
    from cachedoctor.core.check.report import CheckReport


@click.command(context_settings={"allow_interspersed_args": False})
@click.argument("command", nargs=-1, required=True, metavar="-- CMD [ARGS...]")
@click.option("--runs", default=2, show_default=True, type=click.IntRange(1), help="Fresh runs.")
@click.option(
    "--dir",
    "cache_dir",
    shell_complete=complete_dir,
    metavar="DIR",
    help="Use DIR as the cache (default: a new temp dir).",
)
@click.option("--quiet", is_flag=True, help="Send CMD's output to the log instead of the terminal.")
@click.option("--log", "log_path", metavar="FILE", help="Append CMD's output to FILE (kept).")
@click.option("--keep", is_flag=True, help="Keep the temporary cache directory and log.")
@click.option(
    "--verify",
    is_flag=True,
    help="Run CMD once more reading the cache without trusting it: every module compiles "
    "afresh, and the program each key's cached entry holds is compared with the fresh one "
    "(stale entries).",
)
@click.option(
    "--no-observe", is_flag=True, help="Do not activate cachedoctor's hook in observe mode."
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default="text",
    show_default=True,
    help="Report format (json and junit keep stdout for the report: CMD's stdout goes to stderr).",
)
@click.option("-o", "--output", metavar="FILE", help="Write the report to FILE instead of stdout.")
@click.option(
    "--junit", "junit_file", metavar="FILE", help="Also write a JUnit XML report to FILE."
)
@click.pass_context
def check(
    ctx: click.Context,
    command: tuple[str, ...],
    runs: int,
    cache_dir: str | None,
    quiet: bool,
    log_path: str | None,
    keep: bool,
    verify: bool,
    no_observe: bool,
    fmt: str,
    output: str | None,
    junit_file: str | None,
) -> None:
    """Run CMD several times against one cache and report modules whose key is unstable.

    Each run is a fresh process with JAX_COMPILATION_CACHE_DIR set to one fresh temporary cache
    (or DIR) and every compilation cached. A module that gets a new entry on a later run although
    run 1 compiled it has an unstable cache key. Exit status: 0 all keys stable; 1 an unstable
    key, a stale entry (--verify), or nothing checked (run 1 wrote no entry); 2 usage error, CMD
    failed, or the --verify run did not compile every module run 1 did (NOT CHECKED). The report
    (and --junit FILE) is written on every outcome, a failed CMD included. Modules JAX would not
    store are listed as NOT STORED with JAX's reason. DIR is given to CMD as typed (JAX hashes
    its spelling into the keys).
    """
    from cachedoctor.core.check.check import run_check

    if output is not None:
        _check_writable(output)  # before running CMD, not after
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # cleans up as Ctrl-C does

    machine_stdout = fmt in ("json", "junit") and output is None
    out = None if quiet else (sys.stderr.buffer if machine_stdout else sys.stdout.buffer)
    err = None if quiet else sys.stderr.buffer

    def progress(message: str) -> None:
        sys.stdout.flush()
        click.echo(f"cachedoctor check: {message}", err=True)

    report = run_check(
        command,
        runs=runs,
        cache_dir=cache_dir,
        verify=verify,
        observe=not no_observe,
        log_path=log_path,
        keep=keep,
        stdout=out,
        stderr=err,
        progress=progress,
    )
    if junit_file:
        write_report(junit_file, report, "junit")
    failure = report.command_failed
    if output is not None:
        write_report(output, report, fmt)
    elif failure is None or fmt != "text":  # a failed CMD's text is its one error line
        renderer(fmt).render(report, stdout_console())
    if failure is not None:  # after every report is written: the error line, exit 2
        raise CachedoctorError(failure.message, slug=failure.slug)
    ctx.exit(int(exit_code(report)))


def exit_code(report: CheckReport) -> ExitCode:
    """1 for what the check found; 2 when CMD failed, or the verify run did not compile every
    module run 1 did and found nothing else (it could not vouch for them, as when CMD fails)."""
    if report.command_failed is not None:
        return ExitCode.USAGE
    verify = report.verify
    if report.unstable or (verify is not None and verify.stale) or report.nothing_checked:
        return ExitCode.FINDINGS
    if verify is not None and verify.not_checked:
        return ExitCode.USAGE
    return ExitCode.FINDINGS if report.failed else ExitCode.OK


def _check_writable(output: str) -> None:
    """Refuse an -o FILE that cannot be written, before spending the runs on it."""
    folder = os.path.dirname(os.path.abspath(output))
    problem = None
    if os.path.isdir(output):
        problem = "is a directory"
    elif not os.path.isdir(folder):
        problem = f"its folder {clip(folder)} does not exist"
    elif not os.access(folder, os.W_OK | os.X_OK):
        problem = f"its folder {clip(folder)} is not writable"
    if problem:
        raise CachedoctorError(f"cannot write the report to {clip(output)}: {problem}", slug="io")


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    """SIGTERM unwinds like Ctrl-C: the command is stopped and the temp folder removed."""
    raise SystemExit(128 + signum)
