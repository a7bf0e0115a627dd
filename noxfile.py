"""Developer sessions: tests, lint, typecheck, docs, compat (five JAX releases), bench.

`nox -s compat` needs Python 3.11 and 3.12; with pyenv, every installed version is made visible
to nox so that `python3.12` resolves.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import nox

nox.options.sessions = ["tests", "lint", "typecheck", "docs"]
nox.options.reuse_existing_virtualenvs = True

# (jax version, python) pairs the compat session covers; jaxlib is pinned to the same version.
JAX_RELEASES = [
    ("0.4.38", "3.11"),
    ("0.6.2", "3.11"),
    ("0.8.3", "3.11"),
    ("0.10.2", "3.11"),
    ("0.12.0.1", "3.12"),
]
# The reader-facing and hook tests, run against each JAX release.
COMPAT_TESTS = [
    "tests/test_reader.py",
    "tests/test_scan.py",
    "tests/test_compat.py",
    # the runtime hook patches JAX internals that differ between releases
    "tests/test_keys.py",
    "tests/test_hook.py",
    "tests/test_hook_internals.py",
    "tests/test_hook_manifest.py",
    "tests/test_hook_stale.py",
    "tests/test_hook_distributed.py",
]


def _expose_pyenv_versions() -> None:
    if "PYENV_VERSION" in os.environ or not shutil.which("pyenv"):
        return
    try:
        out = subprocess.run(
            ["pyenv", "versions", "--bare"], capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return
    versions = [v.strip() for v in out.splitlines() if v.strip() and "/" not in v]
    if versions:
        os.environ["PYENV_VERSION"] = ":".join(sorted(versions, reverse=True))


_expose_pyenv_versions()


@nox.session(python="3.11")
def tests(session: nox.Session) -> None:
    """The whole test suite with the newest JAX for this Python."""
    session.install("-e", ".[test]")
    session.run("pytest", "-n", "auto", *session.posargs)


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.6")
    session.run("ruff", "check", "src", "tests", "benchmarks", "noxfile.py")
    session.run("ruff", "format", "--check", "src", "tests", "benchmarks", "noxfile.py")


@nox.session(python="3.11")
def typecheck(session: nox.Session) -> None:
    session.install("-e", ".", "mypy>=1.10")
    session.run("mypy")


@nox.session(python="3.11")
def docs(session: nox.Session) -> None:
    """Check that docs/ and the README name every command and that each --help renders."""
    session.install("-e", ".")
    session.run("python", "tools/check_docs.py")


@nox.session
@nox.parametrize(("jax", "python"), JAX_RELEASES, ids=[j for j, _ in JAX_RELEASES])
def compat(session: nox.Session, jax: str) -> None:
    """Reader tests against caches written by one JAX release, in its own venv."""
    session.install(".[test]", f"jax=={jax}", f"jaxlib=={jax}")
    session.run(
        "pytest", "-q", "-n", "auto", "-p", "no:cacheprovider", *COMPAT_TESTS, *session.posargs
    )


@nox.session(python="3.11")
def bench(session: nox.Session) -> None:
    """Benchmarks (not part of the test suite): see docs/performance.md."""
    session.install("-e", ".", "filelock")  # filelock: JAX's own LRU eviction pass, the baseline
    session.run("python", "benchmarks/run.py", *session.posargs)
