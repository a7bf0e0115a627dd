"""Shared fixtures: real caches written by real JAX in subprocesses, built once per session.

``make_cache(path, [("seed", {}), ("plain", {"CACHEDOCTOR_PLAIN_SIZE": "32"})])`` runs each
bundled program once, in order, in a fresh interpreter against ``path``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from cachedoctor.cache import model, parallel, reader
from cachedoctor.xla import hlo_facts
from tests.support.caches import (
    EVICT,
    ProgramSpec,
    make_cache,
    needs_filelock,
)
from tests.support.gpu_vectors import (
    f_bytes,
)


@pytest.fixture(autouse=True)
def _isolate(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No test sees the developer's cache, colours or terminal width."""
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("CACHEDOCTOR_CONFIG", str(tmp_path / "cachedoctor-config.toml"))
    # the scan index lives in the user cache dir: keep each test's index its own
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


@pytest.fixture(autouse=True)
def _cold_reader_memos() -> None:
    """Each test decodes for real: the reader memoises payloads, HLO facts, compile options and
    program shapes by content for the rest of the process, so a test would otherwise see what an
    earlier test (or mutmut's first run, from which each mutant is forked) left there."""
    reader._PAYLOAD_MEMO.clear()
    reader._HLO_MEMO.clear()
    reader._OPTIONS_MEMO.clear()
    hlo_facts._SHAPES.clear()


PREBUILT_ENV = "CACHEDOCTOR_PREBUILT_CACHES"


@pytest.fixture(scope="session")
def cache_factory(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Build a named cache once per session; tests must copy it before changing it.

    With CACHEDOCTOR_PREBUILT_CACHES=DIR (`nox -s mutation`: hundreds of test runs), each cache
    is built once into DIR and reused by later sessions; mutants of the reader cannot touch
    them, as JAX writes them.
    """
    built: dict[str, Path] = {}
    prebuilt = os.environ.get(PREBUILT_ENV)

    def build(name: str, programs: Sequence[ProgramSpec]) -> Path:
        if name in built:
            return built[name]
        if prebuilt:
            path = Path(prebuilt) / name / "cache"
            done = path.parent / "complete"
            if not done.exists():
                shutil.rmtree(path, ignore_errors=True)
                make_cache(path, programs)
                done.touch()
        else:
            path = tmp_path_factory.mktemp(name) / "cache"
            make_cache(path, programs)
        built[name] = path
        return path

    return build


SEED_3 = [("seed", {})] * 3


PLAIN = [("plain", {})]


@pytest.fixture(scope="session")
def seed_cache(cache_factory: Callable[..., Path]) -> Path:
    """The seed program run 3 times (3 jit_f entries, identical executables) plus a plain one."""
    return cache_factory("seed3", [*SEED_3, *PLAIN])


@pytest.fixture
def copy_of(tmp_path: Path) -> Iterator[Callable[[Path], Path]]:
    """Copy a session cache so a test can change it."""

    def copy(src: Path) -> Path:
        dst = tmp_path / f"copy-{src.parent.name}"
        shutil.copytree(src, dst, symlinks=True)
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
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the entries decoded (serially, in this process) by each scan."""
    seen: list[str] = []
    real = reader.decode_entry

    def counting(path, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(os.path.basename(path))
        return real(path, **kwargs)

    monkeypatch.setattr(reader, "decode_entry", counting)
    monkeypatch.setenv(parallel.WORKERS_ENV, "1")
    return seen
