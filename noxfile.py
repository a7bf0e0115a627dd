"""Developer sessions: tests, lint, typecheck, docs, compat (five JAX releases), crossver,
jaxtests (JAX's own tests with the hook), wheel (the release as built), mutation (mutmut 3),
bench.

`nox -s compat` needs Python 3.11 and 3.12; with pyenv, every installed version is made visible
to nox so that `python3.12` resolves.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import nox

sys.path.insert(0, str(Path(__file__).resolve().parent / "tools"))
import compat_cover  # tools/: the standard library only, as nox's own venv has

nox.options.sessions = ["tests", "lint", "typecheck", "docs"]
nox.options.reuse_existing_virtualenvs = True
# uv builds a session's venv when it is installed (.ci/run installs it beside nox; the test
# extra has it): a compat venv cold in 22 s against pip's 88 s (docs/development.md). It writes
# bytecode only when asked, and nothing writes it later where PYTHONDONTWRITEBYTECODE is set.
nox.options.default_venv_backend = "uv|virtualenv"
os.environ.setdefault("UV_COMPILE_BYTECODE", "1")

# (jax version, python) pairs the compat session covers; jaxlib is pinned to the same version.
JAX_RELEASES = [
    ("0.4.38", "3.11"),
    ("0.6.2", "3.11"),
    ("0.8.3", "3.11"),
    ("0.10.2", "3.11"),
    ("0.12.0.1", "3.12"),
]
# The reader-facing tests and the hook's in-process tests against JAX's internals: every release.
COMPAT_TESTS = [
    "tests/cache/test_reader.py",
    "tests/core/scan/test_scan.py",
    "tests/cache/test_compat.py",
    "tests/xla/test_hlo_facts.py",  # protobuf view against the pure walker, each release's HLO
    "tests/cache/test_whole_decode.py",
    "tests/cache/test_reader_bytes.py",  # every field read, against protobuf and zstandard
    "tests/cache/test_reader_tpu.py",  # real TPU entries: each release's jaxlib reads their kernels
    "tests/core/scan/test_scanmemo.py",  # a served report is the scan, on each release's caches
    "tests/xla/test_schema_memo.py",  # the shipped option table, against each release's library
    # the runtime hook patches JAX internals that differ between releases
    "tests/stablekeys/test_keys.py",
    "tests/stablekeys/test_keys_mosaic.py",  # Pallas kernels' debug locations, against JAX's own
    "tests/stablekeys/test_hook_internals.py",
    "tests/stablekeys/test_hook_manifest.py",
]
# The hook in JAX processes: all of it on the oldest and the newest release; on those between,
# the pairwise cover of release x scheme x mode (tools/compat_cover.py, docs/development.md).
COMPAT_HOOK_SUITES = [
    "tests/stablekeys/test_hook.py",
    "tests/stablekeys/test_hook_stale.py",
    "tests/stablekeys/test_hook_distributed.py",
    "tests/stablekeys/test_hook_bucket.py",  # gs:// and s3:// cache dirs (local servers)
    # read-only wraps JAX's cache object, whose writes differ (0.4.38: -atime on every hit)
    "tests/stablekeys/test_readonly.py",
]
# The second JAX of the cross-version tests: a cache written by it next to one written by the
# newest JAX gives the "different JAX versions" diff verdict and the mixed-versions finding.
CROSSVER_JAX = "0.8.3"  # tests/support/otherjax.py: OTHER_JAX, which the test setup installs
CROSSVER_TESTS = [
    "tests/core/diff/test_diff.py",
    "tests/core/prune/test_prune.py",
    "tests/core/prune/test_prune_evidence.py",  # --stale-jax in a cache two versions share
    "tests/core/scan/test_scan.py",
    "tests/stablekeys/test_hook_compat.py",
    "tests/core/check/test_check_truth.py",  # check's NOT STORED against that JAX's own log
    "tests/e2e/test_prune_matrix.py",
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
    """The whole test suite with the newest JAX for this Python (the bucket tests included:
    their local S3 and GCS servers come with test-remote, as in the README's command)."""
    session.install("-e", ".[test,test-remote]")
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
    """Reader and hook tests against caches written by one JAX release, in its own venv (with
    the local S3 and GCS servers: the hook on bucket cache dirs). The oldest and the newest
    release run every hook suite, those between a pairwise cover of them (_compat_hook_tests)."""
    # Bytecode is written on import here, not compiled at install: uv compiles all 10,600
    # modules of the venv (37 s of CPU, 20 of the install's 24 s) where the tests import a
    # fraction of them; with PYTHONDONTWRITEBYTECODE set (this machine, CI) nothing would be
    # written and every process would compile jax again (docs/development.md).
    session.install(
        ".[test-core,test-remote]",
        f"jax=={jax}",
        f"jaxlib=={jax}",
        env={"UV_COMPILE_BYTECODE": "0"},
    )
    # the cross-version tests set the newest JAX against jax 0.8.3: under an older release there
    # is no "newer" side, so they skip here as they always did (tests/support/otherjax.py)
    quiet = ["-q", "-n", "auto", "-p", "no:cacheprovider"]
    env: dict[str, str | None] = {"CACHEDOCTOR_OTHER_JAX": "0", "PYTHONDONTWRITEBYTECODE": None}
    session.run(
        "pytest", *quiet, *COMPAT_TESTS, *_compat_hook_tests(jax), *session.posargs, env=env
    )


def _compat_hook_tests(jax: str) -> list[str]:
    """Every hook suite on the oldest and the newest release; the pairwise cover's probes on
    each release between them."""
    releases = [j for j, _ in JAX_RELEASES]
    if jax in (releases[0], releases[-1]):
        return COMPAT_HOOK_SUITES
    return compat_cover.cover(releases[1:-1])[jax]


@nox.session(python="3.11")
def crossver(session: nox.Session) -> None:
    """The cross-version tests alone: the newest JAX here, jax CROSSVER_JAX beside it.

    The test setup installs that second JAX itself (tests/support/otherjax.py, kept in
    .test-venvs/), so the README's test command runs these tests too; this session is the
    short loop for them.
    """
    session.install("-e", ".[test]")
    session.run("pytest", "-q", "-n", "auto", *CROSSVER_TESTS, *session.posargs)


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
    prebuilt = Path(session.cache_dir).resolve() / "mutation-caches"
    env = {"CACHEDOCTOR_PREBUILT_CACHES": str(prebuilt)}
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


# JAX's own tests of the persistent cache, its keys, custom_partitioning and pjit, at a pinned
# release, plain and with the hook in each mode: the hook must change no test's outcome (issue
# 28, item 2). JAX's sdist holds no tests, so they come from the release tag: a local clone or
# mirror (--jax-git DIR, or $CACHEDOCTOR_JAX_GIT), else a shallow clone from GitHub.
JAX_OWN_RELEASE = "0.10.2"
JAX_OWN_REPO = "https://github.com/jax-ml/jax"
JAX_OWN_TAG = "jax-v0.10.2"
JAX_OWN_COMMIT = "990e6a0b84138346e6a38785412f36356e0e5dc3"
JAX_OWN_TESTS = [
    "tests/compilation_cache_test.py",
    "tests/cache_key_test.py",
    "tests/custom_partitioning_test.py",
    "tests/custom_partitioning_sharding_rule_test.py",
    "tests/shard_map_test.py::CustomPartitionerTest::test_custom_partitioning",
]
JAX_OWN_PJIT = ["tests/pjit_test.py"]  # ~800 tests: `--quick` leaves them out
JAX_OWN_MODES = ["plain", "stable", "observe", "stats"]  # plain first: the others match it


def _jax_own_tests(session: nox.Session, git_dir: str | None) -> Path:
    """JAX's test files at JAX_OWN_COMMIT (verified), extracted once into the nox cache.

    Only ``tests/``, ``conftest.py`` and ``pyproject.toml`` (its filterwarnings = error):
    never JAX's ``jax/`` package, which pytest would import instead of the installed one.
    """
    src = Path(session.cache_dir) / f"jax-tests-{JAX_OWN_COMMIT[:12]}"
    if (src / "tests" / "compilation_cache_test.py").exists():
        return src
    if git_dir is None:
        probe = ["git", "ls-remote", "--exit-code", JAX_OWN_REPO, f"refs/tags/{JAX_OWN_TAG}"]
        try:
            reachable = subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
        except subprocess.TimeoutExpired:
            reachable = False
        if not reachable:  # no package index carries JAX's tests: they come from git alone
            session.skip(
                f"JAX's own tests are not on any package index; {JAX_OWN_REPO} is unreachable "
                "from here and CACHEDOCTOR_JAX_GIT (a clone of it) is unset"
            )
        clone = Path(session.create_tmp()) / "jax-clone"
        shutil.rmtree(clone, ignore_errors=True)
        session.run(
            "git", "clone", "--quiet", "--depth", "1", "--branch", JAX_OWN_TAG,
            "--filter=blob:none", "--no-checkout", JAX_OWN_REPO, str(clone),
            external=True,
        )  # fmt: skip
        git_dir = str(clone)
    git = ["git", "-C", git_dir]
    found = subprocess.run(
        [*git, "rev-parse", f"{JAX_OWN_TAG}^{{commit}}"], capture_output=True, text=True
    ).stdout.strip()
    if found != JAX_OWN_COMMIT:
        session.error(f"{git_dir}: {JAX_OWN_TAG} is {found or 'missing'}, not {JAX_OWN_COMMIT}")
    archive = subprocess.run(
        [*git, "archive", JAX_OWN_COMMIT, "conftest.py", "pyproject.toml", "tests"],
        capture_output=True,
        check=True,
    ).stdout
    partial = src.with_name(src.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(partial)], input=archive, check=True)
    partial.rename(src)
    return src


@nox.session(python="3.11")
def jaxtests(session: nox.Session) -> None:
    """JAX's own cache, key, custom_partitioning and pjit tests, plain and with the hook.

    nox -s jaxtests [-- [--quick] [--jax-git DIR] [--cache 0|1]]

    Each suite runs on 8 CPU devices with the hook off (CACHEDOCTOR_DISABLE=1), then in stable,
    observe and stats mode, without and with JAX's own persistent-cache test mode
    (JAX_TEST_WITH_PERSISTENT_COMPILATION_CACHE=1: a fresh cache per test, every compile
    written); tools/compare_junit.py fails the session when any test's outcome differs from
    the plain run's. --quick leaves pjit_test.py out; --cache picks one cache mode.
    """
    args = list(session.posargs)
    quick = "--quick" in args
    git_dir = args[args.index("--jax-git") + 1] if "--jax-git" in args else None
    git_dir = git_dir or os.environ.get("CACHEDOCTOR_JAX_GIT") or None
    cache_modes = [args[args.index("--cache") + 1]] if "--cache" in args else ["0", "1"]
    src = _jax_own_tests(session, git_dir)  # first: it may skip, and installs nothing
    session.install(
        ".",
        f"jax=={JAX_OWN_RELEASE}",
        f"jaxlib=={JAX_OWN_RELEASE}",
        "absl-py",
        "pytest>=8,<9",  # JAX's build/test-requirements.txt
        "pytest-xdist",
    )
    results = Path(session.create_tmp()).resolve() / "jax-own"
    results.mkdir(exist_ok=True)
    tests = JAX_OWN_TESTS + ([] if quick else JAX_OWN_PJIT)
    compare = str(Path("tools/compare_junit.py").resolve())
    differ = []
    for cache in cache_modes:
        xmls = []
        for mode in JAX_OWN_MODES:
            env = {
                "JAX_PLATFORMS": "cpu",
                "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
                "JAX_TEST_WITH_PERSISTENT_COMPILATION_CACHE": cache,
                "CACHEDOCTOR_CONFIG": str(results / "absent.toml"),
                "CACHEDOCTOR_DISABLE": "1" if mode == "plain" else "0",
                "CACHEDOCTOR_HOOK": "" if mode == "plain" else mode,
            }
            xml = results / f"cache{cache}-{mode}.xml"
            xmls.append(str(xml))
            with session.chdir(src):  # JAX's pyproject.toml: filterwarnings = error
                session.run(
                    "pytest", "-q", "-p", "no:cacheprovider", "-n", "auto",
                    f"--junitxml={xml}", *tests, env=env, success_codes=[0, 1],
                )  # fmt: skip
        try:
            session.run("python", compare, *xmls)
        except nox.command.CommandFailed:
            differ.append(f"JAX_TEST_WITH_PERSISTENT_COMPILATION_CACHE={cache}")
    if differ:
        session.error("the hook changed outcomes of JAX's own tests with " + ", ".join(differ))


@nox.session(python="3.11")
def wheel(session: nox.Session) -> None:
    """The release as a user gets it: build the sdist and wheel, check them, install the wheel
    with pipx in a fresh environment (no extras) and run the demo from it.

    Then, in that environment, ``enable --max-size`` and one JAX program: JAX must write its
    LRU's -atime files beside the entries (eviction needs filelock, which the wheel brings).
    """
    session.install("build", "twine", "pipx")
    tmp = Path(session.create_tmp()).resolve()
    dist = tmp / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    session.run("python", "-m", "build", "--outdir", str(dist))
    (sdist,) = dist.glob("*.tar.gz")
    (built,) = dist.glob("*.whl")
    session.run("twine", "check", "--strict", str(sdist), str(built))
    session.run("python", "tools/check_dist.py", str(sdist), str(built))

    home = tmp / "pipx"
    shutil.rmtree(home, ignore_errors=True)
    env = {
        "PIPX_HOME": str(home),
        "PIPX_BIN_DIR": str(home / "bin"),
        "PIPX_MAN_DIR": str(home / "man"),
        "CACHEDOCTOR_CONFIG": str(tmp / "config.toml"),  # not the pipx environment's own file
        "JAX_PLATFORMS": "cpu",
    }
    session.run("pipx", "install", str(built), env=env)
    cachedoctor = str(home / "bin" / "cachedoctor")
    version = session.run(cachedoctor, "--version", external=True, env=env, silent=True)
    if not version or "(jax 0." not in str(version) or "not installed" in str(version):
        session.error(f"--version does not name the installed jax: {version!r}")
    session.run(cachedoctor, "demo", external=True, env=env)

    cache = tmp / "lru-cache"
    shutil.rmtree(cache, ignore_errors=True)
    session.run(
        cachedoctor, "enable", "--dir", str(cache), "--max-size", "10GB",
        "--min-compile-time", "0", external=True, env=env,
    )  # fmt: skip
    python = home / "venvs" / "cachedoctor" / "bin" / "python"
    session.run(str(python), "-m", "cachedoctor.programs.plain", external=True, env=env)
    entries, atimes = list(cache.glob("*-cache")), list(cache.glob("*-atime"))
    if not entries or len(atimes) != len(entries):
        session.error(f"{len(entries)} entries and {len(atimes)} -atime files in {cache}")
    session.run(cachedoctor, "status", external=True, env=env)
    session.run(cachedoctor, "disable", external=True, env=env)
