"""JUnit XML, the report format CI systems display as test results.

``lint``: one testcase per finding, and one passing testcase for each finding kind with no
finding, so a clean cache shows as "N passed" rather than an empty report. A finding at or above
``--fail-on`` is a ``<failure>``; a baselined or ignored one is ``<skipped>``; one below the
threshold passes with its message in ``<system-out>``. ``check``: one testcase per module run 1
compiled, failing when its key was unstable; one skipped testcase per module JAX would not store
(JAX's reason); one failing testcase for a run of CMD that failed.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass

from cachedoctor.core.check.report import CheckReport
from cachedoctor.core.findings import FindingKind
from cachedoctor.core.lint import LintReport

_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _xml_text(text: str) -> str:
    """XML 1.0 cannot hold most control characters, even escaped: show them as U+FFFD."""
    return _NOT_XML.sub("\ufffd", text)


@dataclass(frozen=True)
class Case:
    classname: str
    name: str
    failure: tuple[str, str] | None = None  # (message, details)
    skipped: str | None = None
    output: str | None = None


def lint_cases(report: LintReport) -> list[Case]:
    cases: list[Case] = []
    by_kind: dict[str, int] = {}
    for lf in report.findings:
        f = lf.finding
        by_kind[f.kind.value] = by_kind.get(f.kind.value, 0) + 1
        name = f.module or lf.fingerprint.split(" ", 2)[-1]
        body = f"{f.message}\n→ {f.advice}\nfingerprint: {lf.fingerprint}"
        if f.entries:
            body += "\nentries:\n" + "\n".join(f"  {e}" for e in f.entries)
        classname = f"cachedoctor.commands.lint.{f.kind.value}"
        if lf.failing:
            cases.append(Case(classname, name, failure=(f"{f.severity.label}: {f.message}", body)))
        elif lf.baselined:
            cases.append(Case(classname, name, skipped=f"in baseline: {f.message}", output=body))
        else:
            cases.append(Case(classname, name, output=f"{f.severity.label}: {body}"))
    for kind in FindingKind:
        if kind.value in report.ignored_kinds:
            cases.append(
                Case(f"cachedoctor.commands.lint.{kind.value}", "(all)", skipped="--ignore")
            )
        elif kind.value not in by_kind:
            cases.append(Case(f"cachedoctor.commands.lint.{kind.value}", "no finding"))
    return cases


def check_cases(report: CheckReport) -> list[Case]:
    unstable = {m.module: m for m in report.unstable}
    cases = []
    failure = report.command_failed
    if failure is not None:  # the check stopped at this run: nothing else was judged
        line = report.summary_line()
        cases.append(Case("cachedoctor.commands.check", f"run {failure.run}", failure=(line, line)))
    for n in report.refused:  # no entry, so its key was not checked
        body = f"{n.evidence}\n→ {n.advice}" + (f"\nJAX's log: {n.jax_log}" if n.jax_log else "")
        cases.append(
            Case(
                "cachedoctor.commands.check.not-stored",
                n.module,
                skipped=f"not stored by JAX: {n.summary}",
                output=body,
            )
        )
    if report.nothing_checked:
        line = report.summary_line()
        cases.append(Case("cachedoctor.commands.check", "run 1", failure=(line, line)))
    for module in report.modules:
        m = unstable.get(module)
        if m is None:
            cases.append(Case("cachedoctor.commands.check.stable-key", module))
        else:
            lines = m.explanation_lines()
            cases.append(
                Case(
                    "cachedoctor.commands.check.stable-key",
                    module,
                    failure=(f"unstable cache key: {m.verdict}", "\n".join(lines)),
                )
            )
    if report.verify is not None:
        for c in report.verify.checks:
            if c.stale is False:
                cases.append(Case("cachedoctor.commands.check.verify", c.key))
            else:
                cases.append(
                    Case("cachedoctor.commands.check.verify", c.key, failure=(c.detail, c.entries))
                )
        for module in report.verify.not_checked:
            reason = report.verify.reason
            cases.append(Case("cachedoctor.commands.check.verify", module, skipped=reason))
    return cases


def to_xml(suite_name: str, cases: list[Case], properties: dict[str, str] | None = None) -> str:
    """A ``<testsuites>`` document with one ``<testsuite>`` holding ``cases``."""
    failures = sum(1 for c in cases if c.failure)
    skipped = sum(1 for c in cases if c.skipped and not c.failure)
    root = ET.Element(
        "testsuites", name="cachedoctor", tests=str(len(cases)), failures=str(failures)
    )
    suite = ET.SubElement(
        root,
        "testsuite",
        name=suite_name,
        tests=str(len(cases)),
        failures=str(failures),
        errors="0",
        skipped=str(skipped),
    )
    if properties:
        props = ET.SubElement(suite, "properties")
        for key, value in properties.items():
            ET.SubElement(props, "property", name=key, value=_xml_text(value))
    for c in cases:
        case = ET.SubElement(
            suite, "testcase", classname=_xml_text(c.classname), name=_xml_text(c.name)
        )
        if c.failure:
            message, details = c.failure
            el = ET.SubElement(case, "failure", message=_xml_text(message), type="cachedoctor")
            el.text = _xml_text(details)
        elif c.skipped:
            ET.SubElement(case, "skipped", message=_xml_text(c.skipped))
        if c.output:
            ET.SubElement(case, "system-out").text = _xml_text(c.output)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def lint_xml(report: LintReport) -> str:
    return to_xml(
        "cachedoctor lint",
        lint_cases(report),
        {"cache_dir": report.scan.cache_dir, "fail_on": report.fail_on.label},
    )


def check_xml(report: CheckReport) -> str:
    return to_xml(
        "cachedoctor check",
        check_cases(report),
        {"command": " ".join(report.argv), "runs": str(len(report.runs))},
    )
