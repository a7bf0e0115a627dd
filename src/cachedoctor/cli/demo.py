"""`cachedoctor demo`: reproduce the custom_partitioning cache bug on this machine."""

from __future__ import annotations

import shutil
import tempfile

import click
from rich.text import Text

from cachedoctor.cli._common import stdout_console
from cachedoctor.errors import CachedoctorError, ExitCode
from cachedoctor.runner import Run, run_program
from cachedoctor.scan import FindingKind, scan_directory


def _check(run: Run, what: str) -> None:
    if run.returncode != 0:
        tail = "\n".join(run.stderr.strip().splitlines()[-5:])
        raise CachedoctorError(
            f"{what} failed (exit {run.returncode}):\n{tail}", slug="demo-failed"
        )


@click.command()
@click.option("--runs", default=3, show_default=True, help="Fresh processes per phase.")
@click.option("--keep", is_flag=True, help="Keep the temporary cache directory and print its path.")
@click.pass_context
def demo(ctx: click.Context, runs: int, keep: bool) -> None:
    """Reproduce the custom_partitioning cache bug and show the fix.

    Runs a small JAX program with a custom_partitioning op (8 CPU devices) several times in
    fresh processes against a temporary cache, then scans the cache.
    """
    console = stdout_console()
    workdir = tempfile.mkdtemp(prefix="cachedoctor-demo-")
    try:
        console.print(Text("1. plain JAX: the seed program, run in fresh processes", style="bold"))
        for i in range(runs):
            run = run_program("seed", workdir)
            _check(run, f"run {i + 1}")
            result = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
            console.print(f"   run {i + 1}: {result}  ({run.seconds:.1f} s)")
        report = scan_directory(workdir)
        entries = [e for e in report.entries if e.module == "jit_f"]
        console.print(f"   the cache now holds {len(entries)} entries for jit_f:")
        for e in entries:
            console.print(f"     {e.key}")
        unstable = [f for f in report.findings if f.kind is FindingKind.UNSTABLE_KEY]
        console.print(Text("\n2. cachedoctor scan", style="bold"))
        from cachedoctor.render.table import render_findings

        render_findings(report, console)
        if not unstable:
            console.print(
                Text("no unstable-key finding: this JAX keeps the key stable", style="green")
            )
        ctx.exit(int(ExitCode.OK))
    finally:
        if keep:
            console.print(f"\ncache kept at {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
