"""``cachedoctor stats`` output: a terminal summary with a hit-rate chart, and a standalone page.

The HTML page holds everything it shows (inline CSS and SVG, no script, no network), so it can be
attached to a CI run or mailed and still open.
"""

from __future__ import annotations

import html
import math
import re
import time
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from cachedoctor.core.stats import Group, StatsReport, ZeroReport
from cachedoctor.core.usage.model import Counters
from cachedoctor.errors import count
from cachedoctor.render.console import print_table
from cachedoctor.render.findings import render_finding_list

BAR_WIDTH = 40  # characters of the terminal chart's full bar
_CODE_SPAN = re.compile(r"`([^`\n]+)`")  # `cachedoctor diff --module m`, as the words mark code


def rate_words(c: Counters) -> str:
    rate = c.hit_rate
    return "-" if rate is None else f"{rate:.0%}"


def secs(value: float) -> str:
    """Seconds to one decimal, minutes from 100 s; under 0.1 s as many decimals as it takes to
    show a digit (0.005 s, not 0.0 s: a cost that is there reads as there)."""
    size = abs(value)
    if size >= 100:
        return f"{value / 60:.1f} min"
    digits = 1 if size == 0 or size >= 0.1 else -math.floor(math.log10(size))
    if digits > 1 and round(size, digits) >= 10.0 ** (1 - digits):
        digits -= 1  # 0.0096 rounds to 0.01, not 0.010
    return f"{value:.{min(digits, 6)}f} s"


def saved_figure(c: Counters) -> tuple[str, str]:
    """Compile time saved as a person reads it: the figure, and the words that explain a figure
    of none (else ""). JAX counts each hit's saving as the compile time it kept with the entry
    minus the read's time, and keeps compile times in whole seconds: hits of modules that
    compile in under 1 s sum to minus their reads' time, never shown as a negative saving."""
    if c.hits == 0:
        return "none", "no lookup hit"
    if c.saved_secs < 0:
        return "none", (
            f"reads cost {secs(-c.saved_secs)} more than the compiles they replaced, as JAX "
            "counts them (it keeps compile times in whole seconds)"
        )
    return secs(c.saved_secs), ""


def saved_words(c: Counters) -> str:
    """:func:`saved_figure` in one line: what every format says of the compile time saved."""
    figure, words = saved_figure(c)
    return f"{figure}: {words}" if words else figure


def stats_document(report: StatsReport) -> dict[str, Any]:
    """``stats --json``: ``report.to_dict()`` under a ``schema_version`` (docs/stats.md)."""
    from cachedoctor.core.scan.report import SCHEMA_VERSION  # the scan's: imported when asked

    return {"schema_version": SCHEMA_VERSION, **report.to_dict()}


def render_stats(report: StatsReport, console: Console, *, max_modules: int = 25) -> None:
    t = report.totals
    console.print(Text(heading(report), style="bold"))
    for line in whose_lines(report):
        console.print("  " + line)
    scope = scope_words(report)
    if report.processes == 0:
        console.print(no_records(report, scope))
        render_finding_list(report.findings, console)
        return
    if scope:
        console.print("  " + ", ".join(scope))
    summary = Table.grid(padding=(0, 2))
    summary.add_column(style="dim")
    summary.add_column()
    for name, value in (
        ("processes", str(report.processes)),
        ("requests", str(t.requests)),
        ("hits", str(t.hits)),
        ("misses", str(t.misses)),
        ("hit rate", rate_words(t)),
        ("entries written", str(t.writes)),
        *_not_written(t),
        ("compile time saved", saved_words(t)),
        ("compile time spent", secs(t.compile_secs) + " (on misses)"),
        ("retrieval time", secs(t.retrieval_secs)),
    ):
        summary.add_row(name, value)
    print_table(console, summary)
    _render_chart(report.days, console)
    modules = Table(
        title="modules (most compile time spent on misses first)",
        title_justify="left",
        show_edge=False,
    )
    for col in ("module", "processes", "requests", "hits", "misses", "hit rate", "spent s"):
        modules.add_column(col, justify="left" if col == "module" else "right")
    modules.add_column("why it missed")
    for m in report.modules[:max_modules]:
        c = m.counters
        modules.add_row(
            m.module,
            str(m.processes),
            str(c.requests),
            str(c.hits),
            str(c.misses),
            rate_words(c),
            f"{c.compile_secs:.2f}",
            m.missed_because or "",
            style="yellow" if m.never_hit else None,
        )
    if len(report.modules) > max_modules:
        modules.caption = f"{len(report.modules) - max_modules} more modules (use --json)"
    print_table(console, modules)
    _render_groups("hosts", report.hosts, console)
    render_finding_list(report.findings, console)


def _not_written(t: Counters) -> list[tuple[str, str]]:
    """The misses JAX did not turn into an entry, by outcome (rows only when there are any)."""
    rows = []
    for name, parts in (
        ("failed writes", [(t.write_failures, "put raised"), (t.writes_lost, "no entry after")]),
        (
            "refused by JAX",
            [
                (t.refused_host_callbacks, "host callbacks"),
                (t.refused_compile_time, "under the minimum compile time"),
                (t.refused_size, "under the minimum entry size"),
                (t.refused_process, "not process 0"),
            ],
        ),
        ("read-only", [(t.refused_read_only, "misses not written, by choice")]),
    ):
        said = [f"{label} {n}" for n, label in parts if n]
        if said:
            rows.append((name, f"{sum(n for n, _ in parts)} ({', '.join(said)})"))
    return rows


def heading(report: StatsReport) -> str:
    """What the figures are of: the one cache (a records folder's too), or the folder whose
    records are of several caches."""
    if report.cache is None:
        return f"records in {report.cache_dir}, of {len(report.records_of)} caches"
    return f"cache {report.cache}"


def whose_lines(report: StatsReport) -> list[str]:
    """Whose records the figures add up, where that is not the cache's own folder alone, and
    where the records of its read-only runs are that they do not add up."""
    caches = report.records_of
    lines = []
    if len(caches) == 1 and caches[0][2]:
        lines.append(f"records of its read-only runs, in {report.cache_dir}")
    elif len(caches) > 1:
        lines.append("the figures add up the records of each:")
        for cache, n, read_only in caches:
            runs = count(n, "process", "processes") + (" (read-only)" if read_only else "")
            lines.append(f"  {cache}: {runs}")
    for folder, n in report.elsewhere:
        lines.append(
            f"{count(n, 'record')} of its read-only runs in {folder}, not added up here:"
            f" `cachedoctor stats {folder}`"
        )
    return lines


def scope_words(report: StatsReport) -> list[str]:
    scope = []
    if report.since is not None:
        scope.append(f"since {time.strftime('%Y-%m-%d %H:%M', time.gmtime(report.since))} UTC")
    if report.module_filter:
        scope.append(f"module {report.module_filter}")
    return scope


def no_records(report: StatsReport, scope: list[str]) -> str:
    """Why nothing is shown: filtered out, archived by --zero, or never recorded."""
    if report.records_read:
        which = [f"of module {report.module_filter}"] if report.module_filter else []
        which += [s for s in scope if s.startswith("since")]
        return f"{count(report.records_read, 'stats record')}, none {' and '.join(which)}"
    if report.archives:
        return (
            "no stats records since the last `--zero` (archived in "
            f"cachedoctor-stats/{report.archives[-1]}); each process records at its exit"
        )
    return (
        "no stats records: run JAX with the hook (`cachedoctor enable`: every mode records; "
        "`--stats-only` where JAX's own keys must stay, which turns stable keys off)"
    )


def _render_chart(days: Sequence[Group], console: Console) -> None:
    console.print(Text("hit rate per day", style="bold"))
    for day in days:
        rate = day.counters.hit_rate
        filled = round((rate or 0.0) * BAR_WIDTH)
        line = Text(f"  {day.name}  ")
        line.append("█" * filled, style="green")
        line.append("░" * (BAR_WIDTH - filled), style="dim")
        line.append(f"  {rate_words(day.counters):>4}  {day.counters.hits}/{day.counters.requests}")
        line.append(f"  {day.processes} processes", style="dim")
        console.print(line)


def _render_groups(title: str, groups: Sequence[Group], console: Console) -> None:
    table = Table(title=title, title_justify="left", show_edge=False)
    for col in ("name", "processes", "requests", "hits", "hit rate", "saved s", "spent s"):
        table.add_column(col, justify="left" if col == "name" else "right")
    for g in groups:
        c = g.counters
        table.add_row(
            g.name,
            str(g.processes),
            str(c.requests),
            str(c.hits),
            rate_words(c),
            f"{max(c.saved_secs, 0.0):.2f}",  # a negative sum is reads dearer than compiles
            f"{c.compile_secs:.2f}",
        )
    print_table(console, table)


def render_zero(report: ZeroReport, console: Console) -> None:
    for name, why in report.left:
        console.print(f"left alone: {name} ({why})", markup=False)
    if not report.records and report.left:
        console.print("no stats record could be read: nothing archived")
    elif not report.records:
        console.print("no stats records to archive")
    elif not report.applied:
        console.print(
            f"would archive and remove {len(report.records)} records (dry run; add --apply)"
        )
    else:
        console.print(f"archived {len(report.records)} records to {report.archive}; counters reset")


# --- HTML ------------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{padding:2px 10px;text-align:right}
td.text,th.text{text-align:left}tr.never td{color:#a15c00}
.kpi{display:inline-block;margin-right:2em}.kpi b{display:block;font-size:1.6em}
"""


def _svg_chart(days: Sequence[Group]) -> str:
    """Hit rate per day as bars: one labelled bar per day, 0..100%."""
    bar, gap, height, top = 36, 14, 160, 20
    width = max(1, len(days)) * (bar + gap) + 50
    parts = [
        f'<svg id="hit-rate-chart" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height + top + 40}" role="img" aria-label="hit rate per day">',
        f'<line x1="40" y1="{top + height}" x2="{width}" y2="{top + height}" stroke="#888"/>',
        f'<text x="0" y="{top + 4}" font-size="11">100%</text>',
        f'<text x="8" y="{top + height}" font-size="11">0%</text>',
    ]
    for i, day in enumerate(days):
        rate = day.counters.hit_rate or 0.0
        h = round(rate * height)
        x = 45 + i * (bar + gap)
        label = rate_words(day.counters)
        parts.append(
            f'<rect class="day" data-day="{html.escape(day.name)}" data-rate="{label}" '
            f'x="{x}" y="{top + height - h}" width="{bar}" height="{h}" fill="#3a8f3a">'
            f"<title>{html.escape(day.name)}: {label}</title></rect>"
        )
        parts.append(
            f'<text x="{x + bar / 2}" y="{top + height - h - 4}" font-size="11" '
            f'text-anchor="middle">{label}</text>'
        )
        parts.append(
            f'<text x="{x + bar / 2}" y="{top + height + 14}" font-size="10" '
            f'text-anchor="middle">{html.escape(day.name[5:])}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def html_text(text: str) -> str:
    """Words as HTML: escaped, and their `code` spans as ``<code>`` (the terminal's backticks
    are markup here, not text)."""
    return _CODE_SPAN.sub(r"<code>\1</code>", html.escape(text))


def _html_table(
    table_id: str,
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    text: Sequence[int] = (0,),
) -> str:
    """A table; the columns ``text`` holds are words (left-aligned, code spans kept), the others
    figures (right-aligned)."""

    def cell(tag: str, i: int, value: str) -> str:
        if i in text:
            return f'<{tag} class="text">{html_text(value)}</{tag}>'
        return f"<{tag}>{html.escape(value)}</{tag}>"

    head = "".join(cell("th", i, h) for i, h in enumerate(header))
    body = []
    for row in rows:
        css = ' class="never"' if row and row[-1] == "never" else ""
        cells = "".join(cell("td", i, c) for i, c in enumerate(row[:-1]))
        body.append(f"<tr{css}>{cells}</tr>")
    return f'<table id="{table_id}"><tr>{head}</tr>{"".join(body)}</table>'


def html_page(report: StatsReport) -> str:
    """A self-contained page with the same numbers and chart as the terminal output."""
    t = report.totals
    saved, why_none = saved_figure(t)
    kpis = "".join(
        f'<div class="kpi" id="kpi-{key}"><b>{html.escape(value)}</b>{html.escape(label)}</div>'
        for key, label, value in (
            ("processes", "processes", str(report.processes)),
            ("requests", "requests", str(t.requests)),
            ("hit-rate", "hit rate", rate_words(t)),
            ("saved", "compile time saved" + (f": {why_none}" if why_none else ""), saved),
            ("spent", "compile time spent on misses", secs(t.compile_secs)),
        )
    )
    modules = _html_table(
        "modules",
        (
            "module",
            "processes",
            "requests",
            "hits",
            "misses",
            "hit rate",
            "spent s",
            "why it missed",
        ),
        [
            (
                m.module,
                str(m.processes),
                str(m.counters.requests),
                str(m.counters.hits),
                str(m.counters.misses),
                rate_words(m.counters),
                f"{m.counters.compile_secs:.2f}",
                m.missed_because or "",
                "never" if m.never_hit else "",
            )
            for m in report.modules
        ],
        text=(0, 7),  # the module, why it missed
    )
    hosts = _html_table(
        "hosts",
        ("host", "processes", "requests", "hits", "hit rate"),
        [
            (
                h.name,
                str(h.processes),
                str(h.counters.requests),
                str(h.counters.hits),
                rate_words(h.counters),
                "",
            )
            for h in report.hosts
        ],
    )
    findings = "".join(
        f"<li>{html.escape(f.kind.value)}: {html_text(f.message)}</li>" for f in report.findings
    )
    title = f"cachedoctor stats: {report.cache or report.cache_dir}"
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{html.escape(title)}</h1><section id='totals'>{kpis}</section>"
        f"<h2>Hit rate per day</h2>{_svg_chart(report.days)}"
        f"<h2>Modules (most compile time spent on misses first)</h2>{modules}<h2>Hosts</h2>{hosts}"
        f"<h2>Findings</h2><ul id='findings'>{findings or '<li>none</li>'}</ul>"
        "</body></html>\n"
    )
