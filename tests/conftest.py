"""Shared fixtures: real caches written by real JAX in subprocesses, built once per session.

``make_cache(path, [("seed", {}), ("plain", {"CACHEDOCTOR_PLAIN_SIZE": "32"})])`` runs each
bundled program once, in order, in a fresh interpreter against ``path``.
"""

from __future__ import annotations

import compileall
import os
import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from cachedoctor.cache import model, parallel, reader
from cachedoctor.core.scan import memo as scanmemo
from cachedoctor.core.scan.report import ScanReport
from cachedoctor.stablekeys import entry_files, manifest
from cachedoctor.xla import hlo_facts
from tests.support import gold, otherjax, sessioncache
from tests.support.buckets import Servers, running_servers
from tests.support.caches import EVICT, ProgramSpec, make_cache, needs_filelock
from tests.support.gpu_vectors import f_bytes
from tests.support.sessioncache import SharedBuilds

T = TypeVar("T")


@pytest.fixture(autouse=True)
def _isolate(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No test sees the developer's cache, colours or terminal width."""
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("CACHEDOCTOR_CONFIG", str(tmp_path / "cachedoctor-config.toml"))
    # the scan index lives in the user cache dir: keep each test's index its own
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    # ...and never inside a cache (cache/travel.py): the session's shared caches must not
    # change (shared_builds), nor one test's index serve another's scan of them. The tests of
    # the index that travels (tests/cache/test_index.py, test_travel.py) turn it back on.
    monkeypatch.setenv("CACHEDOCTOR_INDEX_IN_CACHE", "0")
    # a bucket's store is kept per process, and an in-process hook makes it JAX's own fsspec
    # instance (cached by fsspec, bound to the endpoint of its day): a later test's servers
    # listen elsewhere (a module fixture set up again on this worker), so each test starts anew
    monkeypatch.setattr(manifest, "_STORES", {})
    monkeypatch.setattr(entry_files, "_SHARE_JAX_FILESYSTEM", False)


@pytest.fixture(autouse=True)
def _cold_reader_memos() -> None:
    """Each test decodes for real: the reader memoises payloads, HLO facts, compile options and
    program shapes by content for the rest of the process, so a test would otherwise see what an
    earlier test (or mutmut's first run, from which each mutant is forked) left there."""
    reader.clear_memos()
    hlo_facts._SHAPES.clear()


# --- the fast loop: `pytest -m "not slow"` starts no process ---------------------------------
#
# A JAX program in a fresh interpreter costs seconds; the CLI's console script half of one. Every
# test that starts a process (a bundled program, make_cache, hookrun, `check`, the console
# script) or uses a cache JAX wrote (``cache_factory`` and every fixture built on it) is marked
# ``slow``, and these two hooks keep it so: collection refuses an unmarked test that uses a
# JAX-built cache, and a process started while an unmarked test runs (its setup included, so a
# module fixture that runs JAX counts) fails that test.

JAX_FIXTURES = ("cache_factory", "shared_builds")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-gold",
        action="store_true",
        help="rewrite the gold files of tests/e2e/test_gold.py (tests/gold/)",
    )


@pytest.fixture(scope="session")
def update_gold(request: pytest.FixtureRequest) -> bool:
    """``--update-gold`` or CACHEDOCTOR_UPDATE_GOLD=1: gold files are written, not compared."""
    return bool(request.config.getoption("--update-gold") or os.environ.get(gold.UPDATE_ENV))


_running: list[pytest.Item] = []


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before any fixture is set up: a test using a JAX-built cache must be marked slow."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    for value in params.values():  # a compat interpreter the test setup is still installing
        failed = isinstance(value, str) and otherjax.wait(value)
        if failed:
            pytest.skip(failed)
    uses = [n for n in JAX_FIXTURES if n in getattr(item, "fixturenames", ())]
    if uses and item.get_closest_marker("slow") is None:
        pytest.fail(
            f"{item.nodeid} uses a JAX-built cache ({uses[0]}) but is not marked slow",
            pytrace=False,
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    _running.append(item)
    try:
        yield
    finally:
        _running.pop()


@pytest.hookimpl(optionalhook=True)  # a run without xdist (-p no:xdist) knows no such hook
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: two workers per core. Most tests wait on JAX processes they started (which
    load the cores themselves), on a lock of a shared build or on a bucket client's backoff; on
    2 cores the whole suite took 12 min 6 s with 2 workers and 10 min 40 s with 3 (docs/
    development.md)."""
    return max(2, 2 * (os.cpu_count() or 1))


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """``-n`` with no ``--dist`` anywhere (command line, PYTEST_ADDOPTS) schedules by work
    stealing, before xdist turns it into ``load``: with ``load`` the run ended on one worker's
    queue (busy 659 to 858 s across workers; worksteal: 783 to 800 s). Not in addopts, where
    ``--dist`` stopped every run without xdist (``-p no:xdist``: mutmut)."""
    if getattr(config.option, "numprocesses", None) and config.option.dist == "no":
        config.option.dist = "worksteal"


def pytest_configure(config: pytest.Config) -> None:
    # numpy's OpenBLAS starts a spinning thread per core in every process that imports it (each
    # JAX process, each worker): 9 % of a seed program's CPU on 2 cores, more with four workers
    # on them. JAX compiles and runs with its own threads (XLA's Eigen), which this leaves alone.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    if not hasattr(config, "workerinput"):  # the controller (or the only process): before workers
        # PYTHONDONTWRITEBYTECODE (set on this machine and CI's) would have every process the
        # suite starts compile cachedoctor from source again: a console-script `scan` 0.46 s of
        # CPU without the bytecode, 0.32 s with it. Written once here, read by all of them.
        root = Path(__file__).resolve().parents[1]
        for folder in (root / "src", root / "tests"):
            compileall.compile_dir(folder, quiet=2)  # only a speed-up: a read-only tree is fine
        # the second JAX, built in the background (tests/support/otherjax.py)
        otherjax.start(background="not slow" not in (config.option.markexpr or ""))
    real = subprocess.Popen._execute_child  # type: ignore[attr-defined]

    def guarded(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> Any:
        item = _running[-1] if _running else None
        if item is not None and item.get_closest_marker("slow") is None:
            pytest.fail(
                f"{item.nodeid} starts a process ({str(args)[:120]}) but is not marked slow: "
                "mark it @pytest.mark.slow, or keep it in this process",
                pytrace=False,
            )
        return real(self, args, *rest, **kwargs)

    subprocess.Popen._execute_child = guarded  # type: ignore[attr-defined]


PREBUILT_ENV = "CACHEDOCTOR_PREBUILT_CACHES"


@pytest.fixture(scope="session")
def shared_builds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedBuilds]:
    """Build a folder once per session across xdist workers (``tests/support/sessioncache.py``):
    ``shared_builds(name, make, *parts)`` runs ``make(folder)`` once for that name and those
    parts and returns ``(folder, what make returned)``. The folders must not change: the
    session fails at its end when a test changed one (copy it first: ``copy_of``)."""
    watch = sessioncache.Watch()
    root = sessioncache.session_root(tmp_path_factory) / "jax"

    def build(name: str, make: Callable[[Path], T], *parts: object) -> tuple[Path, T]:
        key = sessioncache.build_key(name, *parts)
        folder, value = sessioncache.build_once(root, key, make)
        watch.record(folder)
        return folder, value

    yield build
    changed = watch.changed()
    if changed:
        pytest.fail("a test changed a shared session cache: " + "; ".join(changed), pytrace=False)


@pytest.fixture(scope="session")
def cache_factory(
    tmp_path_factory: pytest.TempPathFactory, shared_builds: SharedBuilds
) -> Callable[..., Path]:
    """Build a named cache once per session (across xdist workers); tests must copy it before
    changing it. ``cache_factory(name, programs)`` runs the ``make_cache`` programs in order.

    With CACHEDOCTOR_PREBUILT_CACHES=DIR (`nox -s mutation`: hundreds of test runs), each cache
    is built once into DIR and reused by later sessions for as long as its key is the same (the
    programs, their sources, the interpreter, jax and jaxlib: ``sessioncache.build_key``);
    mutants of the reader cannot touch them, as JAX writes them.
    """
    prebuilt = os.environ.get(PREBUILT_ENV)

    def build(name: str, programs: Sequence[ProgramSpec]) -> Path:
        def make(folder: Path) -> None:
            make_cache(folder / "cache", programs)
            sessioncache.record_times(folder / "cache")

        spec = [list(p) for p in programs]
        if prebuilt:
            sources = sessioncache.program_sources(programs)
            key = sessioncache.build_key(name, spec, sources=sources)
            folder, _ = sessioncache.build_once(Path(prebuilt), key, make)
        else:
            folder, _ = shared_builds(name, make, spec)
        return folder / "cache"

    return build


SEED_3: list[ProgramSpec] = [("seed", {})] * 3


PLAIN: list[ProgramSpec] = [("plain", {})]


@pytest.fixture(scope="session")
def seed_cache(cache_factory: Callable[..., Path]) -> Path:
    """The seed program run 3 times (3 jit_f entries, identical executables) plus a plain one."""
    return cache_factory("seed3", [*SEED_3, *PLAIN])


@pytest.fixture
def copy_of(tmp_path: Path) -> Iterator[Callable[[Path], Path]]:
    """Copy a session cache so a test can change it, with the access and modification times
    JAX left (usage evidence: ``core/usage/lookups``), whatever read the shared copy since."""

    def copy(src: Path) -> Path:
        dst = tmp_path / f"copy-{src.parent.name}"
        sessioncache.copy_as_written(src, dst)
        return dst

    yield copy


@pytest.fixture(scope="session")
def evict_cache(cache_factory: Callable[..., Path]) -> Path:
    """Three plain programs written with JAX's LRU eviction on: -atime files and a .lockfile."""
    needs_filelock()
    return cache_factory(
        "evict",
        [
            ("plain", EVICT),
            ("plain", {**EVICT, "CACHEDOCTOR_PLAIN_SIZE": "32"}),
            ("plain", {**EVICT, "CACHEDOCTOR_PLAIN_SIZE": "64"}),
        ],
    )


@pytest.fixture(scope="module")
def real_hlo_with_config(seed_cache: Path) -> bytes:
    path = next(seed_cache.glob("jit_g-*-cache"))
    detail = reader.decode_entry(path, detail=True)
    assert isinstance(detail, model.EntryDetail) and detail.hlo_module and detail.hlo_config
    return f_bytes(1, detail.hlo_module) + f_bytes(2, detail.hlo_config)


@pytest.fixture
def memo_served(monkeypatch: pytest.MonkeyPatch) -> list[ScanReport]:
    """The reports the scan memo served in this test (a scan returns the memo's report as it
    is: ``any(report is r for r in memo_served)`` tells whether a scan was served)."""
    served: list[ScanReport] = []
    real = scanmemo.Memo.served

    def recording(self: scanmemo.Memo, now: float, rest: scanmemo.Rest | None) -> ScanReport | None:
        report = real(self, now, rest)
        if report is not None:
            served.append(report)
        return report

    monkeypatch.setattr(scanmemo.Memo, "served", recording)
    return served


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the entries decoded (serially, in this process) by each scan, a file served
    from the decode of an equal file (``reader.copy_of_file``) included."""
    seen: list[str] = []
    real = reader.decode_entry
    real_copy = reader.copy_of_file

    def counting(path, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(os.path.basename(path))
        return real(path, **kwargs)

    def counting_copy(digest, path, *args):  # type: ignore[no-untyped-def]
        found = real_copy(digest, path, *args)
        if found is not None:
            seen.append(os.path.basename(path))
        return found

    monkeypatch.setattr(reader, "decode_entry", counting)
    monkeypatch.setattr(reader, "copy_of_file", counting_copy)
    monkeypatch.setenv(parallel.WORKERS_ENV, "1")
    return seen


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    """moto's S3 server and the GCS emulator on 127.0.0.1, this process's environment aimed at
    them (``servers.env`` for JAX's processes); skipped, saying why, without ``test-remote``."""
    with running_servers() as found:
        yield found
