"""`cachedoctor check -- CMD` on real JAX programs; the workflow of docs/ci.md, run for real."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from cachedoctor.programs import program_path
from tests.support.caches import REPO, cli_env, make_cache
from tests.support.cli import run_cli

pytestmark = pytest.mark.slow  # every test here runs JAX or the CLI in a subprocess

ROOT = REPO
PY = sys.executable
SEED = [PY, str(program_path("seed"))]
PLAIN = [PY, str(program_path("plain"))]


def cachedoctor(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The CLI in a subprocess, as CI runs it (check starts processes and tees their output)."""
    return run_cli(*args, env=env or cli_env(), cwd=cwd)


def test_seed_program_is_unstable() -> None:
    proc = cachedoctor("check", "--", *SEED)
    assert proc.returncode == 1, proc.stderr
    out = proc.stdout
    # CMD's own output passed through, once per run
    assert out.count("result: [1.0, 2.0") == 2
    assert re.search(r"UNSTABLE jit_f: 2 distinct keys; recompiled in run 2", out), out
    assert "identical executables under different keys" in out
    assert "backend_config" in out
    assert "unstable cache key): jit_f" in out.splitlines()[-1]
    assert "jit_iota" not in out.split("UNSTABLE", 1)[1].split("cachedoctor check:")[0]
    # the observe layer names the volatile input and its two raw values
    assert "verdict (manifests): the key input custom_call[0].backend_config changed" in out
    assert re.search(r"custom_call\[0\]\.backend_config: '\d+' → '\d+'", out), out
    assert "stable hasher: one key for all runs, so it would have hit" in out
    assert "\n  diff: same executable" in out  # cachedoctor diff's verdict, first and last key
    # the observe layer recorded the partitioner calls: the same in both runs
    assert "stable key mode: replay (1 recorded partitioner call(s) in 1 custom" in out


def test_seed_with_manifests_json() -> None:
    proc = cachedoctor("check", "--quiet", "--format", "json", "--", *SEED)
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    (module,) = doc["unstable"]
    assert module["module"] == "jit_f" and len(module["keys"]) == 2
    assert module["source"] == "manifests" and module["stable_would_hit"] is True
    (change,) = module["volatile"]
    assert change["field"] == "custom_call[0].backend_config"
    assert len(set(change["values"])) == 2 and change["canonical_same"] is True


def test_seed_is_stable_with_the_stable_hook() -> None:
    """CACHEDOCTOR_HOOK=stable (the user's choice) is kept: check then proves the fix works."""
    proc = cachedoctor(
        "check", "--quiet", "--", *SEED, env=cli_env() | {"CACHEDOCTOR_HOOK": "stable"}
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "observe: hook in stable mode" in proc.stdout
    assert "all 3 modules compiled in run 1 hit in runs 2..2" in proc.stdout


def test_plain_program_is_stable_quiet_json(tmp_path: Path) -> None:
    log = tmp_path / "check.log"
    proc = cachedoctor("check", "--quiet", "--log", str(log), "--format", "json", "--", *PLAIN)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)  # nothing but the report on stdout
    assert doc["schema_version"] == 1 and doc["failed"] is False and doc["unstable"] == []
    assert "jit_g" in doc["modules"]
    assert [r["returncode"] for r in doc["runs"]] == [0, 0]
    assert doc["runs"][0]["new_keys"] and doc["runs"][1]["new_keys"] == []
    assert "result:" not in proc.stdout + proc.stderr  # --quiet: CMD's output only in the log
    assert log.read_text().count("result:") == 2
    assert not Path(doc["cache_dir"]).exists()  # the temporary cache is cleaned up


def test_verify_finds_a_stale_hit(tmp_path: Path) -> None:
    """The stale hit in docs/stable-keys.md: pointer out of the key, partitioned code changed."""
    cache = tmp_path / "cache"
    strip = {"JAX_REMOVE_CUSTOM_PARTITIONING_PTR_FROM_CACHE_KEY": "1"}
    make_cache(cache, [("seed", strip)])  # x + 1 is cached
    env = cli_env() | strip | {"CACHEDOCTOR_SEED_ADD": "5"}  # now x + 5, same stripped key
    proc = cachedoctor(
        "check", "--dir", str(cache), "--verify", "--format", "github",
        "--", *SEED, env=env,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "result: [1.0, 2.0" in proc.stdout  # run 1: the stale executable's (wrong) answer
    errors = [line for line in proc.stdout.splitlines() if line.startswith("::error")]
    assert any("cachedoctor check --verify (jit_f)" in e for e in errors), proc.stdout
    last = proc.stdout.splitlines()[-1]
    stale = re.search(r"; (\d+) stale (entry|entries) \(--verify\)", last)
    assert stale is not None, last
    assert (stale.group(2) == "entry") == (stale.group(1) == "1"), last  # the noun's number


def test_failing_command_is_reported(tmp_path: Path) -> None:
    proc = cachedoctor("check", "--", PY, "-c", "import sys; print('boom'); sys.exit(3)")
    assert proc.returncode == 2
    assert "boom" in proc.stdout  # passed through
    last = proc.stderr.strip().splitlines()[-1]
    assert re.match(
        r"cachedoctor: command-failed: run 1/2 failed: `.+` exited with 3 "
        r"\(output above; --keep keeps cache and log\)$",
        last,
    ), last  # the output was shown, so the temp folder goes (tests/e2e/test_trust.py checks it)

    # fails only on run 2: the message names run 2; --quiet keeps the output in the log alone
    marker = tmp_path / "ran-once"
    script = (
        f"import os, sys; p = {str(marker)!r}\n"
        "sys.exit(4) if os.path.exists(p) else open(p, 'w').close()"
    )
    proc = cachedoctor("check", "--quiet", "--", PY, "-c", script)
    assert proc.returncode == 2
    assert "run 2/2 failed" in proc.stderr and "exited with 4" in proc.stderr
    assert "output only in the log" in proc.stderr
    shutil.rmtree(Path(proc.stderr.strip().rsplit("log: ", 1)[1].rstrip(")")).parent)

    proc = cachedoctor("check", "--", str(tmp_path / "no-such-program"))
    assert proc.returncode == 2 and "command-not-found" in proc.stderr
    proc = cachedoctor("check")
    assert proc.returncode == 2


def test_junit_report_for_check(tmp_path: Path) -> None:
    out = tmp_path / "check.xml"
    proc = cachedoctor("check", "--quiet", "--format", "junit", "-o", str(out), "--", *SEED)
    assert proc.returncode == 1, proc.stderr
    suite = ET.parse(out).getroot().find("testsuite")
    assert suite is not None and suite.get("failures") == "1"
    failed = [c.get("name") for c in suite.findall("testcase") if c.find("failure") is not None]
    assert failed == ["jit_f"]


# -- docs/ci.md, run for real ------------------------------------------------------------------

PROJECT_TEST = """
import jax
import jax.numpy as jnp


def test_model():
    f = jax.jit(lambda x: jnp.tanh(x) @ x.T)
    assert f(jnp.ones((4, 4))).shape == (4, 4)
"""


def workflow_jobs(markdown: str) -> dict[str, dict[str, object]]:
    """Jobs of the yaml block in docs/ci.md: their env and their `run:` steps, in order.

    A small reader for the shape the doc uses (no YAML dependency): `name:` then `run:` lines.
    """
    block = re.search(r"```yaml\n(.*?)```", markdown, re.S)
    assert block, "docs/ci.md has no yaml block"
    jobs: dict[str, dict[str, object]] = {}
    job: dict[str, object] | None = None
    in_env = False
    step_name = ""
    for line in block.group(1).splitlines():
        if m := re.match(r"^  ([\w-]+):\s*$", line):
            job = {"env": {}, "steps": []}
            jobs[m.group(1)] = job
            in_env = False
            continue
        if job is None:
            continue
        if re.match(r"^    env:\s*$", line):
            in_env = True
            continue
        if in_env and (m := re.match(r"^      ([A-Z_]+): (.*)$", line)):
            job["env"][m.group(1)] = m.group(2).strip().strip('"')  # type: ignore[index]
            continue
        if not line.startswith("      ") or line.startswith("    steps:"):
            in_env = False
        if m := re.match(r"^      - name: (.*)$", line):
            step_name = m.group(1)
        elif m := re.match(r"^      (?:- |  )run: (.*)$", line):
            job["steps"].append((step_name, m.group(1)))  # type: ignore[attr-defined]
    return jobs


def test_ci_doc_workflow_runs(tmp_path: Path) -> None:
    jobs = workflow_jobs((ROOT / "docs" / "ci.md").read_text())
    assert set(jobs) == {"test", "cache-keys"}
    project = tmp_path / "project"
    (project / "tests").mkdir(parents=True)
    (project / "tests" / "test_model.py").write_text(PROJECT_TEST)
    env = cli_env()
    env["PATH"] = os.path.dirname(PY) + os.pathsep + env.get("PATH", "")  # python, cachedoctor
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
    env["JAX_PLATFORMS"] = "cpu"
    ran = []
    for name, job in jobs.items():
        job_env = env | dict(job["env"])  # type: ignore[call-overload]
        for step, command in job["steps"]:  # type: ignore[attr-defined]
            if step == "Install":
                assert command.startswith("pip install")
                continue
            proc = subprocess.run(
                ["bash", "-c", command],
                cwd=project,
                env=job_env,
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
            assert proc.returncode == 0, f"{name} / {step}: {command}\n{proc.stdout}\n{proc.stderr}"
            ran.append((name, command.split()[0], proc.stdout))
    assert [(job, cmd) for job, cmd, _ in ran] == [
        ("test", "python"),
        ("test", "cachedoctor"),
        ("cache-keys", "cachedoctor"),
    ]
    cache = project / ".jax-cache"
    assert any(p.name.startswith("jit_") for p in cache.iterdir())  # the tests filled the cache
    lint_out, check_out = ran[1][2], ran[2][2]
    assert lint_out.strip().splitlines()[-1].startswith("cachedoctor lint .jax-cache: 0 findings")
    assert re.search(r"all \d+ modules compiled in run 1 hit in runs 2..2$", check_out.strip()), (
        check_out
    )
    assert (project / "check.log").read_text().count("1 passed") == 2
