"""`cachedoctor stats --format openmetrics` (and `prometheus`, and `cachedoctor.metrics`): text
that prometheus_client's strict OpenMetrics parser reads, whose figures are JAX's own (its log
lines in the same runs), the records' as they lie on disk, `stats --json`'s and the cache's
files. The records come from real JAX processes, in caches other tests build too (the
`XLA_FLAGS` history of docs/why.md, the seed program run three times): no process of its own."""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from prometheus_client.parser import text_string_to_metric_families as text_004

import cachedoctor
from cachedoctor.cli import cli
from cachedoctor.core.why import CAUSE_ORDER
from cachedoctor.layout import STATS_DIRNAME
from tests.support.hookrun import MISS_RE, recorded_seed_cache
from tests.support.keylog import differing, logged_keys, shared_history
from tests.support.sessioncache import SharedBuilds

FLAG = {"XLA_FLAGS": "--xla_cpu_enable_fast_math=true"}
HIT_RE = re.compile(r"Persistent compilation cache hit for '([^']+)'")  # JAX_LOG_COMPILES=1
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def openmetrics(text: str) -> list[Metric]:
    """prometheus_client's OpenMetrics parser (untyped), every family read."""
    return list(text_string_to_metric_families(text))  # type: ignore[no-untyped-call]


@pytest.fixture(scope="module")
def flag_history(shared_builds: SharedBuilds) -> tuple[Path, list[str]]:
    """why_program.py run twice, the second time with an XLA flag (docs/why.md's example):
    the cache and JAX's log of each run."""
    return shared_history(shared_builds, ({}, FLAG))


@pytest.fixture(scope="module")
def recorded(shared_builds: SharedBuilds) -> Path:
    """The seed program run three times with stats recording (as tests/core/conftest.py's):
    jit_f never hits (a custom_partitioning pointer in its key)."""
    return recorded_seed_cache(shared_builds)


def stats(*args: str) -> tuple[int, str]:
    done = CliRunner().invoke(cli, ["stats", *args])
    return done.exit_code, done.output


def metrics(cache: Path, *args: str, fmt: str = "openmetrics") -> str:
    code, out = stats(str(cache), "--format", fmt, "--max-modules", "1000", *args)
    assert code == 0, out
    return out


def as_json(cache: Path, *args: str) -> dict[str, Any]:
    code, out = stats(str(cache), "--json", *args)
    assert code == 0, out
    doc: dict[str, Any] = json.loads(out)
    return doc


def parsed(text: str) -> tuple[dict[str, tuple[str, str]], Samples]:
    """The text as prometheus_client's OpenMetrics parser reads it (it raises on anything
    OpenMetrics 1.0 forbids): each family's type and unit, and every sample's value."""
    families: dict[str, tuple[str, str]] = {}
    samples: Samples = {}
    for family in openmetrics(text):
        families[family.name] = (family.type, family.unit)
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "cache"))
            assert (s.name, labels) not in samples, s
            samples[s.name, labels] = s.value
    return families, samples


def of(samples: Samples, name: str, **labels: str) -> float:
    return samples[name, tuple(sorted(labels.items()))]


def by(samples: Samples, name: str, label: str) -> dict[str, float]:
    return {dict(k)[label]: v for (n, k), v in samples.items() if n == name}


def entry_files(cache: Path, module: str | None = None) -> list[Path]:
    """The cache's entries as the file system lists them (JAX's `<module>-<hash>-cache`)."""
    found = [p for p in cache.iterdir() if re.fullmatch(r".+-[0-9a-f]{64}-cache", p.name)]
    return [p for p in found if module is None or p.name.rsplit("-", 2)[0] == module]


@pytest.mark.slow
def test_the_figures_are_jaxs_the_records_and_the_json(
    flag_history: tuple[Path, list[str]],
) -> None:
    cache, logs = flag_history
    text = metrics(cache)
    assert text.endswith("# EOF\n")
    families, samples = parsed(text)
    assert families["cachedoctor_requests"] == ("counter", "")
    assert families["cachedoctor_compile_seconds"] == ("counter", "seconds")
    assert families["cachedoctor_cache_size_bytes"] == ("gauge", "bytes")

    # JAX's own log lines: a hit or a miss per lookup, per module
    jax_hits = Counter(m for log in logs for m in HIT_RE.findall(log))
    jax_misses = Counter(m for log in logs for m in MISS_RE.findall(log))
    requests = by(samples, "cachedoctor_requests_total", "module")
    assert set(requests) == set(jax_hits | jax_misses) and jax_misses["jit_step"] == 2
    for module in requests:
        assert (
            of(samples, "cachedoctor_requests_total", module=module, result="hit")
            == (jax_hits[module])
        )
        assert (
            of(samples, "cachedoctor_requests_total", module=module, result="miss")
            == (jax_misses[module])
        )
    assert of(samples, "cachedoctor_processes_total") == len(logs) == 2

    # the records on disk, added up here
    on_disk: dict[str, Counter[str]] = {}
    for path in (cache / STATS_DIRNAME).glob("*.json"):
        for module, counts in json.loads(path.read_text())["modules"].items():
            on_disk.setdefault(module, Counter()).update(
                {k: v for k, v in counts.items() if k != "keys"}
            )
    for module, counts in on_disk.items():
        assert of(samples, "cachedoctor_compile_seconds_total", module=module) == pytest.approx(
            counts["compile_secs"]
        )
        assert of(samples, "cachedoctor_retrieval_seconds_total", module=module) == pytest.approx(
            counts["retrieval_secs"]
        )

    # `stats --json`: the same floats, to the last digit
    doc = as_json(cache)
    for m in doc["modules"]:
        assert (
            of(samples, "cachedoctor_compile_seconds_total", module=m["module"])
            == (m["compile_secs"])
        )
        assert of(samples, "cachedoctor_saved_seconds", module=m["module"]) == m["saved_secs"]
    totals = doc["totals"]
    outcomes = by(samples, "cachedoctor_miss_outcomes_total", "outcome")
    assert outcomes["writes"] == totals["writes"] == len(entry_files(cache))
    assert all(outcomes[k] == totals[k] for k in outcomes)

    # the causes: JAX's keys of jit_step differ in these components; the first, as `why`
    # ranks them, names the cause of the second run's misses, the first run's are first ones
    first, second = (logged_keys(log)[0] for log in logs)
    jax_says = differing(first, second)
    cause = min(jax_says, key=CAUSE_ORDER.index)
    misses = by(samples, "cachedoctor_misses_total", "cause")
    assert misses == {cause: len(requests), "first-or-unrecorded": len(requests)}
    assert sum(misses.values()) == totals["misses"]
    spent = by(samples, "cachedoctor_miss_compile_seconds_total", "cause")
    assert sum(spent.values()) == pytest.approx(totals["compile_secs"])

    # the cache's files now
    entries = entry_files(cache)
    assert of(samples, "cachedoctor_cache_entries") == len(entries)
    assert of(samples, "cachedoctor_cache_size_bytes") == sum(p.stat().st_size for p in entries)

    # the Python API returns these figures
    api = cachedoctor.metrics(cache, max_modules=1000)
    from_api = {
        (s.name, tuple(sorted((k, v) for k, v in s.labels if k != "cache"))): s.value
        for f in api.families
        for s in f.samples
    }
    assert from_api == samples
    assert api.value("cachedoctor_requests_total", module="jit_step", result="miss") == 2


@pytest.mark.slow
def test_prometheus_text_is_the_same_figures_in_the_textfile_collectors_format(
    flag_history: tuple[Path, list[str]],
) -> None:
    """Format 0.0.4 (node_exporter's textfile collector): a counter's HELP and TYPE name its
    samples' `_total` name (expfmt types only samples of the very name), no UNIT, no EOF."""
    cache, _ = flag_history
    text = metrics(cache, fmt="prometheus")
    assert "# EOF" not in text and "# UNIT" not in text
    assert "# TYPE cachedoctor_requests_total counter\n" in text
    assert "# TYPE cachedoctor_cache_size_bytes gauge\n" in text
    samples: Samples = {}
    for family in text_004(text):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "cache"))
            samples[s.name, labels] = s.value
            assert family.type == ("counter" if s.name.endswith("_total") else "gauge"), s
    assert samples == parsed(metrics(cache))[1]


@pytest.mark.slow
def test_a_module_that_never_hit_misses_for_its_reason(recorded: Path) -> None:
    doc = as_json(recorded)
    _, samples = parsed(metrics(recorded))
    (never,) = (m for m in doc["modules"] if m["never_hit"])
    assert never["reason_kind"] == "unstable-key"  # the premise (scan's finding)
    assert of(samples, "cachedoctor_misses_total", cause="unstable-key") == never["misses"]
    assert of(samples, "cachedoctor_miss_compile_seconds_total", cause="unstable-key") == (
        pytest.approx(never["compile_secs"])
    )
    kinds = Counter((f["kind"], f["severity"]) for f in doc["findings"])
    assert kinds[("never-hit", "warning")] == 1
    for (kind, severity), n in kinds.items():
        assert of(samples, "cachedoctor_findings", kind=kind, severity=severity) == n


@pytest.mark.slow
def test_max_modules_keeps_the_first_and_adds_up_the_rest(recorded: Path) -> None:
    doc = as_json(recorded)
    code, text = stats(str(recorded), "--format", "openmetrics", "--max-modules", "1")
    assert code == 0, text
    _, samples = parsed(text)
    hits = by(
        {k: v for k, v in samples.items() if ("result", "hit") in k[1]},
        "cachedoctor_requests_total",
        "module",
    )
    first = doc["modules"][0]
    assert set(hits) == {first["module"], "(other modules)"}
    assert hits[first["module"]] == first["hits"]
    assert hits["(other modules)"] == doc["totals"]["hits"] - first["hits"]
    spent = by(samples, "cachedoctor_compile_seconds_total", "module")
    assert sum(spent.values()) == pytest.approx(doc["totals"]["compile_secs"])


HOSTILE = {
    "jit_f": 'jit_"quoted" \\back\\slash\nnew line',
    "jit_iota": 'jit_ünïcødé ☃ {a="b",c} # EOF',
}


@pytest.mark.slow
def test_any_module_name_is_one_label_value(recorded: Path, copy_of: Any) -> None:
    """Names are JAX's MLIR symbol names, which may hold anything: each is escaped so that the
    parser reads it back as it is, in both formats."""
    cache = copy_of(recorded)
    for path in (cache / STATS_DIRNAME).glob("*.json"):
        record = json.loads(path.read_text())
        record["modules"] = {HOSTILE.get(k, k): v for k, v in record["modules"].items()}
        path.write_text(json.dumps(record))
    names = {m["module"] for m in as_json(cache)["modules"]}
    assert set(HOSTILE.values()) <= names  # the records still read
    _, samples = parsed(metrics(cache))
    assert set(by(samples, "cachedoctor_compile_seconds_total", "module")) == names
    from_004 = {
        s.labels["module"]
        for family in text_004(metrics(cache, fmt="prometheus"))
        for s in family.samples
        if s.name == "cachedoctor_compile_seconds_total"
    }
    assert from_004 == names


@pytest.mark.slow
def test_nothing_recorded_is_still_valid_text(
    tmp_path: Path, flag_history: tuple[Path, list[str]]
) -> None:
    families, samples = parsed(metrics(tmp_path))  # an empty folder: an empty cache
    assert of(samples, "cachedoctor_processes_total") == 0
    assert of(samples, "cachedoctor_cache_entries") == of(samples, "cachedoctor_cache_size_bytes")
    assert of(samples, "cachedoctor_cache_entries") == 0
    assert not by(samples, "cachedoctor_requests_total", "module")
    assert families["cachedoctor_requests"] == ("counter", "")  # declared, without samples

    cache, _ = flag_history
    _, later = parsed(metrics(cache, "--since", "2099-01-01"))
    assert of(later, "cachedoctor_processes_total") == 0
    assert not by(later, "cachedoctor_requests_total", "module")
    assert of(later, "cachedoctor_cache_entries") == len(entry_files(cache))  # the cache now


@pytest.mark.slow
def test_module_selects_the_records_and_the_entries(flag_history: tuple[Path, list[str]]) -> None:
    cache, _ = flag_history
    _, samples = parsed(metrics(cache, "--module", "jit_st*"))
    assert set(by(samples, "cachedoctor_compile_seconds_total", "module")) == {"jit_step"}
    entries = entry_files(cache, "jit_step")
    assert of(samples, "cachedoctor_cache_entries") == len(entries) == 2
    assert of(samples, "cachedoctor_cache_size_bytes") == sum(p.stat().st_size for p in entries)


@pytest.mark.slow
def test_the_other_options_go_as_with_every_format(
    flag_history: tuple[Path, list[str]], tmp_path: Path
) -> None:
    cache, _ = flag_history
    code, out = stats(str(cache), "--format", "openmetrics", "--json")
    assert code == 2 and "--json is --format json" in out
    code, out = stats(str(cache), "--format", "prometheus", "--zero")
    assert code == 2 and "--zero archives every record" in out
    page = tmp_path / "page.html"
    code, out = stats(str(cache), "--format", "openmetrics", "--html", str(page))
    assert code == 0 and out.endswith("# EOF\n")
    assert "<svg" in page.read_text() and "jit_step" in page.read_text()


def test_values_read_back_exactly() -> None:
    """Every float the records can hold is written so that it reads back as the same float."""
    from cachedoctor.render.openmetrics import _number

    for value in (0.0, -0.0, 1e-05, 0.1 + 0.2, 3.4661239570000077, -0.004, 1e300, 7):
        text = f"# TYPE x gauge\nx {_number(value)}\n# EOF\n"
        (family,) = openmetrics(text)
        assert family.samples[0].value == value
        assert not math.isnan(family.samples[0].value)
