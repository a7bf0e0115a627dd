"""Shared fixtures: real caches written by real JAX in subprocesses, built once per session.

``make_cache(path, [("seed", {}), ("plain", {"CACHEDOCTOR_PLAIN_SIZE": "32"})])`` runs each
bundled program once, in order, in a fresh interpreter against ``path``.
"""

from __future__ import annotations

import os
import shutil
import sys
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
import zstandard

from cachedoctor.cache import listdir, reader
from cachedoctor.core.check.runner import Run, program_env, run_command, run_program
from cachedoctor.xla import hlo_facts

ProgramSpec = tuple[str, dict[str, str]]
TESTS_DIR = Path(__file__).parent

OTHER_JAX_ENV = "CACHEDOCTOR_OTHER_JAX_PYTHON"
CROSSVER_SKIP = (
    f"no second JAX interpreter: `nox -s crossver` builds a jax 0.8.3 venv and sets {OTHER_JAX_ENV}"
)


def make_cache(path: Path, programs: Sequence[ProgramSpec], python: str | None = None) -> list[Run]:
    path.mkdir(parents=True, exist_ok=True)
    runs = []
    for name, env in programs:
        if name.endswith(".py"):  # a program of the tests' own (tests/NAME), not a bundled one
            argv = [python or sys.executable, str(TESTS_DIR / name)]
            run = run_command(argv, program_env(str(path), env))
        else:
            run = run_program(name, str(path), env, python=python)
        assert run.returncode == 0, f"{name} failed:\n{run.stderr[-2000:]}"
        runs.append(run)
    return runs


def hlo_modules(cache: Path) -> list[bytes]:
    """The HLO module of every entry of a cache that has one, as the reader extracts it."""
    out = []
    for item in listdir.list_cache(cache).entries:
        detail = reader.decode_entry(cache / item.name, detail=True)
        assert isinstance(detail, reader.EntryDetail)
        if detail.hlo_module is not None:
            out.append(detail.hlo_module)
    return out


def other_jax_python() -> str:
    """The interpreter of a second, older JAX (set by `nox -s crossver`); skips when unset."""
    python = os.environ.get(OTHER_JAX_ENV)
    if not python:
        pytest.skip(CROSSVER_SKIP)
    if not os.path.exists(python):
        pytest.fail(f"{OTHER_JAX_ENV}={python} does not exist")
    return python


def raw_payload_layout(entry: Path) -> str:
    """The payload layout read straight from the bytes with zstandard/zlib, not the reader.

    After the 4-byte compile time, JAX <= 0.9.0 writes the bare PjRt proto (first byte 0x0a);
    later JAX writes a varint length, then the header whose field 1 is the IFRT version.
    """
    blob = entry.read_bytes()
    if blob.startswith(b"\x28\xb5\x2f\xfd"):
        data = zstandard.ZstdDecompressor().decompressobj().decompress(blob)
    else:
        data = zlib.decompress(blob)
    payload = data[4:]
    if payload[0] == 0x0A:
        return "pjrt"
    length_bytes = 1 if payload[0] < 0x80 else 2
    header = payload[length_bytes:]
    assert header[0] == 0x08, f"unexpected header start {header[:4].hex()}"
    return f"ifrt-v{header[1]}"


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


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    env["NO_COLOR"] = "1"
    env["COLUMNS"] = "200"
    return env
