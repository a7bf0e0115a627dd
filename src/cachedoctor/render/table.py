"""Human output with rich: summaries, tables and findings for a terminal."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

from cachedoctor.cache.model import EntryDetail, EntryInfo
from cachedoctor.core.scan.report import ModuleStats, ScanReport, ScanSummary
from cachedoctor.errors import count
from cachedoctor.render.console import print_table

# the finding list is its own module (render/findings.py: stats imports it without the scan's)
from cachedoctor.render.findings import SEVERITY_STYLE as SEVERITY_STYLE
from cachedoctor.render.findings import render_finding_list as render_finding_list
from cachedoctor.units import format_bytes

if TYPE_CHECKING:
    from cachedoctor.core.show import KernelView


def _counts(pairs: tuple[tuple[str, int], ...]) -> str:
    return ", ".join(f"{name} ({n})" for name, n in pairs) or "-"


def _compile_time(s: ScanSummary) -> str:
    """The stored compile times added up, and how many entries have none (undecodable)."""
    if not s.without_compile_time:
        return f"{s.compile_seconds} s"
    return (
        f"{s.compile_seconds} s ({count(s.without_compile_time, 'entry', 'entries')} "
        "undecodable: no compile time)"
    )


def render_scan(report: ScanReport, console: Console, *, max_modules: int = 25) -> None:
    s = report.summary
    console.print(Text(f"cache {report.cache_dir}", style="bold"))
    jax = report.jax
    console.print(
        f"  installed jax {jax.jax_version or 'not installed'}"
        + (f", jaxlib {jax.jaxlib_version}" if jax.jaxlib_version else "")
    )
    rows = [
        ("entries", _entries(s)),
        ("on disk", format_bytes(s.bytes_on_disk)),
        ("decompressed", format_bytes(s.decompressed_bytes)),
        ("compile time stored", _compile_time(s)),
        ("modules", str(s.modules)),
        ("platforms", _counts(s.platforms)),
        ("formats", _counts(s.formats)),
        ("LRU eviction", _eviction(s)),
    ]
    for name, size in s.subcaches:
        rows.append((f"sub-cache {name}", format_bytes(size)))
    sub = report.subcaches
    if sub is not None and sub.autotune.exists:
        kinds = ", ".join(f"{k} ({n})" for k, n in sub.autotune.kind_counts) or "-"
        rows.append(("autotune results", f"{len(sub.autotune.entries)} fusions: {kinds}"))
    if sub is not None and sub.kernel_cache is not None:
        kc = sub.kernel_cache
        version = kc.compatibility_version if kc.compatibility_version is not None else "-"
        rows.append(
            (
                "kernel cache",
                f"{len(kc.entries)} kernels, {format_bytes(kc.total_binary_bytes)} of binaries,"
                f" compatibility version {version}",
            )
        )
    summary = Table.grid(padding=(0, 2))
    summary.add_column(style="dim")
    summary.add_column()
    for k, v in rows:
        summary.add_row(k, v)
    print_table(console, summary)
    if report.modules:
        table = Table(title="modules", title_justify="left", show_edge=False)
        table.add_column("module", overflow="fold")
        table.add_column("entries", justify="right")
        table.add_column("programs", justify="right")
        table.add_column("on disk", justify="right")
        table.add_column("compile s", justify="right")
        with_bad = any(m.undecodable for m in report.modules)
        if with_bad:
            table.add_column("undecodable", justify="right")
        with_modes = any(m.key_modes for m in report.modules)
        if with_modes:
            table.add_column("key mode (stable hasher)", overflow="fold")
        for m in report.modules[:max_modules]:
            style = "yellow" if m.entries - m.undecodable > m.programs else None
            table.add_row(
                m.module,
                str(m.entries),
                str(m.programs),
                format_bytes(m.bytes_on_disk),
                str(m.compile_seconds),
                *([str(m.undecodable)] if with_bad else []),
                *([_key_modes(m)] if with_modes else []),
                style=style,
            )
        if len(report.modules) > max_modules:
            table.caption = f"{len(report.modules) - max_modules} more modules (use --json)"
        print_table(console, table)
    render_findings(report, console)


def _entries(s: ScanSummary) -> str:
    """The regular entries, then what else is named like one: each counted as what it is."""
    notes = [f"{s.corrupt} undecodable"] if s.corrupt else []
    if s.symlinks:
        notes.append(f"+{count(s.symlinks, 'symbolic link')} named -cache, not followed")
    return f"{s.entries} ({'; '.join(notes)})" if notes else str(s.entries)


def _eviction(s: ScanSummary) -> str:
    """JAX's LRU eviction with its evidence: the .lockfile and the entries' -atime files (JAX
    writes both only with eviction on); -atime files without an entry are no evidence."""
    of_entries = (
        f"-atime files beside {s.entry_atime_files} of {count(s.entries, 'entry', 'entries')}"
    )
    if s.lockfile:
        evidence = [".lockfile", of_entries]
    elif s.entry_atime_files:
        evidence = [of_entries, "no .lockfile"]
    else:
        evidence = []
    if s.orphan_atime_files:
        evidence.append(
            count(s.orphan_atime_files, "-atime file", "-atime files") + " without an entry"
        )
    verdict = "in use" if s.eviction_in_use else "off"
    return f"{verdict} ({'; '.join(evidence)})" if evidence else verdict


def _key_modes(module: ModuleStats) -> str:
    """Each key mode with why; ``static`` needs no why, and a count only when modes differ."""
    if not module.key_modes:
        return "- (no manifest)"
    several = len(module.key_modes) > 1
    return "; ".join(
        (f"{u.entries}× " if several else "")
        + (u.mode if u.mode == "static" else f"{u.mode}: {u.reason}")
        for u in module.key_modes
    )


def render_findings(report: ScanReport, console: Console) -> None:
    render_finding_list(report.findings, console)


def _fmt_time(ns: int) -> str:
    return _dt.datetime.fromtimestamp(ns / 1e9, tz=_dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def entry_rows(e: EntryInfo) -> list[tuple[str, str]]:
    rows = [
        ("key", e.key),
        ("module", e.module or "-"),
        ("file", e.path),
        ("on disk", f"{format_bytes(e.size)}, written {_fmt_time(e.mtime_ns)}"),
        ("compression", e.compression or "-"),
        ("decompressed", format_bytes(e.decompressed_size)),
        ("compile time", f"{e.compile_time_s} s" if e.compile_time_s is not None else "-"),
        ("format", e.format_label + (f" ({e.runtime_name})" if e.runtime_name else "")),
        ("platform", e.platform + (f" ({e.pjrt_client_name})" if e.pjrt_client_name else "")),
    ]
    if e.cpu_triple or e.cpu_name:
        rows.append(("cpu target", f"{e.cpu_triple or '?'} / {e.cpu_name or '?'}"))
    rows += [
        ("replicas × partitions", f"{e.num_replicas} × {e.num_partitions}"),
        ("spmd / shardy", f"{e.use_spmd_partitioning} / {e.use_shardy}"),
        ("autotune cache dir", e.autotune_dir or "-"),
        ("autotune mode", e.autotune_mode or "-"),
        ("kernel cache file", e.kernel_cache_file or "-"),
    ]
    if e.hlo is not None:
        rows += [
            ("hlo module", f"{e.hlo.name} (entry {e.hlo.entry_computation})"),
            ("instructions", f"{e.hlo.instructions} in {e.hlo.computations} computations"),
            ("parameters", ", ".join(e.hlo.parameters) or "-"),
            ("result", e.hlo.result or "-"),
            ("top opcodes", ", ".join(f"{op} ({n})" for op, n in e.hlo.opcodes[:8])),
        ]
    if e.gpu is not None:
        g = e.gpu
        rows += [
            ("gpu layout", g.layout + (" (split)" if g.executable_split else "")),
            ("compute capability", g.compute_capability or "-"),
            ("PTX / cubin", f"{format_bytes(g.ptx_size)} / {format_bytes(g.cubin_size)}"),
            ("cuDNN graphs / thunks", f"{g.cudnn_graphs} / {g.thunks}"),
        ]
    if e.tpu is not None:
        t = e.tpu
        rows += [
            ("tpu chip", t.chip or "-"),
            ("tpu program", format_bytes(t.program_size)),
            ("tpu environment", f"{t.environment or '-'} ({format_bytes(t.environment_size)})"),
            ("pallas kernels", str(len(t.kernels))),
        ]
    for section in e.sections:
        rows.append((f"section {section.name}", format_bytes(section.size)))
    rows.append(("executable sha256", e.executable_digest or "-"))
    rows.append(("program digest", e.program_digest or "-"))
    return rows


def render_show(
    detail: EntryDetail,
    console: Console,
    hlo_text: str | None = None,
    kernels: Sequence[KernelView] = (),
    original_hlo_text: str | None = None,
) -> None:
    e = detail.info
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="dim")
    grid.add_column(overflow="fold")
    for k, v in entry_rows(e):
        grid.add_row(k, v)
    print_table(console, grid)
    if e.hlo is not None and e.hlo.custom_calls:
        table = Table(title="custom calls", title_justify="left", show_edge=False)
        table.add_column("instruction")
        table.add_column("target")
        table.add_column("backend_config", overflow="fold")
        for c in e.hlo.custom_calls:
            table.add_row(f"{c.computation}/{c.instruction}", c.target, c.backend_config or "-")
        print_table(console, table)
    elif e.hlo is not None:
        console.print(Text("no custom calls in the compiled module", style="dim"))
    if kernels:
        print_table(console, _kernel_table(kernels))
    for p in e.problems:
        console.print(Text(f"problem {p.kind}: {p.message}", style="bold red"))
    if hlo_text is not None:
        console.rule("HLO" if original_hlo_text is None else "HLO (optimised, as compiled)")
        console.print(hlo_text, markup=False, highlight=False)
    if original_hlo_text is not None:
        console.rule("HLO (before optimisation)")
        console.print(original_hlo_text, markup=False, highlight=False)


def _kernel_table(kernels: Sequence[KernelView]) -> Table:
    """Each Pallas kernel: its name, grid, and where its debug locations point."""
    table = Table(title="pallas kernels (Mosaic)", title_justify="left", show_edge=False)
    table.add_column("instruction")
    table.add_column("kernel")
    table.add_column("grid")
    table.add_column("debug locations", overflow="fold")
    table.add_column("body sha256 (stripped)")
    for k in kernels:
        if k.problem is not None:
            table.add_row(k.instruction, "?", "?", k.problem, (k.body_sha256 or "-")[:12])
            continue
        where = ", ".join(dict.fromkeys(k.locations))  # each file:line once, in order
        grid = "×".join(map(str, k.grid)) if k.grid else "-"
        stripped = (k.stripped_sha256 or "-")[:12]
        table.add_row(k.instruction, k.name or "-", grid, where or "-", stripped)
    return table
