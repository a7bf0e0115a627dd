"""``stats --format markdown``, the job summary the Action writes, on caches real JAX processes
recorded: what it shows (rendered by another parser, ``tests/support/markdown.py``) against the
JSON report of the same cache, figure by figure; a saving JAX counts negative said in words in
every format; names that would break Markdown; the row cap."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cachedoctor.layout import STATS_DIRNAME
from tests.support.cli import invoke
from tests.support.hookrun import base_env
from tests.support.markdown import Shown, shown

pytestmark = pytest.mark.slow  # the records come from JAX processes (tests/core/conftest.py)

SUMMARY = ["hit rate", "lookups", "hits", "misses", "compile time saved", "spent on misses"]
MODULES = ["module", "misses", "lookups", "hit rate", "spent on misses", "why it missed"]
NEGATIVE = re.compile(
    r"none: reads cost (\d+\.\d+) s more than the compiles they replaced, as JAX counts them "
    r"\(it keeps compile times in whole seconds\)"
)


def stats(cache: Path, *args: str) -> str:
    """``stats`` as the console script prints it, in this process (a JAX-free command)."""
    code, out, err = invoke("stats", str(cache), *args, env=base_env(None))
    assert code == 0 and "Traceback" not in err, err
    return out


def report_of(cache: Path, *args: str) -> tuple[dict[str, Any], Shown]:
    """The JSON document and what the Markdown shows, of the same cache and options."""
    return json.loads(stats(cache, "--json", *args)), shown(
        stats(cache, "--format", "markdown", *args)
    )


def seconds(shown_text: str) -> float:
    value, unit = shown_text.split()
    return float(value) * (60 if unit == "min" else 1)


def close(shown_text: str, value: float) -> bool:
    """``shown_text`` (seconds as the report words them) is ``value`` rounded to its digits."""
    number, unit = shown_text.split()
    step = 10.0 ** -len(number.partition(".")[2]) * (60 if unit == "min" else 1)
    return abs(seconds(shown_text) - value) <= step / 2 + 1e-12


def why(module: dict[str, Any]) -> str:
    """What "why it missed" must say, from the JSON: the reason it never hit, then its misses'
    causes (at most 3 named)."""
    said = [module["reason"]] if module["reason"] else []
    causes = module["miss_causes"]
    said += [f"{c['misses']}× {c['words']}" if c["misses"] > 1 else c["words"] for c in causes[:3]]
    said += [f"and {len(causes) - 3} more"] if len(causes) > 3 else []
    return "; ".join(said) or "-"


def test_markdown_shows_what_the_json_says(recorded_cache: Path) -> None:
    doc, md = report_of(recorded_cache)
    assert md.headings == [
        f"cachedoctor stats: {recorded_cache}",
        "Modules that missed, most compile time spent on misses first",
        "Findings",
    ]
    assert md.paragraphs[0] == f"From the stats records of {doc['processes']} processes."
    (summary, modules) = md.tables
    t = doc["totals"]
    assert summary[0] == SUMMARY
    rate, lookups, hits, misses, _saved, spent = summary[1]
    assert rate == f"{t['hits'] / t['requests']:.0%}"
    assert (lookups, hits, misses) == (str(t["requests"]), str(t["hits"]), str(t["misses"]))
    assert close(spent, t["compile_secs"]), (spent, t["compile_secs"])

    assert modules[0] == MODULES
    missed = [m for m in doc["modules"] if m["misses"]]
    assert [row[0] for row in modules[1:]] == [m["module"] for m in missed]  # JSON's order
    assert len(missed) == 3  # jit_f, and the first compile of the other two
    for row, m in zip(modules[1:], missed, strict=True):
        assert row[1:4] == [
            str(m["misses"]),
            str(m["requests"]),
            f"{m['hits'] / m['requests']:.0%}",
        ]
        assert close(row[4], m["compile_secs"]), (row, m["compile_secs"])
        assert row[5] == why(m)
    jit_f = next(m for m in missed if m["module"] == "jit_f")
    assert jit_f["reason"].startswith("unstable key") and jit_f["miss_causes"]  # both said

    findings = doc["findings"]
    assert [f["kind"] for f in findings] == ["never-hit"]
    assert md.items == [
        f"{f['severity']} {f['kind']}: {f['message']} → {f['advice']}" for f in findings
    ]


def test_a_negative_saving_is_said_in_words_in_every_format(
    recorded_cache: Path, tmp_path: Path
) -> None:
    """JAX counts a hit's saving as the compile time it kept with the entry minus the read's
    time, and keeps whole seconds: the seed's modules compile in well under 1 s, so its hits
    count minus their read time. Every format says so in words, with the same figure."""
    doc, md = report_of(recorded_cache)
    t = doc["totals"]
    assert t["hits"] > 0 and t["saved_secs"] < 0, t
    assert t["saved_secs"] == pytest.approx(-t["retrieval_secs"])  # kept: 0 s a compile
    said = md.tables[0][1][4]
    match = NEGATIVE.fullmatch(said)
    assert match, said
    figure = f"{match.group(1)} s"
    assert close(figure, -t["saved_secs"]) and seconds(figure) > 0, (figure, t)

    page = tmp_path / "stats.html"
    text = stats(recorded_cache, "--html", str(page))
    (line,) = [x for x in text.splitlines() if x.startswith("compile time saved")]
    assert line.split(None, 3)[3].rstrip() == said
    kpi = re.search(r'id="kpi-saved"><b>([^<]*)</b>([^<]*)</div>', page.read_text())
    assert kpi and kpi.groups() == ("none", f"compile time saved: {said.removeprefix('none: ')}")
    for out in (text, page.read_text(), stats(recorded_cache, "--format", "markdown")):
        assert not re.search(r"-\d+(\.\d+)? (s|min)\b", out), out  # no negative seconds


def test_names_that_would_break_markdown_show_as_they_are(recorded_cache: Path, copy_of) -> None:
    """A record names a module with Markdown's own characters (JAX's names never hold them; a
    record is a file, and its names are text): it stays one cell, shown as it is; the causes
    ``why`` words with backticks (`cachedoctor enable`) show their backticks."""
    cache = copy_of(recorded_cache)
    folder = cache / STATS_DIRNAME
    record = json.loads(sorted(folder.glob("*.json"))[0].read_text())
    odd = "jit_a|b``c*d_ <b>x</b>"
    record["modules"] = {odd: record["modules"]["jit_f"]}
    (folder / "odd-names.json").write_text(json.dumps(record))
    doc, md = report_of(cache)
    assert doc["processes"] == 4 and odd in {m["module"] for m in doc["modules"]}
    assert "b" not in md.tags  # no HTML got through
    rows = {row[0]: row for row in md.tables[1][1:]}
    assert len(rows[odd]) == len(MODULES), rows[odd]
    jit_f = next(m for m in doc["modules"] if m["module"] == "jit_f")
    assert rows["jit_f"][5] == why(jit_f)
    assert "`cachedoctor enable`" in rows["jit_f"][5]


def test_the_modules_and_findings_are_capped(recorded_cache: Path) -> None:
    doc, md = report_of(recorded_cache, "--max-modules", "1")
    missed = [m["module"] for m in doc["modules"] if m["misses"]]
    assert [row[0] for row in md.tables[1][1:]] == missed[:1]
    more = len(missed) - 1
    assert f"…and {more} more modules that missed (--json lists all)." in md.paragraphs
    doc, md = report_of(recorded_cache, "--max-modules", "0")
    assert (
        len(md.tables) == 1 and f"…and {len(missed)} more modules that missed" in md.paragraphs[1]
    )
    assert md.items == [f"…and {len(doc['findings'])} more finding (--json)"]


def test_format_json_is_json_and_clashes_are_usage_errors(recorded_cache: Path) -> None:
    assert json.loads(stats(recorded_cache, "--format", "json")) == json.loads(
        stats(recorded_cache, "--json")
    )
    for argv, said in (
        (["--json", "--format", "markdown"], "--json is --format json"),
        (["--zero", "--format", "markdown"], "it does not go with --format"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "cachedoctor", "stats", str(recorded_cache), *argv],
            capture_output=True,
            text=True,
            env=base_env(None),
            timeout=300,
        )
        assert proc.returncode == 2 and said in proc.stderr and not proc.stdout, proc
