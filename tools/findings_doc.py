"""docs/findings.md, generated from the catalog of finding kinds (``core.catalog_entries.ENTRIES``).

One section per finding kind, in the manner of ruff's rule pages: what it does, why it matters,
when it is raised and on what evidence, how to fix it, and an example printed as ``scan`` prints
it (the real renderer, the real templates). ``tools/check_docs.py --write`` writes the page;
``tools/check_docs.py`` fails when it is stale or when a finding kind has no entry.
"""

from __future__ import annotations

import io
import re
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from cachedoctor.core.catalog_entries import ENTRIES  # noqa: E402
from cachedoctor.core.findings import Case, CatalogEntry, Family, FindingKind  # noqa: E402

TARGET = ROOT / "docs" / "findings.md"

HEADER = """# Findings

Every verdict of `scan`, `lint` and `stats` is a finding: a kind, a severity (`info`, `warning`
or `error`), a message that names the module or the file, one line of advice and the evidence it
rests on (`evidence:` in the text output, `evidence` in JSON). Each kind below is one entry of
the catalog of finding kinds in `src/cachedoctor/core/catalog_entries.py`, whose cases are the
words the rules raise findings with (`src/cachedoctor/core/catalog.py`): this page is generated
from it by `python tools/check_docs.py --write`, and `nox -s docs` fails when it is stale.

`--fail-on warning` makes `scan` and `lint` exit 1 on warnings too (the default is `error`);
`--ignore KIND` drops a kind (an unknown KIND is an error). In the templates below, a word in
⟨angle brackets⟩ is filled in by the rule that raises the finding: a path, a module, a reason's
own advice.
"""


def placeholders(text: str) -> str:
    """A template's ``{field}`` as ⟨field⟩, which reads as a blank to fill in."""
    return re.sub(r"\{(\w+)\}", lambda m: "⟨" + m.group(1).replace("_", " ") + "⟩", text)


def severity_text(entry: CatalogEntry) -> str:
    """The default severity, then each other one with when it is used."""
    others: dict[str, list[str]] = {}
    for case in entry.cases:
        if case.severity is not entry.severity:
            others.setdefault(case.severity.label, []).append(case.when)
        for other, when in case.otherwise:
            others.setdefault(other.label, []).append(when)
    return "; ".join(
        [
            entry.severity.label,
            *(f"{label} when {'; or when '.join(w)}" for label, w in others.items()),
        ]
    )


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def example_output(entry: CatalogEntry) -> str:
    """The example finding as the text output prints it."""
    from rich.console import Console

    from cachedoctor.render.table import render_finding_list

    out = io.StringIO()
    console = Console(file=out, width=100, no_color=True, highlight=False, soft_wrap=True)
    render_finding_list([entry.example.finding()], console)
    return out.getvalue().rstrip()


def _cases_table(cases: tuple[Case, ...]) -> Iterator[str]:
    yield "| when | severity | evidence |"
    yield "|---|---|---|"
    for case in cases:
        severity = case.severity.label + "".join(
            f"; {other.label} when {when}" for other, when in case.otherwise
        )
        yield f"| {case.when} | {severity} | {placeholders(case.evidence)} |"


def section(entry: CatalogEntry) -> str:
    lines = [
        f"### `{entry.kind.value}`",
        "",
        f"Family: {entry.family.value} · severity: {severity_text(entry)} · raised by: "
        + ", ".join(f"`{c}`" for c in entry.raised_by.commands),
        "",
        "#### What it does",
        "",
        entry.what,
        "",
        "#### Why it matters",
        "",
        entry.why,
        "",
        "#### When, on what evidence",
        "",
        *_cases_table(entry.cases),
        "",
        "#### How to fix",
        "",
    ]
    if len(entry.cases) == 1:
        lines.append(_sentence(placeholders(entry.cases[0].advice)))
    else:
        lines += [f"- {_sentence(c.when)}: {placeholders(c.advice)}" for c in entry.cases]
    lines += ["", "#### Example", "", "```text", example_output(entry), "```", ""]
    return "\n".join(lines)


def render() -> str:
    parts = [HEADER, "| kind | family | severity | what it finds |", "|---|---|---|---|"]
    for entry in ENTRIES:
        anchor = entry.kind.value  # GitHub's anchor of "### `kind`"
        parts.append(
            f"| [`{entry.kind.value}`](#{anchor}) | {entry.family.value} | "
            f"{'/'.join(_severities(entry))} | {entry.summary} |"
        )
    parts.append("")
    for family in Family:
        entries = [r for r in ENTRIES if r.family is family]
        if entries:
            parts.append(f"## {family.value.capitalize()}\n")
            parts += [section(r) for r in entries]
    return "\n".join(parts).rstrip() + "\n"


def _severities(entry: CatalogEntry) -> list[str]:
    found = [entry.severity]
    for case in entry.cases:
        for severity in (case.severity, *dict(case.otherwise)):
            if severity not in found:
                found.append(severity)
    return [s.label for s in found]


def problems() -> Iterator[str]:
    """A finding kind without exactly one entry in the table; a stale page."""
    kinds = [entry.kind for entry in ENTRIES]
    for kind in FindingKind:
        if kinds.count(kind) != 1:
            n = kinds.count(kind)
            yield f"finding kind {kind.value} has {n} entries in core/catalog_entries.py"
    if not TARGET.exists() or TARGET.read_text() != render():
        yield "docs/findings.md is stale: run `python tools/check_docs.py --write`"
