"""The composite GitHub Action (action.yml): its steps run as GitHub runs them.

Each ``run:`` script gets its ``env:`` with ``${{ inputs.* }}`` replaced by the inputs (or their
defaults) and runs under ``bash --noprofile --norc -eo pipefail``, in a temporary directory,
against a real cache. The install step asks pip for the package already installed here
(``--no-index``: it must be satisfied without a network); with every input at its default it
installs the action's own checkout (``GITHUB_ACTION_PATH``), which needs no index either.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

import cachedoctor
from cachedoctor.programs import program_path
from tests.support.caches import REPO
from tests.support.hookrun import base_env, recorded_seed_cache, run_recorded
from tests.support.markdown import shown
from tests.support.sessioncache import SharedBuilds

pytestmark = pytest.mark.slow  # every test here runs JAX or the CLI in a subprocess

ACTION = REPO / "action.yml"
EXPR = re.compile(r"\$\{\{\s*inputs\.([\w-]+)\s*\}\}")


def run_action(
    workdir: Path, job_env: dict[str, str] | None = None, /, **inputs: str
) -> tuple[int, str, dict[str, str]]:
    """Run every step (in the job's environment ``job_env``); stop at the first failing one, as
    GitHub does. (status, output, outputs)"""
    action = yaml.safe_load(ACTION.read_text())
    assert action["runs"]["using"] == "composite"
    values = {name: str(spec.get("default", "")) for name, spec in action["inputs"].items()}
    unknown = set(inputs) - set(values)
    assert not unknown, f"not inputs of the action: {unknown}"
    values.update(inputs)
    github_output = workdir / "github-output"
    github_output.touch()
    log = []
    for step in action["runs"]["steps"]:
        assert step["shell"] == "bash"
        env = base_env(None, GITHUB_OUTPUT=str(github_output), GITHUB_ACTION_PATH=str(REPO))
        env.pop("GITHUB_STEP_SUMMARY", None)  # never this test run's own job summary
        env.update(job_env or {})
        for key, value in step.get("env", {}).items():
            env[key] = EXPR.sub(lambda m: values[m.group(1)], str(value))
        assert "${{" not in step["run"], "inputs reach scripts through env only (no injection)"
        proc = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]],
            cwd=workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        log.append(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            return proc.returncode, "".join(log), {}
    outputs = dict(
        line.split("=", 1) for line in github_output.read_text().splitlines() if "=" in line
    )
    return 0, "".join(log), outputs


INSTALLED = {"python": sys.executable, "package": "--no-index cachedoctor"}


def test_lint_annotates_and_writes_junit(seed_cache: Path, tmp_path: Path) -> None:
    status, log, outputs = run_action(
        tmp_path, **INSTALLED, **{"cache-dir": str(seed_cache), "fail-on": "warning"}
    )
    assert status == 1, log  # the unstable key of jit_f is a warning
    assert re.search(r"^::error title=cachedoctor unstable-key \(jit_f\)::", log, re.M), log
    junit = ET.parse(tmp_path / "cachedoctor-junit.xml").getroot()
    failed = [c.get("name") for c in junit.iter("testcase") if c.find("failure") is not None]
    assert "jit_f" in failed

    status, log, outputs = run_action(tmp_path, **INSTALLED, **{"cache-dir": str(seed_cache)})
    assert status == 0, log  # nothing at the default --fail-on error
    assert outputs["junit"] == "cachedoctor-junit.xml"


def test_check_runs_the_command_twice(tmp_path: Path) -> None:
    plain = f"{sys.executable} {program_path('plain')}"
    status, log, outputs = run_action(
        tmp_path, **INSTALLED, command="check", run=plain, junit="out/check.xml"
    )
    assert status == 0, log
    junit = ET.parse(tmp_path / outputs["junit"]).getroot()
    assert junit.get("failures") == "0"


def test_preflight_says_on_the_runner_whether_the_cache_will_hit(tmp_path: Path) -> None:
    """A cache written with the hook recording (8 host devices), restored on a runner: with the
    same settings the preflight passes; with 4 devices it fails with an error annotation per
    module, and JAX then misses, as predicted."""
    from tests.support.keylog import MODULE, hits, run_logged

    cache = tmp_path / "cache"
    run_logged(cache)
    inputs = {**INSTALLED, "command": "preflight", "cache-dir": str(cache)}
    eight = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    status, log, _ = run_action(tmp_path, eight, **inputs)
    assert status == 0 and "will hit" in log, log
    four = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    status, log, _ = run_action(tmp_path, four, **inputs)
    assert status == 1, log
    title = f"::error title=cachedoctor preflight ({MODULE})::{MODULE} will miss: written for 8"
    assert title in log, log
    assert MODULE not in hits(run_logged(cache, env={"WHY_DEVICES": "4"}))


def test_a_wrong_command_is_an_annotated_error(tmp_path: Path) -> None:
    status, log, _ = run_action(tmp_path, **INSTALLED, command="scan")
    assert status == 2
    wrong = "::error title=cachedoctor::command must be lint, preflight, check or stats, not 'scan'"
    assert wrong in log


@pytest.fixture(scope="module")
def recorded(shared_builds: SharedBuilds) -> Path:
    """The seed program run three times with stats recording (as tests/core/conftest.py's)."""
    return recorded_seed_cache(shared_builds)


def stats(cache: Path, *args: str) -> str:
    """What `cachedoctor stats CACHE ARGS` prints."""
    return subprocess.run(
        [sys.executable, "-m", "cachedoctor", "stats", str(cache), *args],
        capture_output=True,
        text=True,
        env=base_env(None),
        check=True,
    ).stdout


def test_lint_and_stats_append_the_job_summary(recorded: Path, tmp_path: Path) -> None:
    """With $GITHUB_STEP_SUMMARY set, lint and stats append `stats --format markdown` of the
    cache to it, after what earlier steps wrote; `summary: false` writes nothing."""
    summary = tmp_path / "step-summary.md"
    earlier = "## an earlier step\n\n"
    summary.write_text(earlier)
    job = {"GITHUB_STEP_SUMMARY": str(summary)}
    inputs = {**INSTALLED, "cache-dir": str(recorded)}
    status, log, _ = run_action(tmp_path, job, **inputs)
    assert status == 0, log  # never-hit is a warning, under the default --fail-on error
    markdown = stats(recorded, "--format", "markdown")
    assert summary.read_text() == earlier + markdown
    totals = json.loads(stats(recorded, "--json"))["totals"]
    page = shown(markdown)
    assert page.headings[0] == f"cachedoctor stats: {recorded}"
    assert page.tables[0][1][:2] == [f"{totals['hit_rate']:.0%}", str(totals["requests"])]

    status, log, _ = run_action(tmp_path, job, **inputs, command="stats")
    assert status == 0, log
    assert re.search(r"^hit rate\s+\d+%\s*$", log, re.M), log  # the text, in the log
    assert summary.read_text() == earlier + markdown + markdown

    status, log, _ = run_action(tmp_path, job, **inputs, summary="false")
    assert status == 0, log
    assert summary.read_text() == earlier + markdown + markdown
    status, log, _ = run_action(tmp_path, job, **inputs, summary="yes")
    assert status == 2 and "summary must be true or false, not 'yes'" in log, log


def test_read_only_reaches_the_jobs_later_steps(tmp_path: Path) -> None:
    """`read-only: true` puts CACHEDOCTOR_READ_ONLY and the records folder into $GITHUB_ENV: a
    JAX program of a later step hits and leaves the cache as it was (every file's bytes and
    mtime); `command: stats` with it summarises the records that run wrote."""
    cache = tmp_path / "cache"  # at its own path: a copy elsewhere would miss (relocated)
    run_recorded(cache, "stats")
    github_env, summary = tmp_path / "github-env", tmp_path / "step-summary.md"
    job = {
        "GITHUB_ENV": str(github_env),
        "RUNNER_TEMP": str(tmp_path / "runner-temp"),
        "GITHUB_STEP_SUMMARY": str(summary),
    }
    inputs = {**INSTALLED, "cache-dir": str(cache), "read-only": "true", "summary": "false"}
    status, log, _ = run_action(tmp_path, job, **inputs)
    assert status == 0, log
    later = dict(line.split("=", 1) for line in github_env.read_text().splitlines())
    records = tmp_path / "runner-temp" / "cachedoctor-records"
    assert later == {"CACHEDOCTOR_READ_ONLY": "1", "CACHEDOCTOR_RECORDS_DIR": str(records)}

    def files() -> dict[str, tuple[bytes, int]]:
        return {
            str(p.relative_to(cache)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in cache.rglob("*")
            if p.is_file()
        }

    before = files()
    run_recorded(cache, "stats", **later)  # a later step of the job
    assert files() == before
    status, log, _ = run_action(tmp_path, job, **{**inputs, "summary": "true"}, command="stats")
    assert status == 0, log
    assert summary.read_text() == stats(records, "--format", "markdown")
    doc = json.loads(stats(records, "--json"))
    assert doc["processes"] == 1 and doc["totals"]["writes"] == 0 and doc["totals"]["hits"] > 0
    status, log, _ = run_action(tmp_path, job, **{**inputs, "read-only": "1"})
    assert status == 2 and "read-only must be true or false, not '1'" in log, log


def test_default_install_is_the_actions_own_checkout_and_needs_no_index(tmp_path: Path) -> None:
    """Every input at its default: pip installs GITHUB_ACTION_PATH, never a name from an index.
    pip resolves it with --no-index (a dry run, with this environment's build backend): the
    report says what it would install and from where."""
    action = yaml.safe_load(ACTION.read_text())
    (install,) = [s for s in action["runs"]["steps"] if s["name"] == "Install cachedoctor"]
    report = tmp_path / "pip-report.json"
    values = {n: str(spec.get("default", "")) for n, spec in action["inputs"].items()}
    assert values["package"] == ""  # the default names no package
    values.update(
        python=sys.executable,
        **{"pip-args": f"--dry-run --no-index --no-build-isolation --report {report}"},
    )
    env = base_env(None, GITHUB_ACTION_PATH=str(REPO))
    for key, value in install.get("env", {}).items():
        env[key] = EXPR.sub(lambda m: values[m.group(1)], str(value))
    proc = subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", install["run"]],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    installs = json.loads(report.read_text())["install"]
    (ours,) = [i for i in installs if i["metadata"]["name"] == "cachedoctor"]
    assert ours["download_info"]["url"] == REPO.as_uri()
    assert ours["metadata"]["version"] == cachedoctor.__version__


def test_without_the_action_path_the_default_install_says_so(tmp_path: Path) -> None:
    action = yaml.safe_load(ACTION.read_text())
    (install,) = [s for s in action["runs"]["steps"] if s["name"] == "Install cachedoctor"]
    env = base_env(None, CD_PYTHON=sys.executable, CD_PACKAGE="", CD_PIP_ARGS="")
    env.pop("GITHUB_ACTION_PATH", None)
    proc = subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", install["run"]],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "::error title=cachedoctor::GITHUB_ACTION_PATH is not set" in proc.stdout
