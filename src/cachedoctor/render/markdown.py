"""``stats --format markdown``: the report as GitHub-flavoured Markdown, for a CI job's summary.

The Action appends it to ``$GITHUB_STEP_SUMMARY``; any CI that shows Markdown can take it as it
is. Short on purpose: the totals in one table, the modules that missed (most compile time spent
on misses first, with why) up to ``max_modules`` rows, then the findings. Every figure is worded
as the terminal words it (``render/stats.py``: the hit rate, the seconds, the compile time
saved).

What the records hold is text from files (module names, the causes ``why`` words, messages
that quote them): each piece is escaped, so that no name opens a code span, ends a table cell,
starts emphasis or an HTML tag, or breaks a line.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from cachedoctor.core.findings import Finding
from cachedoctor.core.stats import ModuleRow, StatsReport
from cachedoctor.errors import count
from cachedoctor.render.stats import (
    no_records,
    rate_words,
    saved_words,
    scope_words,
    secs,
    whose_lines,
)

# Markdown's punctuation that changes what text shows: a backslash, a code span, emphasis (an
# underscore only at a word's edge: inside a word it never emphasises), links, HTML tags and
# entities, table cells, strikethrough
_SPECIAL = re.compile(r"[\\`*\[\]<>&|~]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
_BREAKS = re.compile(r"\s*[\r\n\u2028\u2029]+\s*")


def _line(text: str) -> str:
    """``text`` on one line: a line break would end a table row or a list item."""
    return _BREAKS.sub(" ", text)


def escape(text: str) -> str:
    """``text`` as Markdown that shows it as it is, on one line (a table cell's too)."""
    return _SPECIAL.sub(lambda m: "\\" + m.group(0), _line(text))


def code(text: str, *, in_table: bool = False) -> str:
    """``text`` as a code span: fenced by one backtick more than its longest run of them (so a
    backtick in a name neither ends the span nor opens one), its ``|`` escaped in a table cell
    (GitHub splits cells before it reads code spans)."""
    text = _line(text) or " "
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text[0] in "` " or text[-1] in "` " else ""
    if in_table:
        text = text.replace("|", "\\|")
    return f"{fence}{pad}{text}{pad}{fence}"


def _table(header: Sequence[str], align: str, rows: Sequence[Sequence[str]]) -> list[str]:
    """``align``: one letter per column, l or r."""
    rule = ["---:" if a == "r" else ":---" for a in align]
    return [f"| {' | '.join(row)} |" for row in (header, rule, *rows)]


def _why(row: ModuleRow) -> str:
    """Why a module missed: the reason it never hit, then the causes of its recorded misses."""
    said = [row.reason] if row.reason else []
    said += [f"{c.misses}× {c.words}" if c.misses > 1 else c.words for c in row.causes[:3]]
    if len(row.causes) > 3:
        said.append(f"and {len(row.causes) - 3} more")
    return escape("; ".join(said)) or "-"


def _modules(report: StatsReport, max_modules: int) -> list[str]:
    missed = [m for m in report.modules if m.counters.misses]
    if not missed:
        return ["No module missed."]
    rows = [
        (
            code(m.module, in_table=True),
            str(m.counters.misses),
            str(m.counters.requests),
            rate_words(m.counters),
            secs(m.counters.compile_secs),
            _why(m),
        )
        for m in missed[:max_modules]
    ]
    header = ("module", "misses", "lookups", "hit rate", "spent on misses", "why it missed")
    lines = _table(header, "lrrrrl", rows) if rows else []
    if len(missed) > max_modules:
        more = len(missed) - max_modules
        lines += ["", f"…and {count(more, 'more module')} that missed (`--json` lists all)."]
    return lines


def _findings(findings: Sequence[Finding], max_rows: int) -> list[str]:
    if not findings:
        return ["No findings."]
    lines = [
        f"- **{f.severity.label}** `{f.kind.value}`: {escape(f.message)} → {escape(f.advice)}"
        for f in findings[:max_rows]
    ]
    if len(findings) > max_rows:
        lines.append(f"- …and {count(len(findings) - max_rows, 'more finding')} (`--json`)")
    return lines


def stats_markdown(report: StatsReport, *, max_modules: int = 25) -> str:
    """The report as Markdown; ``max_modules`` rows of modules and of findings at most."""
    t = report.totals
    scope = scope_words(report)
    lines = [f"## cachedoctor stats: {code(report.cache or report.cache_dir)}", ""]
    whose = whose_lines(report)
    if whose:  # a records folder, or records elsewhere: whose the figures are
        lines += [f"- {escape(line.strip())}" for line in whose] + [""]
    if report.processes == 0:
        lines += [escape(no_records(report, scope)), ""]
    else:
        said = f"From the stats records of {count(report.processes, 'process', 'processes')}"
        lines += [escape(", ".join([said, *scope])) + ".", ""]
        header = ("hit rate", "lookups", "hits", "misses", "compile time saved", "spent on misses")
        figures = (rate_words(t), str(t.requests), str(t.hits), str(t.misses))
        saved = (escape(saved_words(t)), secs(t.compile_secs))
        lines += [*_table(header, "rrrrlr", [(*figures, *saved)]), ""]
        lines += ["### Modules that missed, most compile time spent on misses first", ""]
        lines += [*_modules(report, max_modules), ""]
    lines += ["### Findings", "", *_findings(report.findings, max_modules)]
    return "\n".join(lines) + "\n"
