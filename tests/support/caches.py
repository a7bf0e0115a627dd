"""Real caches written by real JAX in subprocesses, and what tests read off them.

``make_cache(path, [("seed", {}), ("plain", {"CACHEDOCTOR_PLAIN_SIZE": "32"})])`` runs each
bundled program once, in order, in a fresh interpreter against ``path``; a name ending in
``.py`` is one of the tests' own programs, beside this module.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import stat
import sys
import time
import zlib
from collections.abc import Sequence
from pathlib import Path

import pytest
import zstandard

from cachedoctor.cache import listdir, reader
from cachedoctor.cache.model import EntryDetail, EntryInfo
from cachedoctor.core.check.runner import Run, program_env, run_command, run_program
from cachedoctor.core.findings import FindingKind
from cachedoctor.core.scan.report import ScanReport
from cachedoctor.core.scan.run import scan_directory
from cachedoctor.layout import MANIFEST_DIRNAME, STATS_DIRNAME
from cachedoctor.storage.location import Location
from tests.support import otherjax

ProgramSpec = tuple[str, dict[str, str]]


SUPPORT_DIR = Path(__file__).resolve().parent  # the tests' own programs and fixtures
REPO = SUPPORT_DIR.parents[1]  # the checkout: action.yml, benchmarks/, tools/, docs/


OTHER_JAX_ENV = otherjax.OTHER_JAX_ENV


CROSSVER_SKIP = (
    f"no second JAX: {otherjax.OFF_ENV}=0 turned off its install by the test setup"
    f" (tests/support/otherjax.py), or it failed: its log is {otherjax.venv_dir()}.log"
)


def make_cache(path: Path, programs: Sequence[ProgramSpec], python: str | None = None) -> list[Run]:
    path.mkdir(parents=True, exist_ok=True)
    runs = []
    for name, env in programs:
        if name.endswith(".py"):  # a program of the tests' own (tests/support/NAME)
            argv = [python or sys.executable, str(SUPPORT_DIR / name)]
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
        assert isinstance(detail, EntryDetail)
        if detail.hlo_module is not None:
            out.append(detail.hlo_module)
    return out


def other_jax_python() -> str:
    """The interpreter of a second, older JAX (``tests/support/otherjax.py`` installs it);
    skips when that was turned off or failed, saying which."""
    python = os.environ.get(OTHER_JAX_ENV)
    if not python:
        pytest.skip(CROSSVER_SKIP)
    failed = otherjax.wait(python)
    if failed:
        pytest.skip(failed)
    if not os.path.exists(python):
        pytest.fail(f"{OTHER_JAX_ENV}={python} does not exist")
    return os.path.abspath(python)  # tests run it from their own folders


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


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    env["NO_COLOR"] = "1"
    env["COLUMNS"] = "200"
    return env


EVICT = {"JAX_COMPILATION_CACHE_MAX_SIZE": str(10**9)}


def needs_filelock() -> None:
    """JAX refuses to turn eviction on without the filelock package (jax/_src/lru_cache.py)."""
    if importlib.util.find_spec("filelock") is None:
        pytest.skip("JAX's LRU eviction needs filelock, a dependency of cachedoctor: reinstall it")


def snapshot(root: Path) -> dict[str, tuple[object, ...]]:
    """Every path under ``root``: type, size, sha256, mode, mtime (links: their target)."""
    out: dict[str, tuple[object, ...]] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath) / name
            st = p.lstat()
            rel = str(p.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", st.st_mode, st.st_mtime_ns)
            else:
                digest = hashlib.sha256(read_noatime(p)).hexdigest()
                out[rel] = ("file", st.st_size, digest, st.st_mode, st.st_mtime_ns)
    return out


def read_noatime(path: Path) -> bytes:
    """A file's bytes, leaving its access time (usage evidence) as it was where allowed."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOATIME", 0))
    except PermissionError:
        fd = os.open(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def entry_keys(root: Path) -> set[str]:
    return {i.key for i in listdir.list_cache(root).entries if i.key}


def write_manifest(root: Path, key: str, jaxlib: str = "0.10.2", mode: str = "stable") -> Path:
    """A manifest in the format of cachedoctor.stablekeys.manifest (branch hook), schema 1."""
    folder = root / MANIFEST_DIRNAME
    folder.mkdir(exist_ok=True)
    module = key.rsplit("-", 1)[0]
    data = {
        "key": key,
        "stable_key": key,
        "jax_key": None,
        "mode": mode,
        "module_name": module,
        "hasher_version": 1,
        "components": [{"name": "computation", "digest": "00" * 32, "data": None}],
        "volatile": [],
        "sound": True,
        "xla_flags": [],
        "cache_dir": str(root),
        "versions": {"jax": jaxlib, "jaxlib": jaxlib},
        "platform": {"platform": "cpu"},
        "created": time.time(),
        "host": "test",
        "pid": 1,
        "migrated_from": None,
        "has_ir": False,
        "schema_version": 1,
        "extra": {},
    }
    path = folder / f"{key}.json"
    path.write_text(json.dumps(data))
    return path


def assert_usable(root: Path) -> None:
    """No corrupt entry, and every entry has its -atime when eviction is in use."""
    report = scan_directory(Location.parse(root))
    kinds = {f.kind for f in report.findings}
    assert FindingKind.CORRUPT not in kinds, report.findings
    assert FindingKind.MISSING_ATIME not in kinds, report.findings


# The console script installed beside this interpreter (the venv need not be activated).
_BESIDE = Path(sys.executable).parent / "cachedoctor"


SCRIPT = str(_BESIDE) if _BESIDE.exists() else shutil.which("cachedoctor")


def entries_of(report: ScanReport) -> tuple[EntryInfo, ...]:
    """A scan's entries (every scan the tests make asks for them: ``entries=True``)."""
    return report.loaded_entries()[0]


def record_files(cache: Path) -> list[Path]:
    """The stats records the hook wrote in ``cache``, by name."""
    return sorted((cache / STATS_DIRNAME).glob("*.json"))
