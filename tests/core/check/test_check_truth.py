"""`check` tells the truth a CI job acts on (issue Trust III).

- NOT STORED gives JAX's reason under pytest as well as plain `python`, on each JAX here
  (CACHEDOCTOR_COMPAT_PYTHONS adds others), checked against JAX's own log lines of the same run:
  the test program hands JAX's "jax" logger a file of its own, which pytest's log capture leaves
  alone while it swallows what would reach the output `check` reads;
- a failed CMD still gets its JSON, JUnit and GitHub report, with exit 2 (docs/ci.md);
- `--dir caches/x` gives CMD the folder as typed: the keys are those a job with that
  JAX_COMPILATION_CACHE_DIR writes (JAX hashes the spelling into its keys).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from cachedoctor.programs import program_path
from tests.support.caches import cli_env
from tests.support.cli import run_cli
from tests.support.hookrun import SRC, compat_params

pytestmark = pytest.mark.slow  # every test here runs the CLI and JAX in subprocesses

PY = sys.executable

# jits functions too fast for the minimum compile time it sets itself (a conftest or a test
# module may: CMD's code overrides the JAX_PERSISTENT_CACHE_* variables check sets); JAX's own
# log lines go to JAX_OWN_LOG as well (the oracle), and to stderr as without a handler
TOO_FAST = """
import logging, os
import jax
import jax.numpy as jnp

jax.config.update("jax_persistent_cache_min_compile_time_secs", 60.0)
# a handler of its own ends logging's last resort (stderr): a stream handler stands in for it
for _handler in (logging.FileHandler(os.environ["JAX_OWN_LOG"]), logging.StreamHandler()):
    _handler.setLevel(logging.WARNING)
    logging.getLogger("jax").addHandler(_handler)


@jax.jit
def double(x):
    return x * 2.0


@jax.jit
def noisy(x):  # host callbacks: jax 0.10 refuses it for them, 0.12 for its compile time
    jax.debug.print("x={x}", x=x)
    return x + 1.0


def test_too_fast():
    assert float(double(jnp.ones(()))) == 2.0
    assert float(noisy(jnp.ones(()))) == 2.0


if __name__ == "__main__":
    test_too_fast()
"""

# the same program, each entry under JAX's minimum entry size instead
TOO_SMALL = TOO_FAST.replace(
    '"jax_persistent_cache_min_compile_time_secs", 60.0',
    '"jax_persistent_cache_min_entry_size_bytes", 10**9',
)

# JAX's words in compiler._cache_write and compilation_cache.put_executable_and_time
# (0.4.38 .. 0.12), read independently of cachedoctor's
JAX_REFUSAL = re.compile(
    r"^Not writing persistent cache entry (?:for '(?P<module>[^']+)' because "
    r"(?:it took < (?P<min>[\d.]+) seconds to compile|(?P<callbacks>it uses host callbacks))"
    r"|with key '(?P<key>[^']+)' since its size \((?P<size>\d+) bytes\) is less than "
    r"threshold)[^\n]*",
    re.M,
)
KIND = {"min": "under-min-compile-time", "callbacks": "host-callbacks", "size": "under-min-size"}


def cachedoctor(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env=env or check_env(), cwd=cwd)


def check_env(**extra: str) -> dict[str, str]:
    """The CLI's environment; CMD's Python (another JAX too) loads this checkout's hook."""
    env = cli_env() | {"JAX_PLATFORMS": "cpu", **extra}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), *filter(None, [env.get("PYTHONPATH")])])
    return env


def jax_said(log: Path) -> dict[str, tuple[str, str]]:
    """Module -> (reason kind, JAX's line), from JAX's own log file."""
    said: dict[str, tuple[str, str]] = {}
    for m in JAX_REFUSAL.finditer(log.read_text()):
        kind = KIND[next(k for k in KIND if m.group(k))]
        module = m.group("module") or m.group("key").rsplit("-", 1)[0]
        said.setdefault(module, (kind, m.group(0)))
    return said


PYTHONS = [pytest.param(PY, id="this-jax"), *compat_params()]


@pytest.mark.parametrize("python", PYTHONS)
@pytest.mark.parametrize("runner", ["pytest", "python", "python-no-observe"])
def test_not_stored_gives_jaxs_reason(tmp_path: Path, runner: str, python: str) -> None:
    (tmp_path / "test_too_fast.py").write_text(TOO_FAST)
    own, log = tmp_path / "jax-own.log", tmp_path / "check.log"
    if runner == "pytest":
        has = subprocess.run([python, "-c", "import pytest"], capture_output=True, check=False)
        if has.returncode != 0:
            pytest.skip(f"no pytest in {python}")
        cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_too_fast.py"]
    else:
        cmd = [python, "test_too_fast.py"]
    flags = ["--no-observe"] if runner == "python-no-observe" else []
    junit = tmp_path / "check.xml"
    proc = cachedoctor(
        "check", "--runs", "1", "--quiet", "--log", str(log), "--format", "json",
        "--junit", str(junit), *flags, "--", *cmd,
        cwd=tmp_path, env=check_env(JAX_OWN_LOG=str(own)),
    )  # fmt: skip
    doc = json.loads(proc.stdout)
    said = jax_said(own)
    assert {"jit_double", "jit_noisy"} <= set(said), own.read_text()  # JAX's refusals: the oracle
    assert proc.returncode == 1 and doc["nothing_checked"], proc.stderr  # nothing was stored
    reasons = {r["module"]: r for r in doc["not_stored_reasons"]}
    assert doc["not_stored"] == sorted(said) == sorted(reasons)
    output = log.read_text()
    for module, (kind, line) in said.items():
        got = reasons[module]
        assert got["kind"] == kind, got
        if runner == "pytest":  # pytest swallowed JAX's line: the hook's records tell
            assert line not in output and got["jax_log"] is None
            assert got["source"] == "stats records"
        else:  # the same line reached check's output, and is quoted
            assert line in output and got["jax_log"] == line
        if runner == "python-no-observe":  # no hook: JAX's line is all there is
            assert got["source"] == "JAX's log" and line.endswith(got["summary"][len("JAX: ") :])
        else:
            assert got["source"] == "stats records"
        if kind == "under-min-compile-time" and runner != "python-no-observe":  # the setting
            assert re.search(r"jax_persistent_cache_min_compile_time_secs = 60\b", got["evidence"])
    skipped = {
        str(c.get("name")): str(s.get("message"))
        for c in ET.parse(junit).getroot().iter("testcase")
        if (s := c.find("skipped")) is not None
    }
    assert sorted(skipped) == sorted(said)
    assert skipped["jit_double"].startswith("not stored by JAX: ")


def test_not_stored_in_text_says_jaxs_reason(tmp_path: Path) -> None:
    """The text report: a NOT STORED line per module, and the summary names them."""
    (tmp_path / "test_too_fast.py").write_text(TOO_FAST)
    env = check_env(JAX_OWN_LOG=str(tmp_path / "jax-own.log"))
    cmd = [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_too_fast.py"]
    proc = cachedoctor("check", "--quiet", "--runs", "1", "--", *cmd, cwd=tmp_path, env=env)
    assert proc.returncode == 1, proc.stderr
    assert "\nNOT STORED jit_double: " in proc.stdout
    assert "\n  evidence (stats records): " in proc.stdout
    out = proc.stdout
    last = " ".join(out[out.rindex("\ncachedoctor check: ") :].split())  # wrapped lines joined
    assert last.startswith("cachedoctor check: nothing was checked: run 1 wrote no cache entry")
    assert re.search(r"not stored by JAX, so compiled afresh every run: [\w, ]*jit_double", last)


def test_a_failed_command_still_gets_its_reports(tmp_path: Path) -> None:
    """JSON on stdout, the JUnit file, -o FILE and GitHub's annotations; exit 2, one error line."""
    fail = [PY, "-c", "import sys; print('boom'); sys.exit(3)"]
    junit = tmp_path / "check.xml"
    proc = cachedoctor(
        "check", "--quiet", "--format", "json", "--junit", str(junit), "--", *fail, cwd=tmp_path
    )
    assert proc.returncode == 2, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["failed"] is True and doc["nothing_checked"] is False
    failed = doc["command_failed"]
    assert failed["run"] == 1 and failed["returncode"] == 3 and failed["slug"] == "command-failed"
    assert [r["returncode"] for r in doc["runs"]] == [3]
    assert "boom" in Path(doc["log"]).read_text()  # --quiet: its output is kept in the log
    last = proc.stderr.strip().splitlines()[-1]
    assert last == f"cachedoctor: command-failed: {failed['message']}"
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("failures") == "1"
    (case,) = suite.findall("testcase")
    assert case.get("name") == "run 1" and case.find("failure") is not None

    out = tmp_path / "report.json"
    proc = cachedoctor("check", "--format", "json", "-o", str(out), "--", *fail, cwd=tmp_path)
    assert proc.returncode == 2 and json.loads(out.read_text())["command_failed"]["returncode"] == 3
    proc = cachedoctor("check", "--format", "github", "--", *fail, cwd=tmp_path)
    assert proc.returncode == 2 and "::error title=cachedoctor check%3A run 1 failed::" in (
        proc.stdout
    )
    proc = cachedoctor(
        "check", "--format", "json", "--", str(tmp_path / "no-such-program"), cwd=tmp_path
    )
    assert proc.returncode == 2 and "command-not-found" in proc.stderr
    failed = json.loads(proc.stdout)["command_failed"]
    assert failed["returncode"] is None and failed["slug"] == "command-not-found"


def test_dir_is_given_to_the_command_as_typed(tmp_path: Path) -> None:
    """`check --dir caches/x` checks the keys a job with JAX_COMPILATION_CACHE_DIR=caches/x
    writes: those of a plain run with that spelling, in another folder (JAX hashes it)."""
    plain = [PY, str(program_path("plain"))]
    job, here = tmp_path / "job", tmp_path / "here"
    job.mkdir()
    here.mkdir()
    env = check_env(
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )
    keys = {}
    for where, spelling in ((job, "caches/x"), (here, str(here / "caches" / "x"))):
        ran = subprocess.run(
            plain, cwd=where, env=env | {"JAX_COMPILATION_CACHE_DIR": spelling}, check=False,
            capture_output=True, timeout=600,
        )  # fmt: skip
        assert ran.returncode == 0, ran.stderr
        keys[where] = sorted(p.name[: -len("-cache")] for p in (where / "caches/x").glob("*-cache"))
    assert keys[job] and keys[job] != keys[here]  # the spelling is in the keys
    for p in (here / "caches" / "x").glob("*-cache"):
        p.unlink()

    proc = cachedoctor(
        "check", "--quiet", "--verify", "--format", "json", "--dir", "caches/x", "--", *plain,
        cwd=here, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert sorted(doc["runs"][0]["new_keys"]) == keys[job]
    verify = doc["verify"]  # the verify run looked up the runs' keys, and found each
    assert verify["not_checked"] == [] and verify["checks"]
    assert {c["outcome"] for c in verify["checks"]} == {"same-program"}


@pytest.mark.parametrize("python", PYTHONS)
@pytest.mark.parametrize("observe", [True, False], ids=["records", "log"])
def test_not_stored_under_the_minimum_entry_size(
    tmp_path: Path, observe: bool, python: str
) -> None:
    """JAX's put refuses an entry under its minimum size, naming the key, not the module."""
    (tmp_path / "too_small.py").write_text(TOO_SMALL)
    own, log = tmp_path / "jax-own.log", tmp_path / "check.log"
    flags = [] if observe else ["--no-observe"]
    proc = cachedoctor(
        "check", "--runs", "1", "--quiet", "--log", str(log), "--format", "json", *flags,
        "--", python, "too_small.py", cwd=tmp_path, env=check_env(JAX_OWN_LOG=str(own)),
    )  # fmt: skip
    doc = json.loads(proc.stdout)
    said = jax_said(own)
    assert said["jit_double"][0] == "under-min-size", own.read_text()  # the oracle
    reasons = {r["module"]: r for r in doc["not_stored_reasons"]}
    assert doc["not_stored"] == sorted(said) == sorted(reasons), proc.stderr
    for module, (kind, line) in said.items():
        got = reasons[module]
        assert got["kind"] == kind and got["jax_log"] == line, got
        assert got["source"] == ("stats records" if observe else "JAX's log")
    if observe:  # the setting the process ran with
        evidence = reasons["jit_double"]["evidence"]
        assert "jax_persistent_cache_min_entry_size_bytes = 1000000000" in evidence
