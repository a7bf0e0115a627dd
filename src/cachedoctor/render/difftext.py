"""Human output of ``cachedoctor diff``: the verdict first, then each section, top down."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from cachedoctor.core.diff.options import cleared_by_jax
from cachedoctor.core.diff.report import DiffReport, EntrySide, ModuleDiffReport
from cachedoctor.units import format_bytes
from cachedoctor.xla.optiondiff import FieldDiff

MAX_OPTION_ROWS = 25
MAX_DIFF_LINES = 200
MAX_REMOVED_EXAMPLES = 3


def _heading(console: Console, title: str) -> None:
    console.print()
    console.print(Text(title, style="bold underline"))


def _side_line(label: str, s: EntrySide) -> Text:
    when = _dt.datetime.fromtimestamp(s.mtime_ns / 1e9, tz=_dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
    text = Text()
    text.append(f"{label}  ", style="bold")
    text.append(s.key)
    text.append(
        f"\n   {s.path}\n   {s.format}, {s.platform}, {format_bytes(s.size)} on disk, "
        f"compiled in {s.compile_time_s} s, written {when} UTC",
        style="dim",
    )
    return text


def _value(v: str | None) -> str:
    return "(unset)" if v is None else v


def _options_table(console: Console, diffs: Sequence[FieldDiff], limit: int) -> None:
    """One difference per line, or three when the values are long (paths)."""
    for d in diffs[:limit]:
        a, b = _value(d.a), _value(d.b)
        if len(d.path) + len(a) + len(b) < 96:
            console.print(Text(f"  {d.path}: {a} vs {b}"), soft_wrap=True)
        else:
            console.print(Text(f"  {d.path}"), soft_wrap=True)
            console.print(Text(f"      A {a}"), soft_wrap=True)
            console.print(Text(f"      B {b}"), soft_wrap=True)
    if len(diffs) > limit:
        console.print(Text(f"  … and {len(diffs) - limit} more (--json lists all)", style="dim"))


def _unified(console: Console, lines: Sequence[str], limit: int = MAX_DIFF_LINES) -> None:
    for line in lines[:limit]:
        style = None
        if line.startswith(("+++", "---")):
            style = "bold"
        elif line.startswith("+"):
            style = "green"
        elif line.startswith("-"):
            style = "red"
        elif line.startswith("@@"):
            style = "cyan"
        console.print(Text(line, style=style or ""), soft_wrap=True)
    if len(lines) > limit:
        console.print(Text(f"… {len(lines) - limit} more diff lines (--json has all)", style="dim"))


def render_diff(report: DiffReport, console: Console, *, show_sides: bool = True) -> None:
    v = report.verdict
    line = Text()
    line.append("verdict: ", style="bold")
    line.append(v.line, style="bold green" if v.equivalent else "bold yellow")
    console.print(line, soft_wrap=True)
    for reason in v.because:
        console.print(Text(f"  · {reason}"), soft_wrap=True)
    if v.advice:
        console.print(Text(f"  → {v.advice}", style="cyan"), soft_wrap=True)
    if show_sides:
        console.print()
        console.print(_side_line("A", report.a))
        console.print(_side_line("B", report.b))
    _key_components(report, console)
    _options_section(report, console)
    _hlo_section(report, console)
    _kernel_section(report, console)
    _executable_section(report, console)


def _key_components(report: DiffReport, console: Console) -> None:
    """The key components in the hook's manifests, or a note saying why there are none."""
    m = report.manifest
    _heading(console, "key components")
    console.print(Text(m.note, style="" if m.available else "dim"))
    if m.available:
        if m.stable_keys[0] or m.stable_keys[1]:
            if m.stable_keys[0] == m.stable_keys[1]:
                console.print(Text(f"  stable keys: the same ({m.stable_keys[0]})"))
            else:
                console.print(
                    Text(f"  stable keys: {m.stable_keys[0]} vs {m.stable_keys[1]}", style="yellow")
                )
        same = [c.name for c in m.components if c.same]
        if same:
            console.print(Text("  = " + ", ".join(same), style="dim"), soft_wrap=True)
        for c in m.components:
            if c.same:
                continue
            text = Text(f"  ≠ {c.name}", style="yellow")
            if c.a is not None or c.b is not None:
                text.append(f": {_value(c.a)} vs {_value(c.b)}")
            console.print(text, soft_wrap=True)
            for d in c.fields[:MAX_OPTION_ROWS]:
                console.print(
                    Text(f"      {d.path}: {_value(d.a)} vs {_value(d.b)}"), soft_wrap=True
                )
        same_volatile = [vi.field for vi in m.volatile if vi.a_raw == vi.b_raw]
        for vi in m.volatile:
            if vi.a_raw == vi.b_raw:
                continue
            note = (
                " (canonicalised to the same value)"
                if vi.a_canonical == vi.b_canonical
                else " (canonicalised to different values)"
            )
            console.print(
                Text(f"  ≠ volatile {vi.field}: {_value(vi.a_raw)} vs {_value(vi.b_raw)}{note}"),
                soft_wrap=True,
            )
        if same_volatile:
            console.print(
                Text("  = volatile " + ", ".join(same_volatile), style="dim"), soft_wrap=True
            )
        for name, x, y in m.versions:
            console.print(Text(f"  ≠ {name}: {_value(x)} vs {_value(y)}", style="yellow"))
        for target, x, y in m.backend_configs:
            label = "same" if x == y else "different"
            console.print(
                Text(f"  recorded modules: {target} backend_config {label}: {x} vs {y}"),
                soft_wrap=True,
            )
        if m.ir_diff:
            console.print(Text("  recorded modules differ:", style="bold"))
            _unified(console, m.ir_diff)


def _options_section(report: DiffReport, console: Console) -> None:
    """Compile options, the executable's effective module config and the pjrt_ifrt header."""
    o = report.options
    _heading(console, "compile options")
    hashed = [d for d in o.compile_options if not cleared_by_jax(d)]
    cleared = [d for d in o.compile_options if cleared_by_jax(d)]
    if not hashed:
        console.print(Text("identical" + (" in what JAX hashes" if cleared else ""), style="green"))
    else:
        _options_table(console, hashed, MAX_OPTION_ROWS)
    if cleared:
        names = ", ".join(sorted({d.path.rsplit(".", 1)[-1] for d in cleared}))
        console.print(
            Text(
                f"also differ, but JAX clears them before hashing (not key inputs): {names}",
                style="dim",
            ),
            soft_wrap=True,
        )
    mirrored = {(d.path.split("debug_options.", 1)[-1], d.a, d.b) for d in o.compile_options}
    extra = [
        d
        for d in o.module_config
        if (d.path.split("debug_options.", 1)[-1], d.a, d.b) not in mirrored
    ]
    if o.module_config:
        console.print(
            Text(
                f"effective module config (in the executable): {len(o.module_config)} "
                f"differences, {len(extra)} not shown above",
                style="dim",
            )
        )
        if extra:
            _options_table(console, extra, 10)
    if o.ifrt_header:
        console.print(Text("pjrt_ifrt header:", style="dim"))
        _options_table(console, o.ifrt_header, 10)
    console.print(Text(f"field names from {o.names_from}", style="dim"))


def _hlo_section(report: DiffReport, console: Console) -> None:
    """The canonical HLO, what normalisation removed, and jaxlib's HLO text."""
    h = report.hlo
    _heading(console, "HLO")
    if not h.available:
        console.print(Text(h.note or "not available", style="dim"))
    else:
        if h.same_canonical:
            console.print(
                Text(
                    f"canonical HLO identical ({h.instructions[0]} instructions)",
                    style="green",
                )
            )
        else:
            console.print(
                Text(
                    f"{h.changed_instructions} of {max(h.instructions)} instructions differ "
                    f"(A {h.instructions[0]}, B {h.instructions[1]})",
                    style="yellow",
                )
            )
            _unified(console, h.canonical_diff)
        if h.removed_counts:
            console.print(Text("removed or ignored by normalisation (real values):", style="bold"))
            for category, what, count in h.removed_counts:
                examples = [r for r in h.removed if r.category == category and r.what == what]
                console.print(Text(f"  {category:24} {what}: {count} differ"))
                for r in examples[:MAX_REMOVED_EXAMPLES]:
                    console.print(
                        Text(f"      {r.where}: {r.a} vs {r.b}", style="dim"), soft_wrap=True
                    )
        elif h.same_canonical:
            console.print(Text("no differences removed by normalisation", style="dim"))
        if h.note:
            console.print(Text(h.note, style="dim"))
        if h.raw_diff is not None:
            console.print(Text("HLO text (jaxlib):", style="bold"))
            if h.raw_diff:
                _unified(console, h.raw_diff)
            else:
                console.print(Text("identical", style="green"))


def _kernel_section(report: DiffReport, console: Console) -> None:
    """Each Pallas kernel: the same body, moved (debug locations only), or changed."""
    k = report.kernels
    if k is None:
        return
    _heading(console, "pallas kernels (Mosaic)")
    if k.note:
        console.print(Text(k.note, style="dim"), soft_wrap=True)
    for p in k.pairs:
        name = f"{p.name or '?'} ({p.instruction})"
        if p.same_body:
            console.print(Text(f"  = {name}: the same body", style="dim"), soft_wrap=True)
        elif p.same_stripped:
            console.print(Text(f"  ~ {name}: debug locations only: {p.change}"), soft_wrap=True)
            moved = zip(p.a_locations, p.b_locations, strict=False)
            for a_loc, b_loc in dict.fromkeys((x, y) for x, y in moved if x != y):
                console.print(Text(f"      {a_loc} → {b_loc}", style="dim"), soft_wrap=True)
        elif p.same_stripped is False:
            console.print(
                Text(f"  ≠ {name}: the body differs beyond its debug locations", style="yellow"),
                soft_wrap=True,
            )
        else:
            console.print(Text(f"  ? {name}: could not be read"), soft_wrap=True)


def _executable_section(report: DiffReport, console: Console) -> None:
    """The executable's bytes: identical, or section by section."""
    e = report.executable
    _heading(console, "executable bytes")
    if e.identical:
        digest = report.a.executable_digest or ""
        console.print(Text(f"identical (sha256 {digest[:16]}…)", style="green"))
        return
    table = Table(show_edge=False, box=None, padding=(0, 2))
    table.add_column("section")
    table.add_column("A", justify="right")
    table.add_column("B", justify="right")
    table.add_column("")
    for s in e.sections:
        table.add_row(
            s.name,
            "-" if s.a_size is None else "scalar" if s.scalar else format_bytes(s.a_size),
            "-" if s.b_size is None else "scalar" if s.scalar else format_bytes(s.b_size),
            Text("same", style="dim") if s.same else Text("differs", style="yellow"),
        )
    console.print(table)


def render_module(report: ModuleDiffReport, console: Console) -> None:
    head = Text()
    head.append(f"module {report.module}", style="bold")
    compared = len(report.reports) + (report.latest is not None)
    total = compared + len(report.undecodable)
    head.append(f" in {report.cache_dir}: {total} entries", style="dim")
    console.print(head)
    for why in report.undecodable:
        line = Text(f"not compared (does not decode): {why}", style="yellow")
        console.print(line, soft_wrap=True)
    if report.latest is None:
        console.print(Text("no entry decodes: nothing to compare", style="yellow"))
        return
    console.print(Text(f"most recent: {report.latest}", style="dim"))
    if not report.reports:
        console.print(Text("only one decodable entry: nothing to compare", style="green"))
        return
    for r in report.reports:
        console.print()
        console.rule(Text(f"{r.a.key}  vs  most recent", style="bold"))
        render_diff(r, console, show_sides=False)
