"""`cachedoctor lint`: formats parsed back, baselines across real runs, exit codes."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner

from cachedoctor.cli import main
from cachedoctor.core.findings import Finding, FindingKind, Severity
from cachedoctor.core.lint import fingerprint, judge, lint_directory
from cachedoctor.core.scan.run import scan_directory
from cachedoctor.render import github, junit
from cachedoctor.storage.location import Location
from tests.support.caches import make_cache

ANNOTATION = re.compile(r"^::(error|warning|notice)(?: ([^:]*))?::(.*)$")


def unescape_data(text: str) -> str:
    return text.replace("%0A", "\n").replace("%0D", "\r").replace("%25", "%")


def unescape_property(text: str) -> str:
    return unescape_data(text.replace("%3A", ":").replace("%2C", ","))


def parse_annotations(output: str) -> list[dict[str, object]]:
    """The workflow commands in ``output``, decoded the way the Actions runner does."""
    found = []
    for line in output.splitlines():
        match = ANNOTATION.match(line)
        if not match:
            continue
        level, props, data = match.groups()
        properties = {}
        for item in (props or "").split(","):
            if item:
                key, _, value = item.partition("=")
                properties[key] = unescape_property(value)
        found.append({"level": level, "properties": properties, "message": unescape_data(data)})
    return found


def invoke(*args: str) -> tuple[int, str, str]:
    """Run the CLI in-process through ``main`` (its one-line errors and exit codes included)."""
    code: int | str | None = 0
    with CliRunner().isolation() as streams:
        try:
            code = main(list(args))  # the console script exits with what main returns
        except SystemExit as exc:
            code = exc.code
        out, err = streams[0].getvalue().decode(), streams[1].getvalue().decode()
    return int(code or 0), out, err


@pytest.mark.slow
def test_github_annotations_parse_back(seed_cache: Path) -> None:
    code, out, _ = invoke("lint", str(seed_cache), "--format", "github", "--fail-on", "warning")
    assert code == 1
    notes = parse_annotations(out)
    assert len(notes) == 1, out
    note = notes[0]
    assert note["level"] == "error"  # failing under --fail-on warning
    assert note["properties"] == {"title": "cachedoctor unstable-key (jit_f)"}
    message = str(note["message"])
    assert message.startswith("jit_f: 3 entries hold identical executables under different keys")
    assert "\n→ " in message and "cachedoctor enable" in message
    assert out.splitlines()[-1].startswith("cachedoctor lint ")  # plain summary, not a command

    code, out, _ = invoke("lint", str(seed_cache), "--format", "github")
    assert code == 0
    assert [n["level"] for n in parse_annotations(out)] == ["warning"]


def test_github_escaping_round_trips() -> None:
    nasty = "100% of a,b: c\r\nnext line"
    line = github.command("warning", nasty, {"title": nasty})
    assert "\n" not in line and "\r" not in line
    (parsed,) = parse_annotations(line)
    assert parsed["message"] == nasty
    assert parsed["properties"] == {"title": nasty}
    # the property value may not contain the separators themselves
    props = line.split("::")[1].split(" ", 1)[1]
    assert props.count(",") == 0 and ":" not in props


@pytest.mark.slow
def test_junit_parses_back(seed_cache: Path, tmp_path: Path) -> None:
    report_file = tmp_path / "lint.xml"
    code, out, _ = invoke(
        "lint", str(seed_cache), "--format", "junit", "--fail-on", "warning", "-o", str(report_file)
    )
    assert code == 1 and out == ""
    root = ET.parse(report_file).getroot()
    suite = root.find("testsuite")
    assert suite is not None
    cases = suite.findall("testcase")
    assert int(suite.get("tests", "0")) == len(cases) == len(FindingKind)
    failed = [c for c in cases if c.find("failure") is not None]
    assert int(suite.get("failures", "0")) == 1
    assert [(c.get("classname"), c.get("name")) for c in failed] == [
        ("cachedoctor.commands.lint.unstable-key", "jit_f")
    ]
    failure = failed[0].find("failure")
    assert failure is not None and "jit_f" in (failure.get("message") or "")
    assert "fingerprint: unstable-key jit_f" in (failure.text or "")
    passing = {c.get("classname") for c in cases if c.find("failure") is None}
    assert "cachedoctor.commands.lint.corrupt" in passing

    # below the threshold: passes, with the finding in system-out; --ignore: skipped
    code, out, _ = invoke("lint", str(seed_cache), "--format", "junit")
    assert code == 0
    suite = ET.fromstring(out).find("testsuite")
    assert suite is not None and suite.get("failures") == "0"
    code, out, _ = invoke("lint", str(seed_cache), "--format", "junit", "--ignore", "unstable-key")
    suite = ET.fromstring(out).find("testsuite")
    assert suite is not None
    skipped = [c for c in suite.findall("testcase") if c.find("skipped") is not None]
    assert [c.get("classname") for c in skipped] == ["cachedoctor.commands.lint.unstable-key"]


@pytest.mark.slow
def test_junit_survives_control_characters(seed_cache: Path) -> None:
    scan = scan_directory(Location.parse(seed_cache))
    odd = Finding(FindingKind.UNKNOWN_FILE, Severity.ERROR, "bad\x01name & <x>", "remove it", "ls")
    report = judge(dataclasses.replace(scan, findings=(odd,)))
    root = ET.fromstring(junit.lint_xml(report))
    failure = root.find("testsuite/testcase/failure")
    assert failure is not None and "bad\ufffdname & <x>" in (failure.get("message") or "")


@pytest.mark.slow
def test_json_format(seed_cache: Path) -> None:
    code, out, _ = invoke("lint", str(seed_cache), "--format", "json", "--fail-on", "warning")
    assert code == 1
    doc = json.loads(out)
    assert doc["schema_version"] == 1 and doc["command"] == "lint" and doc["failed"] is True
    (finding,) = doc["findings"]
    assert finding["kind"] == "unstable-key" and finding["module"] == "jit_f"
    assert finding["fingerprint"] == "unstable-key jit_f" and finding["failing"] is True


@pytest.mark.slow
def test_exit_codes(seed_cache: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o700)
    assert invoke("lint", str(empty))[0] == 0  # clean
    assert invoke("lint", str(seed_cache))[0] == 0  # a warning, --fail-on error
    assert invoke("lint", str(seed_cache), "--fail-on", "warning")[0] == 1
    assert invoke("lint", str(seed_cache), "--fail-on", "info", "--ignore", "unstable-key")[0] == 0
    code, _, err = invoke("lint", str(tmp_path / "missing"))
    assert code == 2 and "no such directory" in err
    code, _, err = invoke("lint", str(seed_cache), "--ignore", "unstable-keys")
    assert code == 2 and "unknown finding kind 'unstable-keys'" in err
    code, _, err = invoke("lint", str(seed_cache), "--format", "yaml")
    assert code == 2


@pytest.mark.slow
def test_baseline_is_stable_across_runs(tmp_path: Path) -> None:
    # Its own cache: a copy at another path would re-key every module (the autotune path is hashed).
    cache = tmp_path / "cache"
    make_cache(cache, [("seed", {})] * 2)
    baseline = tmp_path / "baseline.json"
    code, _, err = invoke(
        "lint", str(cache), "--fail-on", "warning", "--write-baseline", str(baseline)
    )
    assert code == 0 and "wrote 1 fingerprints" in err
    data = json.loads(baseline.read_text())
    assert [f["fingerprint"] for f in data["findings"]] == ["unstable-key jit_f"]

    # Another real run adds a third jit_f entry under a new key: still the same finding.
    make_cache(cache, [("seed", {})])
    code, out, _ = invoke(
        "lint", str(cache), "--fail-on", "warning", "--baseline", str(baseline), "--format", "json"
    )
    assert code == 0, out
    (finding,) = json.loads(out)["findings"]
    assert finding["baselined"] and not finding["failing"]
    assert "3 entries" in finding["message"]

    # A new problem is not in the baseline: it fails, and only it does.
    victim = next(p for p in cache.glob("jit_iota-*-cache"))
    victim.write_bytes(victim.read_bytes()[:20])
    code, out, _ = invoke(
        "lint", str(cache), "--fail-on", "warning", "--baseline", str(baseline), "--format", "json"
    )
    assert code == 1
    failing = [f for f in json.loads(out)["findings"] if f["failing"]]
    assert [f["kind"] for f in failing] == ["corrupt"]

    # A baselined finding that is gone is reported (never fails): a fresh, empty cache.
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    code, out, _ = invoke("lint", str(fresh), "--baseline", str(baseline), "--format", "github")
    assert code == 0
    assert any("baselined finding is gone" in str(n["message"]) for n in parse_annotations(out))


@pytest.mark.slow
def test_bad_baselines_are_usage_errors(seed_cache: Path, tmp_path: Path) -> None:
    code, _, err = invoke("lint", str(seed_cache), "--baseline", str(tmp_path / "none.json"))
    assert code == 2 and "no such baseline file" in err
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    code, _, err = invoke("lint", str(seed_cache), "--baseline", str(bad))
    assert code == 2 and "not JSON" in err
    bad.write_text(json.dumps({"findings": []}))
    code, _, err = invoke("lint", str(seed_cache), "--baseline", str(bad))
    assert code == 2 and "not a cachedoctor lint baseline" in err


@pytest.mark.slow
def test_fingerprints_ignore_volatile_parts(seed_cache: Path, tmp_path: Path) -> None:
    moved = tmp_path / "elsewhere"
    shutil.copytree(seed_cache, moved)
    here = {f.fingerprint for f in lint_directory(Location.parse(str(seed_cache))).findings}
    there = {f.fingerprint for f in lint_directory(Location.parse(str(moved))).findings}
    assert here == {"unstable-key jit_f"} and here <= there  # there: also "relocated"
    corrupt = Finding(
        FindingKind.CORRUPT, Severity.ERROR, "k: truncated", "x", "decoding", entries=("k-1",)
    )
    assert fingerprint(corrupt, "/c") == "corrupt - k-1"
    insecure = Finding(
        FindingKind.INSECURE,
        Severity.ERROR,
        "the cache directory /c/x is owned by uid 7",
        advice="x",
        evidence="lstat",
    )
    assert fingerprint(insecure, "/c/x") == "insecure - the cache directory <dir> is owned by uid N"
