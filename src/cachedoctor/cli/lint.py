"""`cachedoctor lint [DIR]`: the scan's findings for CI (annotations, JUnit, baselines)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from cachedoctor.cli._common import CI_FORMATS as FORMATS
from cachedoctor.cli._common import SEVERITY_CHOICE, not_a_cache, progress_bar
from cachedoctor.cli.params import EXECUTOR, EXECUTOR_HELP, LOCATION, complete_dir, complete_kind
from cachedoctor.core.findings import Severity
from cachedoctor.core.where import Location, cache_location, open_executor
from cachedoctor.errors import ExitCode
from cachedoctor.render.console import stdout_console
from cachedoctor.render.formats import renderer, write_report

if TYPE_CHECKING:
    from cachedoctor.core.where import ExecutorChoice


@click.command()
@click.argument(
    "directory", required=False, metavar="[DIR]", type=LOCATION, shell_complete=complete_dir
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default="text",
    show_default=True,
    help="text; json; github (workflow annotations); junit (XML test report).",
)
@click.option(
    "--fail-on",
    type=SEVERITY_CHOICE,
    default="error",
    show_default=True,
    help="Exit 1 when a finding not in the baseline reaches this severity.",
)
@click.option(
    "--ignore",
    multiple=True,
    metavar="KIND",
    shell_complete=complete_kind,
    help="Drop findings of KIND (repeatable).",
)
@click.option(
    "--baseline",
    metavar="FILE",
    help="Accept the findings recorded in FILE: they are reported but never fail.",
)
@click.option(
    "--write-baseline",
    metavar="FILE",
    help="Record today's findings in FILE (exit 0); later runs pass it to --baseline.",
)
@click.option(
    "--executor",
    type=EXECUTOR,
    default="local",
    show_default=True,
    metavar="WHERE",
    help=EXECUTOR_HELP,
)
@click.option("-o", "--output", metavar="FILE", help="Write the report to FILE instead of stdout.")
@click.option(
    "--junit", "junit_file", metavar="FILE", help="Also write a JUnit XML report to FILE."
)
@click.pass_context
def lint(
    ctx: click.Context,
    directory: Location | None,
    fmt: str,
    fail_on: str,
    ignore: tuple[str, ...],
    baseline: str | None,
    write_baseline: str | None,
    executor: ExecutorChoice,
    output: str | None,
    junit_file: str | None,
) -> None:
    """Check a cache directory in CI: findings as annotations or JUnit, with baselines.

    DIR defaults to $JAX_COMPILATION_CACHE_DIR. --executor decodes the entries elsewhere, as for
    scan. Exit status: 0 no failing finding, 1 a finding
    at --fail-on or above that is not in the baseline, 2 usage or I/O error, or DIR does not look
    like a JAX cache (files, but no entry, -atime file or sub-cache).
    """
    from cachedoctor.core import lint as core

    kinds = core.parse_kinds(ignore)
    with (
        open_executor(executor) as pool,
        progress_bar(fmt == "text", "scanning") as progress,  # never beside a CI format
    ):
        report = core.lint_directory(
            cache_location(directory),
            fail_on=Severity.parse(fail_on),
            ignore=kinds,
            baseline_path=baseline,
            progress=progress,
            executor=pool,
        )
    not_a_cache(report.scan)
    if junit_file:
        write_report(junit_file, report, "junit")
    if output is not None:
        write_report(output, report, fmt)
    else:
        renderer(fmt).render(report, stdout_console())
    if write_baseline:
        core.write_baseline(write_baseline, report)
        click.echo(
            f"cachedoctor: wrote {len({f.fingerprint for f in report.findings})} fingerprints "
            f"to {write_baseline}",
            err=True,
        )
        ctx.exit(int(ExitCode.OK))
    ctx.exit(int(ExitCode.FINDINGS if report.failed else ExitCode.OK))
