"""The real TPU caches of tests/fixtures/tpu-v5e, unpacked once per test process.

Two archives, kept as they were written (CI has no TPU): ``shared-jax0.10.2.tar.gz`` (the
project's first TPU caches: the seed program, plain and hooked, and a mix of Pallas kernels and
an MLP) and ``capture-<date>.tar.gz`` (``tools/tpu_capture.py``'s run: one program run from two
folders, a line lower and with a kernel changed, plain and hooked; and damaged copies of two
entries), with ``capture-<date>.json``: what JAX did on each run and with each damaged copy.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.support.caches import REPO

FIXTURES = REPO / "tests" / "fixtures" / "tpu-v5e"
SHARED = FIXTURES / "shared-jax0.10.2.tar.gz"
CAPTURE = FIXTURES / "capture-2026-12-07.tar.gz"
CAPTURE_RESULTS = FIXTURES / "capture-2026-12-07.json"
# the second run on the TPU, with the stable hook that strips kernels' locations: the same
# program from two folders and a line lower (moved-stable), and every command against JAX
VERIFY = FIXTURES / "verify-2026-12-07.tar.gz"
VERIFY_RESULTS = FIXTURES / "verify-2026-12-07.json"
VERIFY_COMMANDS = FIXTURES / "verify-2026-12-07-commands.json"


@functools.cache
def unpacked() -> Path:
    """Both archives unpacked, read-only by intent: ``shared/`` and ``capture/`` below. Tests
    that change a cache copy it first (``copy_of``)."""
    root = Path(tempfile.mkdtemp(prefix="cachedoctor-tpu-"))
    for name, archive in (("shared", SHARED), ("capture", CAPTURE), ("verify", VERIFY)):
        with tarfile.open(archive) as tar:
            tar.extractall(root / name, filter="data")
    return root


def cache(name: str) -> Path:
    """A cache folder: ``shared/seed``, ``shared/hook``, ``shared/mix``, ``capture/moved``,
    ``capture/moved-stable``, ``capture/damage``, ``verify/moved-stable`` (the fixed hook),
    ``verify/cmd`` (stats records of runs from folder a, from b, at another precision),
    ``verify/obs``, ``verify/obs-moved`` (re-keyed) or ``verify/unpacked``."""
    archive, folder = name.split("/")
    return unpacked() / archive / "caches" / folder


@functools.cache
def capture_results() -> dict[str, Any]:
    return dict(json.loads(CAPTURE_RESULTS.read_text()))


@functools.cache
def verify_results() -> dict[str, Any]:
    return dict(json.loads(VERIFY_RESULTS.read_text()))


def damage_variants() -> list[dict[str, Any]]:
    """Each damaged copy: ``name``, ``what`` was done, ``jax`` (hit | error | ...), ``errors``,
    and ``path``, the file."""
    out = []
    for variant in capture_results()["damage"]["variants"]:
        out.append({**variant, "path": unpacked() / "capture" / variant["file"]})
    return out


def written_keys(log: Path) -> list[str]:
    """The keys JAX's log says it wrote (JAX_EXPLAIN_CACHE_MISSES=1)."""
    marker = "to persistent compilation cache with key '"
    return [
        line.split(marker, 1)[1].split("'", 1)[0]
        for line in log.read_text().splitlines()
        if marker in line
    ]


def damaged_cache(tmp_path: Path) -> tuple[Path, dict[str, dict[str, Any]]]:
    """The capture's healthy entries and every damaged copy, each under a key of its own, and
    what JAX did with each copy (``damage_variants``)."""
    folder = tmp_path / "damaged"
    shutil.copytree(cache("capture/damage"), folder)
    by_key = {}
    for v in damage_variants():
        module = v["name"].split(".")[0]
        key = f"{module}-{hashlib.sha256(v['name'].encode()).hexdigest()}"
        shutil.copy(v["path"], folder / f"{key}-cache")
        by_key[key] = v
    hour_ago = time.time() - 3600  # not a write in progress (a young cut file may be one)
    for path in folder.iterdir():
        os.utime(path, (hour_ago, hour_ago))
    return folder, by_key


def unknown_layout_entry(tmp_path: Path) -> tuple[Path, str]:
    """A copy of a real TPU cache plus one entry whose payload, after a valid header, is in a
    layout nobody wrote (a newer libtpu, another plugin: no verdict on it)."""
    import zstandard

    folder = tmp_path / "future"
    shutil.copytree(cache("shared/seed"), folder)
    (real,) = folder.glob("jit_f-*-cache")
    raw = zstandard.ZstdDecompressor().decompressobj().decompress(real.read_bytes())
    header_end = 4 + 2 + raw[4]  # one-byte length: the seed's header is under 128 bytes
    assert raw[4] < 0x80
    future = raw[:header_end] + b"\x7fFUTURE-PLUGIN\x00" + bytes(range(256))
    key = "jit_f-" + "f" * 64
    (folder / f"{key}-cache").write_bytes(zstandard.ZstdCompressor().compress(future))
    return folder, key
