"""`cachedoctor demo`: reproduce the custom_partitioning cache bug, then fix it, on this machine."""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import click
from rich.console import Console
from rich.text import Text

from cachedoctor.core.check.runner import Run, program_env, run_command
from cachedoctor.core.findings import FindingKind
from cachedoctor.core.scan.run import scan_directory
from cachedoctor.core.where import Location
from cachedoctor.errors import CachedoctorError, ExitCode
from cachedoctor.programs import program_path
from cachedoctor.render.console import stdout_console
from cachedoctor.render.formats import FindingList, renderer

_MISS = re.compile(r"PERSISTENT COMPILATION CACHE MISS for '(jit_f)'")


def _check(run: Run, what: str) -> None:
    if run.returncode != 0:
        tail = "\n".join(run.stderr.strip().splitlines()[-5:])
        raise CachedoctorError(
            f"{what} failed (exit {run.returncode}):\n{tail}", slug="demo-failed"
        )


def _f_entries(cache: str) -> set[str]:
    return {p.name.removesuffix("-cache") for p in Path(cache).glob("jit_f-*-cache")}


def _runs(console: Console, cache: str, runs: int, extra_env: dict[str, str]) -> list[bool]:
    """Run the seed program ``runs`` times; True for each run that hit the cache for jit_f."""
    hits = []
    for i in range(runs):
        before = _f_entries(cache)
        env = program_env(cache, {"JAX_EXPLAIN_CACHE_MISSES": "1", **extra_env})
        run = run_command([sys.executable, str(program_path("seed"))], env)
        _check(run, f"run {i + 1}")
        missed = bool(_MISS.search(run.stderr + run.stdout))
        new = sorted(_f_entries(cache) - before)
        result = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
        outcome = "miss, compiled" if missed else "hit"
        wrote = f", wrote {new[0][:22]}…" if new else ""
        console.print(f"   run {i + 1}: {outcome}{wrote}  {result}  ({run.seconds:.1f} s)")
        hits.append(not missed)
    return hits


@click.command()
@click.option(
    "--runs",
    default=3,
    show_default=True,
    type=click.IntRange(2),
    help="Fresh processes per phase (at least 2: one run cannot show a key changing or hitting).",
)
@click.option("--keep", is_flag=True, help="Keep the temporary cache directory and print its path.")
@click.pass_context
def demo(ctx: click.Context, runs: int, keep: bool) -> None:
    """Reproduce the custom_partitioning cache bug and show the fix.

    Runs a small JAX program with a custom_partitioning op (8 CPU devices) in fresh processes
    against a temporary cache: first with plain JAX (every run recompiles), then with
    cachedoctor's stable keys enabled for those processes (the first run compiles, the rest hit).
    Nothing outside the temporary directory is changed.
    """
    console = stdout_console()
    workdir = tempfile.mkdtemp(prefix="cachedoctor-demo-")
    cache = os.path.join(workdir, "cache")
    os.mkdir(cache)
    try:
        console.print(Text("1. plain JAX: the seed program in fresh processes", style="bold"))
        _runs(console, cache, runs, {"CACHEDOCTOR_DISABLE": "1"})
        entries = sorted(_f_entries(cache))
        console.print(f"   the cache now holds {len(entries)} entries for jit_f:")
        for key in entries:
            console.print(f"     {key}")

        console.print(Text("\n2. cachedoctor scan", style="bold"))
        report = scan_directory(Location.local(cache), entries=False)
        renderer("text").render(FindingList(report.findings), console)
        unstable = [f for f in report.findings if f.kind is FindingKind.UNSTABLE_KEY]
        if not unstable:
            console.print(
                Text("no unstable-key finding: this JAX keeps the key stable", style="green")
            )

        console.print(Text("\n3. cachedoctor enable (for the demo's processes only)", style="bold"))
        from cachedoctor.stablekeys import settings

        config = os.path.join(workdir, "config.toml")
        settings.save({"cache_dir": cache, "hook": "stable"}, Path(config))
        console.print(f"   config {config}: cache_dir = {cache}, hook = stable")
        hits = _runs(console, cache, runs, {"CACHEDOCTOR_CONFIG": config})
        stable = sorted(_f_entries(cache) - set(entries))
        console.print(f"   new jit_f entries with stable keys: {len(stable)}")
        for key in stable:
            console.print(f"     {key}")
        later_hits = sum(hits[1:])
        verdict = (
            f"{later_hits} of {runs - 1} later runs hit the cache"
            if runs > 1
            else "run more than once to see hits"
        )
        style = "green" if runs > 1 and later_hits == runs - 1 else "red"
        console.print(Text(f"   {verdict}", style=style))
        ok = len(stable) == 1 and later_hits == runs - 1
        ctx.exit(int(ExitCode.OK if ok else ExitCode.FINDINGS))
    finally:
        if keep:
            console.print(f"\ncache kept at {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
