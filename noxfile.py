"""Developer sessions: tests, lint, typecheck, docs, compat (five JAX releases), crossver,
mutation (mutmut 3), bench.

`nox -s compat` needs Python 3.11 and 3.12; with pyenv, every installed version is made visible
to nox so that `python3.12` resolves.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path

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
    "tests/cache/test_reader.py",
    "tests/core/scan/test_scan.py",
    "tests/cache/test_compat.py",
    # the protobuf view against the pure walker, on each release's HLO
    "tests/xla/test_hlo_facts.py",
    "tests/cache/test_whole_decode.py",
    # every field the reader reports, against protobuf/zstandard
    "tests/cache/test_reader_bytes.py",
    "tests/core/scan/test_scanmemo.py",  # a served report is the scan, on each release's caches
    # the runtime hook patches JAX internals that differ between releases
    "tests/stablekeys/test_keys.py",
    "tests/stablekeys/test_hook.py",
    "tests/stablekeys/test_hook_internals.py",
    "tests/stablekeys/test_hook_manifest.py",
    "tests/stablekeys/test_hook_stale.py",
    "tests/stablekeys/test_hook_distributed.py",
]
# The second JAX of the cross-version tests: a cache written by it next to one written by the
# newest JAX gives the "different JAX versions" diff verdict and the mixed-versions finding.
CROSSVER_JAX = "0.8.3"
CROSSVER_TESTS = [
    "tests/core/diff/test_diff.py",
    "tests/core/prune/test_prune.py",
    "tests/core/scan/test_scan.py",
    "tests/stablekeys/test_hook_compat.py",
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
    """ruff, and the layer contract (import-linter, pyproject.toml; docs/architecture.md)."""
    session.install("ruff>=0.6", "import-linter>=2", "-e", ".")
    session.run("ruff", "check", "src", "tests", "benchmarks", "tools", "noxfile.py")
    session.run("ruff", "format", "--check", "src", "tests", "benchmarks", "tools", "noxfile.py")
    session.run("lint-imports")


@nox.session(python="3.11")
def typecheck(session: nox.Session) -> None:
    """mypy, strict, over src/ and tests/ (pyproject.toml); the tests' own dependencies give
    their types."""
    session.install("-e", ".[test,test-remote]", "mypy>=1.10")
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
    session.install(".[test-core]", f"jax=={jax}", f"jaxlib=={jax}")
    session.run(
        "pytest", "-q", "-n", "auto", "-p", "no:cacheprovider", *COMPAT_TESTS, *session.posargs
    )


@nox.session(python="3.11")
def crossver(session: nox.Session) -> None:
    """The cross-version tests: the newest JAX here, jax CROSSVER_JAX in a second venv.

    The tests find the second interpreter through CACHEDOCTOR_OTHER_JAX_PYTHON and
    CACHEDOCTOR_COMPAT_PYTHONS; without them they skip, naming this session.
    """
    session.install("-e", ".[test]")
    other = Path(session.cache_dir) / f"jax-{CROSSVER_JAX}"
    python = other / "bin" / "python"
    if not python.exists():
        session.run("python", "-m", "venv", str(other))
    session.run(
        str(python), "-m", "pip", "install", "-q", ".",
        f"jax=={CROSSVER_JAX}", f"jaxlib=={CROSSVER_JAX}", external=True,
    )  # fmt: skip
    env = {"CACHEDOCTOR_OTHER_JAX_PYTHON": str(python), "CACHEDOCTOR_COMPAT_PYTHONS": str(python)}
    session.run("pytest", "-q", "-n", "auto", *CROSSVER_TESTS, *session.posargs, env=env)


def _mutation_targets() -> list[str]:
    """The modules mutmut may mutate: ``only_mutate`` of ``[tool.mutmut]`` in pyproject.toml."""
    with open("pyproject.toml", "rb") as f:
        return list(tomllib.load(f)["tool"]["mutmut"]["only_mutate"])


@nox.session(python="3.11")
def mutation(session: nox.Session) -> None:
    """mutmut on the byte-level core and the stable hasher (docs/development.md has the scores).

    Positional arguments pick modules (paths as in ``only_mutate``); the runner tests are
    ``pytest_add_cli_args_test_selection``. mutmut 3 works on a copy in ``mutants/`` and leaves
    the sources alone. The JAX-written test caches are built once into the nox cache folder
    (CACHEDOCTOR_PREBUILT_CACHES), not once per mutant.
    """
    targets = _mutation_targets()
    modules = session.posargs or targets
    unknown = [m for m in modules if m not in targets]
    if unknown:
        session.error(f"not a mutation target: {', '.join(unknown)} (choose from {targets})")
    session.install("-e", ".[test]", "mutmut==3.8.1")
    env = {"CACHEDOCTOR_PREBUILT_CACHES": str(Path(session.cache_dir) / "mutation-caches")}
    # mutant names are module.function: one glob per module
    patterns = [m[len("src/") : -len(".py")].replace("/", ".") + ".*" for m in modules]
    # two workers: each mutant runs its covering tests, and a few of those start JAX processes
    session.run("mutmut", "run", "--max-children", "2", *patterns, env=env)
    session.run("mutmut", "results")


@nox.session(python="3.11")
def bench(session: nox.Session) -> None:
    """Benchmarks (not part of the test suite): see docs/performance.md."""
    session.install("-e", ".", "filelock")  # filelock: JAX's own LRU eviction pass, the baseline
    session.run("python", "benchmarks/run.py", *session.posargs)
