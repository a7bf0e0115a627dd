"""Test suites the pytest plugin's tests run: a third-party JAX library's own tests (optax's, from
its sdist, which the test setup downloads once and keeps beside the second JAX's venv), and
small suites written for one test. Each run is a fresh pytest, with the hook's stats recorder on
(``CACHEDOCTOR_HOOK=stats``), against a fresh persistent cache that stores every compile; JAX
logs each cache hit and miss (``JAX_LOG_COMPILES``, ``JAX_EXPLAIN_CACHE_MISSES``), which pytest
keeps per test in the JUnit XML (``junit_logging=system-err``): the oracle.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import filelock

from tests.support import otherjax

OPTAX = "0.2.8"  # the sdist whose tests run (pyproject's test extra pins optax too)
# a few of its tests that jit small programs: ~9 tests, ~30 compiles, 3-4 s cold on one core
OPTAX_TESTS = [
    "optax/losses/_smoothing_test.py",
    "optax/schedules/_join_test.py",
    "optax/losses/_regression_test.py::SquaredErrorTest",
    "optax/losses/_regression_test.py::L2LossTest",
]
HIT_RE = re.compile(r"Persistent compilation cache hit for '([^']+)'")
MISS_RE = re.compile(r"PERSISTENT COMPILATION CACHE MISS for '([^']+)'")


def optax_sdist() -> tuple[Path | None, str]:
    """The unpacked optax sdist (downloaded once, under a lock), or None and pip's reason."""
    root = otherjax.venv_dir().parent / "sdists"
    root.mkdir(parents=True, exist_ok=True)
    unpacked = root / f"optax-{OPTAX}"
    with filelock.FileLock(str(root / "optax.lock"), timeout=otherjax.BUILD_TIMEOUT_S):
        if (unpacked / "optax" / "__init__.py").exists():
            return unpacked, ""
        argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
        argv += [f"optax=={OPTAX}", "-d", str(root)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        archive = root / f"optax-{OPTAX}.tar.gz"
        if done.returncode != 0 or not archive.exists():
            lines = (done.stderr or done.stdout).strip().splitlines() or ["(no output)"]
            return None, f"pip could not download the optax {OPTAX} sdist: {lines[-1]}"
        with tarfile.open(archive) as tar:
            tar.extractall(root, filter="data")
    return unpacked, ""


@dataclass(frozen=True)
class SuiteRun:
    """One pytest run: its exit status, output, JUnit XML and the plugin's JSON document."""

    returncode: int
    output: str
    junit: Path
    document: Path

    def cases(self) -> dict[str, ET.Element]:
        """Each test case of the JUnit XML, by ``classname::name``."""
        root = ET.parse(self.junit).getroot()
        return {f"{c.get('classname')}::{c.get('name')}": c for c in root.iter("testcase")}


def run_suite(
    folder: Path, cache: Path, args: list[str], name: str, env: dict[str, str] | None = None
) -> SuiteRun:
    """pytest in ``folder`` (its own rootdir, no ini file of ours) on ``cache``."""
    junit, document = cache.parent / f"{name}.xml", cache.parent / f"{name}.json"
    full_env = {
        **os.environ,
        "JAX_COMPILATION_CACHE_DIR": str(cache),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
        "JAX_LOG_COMPILES": "1",  # a hit, as a warning
        "JAX_EXPLAIN_CACHE_MISSES": "1",  # a miss, as a warning
        "JAX_PLATFORMS": "cpu",
        "COLUMNS": "100",  # pytest's separators, as the docs show them
        "CACHEDOCTOR_HOOK": "stats",
        "CACHEDOCTOR_CONFIG": str(cache.parent / "no-config.toml"),
        **(env or {}),
    }
    full_env.pop("PYTEST_ADDOPTS", None)
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:logging"]
    argv += ["-o", "junit_logging=system-err", f"--junitxml={junit}"]
    argv += ["-c", os.devnull, "--rootdir", str(folder), f"--cachedoctor-json={document}"]
    done = subprocess.run(
        [*argv, *args], cwd=folder, env=full_env, capture_output=True, text=True, timeout=600
    )
    return SuiteRun(done.returncode, done.stdout + done.stderr, junit, document)


def jax_says(case: ET.Element) -> tuple[Counter[str], Counter[str]]:
    """JAX's own log of one test case: the modules it hit, and those it missed, counted."""
    text = "".join(e.text or "" for e in case.iter("system-err"))
    return Counter(HIT_RE.findall(text)), Counter(MISS_RE.findall(text))


def plugin_says(case: ET.Element) -> dict[str, Any]:
    """The plugin's properties of one test case (each ``cachedoctor_miss`` in a list)."""
    props: dict[str, Any] = {"miss": []}
    for p in case.iter("property"):
        name = str(p.get("name")).removeprefix("cachedoctor_")
        if name == "miss":
            props["miss"].append(p.get("value"))
        else:
            props[name] = p.get("value")
    return props
