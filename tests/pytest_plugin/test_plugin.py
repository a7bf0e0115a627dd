"""The pytest plugin against JAX's own log: optax's tests from its sdist run cold, then warm,
then warm under pytest-xdist with ``--cachedoctor-fail-on-miss`` (fully warm: nothing fails); a
small suite (docs/pytest.md's examples) run cold, then with ``--cachedoctor-fail-on-miss``
after one program changed, with the stats recorder and without. And the plugin off: free, and
changing nothing.

JAX processes: 7 (optax cold, warm, two xdist workers; the small suite three times).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import pytest_examples, pytest_suites
from tests.support.pytest_suites import SuiteRun, jax_says, plugin_says, run_suite

pytestmark = pytest.mark.slow


def _check_against_jax(run: SuiteRun) -> dict[str, tuple[int, int]]:
    """Per test, the plugin's hits and misses equal JAX's log lines, and its missed modules
    the modules JAX logs as missed; returns (hits, misses) per test."""
    assert run.returncode == 0, run.output[-3000:]
    seen = {}
    for nodeid, case in run.cases().items():
        hits, misses = jax_says(case)
        said = plugin_says(case)
        assert int(said["cache_hits"]) == sum(hits.values()), nodeid
        assert int(said["cache_misses"]) == sum(misses.values()), nodeid
        assert Counter(m.split(":", 1)[0] for m in said["miss"]) == misses, nodeid
        seen[nodeid] = (sum(hits.values()), sum(misses.values()))
    return seen


@pytest.fixture(scope="module")
def optax_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, SuiteRun]]:
    folder, why = pytest_suites.optax_sdist()
    if folder is None:
        pytest.skip(why)
    pytest.importorskip("absl", reason="optax's tests need absl-py (the `test` extra)")
    cache = tmp_path_factory.mktemp("optax") / "cache"
    args = ["-q", *pytest_suites.OPTAX_TESTS]
    runs = {
        "cold": run_suite(folder, cache, ["-p", "no:xdist", *args], "cold"),
        "warm": run_suite(folder, cache, ["-p", "no:xdist", *args], "warm"),
        # fully warm: --cachedoctor-fail-on-miss fails nothing
        "xdist": run_suite(
            folder, cache, ["-n", "2", "--cachedoctor-fail-on-miss", *args], "xdist"
        ),
    }
    yield runs


def test_cold_and_warm_hits_and_misses_per_test_are_jaxs(optax_runs: dict[str, SuiteRun]) -> None:
    cold = _check_against_jax(optax_runs["cold"])
    warm = _check_against_jax(optax_runs["warm"])
    assert sum(m for _, m in cold.values()) > 10 and sum(h for h, _ in cold.values()) == 0
    assert sum(h for h, _ in warm.values()) > 10 and sum(m for _, m in warm.values()) == 0
    doc = json.loads(optax_runs["cold"].document.read_text())
    assert doc["document"] == "pytest" and doc["recorder"] == "stats"
    # every cold miss is a first compile, in why's words, grouped by cause in the summary
    assert {c["verdict"] for c in doc["causes"]} == {"first"}
    assert "misses by cause" in optax_runs["cold"].output


def test_xdist_figures_are_merged_once(optax_runs: dict[str, SuiteRun]) -> None:
    run = optax_runs["xdist"]
    per_test = _check_against_jax(run)
    doc = json.loads(run.document.read_text())
    assert doc["processes"] == 2
    assert sorted(t["nodeid"] for t in doc["tests"]) == sorted(
        json.loads(optax_runs["warm"].document.read_text())["tests"][i]["nodeid"]
        for i in range(len(per_test))
    )
    logged_hits = sum(h for h, _ in per_test.values())
    outside = doc["outside_tests"]["hits"]
    assert doc["totals"]["hits"] == logged_hits + outside
    assert doc["totals"]["cache_misses"] == 0


def test_fail_on_miss_names_the_module_and_the_cause(tmp_path: Path) -> None:
    cold, edited, cache = pytest_examples.runs(tmp_path)
    assert cold.returncode == 0, cold.output[-3000:]
    assert edited.returncode == 1, edited.output[-3000:]
    cases = edited.cases()
    failed = cases["test_small::test_edited"].find("failure")
    assert failed is not None and cases["test_small::test_steady"].find("failure") is None
    message = failed.text or ""
    assert "jit_step: the program changed: 1 instruction differs" in message, message
    assert "1 persistent-cache miss" in message
    _, misses = jax_says(cases["test_small::test_edited"])
    assert misses == Counter({"jit_step": 1})
    # the page shows what these runs print
    page = pytest_examples.page_block(pytest_examples.PAGE.read_text())
    new = pytest_examples.render(
        pytest_examples.excerpt(cold, cache), pytest_examples.excerpt(edited, cache)
    )
    assert pytest_examples.comparable(page) == pytest_examples.comparable(new), (
        "docs/pytest.md's examples differ: python -m tests.support.pytest_examples --write"
    )
    # edited again, the recorder off: the module as JAX's compile event names it, the cause
    # unknown (never guessed)
    suite = cold.junit.parent / "suite"
    pytest_examples.write_suite(suite, 7.0)
    off = {"CACHEDOCTOR_HOOK": ""}
    unrecorded = run_suite(suite, cache, pytest_examples.EDITED_ARGS, "unrecorded", off)
    assert unrecorded.returncode == 1, unrecorded.output[-3000:]
    failed = unrecorded.cases()["test_small::test_edited"].find("failure")
    message = "" if failed is None else failed.text or ""
    assert "jit(step): unknown: the stats recorder is off" in message, message
    assert json.loads(unrecorded.document.read_text())["recorder"] is None


def test_off_the_plugin_imports_nothing_and_registers_nothing(tmp_path: Path) -> None:
    probe = (
        "import sys, cachedoctor.pytest_plugin as p;"
        "print(sorted(m for m in sys.modules if m.startswith(('jax', 'cachedoctor.'))))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout.replace("'", '"'))
    assert loaded == ["cachedoctor._version", "cachedoctor.pytest_plugin"]
    (tmp_path / "test_probe.py").write_text(
        "import sys\n"
        "def test_probe(pytestconfig):\n"
        "    import cachedoctor.units\n"
        "    assert not pytestconfig.pluginmanager.has_plugin('cachedoctor-session')\n"
        "    assert pytestconfig.pluginmanager.has_plugin('cachedoctor')\n"
        "    assert 'jax' not in sys.modules\n"
        "    loader = type(sys.modules['cachedoctor.units'].__loader__).__name__\n"
        "    assert loader != 'AssertionRewritingHook', loader\n"
    )
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q"]
    argv += ["-c", "/dev/null", "--rootdir", str(tmp_path), "-W", "error", str(tmp_path)]
    env = {"CACHEDOCTOR_HOOK": "stats", "PATH": "/usr/bin:/bin"}  # cachedoctor imported first
    done = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "cachedoctor" not in done.stdout.split("passed")[-1]


def test_a_json_document_that_cannot_be_written_fails_the_run(tmp_path: Path) -> None:
    """Asked for and not written: one line saying why, and not a passing exit."""
    (tmp_path / "test_one.py").write_text("def test_one():\n    pass\n")
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q"]
    argv += ["-c", "/dev/null", "--rootdir", str(tmp_path), str(tmp_path)]
    missing = tmp_path / "no-such-folder" / "compiles.json"
    done = subprocess.run(
        [*argv, "--cachedoctor-json", str(missing)], capture_output=True, text=True
    )
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout[-2000:] + done.stderr
    # one line naming the folder that is not there (a path over 100 characters is shortened)
    (said,) = [line for line in done.stdout.splitlines() if line.startswith("cachedoctor: ")]
    assert said.startswith("cachedoctor: cannot write /") and "compiles.js" in said
    assert said.endswith(f": no such directory: {missing.parent}"), said
    assert "Traceback" not in done.stdout + done.stderr
    written = tmp_path / "compiles.json"
    done = subprocess.run(
        [*argv, "--cachedoctor-json", str(written)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout[-2000:]
    assert json.loads(written.read_text())["document"] == "pytest"
