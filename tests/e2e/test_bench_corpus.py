"""The benchmark generator lays out what docs/performance.md says, from entries real JAX wrote.

A distinct corpus must hold each program once under its own key, copies that JAX would still
hit here (the cache path inside them rewritten), exactly the planned share of relocated and
corrupt entries, and a tenth of its copies drawn from the large programs. ``scan`` is the judge.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.support.caches import REPO

BENCH = REPO / "benchmarks"
sys.path.insert(0, str(BENCH))
import generate  # noqa: E402

pytestmark = pytest.mark.slow  # every test here runs JAX or the CLI in a subprocess


def _compile(cache: Path, spec: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(cache), "JAX_PLATFORMS": "cpu"}
    cache.mkdir()
    return subprocess.Popen([sys.executable, str(BENCH / "_compile_programs.py"), spec], env=env)


def _scan(cache: Path) -> Any:
    env = {**os.environ, "CACHEDOCTOR_NO_INDEX": "1", "CACHEDOCTOR_WORKERS": "1"}
    argv = [sys.executable, "-m", "cachedoctor", "scan", str(cache), "--json"]
    return json.loads(subprocess.run(argv, capture_output=True, env=env, check=False).stdout)


def test_distinct_layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    procs = [
        _compile(tmp_path / "dist-src", "varied:0:10"),
        _compile(tmp_path / "elsewhere-cache", "varied:10:12"),
    ]
    assert [p.wait() for p in procs] == [0, 0]
    source = _scan(tmp_path / "dist-src")["entries"]
    programs = {e["program_digest"] for e in source}
    assert len(source) == len(programs) == 10  # ten programs, ten keys: no two coincide
    # the two largest stand in for the deep family (compiling it takes minutes)
    threshold = sorted(e["decompressed_size"] for e in source)[-2]
    large = {e["program_digest"] for e in source if e["decompressed_size"] >= threshold}
    monkeypatch.setattr(generate, "LARGE_ENTRY", threshold)

    info = generate.layout_distinct(tmp_path, 100, seed="test")

    assert (info["entries"], info["distinct_programs"], info["large_programs"]) == (100, 10, 2)
    report = _scan(tmp_path / generate.dist_name(100))
    found: Counter[str] = Counter()
    for finding in report["findings"]:
        found[finding["kind"]] += len(finding["entries"])
    # copies name this cache inside (rewritten), so only the planned share is relocated
    assert found["relocated"] == int(100 * generate.RELOCATED_SHARE)
    assert found["corrupt"] == int(100 * generate.CORRUPT_SHARE)
    loaded = [e["program_digest"] for e in report["entries"] if e["ok"]]
    assert programs <= set(loaded)  # every program once under its own key, then copies
    copies_of_large = sum(d in large for d in loaded) - len(large)
    assert 1 <= copies_of_large <= 25  # about a tenth of the 86 copies
